"""Serving attempts: each completion request admitted (or refused) by the core and answered from its
execution, streamed or whole.

aiohttp serves the client side: its C HTTP parser and `handler_cancellation` (a handler is cancelled
the moment its client disconnects: while queued, before the first token or mid-stream) are what the
overhead targets and the cancellation semantics need. A handler tells a retry from a first attempt by
its call id, asks the core for a decision, and then is the attempt's subscriber: it waits for its
execution's relay, sends the replay of what the execution produced so far and leaves the live bytes
to the relay, until the execution ends or its client leaves (which the core hears at once). An
attempt that a limit refuses gets a 503 naming the limit.

The middle of the server's three layers (see executions.py): it admits attempts onto the executions
the layer below runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from aiohttp import web

from retrybench.analysis.conformance import actions_of, decision_of
from retrybench.control.deadline import DeadlineHeaderError, timeout_from_headers
from retrybench.control.proxy import Attach, AttemptIn, Create, Refuse, Serve, Subscriber
from retrybench.proxy.aiohttp_internals import prepare_raw_chunked, send_head
from retrybench.proxy.executions import ExecutionControl
from retrybench.proxy.relay import ClientSubscriber, Relay
from retrybench.serving.openai_api import BadRequest, call_identity, coalescing_key, error_response, parse_request

__all__ = ["ROUTES", "AttemptHandling"]

ROUTES = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat
FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept")
logger = logging.getLogger(__name__)


class AttemptHandling(ExecutionControl):
    """The completion routes' handlers. The state is set up by `ProxyServer.__init__`; declared here
    for the methods that use it."""

    open_subscribers: int
    engine_waiting: int  # the engines' waiting gauge as last scraped
    _calls: OrderedDict[tuple[str, str], tuple[int, int]]  # (tenant, call id) -> (index, attempts)
    _anonymous: int
    _calls_seen: int
    draining: bool  # stopping: new calls are refused, attempts on what it holds still served
    drain_refused: int  # attempts refused while draining

    def _attempt_number(self, tenant: str, call_id: str | None) -> tuple[int, int, str]:
        """(call index, attempt number, call id): an attempt of a call id seen before is a retry."""
        if call_id is None:  # no retry can name it again: nothing to remember
            self._anonymous += 1
            return self._new_call_index(), 0, f"anonymous-{self._anonymous}"
        identity = (tenant, call_id)
        known = self._calls.pop(identity, None)
        index, attempts = known if known is not None else (self._new_call_index(), 0)
        self._calls[identity] = (index, attempts + 1)
        if len(self._calls) > self.settings.remembered_calls:
            self._calls.popitem(last=False)
        return index, attempts, call_id

    def _new_call_index(self) -> int:
        """Calls are numbered in order of their first attempt (a forgotten call id stays numbered)."""
        self._calls_seen += 1
        return self._calls_seen - 1

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        chat = ROUTES[request.path]
        try:
            body = await request.read()
            arrived = time.monotonic()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"the body is over the limit of {self.settings.max_body_bytes} bytes")
        try:
            parsed = parse_request(body, chat)
            tenant, given_id = call_identity(request.headers)
        except BadRequest as error:
            return error_response(400, str(error), error.param)
        timeout_s = None
        if self.settings.policy.deadline_propagation:
            try:
                timeout_s = timeout_from_headers(request.headers, parsed.stream)
            except DeadlineHeaderError as error:
                return error_response(400, str(error), error.header)
        if self.draining and not (given_id is not None and self.core.holds(
                coalescing_key(tenant, given_id, request.path, body), self.now())):
            return self._refused_while_draining()
        if len(self.relays) >= self.settings.max_executions:
            return self._over_limit("max_executions", f"the proxy holds {len(self.relays)} executions, its limit")
        call_index, attempt_no, call_id = self._attempt_number(tenant, given_id)
        key = coalescing_key(tenant, call_id, request.path, body)
        now = self.now()
        # A header's timeout is wall seconds; the core's clock runs in policy seconds (wall / time_scale).
        deadline_s = None if timeout_s is None else now + timeout_s / self.settings.time_scale
        attempt = AttemptIn(call_index, attempt_no, key, parsed.prompt_tokens, parsed.max_tokens, deadline_s)
        decision = self.core.on_attempt(attempt, now, engine_waiting=self.engine_waiting)
        self.metrics.on_decision(attempt_no, decision)
        if self.log.active:
            self._log({"ev": "attempt", "t": now, "call": call_index, "attempt": attempt_no, "call_id": call_id,
                       "client_attempt": request.headers.get("X-Retrybench-Attempt"), "key": key,
                       "prompt_tokens": parsed.prompt_tokens, "max_tokens": parsed.max_tokens,
                       "engine_waiting": self.engine_waiting, **decision_of(decision),
                       **({"deadline_s": deadline_s} if deadline_s is not None else {})})
        if isinstance(decision, Create | Attach) and decision.expire_at_s is not None:
            self._arm_deadline(decision.expire_at_s, decision.execution_id)
        if isinstance(decision, Refuse):
            return _refusal(decision)
        if isinstance(decision, Serve):
            kept = self.retained.get(decision.execution_id)
            if kept is None:  # the core and this map change together: a bug, but never a hang
                logger.error("execution %d was to be served retained but is not held", decision.execution_id)
                return error_response(500, "the retained response is missing")
            return await self._serve(request, kept, ClientSubscriber((call_index, attempt_no), arrived), attached=False,
                                     retained=True)
        if isinstance(decision, Create):
            policy = self.settings.policy
            relay = Relay(self, decision.execution_id, request.path, body, _forward_headers(request), parsed.stream,
                          keep_replay=policy.coalescing or policy.retain_s > 0, key=key,
                          prompt_tokens=parsed.prompt_tokens)
            self.relays[decision.execution_id] = relay
            if decision.dispatch:
                self._dispatch(relay)
        else:
            assert isinstance(decision, Attach)
            relay = self.relays[decision.execution_id]
            refused = self._attach_refused(relay)
            if refused is not None:
                self._left((call_index, attempt_no))  # the core attached it: it leaves at once
                return self._over_limit(*refused)
            if relay.subscribers == 1:  # its first retry attached
                self.metrics.fate("attached")
        return await self._serve(request, relay, ClientSubscriber((call_index, attempt_no), arrived),
                                 attached=isinstance(decision, Attach))

    async def _serve(self, request: web.Request, relay: Relay, sub: ClientSubscriber,
                     attached: bool, retained: bool = False) -> web.StreamResponse:
        """Be the attempt's subscriber until its execution ends or its client leaves (at once for
        a retained response: it is whole)."""
        relay.pending += 1
        relay.rewire()  # the live client's bytes are now kept for this one
        relay.subscribers += 1
        self.open_subscribers += 1
        joined = finished = False
        try:
            await relay.ready.wait()
            headers = {"X-Retrybench-Execution": str(relay.execution_id),
                       "X-Retrybench-Attached": "1" if attached else "0"}
            if retained:
                headers["X-Retrybench-Retained"] = "1"
            if not relay.stream or relay.status != 200:
                finished = True
                if relay.status == 0:  # the proxy is shutting down
                    return error_response(503, "the proxy is shutting down")
                if relay.engine_refused:  # the engine's queue cap, answered with the policy's status and headers
                    return self._engine_refusal(relay)
                return web.Response(status=relay.status, body=b"".join(relay.chunks),
                                    headers={**headers, "Content-Type": relay.content_type})
            response = web.StreamResponse(status=200, headers={**headers, "Content-Type": relay.content_type,
                                                               "Cache-Control": "no-cache"})
            # From here on the relay writes the upstream's chunk-framed bytes to the socket itself.
            writer = await prepare_raw_chunked(response, request)
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client left")
            sub.transport = transport
            sent = len(relay.chunks)  # a replay goes with the head in one write, then live bytes follow
            await send_head(writer, b"".join(relay.chunks[:sent]))
            if len(relay.chunks) > sent:  # arrived during that write; from here on nothing awaits
                transport.write(b"".join(relay.chunks[sent:]))
            relay.pending -= 1
            joined = True
            if relay.first_token:  # its replay (or the bytes that came during it) held the first payload
                self.first_token_sent(sub)
            if not relay.keep_replay and relay.pending == 0:
                relay.chunks = []
            if not relay.done:
                sub.finished = asyncio.get_running_loop().create_future()
                relay.live.append(sub)
                relay.rewire()
                await sub.finished
            if relay.truncated and relay.error_tail is None:  # the client must not see an end
                raise ConnectionResetError("the upstream stream broke where no error event can follow")
            await response.write_eof()
            finished = True
            return response
        finally:
            self.open_subscribers -= 1
            if not joined:
                relay.pending -= 1
            if sub in relay.live:
                relay.live.remove(sub)
            relay.rewire()
            if not finished and joined and relay.forwarded_the_end():
                relay.delivered_whole = True  # it left with everything: not a subscriber that gave up
            elif not finished:
                self._left(sub.key)

    def _engine_refusal(self, relay: Relay) -> web.Response:
        """The engine's refusal relayed as the policy says: its status, Retry-After (the proxy's wait
        estimate) and x-should-retry (beyond the paper; the defaults relay the engine's 503 as it came)."""
        policy = self.settings.policy
        wait = None
        if policy.engine_retry_after:
            wait = self.core.estimator.wait_s(self.now(), self.core.waiting + self.engine_waiting, relay.prompt_tokens)
        return _refusal(Refuse(policy.engine_status, retry_after_s=wait, no_retry=policy.engine_no_retry,
                               source="engine"))

    def _attach_refused(self, relay: Relay) -> tuple[str, str] | None:
        """(limit, why) when a retry may not attach to `relay`: too many subscribers, or its output
        outgrew the replay limit (it cannot be replayed from the start)."""
        if relay.subscribers >= self.settings.max_subscribers:
            return "max_subscribers", f"execution {relay.execution_id} has {relay.subscribers} subscribers, its limit"
        if relay.replay_dropped:
            return "max_replay_bytes", (f"execution {relay.execution_id}'s output is over "
                                        f"{self.settings.max_replay_bytes} bytes and cannot be replayed to a retry")
        return None

    def _refused_while_draining(self) -> web.Response:
        """A 503 for an attempt a draining proxy cannot answer from what it holds: its client retries
        (behind a balancer, on another instance or on this one restarted), and its connection is closed
        so that a client or balancer keeping it alive opens a new one."""
        self.drain_refused += 1
        response = error_response(503, "the proxy is draining for a restart; retry", "draining",
                                  headers={"Retry-After": "1"})
        response.force_close()
        return response

    def _over_limit(self, limit: str, why: str) -> web.Response:
        """A 503 that names the limit the attempt ran into (a client may retry later)."""
        self.metrics.limit_refused(limit)
        return error_response(503, f"{why} ({limit}); retry later", limit, headers={"Retry-After": "1"})

    def first_token_sent(self, sub: ClientSubscriber) -> None:
        """Count the subscriber's time to first token once: from its request read to its stream's first
        payload written to its socket (live, or in the replay it joined with)."""
        if not sub.first_token_seen:
            sub.first_token_seen = True
            self.metrics.time_to_first_token.observe(time.monotonic() - sub.arrived)

    def _left(self, key: Subscriber) -> None:
        now = self.now()
        actions = self.core.on_subscriber_left(key, now)
        if self.log.active:
            self._log({"ev": "left", "t": now, "call": key[0], "attempt": key[1], "actions": actions_of(actions)})
        self._apply(actions)


def _forward_headers(request: web.Request) -> dict[str, str]:
    return {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}


_REFUSAL_MESSAGES = {"budget": "retry budget exhausted",
                     "deadline": "the proxy estimates this attempt would miss its deadline",
                     "engine": "the engine's queue is full", "breaker": "the circuit breaker is open"}


def _refusal(decision: Refuse) -> web.Response:
    """A refusal's answer: its status, Retry-After (whole seconds, at least 1, and in ms) where it has a wait,
    and `x-should-retry: false` where the policy says so."""
    headers: dict[str, str] = {}
    if decision.retry_after_s is not None:
        wait = decision.retry_after_s
        headers = {"Retry-After": str(max(1, int(wait + 0.999))), "Retry-After-Ms": str(int(wait * 1000))}
    if decision.no_retry:
        headers["x-should-retry"] = "false"
    source = decision.source or ("budget" if decision.status == 429 else "deadline")
    return error_response(decision.status, _REFUSAL_MESSAGES.get(source, "refused"), headers=headers)
