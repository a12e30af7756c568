"""Root conftest: puts the repo root on sys.path (so `fixtures` imports) and loads the shared fixtures."""

pytest_plugins = ["fixtures.live", "fixtures.engines", "fixtures.report", "pytester"]
