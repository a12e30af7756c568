"""The run service: run specs planned (C-hat resolved up front), run on one executor interface (a local
process pool, Ray or a live engine) through the result cache, and `reproduce` built on them."""
