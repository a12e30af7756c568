"""The records a run leaves: run logs, engine traces, results, the cache, atomic writes."""
