"""retrybench: re-test 'Cancellation Is Not Enough' on a simulated or real vLLM engine."""

__version__ = "0.1.0"
