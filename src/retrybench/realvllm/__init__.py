"""Real vLLM: its engine arguments, process and container, the tracing plugin, its images, and the comparison
with the simulator.
"""
