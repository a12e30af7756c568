"""The simulated engine: a vLLM-V1 scheduler model and GPU x model profiles."""
