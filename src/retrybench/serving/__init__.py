"""What every live server shares: the aiohttp app, the clock, the OpenAI API's errors, subprocesses, containers."""
