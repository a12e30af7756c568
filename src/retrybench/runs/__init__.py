"""The run service: run specs to results, through the cache, on the simulated or a live engine."""
