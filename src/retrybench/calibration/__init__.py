"""C-hat, measured the paper's way (Section 3.2): one stage plan (stages.py, pure), its runners on the
simulated engine and a simulated deployment (simulated.py) and on a live engine (live.py), and the one
cache of calibrations every run's rates come from (store.py)."""
