"""Running the proxy's executions: the core's actions carried out on relays, upstream tasks and timers.

The core (`control.proxy.ProxyCore`) decides; this layer of the server does what it decided: dispatches
an execution to an upstream (picked by the router with several), cancels it by cancelling its task
(which closes the upstream connection: how vLLM learns to abort), arms its timers, retains and releases
completed responses, and reports each engine event and each execution's end back to the core.

It is the lowest of the server's three layers, each a module of its own: this one, the attempts served
over HTTP (attempts.py) and the server's lifecycle (proxy_server.py). They are layers of one object
rather than separate objects because they share one state that the event loop changes without locks,
and calls between them stay plain method calls on the paths each attempt and execution takes.
"""

from __future__ import annotations

import asyncio
import logging

from retrybench.analysis.conformance import actions_of
from retrybench.control.deadline import REQUEST_TIMEOUT_MS, forward_timeout_ms
from retrybench.control.proxy import Action, Cancel, Dispatch, Drop, ProxyCore, Release, Retain, SetTimer
from retrybench.control.router import Router, prompt_prefix
from retrybench.proxy.eventlog import EventLog
from retrybench.proxy.proxy_metrics import ProxyMetrics
from retrybench.proxy.proxy_settings import ProxySettings
from retrybench.proxy.relay import JSON, SHUTDOWN, Relay
from retrybench.proxy.upstream import TimedOut, UpstreamPool
from retrybench.records.decisionlog import DecisionEvent
from retrybench.serving.clock import ScaledClock
from retrybench.serving.openai_api import error_body

__all__ = ["SHUTDOWN", "ExecutionControl"]

logger = logging.getLogger(__name__)


class ExecutionControl:
    """The executions the proxy runs, and the core's actions on them. The state is set up by
    `ProxyServer.__init__`; declared here for the methods that use it."""

    settings: ProxySettings
    core: ProxyCore
    clock: ScaledClock
    log: EventLog
    metrics: ProxyMetrics
    router: Router | None
    streams: list[int]  # executions dispatched to each upstream and not ended
    relays: dict[int, Relay]
    retained: dict[int, Relay]  # completed executions whose response may be served again
    _timers: dict[tuple[float, int], asyncio.Handle]  # (due, execution) -> handle
    _deadline_timers: dict[tuple[float, int], asyncio.Handle]  # (deadline, execution) -> handle
    _pools: list[UpstreamPool]  # one per upstream
    _stopping: bool
    _awaited_at_stop: set[int]  # executions a client still waited for when the proxy stopped

    def now(self) -> float:
        """Policy seconds since the proxy started (wall seconds / time_scale)."""
        return self.clock.now()

    def _log(self, event: DecisionEvent) -> None:
        event.setdefault("t", self.now())
        self.log.write(event)

    # -- executions --------------------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Cancel):
                relay = self.relays.get(action.execution_id)
                if relay is not None and relay.task is not None:
                    relay.task.cancel()  # closes the upstream connection: the engine aborts
                self.metrics.fate("cancelled")
            elif isinstance(action, Dispatch):
                self._dispatch(self.relays[action.execution_id])
            elif isinstance(action, Drop):
                self.relays.pop(action.execution_id, None)
                self.core.forget(action.execution_id)
                self.metrics.fate("dropped")
                if self.log.active:
                    self._log({"ev": "end", "execution": action.execution_id, "fate": "dropped"})
            elif isinstance(action, SetTimer):
                self._arm_timer(action.at_s, action.execution_id)
            elif isinstance(action, Retain):
                relay = self.relays[action.execution_id]
                relay.body = b""  # the request was sent; only the response is served again
                self.retained[action.execution_id] = relay
            elif isinstance(action, Release):
                self.retained.pop(action.execution_id, None)

    def _arm_timer(self, at_s: float, execution_id: int) -> None:
        delay = self.clock.wall_until(at_s)
        handle = asyncio.get_running_loop().call_later(delay, self._timer_due, at_s, execution_id)
        self._timers[(at_s, execution_id)] = handle

    def _timer_due(self, at_s: float, execution_id: int) -> None:
        self._timers.pop((at_s, execution_id), None)
        now = self.now()
        if now < at_s:  # uvloop's timers have millisecond resolution and may fire a little early
            self._arm_timer(at_s, execution_id)
            return
        actions = self.core.on_timer(execution_id, now)
        if self.log.active:
            self._log({"ev": "timer", "t": now, "execution": execution_id, "actions": actions_of(actions)})
        self._apply(actions)

    def _arm_deadline(self, at_s: float, execution_id: int) -> None:
        """Call the core's on_deadline for the execution at `at_s` (deadline propagation)."""
        delay = self.clock.wall_until(at_s)
        handle = asyncio.get_running_loop().call_later(delay, self._deadline_due, at_s, execution_id)
        self._deadline_timers[(at_s, execution_id)] = handle

    def _deadline_due(self, at_s: float, execution_id: int) -> None:
        self._deadline_timers.pop((at_s, execution_id), None)
        now = self.now()
        if now < at_s:  # timers may fire a little early
            self._arm_deadline(at_s, execution_id)
            return
        actions = self.core.on_deadline(execution_id, now)
        if self.log.active:
            self._log({"ev": "deadline", "t": now, "execution": execution_id, "actions": actions_of(actions)})
        for action in actions:  # clients still connected get an answer: a 503, or their stream's error end
            relay = self.relays.get(action.execution_id) if isinstance(action, Drop | Cancel) else None
            if relay is None or relay.done:
                continue
            if isinstance(action, Drop):
                relay.status, relay.content_type = 503, JSON
                relay.chunks = [error_body(503, "the call's deadline passed while it waited in the proxy's queue")]
                relay.ready.set()
            elif relay.live or relay.pending:  # ends their streams properly; the Cancel then ends the task
                relay.cut("the call's deadline passed")
        self._apply(actions)

    def engine_event(self, relay: Relay, kind: str, result_bytes: int | None = None) -> None:
        """`result_bytes`: a completed HTTP 200 response's size, for result retention."""
        now = self.now()
        actions = self.core.on_engine_event(relay.execution_id, kind, now, result_bytes)
        if self.log.active:
            event = {"ev": "engine", "t": now, "execution": relay.execution_id, "kind": kind,
                     "actions": actions_of(actions)}
            if result_bytes is not None:
                event["bytes"] = result_bytes
            self._log(event)
        self._apply(actions)

    def _dispatch(self, relay: Relay) -> None:
        pool = self._pools[0] if self.router is None else self._route(relay)
        relay.pool = pool
        relay.ended = asyncio.get_running_loop().create_future()
        headers = relay.headers
        execution = self.core.executions.get(relay.execution_id)
        if execution is not None and execution.deadline_s is not None:  # the time left, to the engine
            headers = {**headers, REQUEST_TIMEOUT_MS: str(forward_timeout_ms(execution.deadline_s, self.now(),
                                                                             self.settings.time_scale))}
        request = pool.request_bytes("POST", relay.path, headers, relay.body)
        sent = pool.send_now(request, relay)  # on a pooled connection at once, or in the task
        relay.task = asyncio.create_task(self._run_upstream(relay, None if sent else request))
        relay.task.add_done_callback(lambda _: self._upstream_task_done(relay))

    def _route(self, relay: Relay) -> UpstreamPool:
        """The upstream the router picks for `relay` (once per execution, never per chunk)."""
        router = self.router
        assert router is not None
        prefix = (prompt_prefix(relay.key, relay.prompt_tokens, self.settings.prefix_tokens)
                  if router.policy == "prefix-affine" else ())
        replica = router.choose(relay.key, prefix, self.streams)
        self.streams[replica] += 1
        relay.replica = replica
        self.metrics.routed(replica)
        if self.log.active:
            self._log({"ev": "route", "execution": relay.execution_id, "upstream": replica})
        return self._pools[replica]

    def _upstream_task_done(self, relay: Relay) -> None:
        """A task cancelled before it first ran never enters its body, so its cleanup never runs (a
        queued call dispatched as a slot freed, whose client left in the same instant): end the
        execution here. A no-op for a task that ran, whose body ended it."""
        if not relay.done:
            relay.close_upstream()
            self._finish(relay, SHUTDOWN if self._stopping else "cancelled")
        # The task's traceback holds the frame that holds the relay: let reference counting free them
        # at once rather than leaving a cycle for the (deliberately infrequent) cyclic collector.
        relay.task = relay.connection = None

    async def _run_upstream(self, relay: Relay, request: bytes | None) -> None:
        """The execution's life upstream; cancelling this task closes the upstream connection."""
        pool = relay.pool
        assert pool is not None and relay.ended is not None
        outcome = "failed"
        try:
            if request is not None:
                try:
                    await pool.open(request, relay)
                except TimeoutError:
                    relay.on_end(TimedOut(f"no connection within {pool.connect_timeout_s:g} s"))
                except OSError as error:
                    relay.on_end(f"upstream unreachable: {error}")
                except Exception as error:  # a bug must fail the execution, never hang its subscribers
                    logger.exception("execution %d failed", relay.execution_id)
                    relay.on_end(f"proxy error: {error!r}")
            outcome = await relay.ended
        except asyncio.CancelledError:
            outcome = SHUTDOWN if self._stopping else "cancelled"
            raise
        finally:
            if outcome in ("cancelled", SHUTDOWN):
                relay.close_upstream()
            self._finish(relay, outcome)

    def whole_response(self, relay: Relay) -> str:
        """A response that is not streamed: it reaches subscribers once it is complete."""
        if relay.status == 200:
            self.engine_event(relay, "first_token")
            self.engine_event(relay, "completed", len(relay.chunks[0]))
            return "completed"
        relay.engine_refused = relay.status == 503
        self.engine_event(relay, "refused" if relay.status == 503 else "completed")
        return "refused" if relay.status == 503 else "failed"

    def _finish(self, relay: Relay, outcome: str) -> None:
        """The execution ended: wake every subscriber, free its buffers, count its fate.

        An execution still running when the proxy stops was not cancelled by a policy: it is logged
        as the simulator records an execution live at the end of a run, orphaned when nobody waited
        for it any more, else unfinished, and not counted in /metrics (the proxy is going away)."""
        relay.done = True
        relay.ready.set()
        if relay.replica >= 0:
            self.streams[relay.replica] -= 1
            relay.replica = -1
        for sub in relay.live:
            if sub.finished is not None and not sub.finished.done():
                sub.finished.set_result(None)
        delivered = relay.subscribers > 0 and (relay.live or relay.pending or relay.delivered_whole)
        self.relays.pop(relay.execution_id, None)
        self.core.forget(relay.execution_id)
        cut_off = outcome == SHUTDOWN
        if outcome == "completed":
            outcome = "completed" if delivered else "orphaned"
        elif cut_off:
            outcome = "unfinished" if relay.execution_id in self._awaited_at_stop else "orphaned"
        if outcome != "cancelled" and not cut_off:  # cancellations are counted when they are decided
            self.metrics.fate(outcome)
        if self.log.active:
            self._log({"ev": "end", "execution": relay.execution_id, "fate": outcome})

    def _expire_retained(self) -> None:
        now = self.now()
        actions = self.core.expire(now)
        if actions:
            if self.log.active:
                self._log({"ev": "expire", "t": now, "actions": actions_of(actions)})
            self._apply(actions)
