"""How a user names an engine: the simulator, an engine started for the run, or the URL of a running one.

The command line's `--engine` and pytest's `--engine` both parse it here, so they accept the same
names and the same URLs. An engine URL must be plain http://: the proxy relays to the engine with
its own HTTP/1.1 client (proxy/upstream.py), which speaks no TLS, so an https:// engine could never
be reached; it is refused when the user names it rather than when the proxy fails to start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["ENGINE_NAMES", "EngineChoice", "EngineKind", "engine_url", "parse_engine"]

EngineKind = Literal["sim", "engine-server", "vllm-process", "vllm-container", "url"]
# sim: the simulator, in virtual time; engine-server: the engine model over HTTP, started per run;
# vllm-process, vllm-container: a real vLLM started per run (by the test fixtures); url: a running engine.
ENGINE_NAMES: tuple[EngineKind, ...] = ("sim", "engine-server", "vllm-process", "vllm-container")


@dataclass(frozen=True)
class EngineChoice:
    """An engine as the user named it; `url` is set for a running engine only."""

    kind: EngineKind
    url: str | None = None

    def __str__(self) -> str:
        return self.url if self.url is not None else self.kind

    @property
    def live(self) -> bool:
        return self.kind != "sim"


def engine_url(text: str) -> str:
    """`text` without a trailing slash if it is an http:// URL with a host; else ValueError saying why."""
    parts = urlsplit(text)
    if parts.scheme == "https":
        raise ValueError(f"{text!r}: https is not supported (the proxy's upstream client speaks plain HTTP/1.1); "
                         "give the engine's http:// address")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// URL")
    _ = parts.port  # raises ValueError for a port that is not a number in range
    return text.rstrip("/")


def parse_engine(text: str, allowed: Sequence[EngineKind] = ENGINE_NAMES) -> EngineChoice:
    """The engine `text` names: one of `allowed`, or an http:// URL; else ValueError saying what would do."""
    for kind in allowed:
        if text == kind:
            return EngineChoice(kind)
    if "://" in text:
        return EngineChoice("url", engine_url(text))
    raise ValueError(f"{text!r} is not one of {', '.join(allowed)} or an http:// URL")
