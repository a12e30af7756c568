"""The paper's traffic: the open-loop trace of calls and the retrying client that sends them."""
