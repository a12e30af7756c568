"""The simulator: client, proxy and engine driven in virtual time."""
