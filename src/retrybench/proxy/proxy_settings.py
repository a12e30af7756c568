"""The proxy's settings: the upstreams, routing, policy, limits and timeouts a deployment chooses.

Kept apart from the server that runs with them: the command line and the test stacks build and check
them (a bad combination is refused when they are made) before any server, socket or task exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retrybench.conditions.config import BreakerPolicy, ProxyPolicy
from retrybench.control.router import ROUTER_POLICIES

__all__ = ["ProxySettings"]


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    upstream: str  # the engine's base URL (the first replica's, with several)
    policy: ProxyPolicy
    more_upstreams: tuple[str, ...] = ()  # further engine replicas: with any, `route` picks one per execution
    route: str = "round-robin"  # control.router.ROUTER_POLICIES; another policy needs several upstreams
    prefix_tokens: int = 2000  # the shared system prompt's length, as prefix-affine routing describes prompts
    max_body_bytes: int = 4 << 20
    log_path: Path | None = None
    scrape_s: float = 1.0  # how often the engine's waiting gauge is read (budget Retry-After, deadline check)
    remembered_calls: int = 1_000_000  # call ids kept to tell retries from first attempts
    time_scale: float = 1.0  # wall seconds per policy second (scaled live runs; 1 in deployment)
    keep_log: bool = False  # also keep the decision log in memory (tests, conformance checks)
    # Opening an upstream connection (wall seconds; None: no limit).
    upstream_connect_timeout_s: float | None = 10.0
    # An exchange with no progress from the engine this long fails (the proxy's seconds, so scaled by
    # time_scale like the engine's own clock; None: no limit). Far above any wait in an engine's queue
    # that the live reproductions run into: vLLM sends a stream's head, then nothing until its first
    # token, and nothing at all for a whole response until it is complete.
    upstream_idle_timeout_s: float | None = 1800.0
    # Bounds on what clients can make the proxy hold; past each, an attempt gets a 503 naming it.
    max_executions: int = 50_000  # queued or streaming at once (the paper's overloads hold a few thousand)
    max_subscribers: int = 1_000  # attempts on one execution (a call's retries attach to it)
    max_replay_bytes: int = 64 << 20  # an execution's output kept for retries to attach (a 300k-token stream)
    # On SIGTERM, how long the proxy waits for the calls in flight before it ends what is left (the
    # proxy's seconds, so scaled by time_scale). A deployment's grace period must be longer.
    drain_timeout_s: float = 30.0
    # Beyond the paper: a circuit breaker in front of the attempt handling (a policy file's [breaker]).
    breaker: BreakerPolicy | None = None

    def __post_init__(self) -> None:
        if self.drain_timeout_s < 0:
            raise ValueError(f"the drain timeout must be >= 0, got {self.drain_timeout_s}")
        upstreams = self.upstreams
        if len(set(upstreams)) != len(upstreams):
            raise ValueError(f"the upstreams must be distinct, got {list(upstreams)}")
        if self.route not in ROUTER_POLICIES:
            raise ValueError(f"unknown route {self.route!r}; known: {', '.join(ROUTER_POLICIES)}")
        if len(upstreams) == 1 and self.route != "round-robin":  # as RunSpec refuses a router for one replica
            raise ValueError(f"route {self.route!r} needs several upstreams (one upstream takes every execution)")

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every engine replica's base URL, without a trailing slash."""
        return tuple(url.rstrip("/") for url in (self.upstream, *self.more_upstreams))
