"""A minimal OpenAI-style streaming upstream, for proxy tests and the overhead benchmark.

It does no engine work: each request streams `max_tokens` chunks, `interval_ms` apart (from the
request body's `stub` object), so that what is measured in front of it is the proxy alone. It
counts open streams and disconnects, which tests use to see that a cancellation reached it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from aiohttp import web

from retrybench.live.serving import new_app, serve_until_signalled, start_app

__all__ = ["StubUpstream"]

_HEAD = b'data: {"id":"cmpl-stub","object":"text_completion","choices":[{"index":0,'
_CHUNK = _HEAD + b'"text":" tok","finish_reason":null}]}\n\n'
_LAST = _HEAD + b'"text":" end","finish_reason":"length"}]}\n\n'
_DONE = b"data: [DONE]\n\n"
_BUSY = {"error": {"message": "The engine is currently busy", "type": "ServiceUnavailableError", "param": None,
                   "code": 503}}


@dataclass
class StubUpstream:
    requests: int = 0
    open_streams: int = 0
    disconnects: int = 0
    completed: int = 0
    bodies: list[bytes] = field(default_factory=list)
    keep_bodies: bool = True
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        routes = [web.post(path, self.completions) for path in ("/v1/completions", "/v1/chat/completions")]
        return new_app([*routes, web.get("/metrics", self.metrics)], client_max_size=64 << 20)

    async def metrics(self, request: web.Request) -> web.Response:
        text = f"vllm:num_requests_waiting{{engine=\"0\"}} 0.0\nvllm:num_requests_running{{engine=\"0\"}} " \
               f"{float(self.open_streams)}\n"
        return web.Response(text=text)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner, bound = await start_app(self.app(), host, port)
        return bound

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        if self.keep_bodies:
            self.bodies.append(body)
        data = json.loads(body)
        stub = data.get("stub", {})
        status = int(stub.get("status", 200))
        n = int(data.get("max_tokens", 16))
        interval = float(stub.get("interval_ms", 0)) / 1000
        first_delay = float(stub.get("first_delay_ms", 0)) / 1000
        if status != 200:
            return web.json_response(_BUSY if status == 503 else {"error": {"message": "stub", "code": status}},
                                     status=status)
        if not data.get("stream"):
            await asyncio.sleep(first_delay + interval * n)
            self.completed += 1
            return web.json_response({"id": "cmpl-stub", "object": "text_completion",
                                      "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                                      "usage": {"completion_tokens": n}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self.open_streams += 1
        try:
            await response.prepare(request)
            if stub.get("sse_error"):
                await response.write(b"data: " + json.dumps(_BUSY).encode() + b"\n\n" + _DONE)
                return response
            if first_delay:
                await asyncio.sleep(first_delay)
            await self._stream(response, n, interval)
            end_delay = float(stub.get("end_delay_ms", 0)) / 1000
            if end_delay:  # [DONE] is sent; the body's last chunk comes this much later
                await asyncio.sleep(end_delay)
            await response.write_eof()
            self.completed += 1
            return response
        except (asyncio.CancelledError, ConnectionError):
            self.disconnects += 1
            raise
        finally:
            self.open_streams -= 1

    async def _stream(self, response: web.StreamResponse, n: int, interval: float) -> None:
        start = time.monotonic()
        for i in range(n - 1):
            await response.write(_CHUNK)
            if interval:
                delay = start + (i + 1) * interval - time.monotonic()
                await asyncio.sleep(max(delay, 0))
        await response.write(_LAST + _DONE)


def main() -> None:
    """`python -m retrybench.live.stub_upstream --port N`: serve until SIGTERM (benchmarks run it apart)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    serve_until_signalled(lambda: StubUpstream(keep_bodies=False), args.host, args.port,
                          lambda _, port: f"stub upstream on http://{args.host}:{port}")


if __name__ == "__main__":
    main()
