"""The overload-control proxy as a server: upstream connections, relays, metrics, its decision log, its container."""
