"""A cancellation that reaches `UpstreamPool.open` in the instant its connection completes is kept: the
exchange is not started, and the caller's task ends cancelled (an execution cancelled as its upstream
connection opened once streamed on for nobody until its end)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from retrybench.proxy.http1 import ResponseHead
from retrybench.proxy.upstream import UpstreamPool, _Connection


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None: ...


class ConnectingSink:
    def __init__(self) -> None:
        self.connections: list[Any] = []

    def on_head(self, head: ResponseHead) -> None: ...

    def on_first_payload(self, payload: bytes) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_end(self, error: str | None) -> None: ...

    def on_connection(self, connection: Any) -> None:
        self.connections.append(connection)


def test_a_cancellation_as_the_connection_completes_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> tuple[asyncio.Task[None], ConnectingSink, FakeTransport]:
        loop = asyncio.get_running_loop()
        pool = UpstreamPool("http://127.0.0.1:1", connect_timeout_s=10.0)
        transport = FakeTransport()
        connected: asyncio.Future[tuple[Any, _Connection]] = loop.create_future()

        async def create_connection(factory: Any, host: str, port: int) -> tuple[Any, _Connection]:
            return await connected

        monkeypatch.setattr(loop, "create_connection", create_connection)
        sink = ConnectingSink()
        task = loop.create_task(pool.open(b"POST / HTTP/1.1\r\n\r\n", sink))
        await asyncio.sleep(0)  # the task now waits for its connection
        connection = _Connection(pool)
        connection.connection_made(transport)  # type: ignore[arg-type]
        connected.set_result((transport, connection))
        task.cancel()  # in the same instant: the connection is complete, the caller leaves
        await asyncio.gather(task, return_exceptions=True)
        return task, sink, transport

    task, sink, transport = asyncio.run(scenario())
    assert task.cancelled(), "the caller's cancellation was lost as its connection completed"
    assert sink.connections == [] and transport.written == [], (
        f"the exchange started for a cancelled caller: {len(sink.connections)} connection(s), "
        f"{transport.written!r} written")
