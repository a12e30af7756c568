"""`retrybench sweep`: maps over run parameters (axes) crossed with conditions and seeds, on this
machine's process pool, on Ray or on a live engine (runs/executors.py), through the result cache;
optionally a boundary search per cell.

axes (what may vary) -> plan (run specs) -> run (grid or bisect, on an executor) -> output (sweep.json,
page with phase diagrams).
"""
