"""What to run: one run's spec, Table 1's blocks, and how a user names an engine."""
