"""The proxy's decision log schema (JSONL): what the live proxy writes (proxy/eventlog.py), the load
generator's run log joins (loadgen/assemble.py) and the conformance check replays (analysis/conformance.py).

The first line is a `DecisionLogHeader`. Every further line is one `DecisionEvent`, with its kind `ev`
and its time `t` (policy seconds since the proxy started):
- attempt: {"call", "attempt", "call_id", "client_attempt", "key", "prompt_tokens", "max_tokens",
  "engine_waiting", "decision"}, and with the decision "create" {"execution", "dispatch"}, "attach" or
  "served-retained" {"execution"}, "refuse" {"status"}; "deadline_s" when the attempt carried a deadline
- left (a client's subscriber left): {"call", "attempt", "actions"}
- engine: {"execution", "kind" (first_token, completed, refused, ...), "actions"}, and "bytes" (a
  completed response's size) when the engine reported one
- timer: {"execution", "actions"}
- deadline (an execution's deadline passed; deadline propagation): {"execution", "actions"}
- expire (retained responses released): {"actions"}
- route (several upstreams): {"execution", "upstream"}
- end: {"execution", "fate"}
- drain (SIGTERM): "phase" start {"executions", "subscribers", "timeout_s"}, then end {"reason" (idle,
  timeout, signal), "waited_s" (wall), "refused" (new calls answered 503), "cut" (executions still
  awaited, then ended by the shutdown)}
`actions` are the core's actions that reach the engine, the queue or the retained responses, as
[kind, execution id] pairs (kind: cancel, dispatch, drop, retain, release). Logs of several proxy
instances merged into one (loadgen/assemble.py) add each event's "instance".
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

__all__ = ["SCHEMA", "DecisionEvent", "DecisionLogHeader", "LoggedDecision"]

SCHEMA = "retrybench-proxy-log/1"

DecisionEvent = dict[str, Any]  # one event line, of any kind listed above


class LoggedDecision(TypedDict):
    """The core's decision on an attempt, as its attempt event records it."""

    decision: Literal["create", "attach", "served-retained", "refuse"]
    execution: NotRequired[int]  # the execution created, attached to or served
    dispatch: NotRequired[bool]  # create: sent to the engine at once (else queued in the proxy)
    status: NotRequired[int]  # refuse: the HTTP status


class DecisionLogHeader(TypedDict):
    """What the proxy ran with: its clock's start and scale, its upstream(s) and its policy."""

    schema: NotRequired[str]  # SCHEMA, in the file
    t0_unix: float  # when its clock started: policy second 0
    time_scale: float  # wall seconds per policy second
    upstream: str
    policy: dict[str, Any]  # the ProxyPolicy's fields (dataclasses.asdict)
    upstreams: NotRequired[list[str]]  # with several upstreams, and how it routes among them
    route: NotRequired[str]
    instances: NotRequired[int]  # logs of several instances merged into one
