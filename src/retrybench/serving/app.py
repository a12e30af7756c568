"""How every live HTTP server is built, bound and run: one way, so they cannot drift apart.

Each server (the proxy, the engine server, the stub upstream, test upstreams) is an aiohttp
application with a `/health` route that answers 200 once it listens (launch.py polls it), bound
with `handler_cancellation` on: a handler is cancelled the moment its client disconnects, which
is how a client leaving reaches the proxy and the engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypedDict, TypeVar

from aiohttp import web

from retrybench.serving.aio import run_event_loop, until_signalled

__all__ = ["Server", "new_app", "serve_until_signalled", "start_app"]

BACKLOG = 4096  # pending connections: a pulse of thousands of attempts must not be refused at accept


class Server(Protocol):
    """A live server: `start` binds it and returns the port, `stop` ends its streams and tasks."""

    async def start(self, host: str, port: int) -> int: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Server)


async def _healthy(request: web.Request) -> web.Response:
    return web.Response(status=200)


def new_app(routes: Iterable[web.AbstractRouteDef], *, client_max_size: int,
            health: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None) -> web.Application:
    """An application serving `/health` (200, or the server's own `health` handler) and `routes` (in
    that order: a catch-all route goes last)."""
    app = web.Application(client_max_size=client_max_size)
    app.add_routes([web.get("/health", health or _healthy), *routes])
    return app


class _RunnerOptions(TypedDict, total=False):
    shutdown_timeout: float


async def start_app(app: web.Application, host: str, port: int, *, shutdown_timeout: float | None = None,
                    reuse_address: bool | None = None) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port; returns its runner (`cleanup()` stops it) and the bound port (the
    one the OS chose when asked for port 0). `shutdown_timeout` bounds how long `cleanup()` waits
    for handlers (aiohttp's default when None)."""
    options: _RunnerOptions = {} if shutdown_timeout is None else {"shutdown_timeout": shutdown_timeout}
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, **options)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=BACKLOG, reuse_address=reuse_address).start()
    bound: int = runner.addresses[0][1]  # public API, on asyncio's loop and uvloop alike
    return runner, bound


def serve_until_signalled(make: Callable[[], S], host: str, port: int, banner: Callable[[S, int], str]) -> None:
    """Start `make()` on host:port, print `banner(server, port)`, serve until SIGINT or SIGTERM,
    then stop it, so that its streams end and its logs are flushed (uvloop where installed)."""

    async def main() -> None:
        server = make()
        bound = await server.start(host, port)
        print(banner(server, bound), flush=True)
        await until_signalled()
        await server.stop()

    run_event_loop(main)
