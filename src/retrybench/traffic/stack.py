"""A client as a stack of retry layers (conditions/client_stack.py), outermost first, as a sans-IO state
machine with the driver interface of traffic/client.py's RetryingClient.

Each layer is a RetryingClient of its own: a layer's attempt is one call of the layer inside it, so a
failing call multiplies, (R1 + 1) x (R2 + 1) x ... requests on the wire. Wire attempts are numbered
0, 1, 2, ... across all layers (the proxy sees every one after the first as a retry). An attempt's outcome
goes to the innermost layer; a layer that gives up passes its last outcome (and Retry-After) to the layer
outside it, as an SDK's exception reaches the application's wrapper.

Timeouts: every layer's current attempt has its own deadline (timeout_kind "total": begun + timeout;
"first_byte": begun + timeout until a first token arrives, none after). The wire attempt's deadline is the
earliest of them. When it passes, the outermost layer whose deadline has passed decides; the attempts of
the layers inside it are abandoned. When a layer would send its next attempt at or after an outer layer's
deadline (a backoff wait longer than what is left), that outer layer's timeout comes first, at its deadline:
the action returned then carries that time (a CallFailed at that deadline, or the next send after it).

The driver tells the client when the wire attempt's first token arrived (`on_first_token`) and gets the
attempt's deadline back, later than before where a first-byte layer no longer cuts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from retrybench.conditions.client_stack import StackLayer
from retrybench.records.runlog import COMPLETED, TIMED_OUT
from retrybench.traffic.client import CallDelivered, CallFailed, ClientAction, RetryingClient, SendAttempt

__all__ = ["StackedClient", "stack_meta"]


@dataclass(slots=True)
class _StackCall:
    """One call's state: per layer, the key of its current call in that layer's RetryingClient, its current
    attempt's number, start and whether a first token reached it; the wire attempt's number."""

    keys: list[int]
    attempt_no: list[int]
    begun_s: list[float]
    first_token: list[bool]
    made: list[int]  # attempts each layer has made for the call, all its inner calls together
    wire_no: int = 0
    wire_send_s: float = 0.0
    done: bool = False


class StackedClient:
    """Decides, per reported wire-attempt outcome, which layer retries, delivers or gives the call up."""

    def __init__(self, layers: Sequence[StackLayer], rng: np.random.Generator) -> None:
        if not layers:
            raise ValueError("a stacked client needs at least one layer")
        self._layers = tuple(layers)
        # The outermost layer draws from `rng` itself, so that a one-layer stack is the RetryingClient with
        # the same generator; each inner layer from a child of it (spawning does not advance `rng`).
        rngs = [rng, *rng.spawn(len(layers) - 1)] if len(layers) > 1 else [rng]
        self._clients = [RetryingClient(layer.policy, r) for layer, r in zip(layers, rngs, strict=True)]
        self._next_key = [0] * len(layers)
        self._calls: dict[int, _StackCall] = {}
        self._outstanding = 0

    @property
    def layers(self) -> tuple[StackLayer, ...]:
        return self._layers

    def start_call(self, call_index: int, now: float) -> SendAttempt:
        """The call's first wire attempt, sent at once: the first attempt of every layer."""
        if call_index in self._calls:
            raise ValueError(f"call {call_index} already started")
        n = len(self._layers)
        call = _StackCall(keys=[0] * n, attempt_no=[0] * n, begun_s=[now] * n, first_token=[False] * n,
                          made=[0] * n, wire_send_s=now)
        self._calls[call_index] = call
        self._outstanding += 1
        self._start_inner(call, 0, now)
        return SendAttempt(call_index, 0, now, self._deadline(call))

    def on_first_token(self, call_index: int, attempt_no: int, now: float) -> float:
        """The wire attempt's first token arrived at `now`: its deadline from now on (math.inf: none)."""
        call = self._outstanding_call(call_index, attempt_no)
        if now < call.wire_send_s:
            raise ValueError(f"call {call_index}: first token at {now} before the attempt was sent "
                             f"({call.wire_send_s})")
        call.first_token = [True] * len(self._layers)
        return self._deadline(call)

    def on_outcome(self, call_index: int, attempt_no: int, outcome: str, now: float,
                   retry_after_s: float | None = None, no_retry: bool = False) -> ClientAction:
        """The call's next action after its outstanding wire attempt ended with `outcome` at `now`;
        `no_retry` (the response's `x-should-retry: false`) reaches each layer with the outcome, and each
        obeys it or not as its policy says."""
        call = self._outstanding_call(call_index, attempt_no)
        if outcome == COMPLETED:
            for k in reversed(range(len(self._layers))):  # each layer's attempt completed: every layer delivers
                self._clients[k].on_outcome(call.keys[k], call.attempt_no[k], COMPLETED, now)
            return self._end(call, CallDelivered(call_index, now))
        layer = len(self._layers) - 1
        if outcome == TIMED_OUT:
            layer = self._timed_out_layer(call, now)
        return self._decide(call_index, call, layer, outcome, now, retry_after_s, no_retry)

    def attempts_made(self, call_index: int) -> int:
        """Wire attempts sent (or scheduled) for the call so far, the first one included."""
        return self._call(call_index).wire_no + 1

    def layer_attempts(self, call_index: int) -> tuple[int, ...]:
        """Attempts each layer made for the call, outermost first (the innermost's are the wire attempts)."""
        return tuple(self._call(call_index).made)

    def outstanding(self) -> int:
        """Calls started but neither delivered nor failed."""
        return self._outstanding

    # -- inside ------------------------------------------------------------------------------

    def _decide(self, call_index: int, call: _StackCall, layer: int, outcome: str, now: float,
                retry_after_s: float | None, no_retry: bool = False) -> ClientAction:
        """Layer `layer` takes the outcome; a layer that gives up hands it to the one outside it."""
        while True:
            action = self._clients[layer].on_outcome(call.keys[layer], call.attempt_no[layer], outcome, now,
                                                     retry_after_s, no_retry)
            if isinstance(action, CallFailed):
                if layer == 0:
                    return self._end(call, CallFailed(call_index, action.at_s, action.reason))
                layer -= 1  # the inner layer's last error reaches the layer outside it
                continue
            assert isinstance(action, SendAttempt)  # a failed outcome is never delivered
            outer = self._expired_before(call, layer, action.send_s)
            if outer is not None:  # an outer layer's timeout comes before this layer's next attempt
                layer, outcome, now, retry_after_s = outer, TIMED_OUT, self._layer_deadline(call, outer), None
                no_retry = False
                continue
            call.attempt_no[layer] = action.attempt_no
            call.begun_s[layer] = action.send_s
            call.first_token[layer] = False
            call.made[layer] += 1
            self._start_inner(call, layer + 1, action.send_s)
            call.wire_no += 1
            call.wire_send_s = action.send_s
            return SendAttempt(call_index, call.wire_no, action.send_s, self._deadline(call))

    def _start_inner(self, call: _StackCall, first: int, at_s: float) -> None:
        """A fresh call in each layer from `first` inwards, begun at `at_s` (their first attempts)."""
        for k in range(first, len(self._layers)):
            key = self._next_key[k]
            self._next_key[k] += 1
            self._clients[k].start_call(key, at_s)
            call.keys[k] = key
            call.attempt_no[k] = 0
            call.begun_s[k] = at_s
            call.first_token[k] = False
            call.made[k] += 1

    def _layer_deadline(self, call: _StackCall, k: int) -> float:
        layer = self._layers[k]
        if layer.timeout_kind == "first_byte" and call.first_token[k]:
            return math.inf
        return call.begun_s[k] + layer.timeout_s

    def _deadline(self, call: _StackCall) -> float:
        return min(self._layer_deadline(call, k) for k in range(len(self._layers)))

    def _timed_out_layer(self, call: _StackCall, now: float) -> int:
        """The layer whose timeout ended the wire attempt: the outermost one past its deadline (the earliest
        deadline's, outermost first, when the driver reports a little early)."""
        deadlines = [self._layer_deadline(call, k) for k in range(len(self._layers))]
        for k, deadline in enumerate(deadlines):
            if deadline <= now:
                return k
        return deadlines.index(min(deadlines))

    def _expired_before(self, call: _StackCall, layer: int, send_s: float) -> int | None:
        """The outermost layer outside `layer` whose deadline comes at or before `send_s`, if any."""
        for k in range(layer):
            if self._layer_deadline(call, k) <= send_s:
                return k
        return None

    def _call(self, call_index: int) -> _StackCall:
        call = self._calls.get(call_index)
        if call is None:
            raise ValueError(f"call {call_index} was never started")
        return call

    def _outstanding_call(self, call_index: int, attempt_no: int) -> _StackCall:
        call = self._call(call_index)
        if call.done:
            raise ValueError(f"call {call_index} already ended (attempt {attempt_no} reported late or twice)")
        if attempt_no != call.wire_no:
            raise ValueError(f"call {call_index}: attempt {attempt_no} is not the outstanding attempt {call.wire_no}")
        return call

    def _end(self, call: _StackCall, action: CallDelivered | CallFailed) -> ClientAction:
        call.done = True
        self._outstanding -= 1
        return action


def stack_meta(client: StackedClient, call_indices: Iterable[int]) -> dict[str, list[str] | list[int]]:
    """What each layer did over the given (started) calls, outermost first, for a run log's meta: its name,
    its timeout kind, the attempts it made in all and the most it made for one call."""
    per_call = [client.layer_attempts(i) for i in call_indices]
    n = len(client.layers)
    return {"layers": [layer.name for layer in client.layers],
            "timeout_kinds": [layer.timeout_kind for layer in client.layers],
            "attempts": [sum(made[k] for made in per_call) for k in range(n)],
            "max_attempts": [max((made[k] for made in per_call), default=0) for k in range(n)]}
