"""The open-loop load generator, the SDK driver, and a live run's orchestration and run log."""
