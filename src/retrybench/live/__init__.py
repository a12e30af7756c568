"""The live stack: the proxy server, the load generator and the engine server, over real HTTP."""
