"""The simulated engine served over HTTP in wall-clock time."""
