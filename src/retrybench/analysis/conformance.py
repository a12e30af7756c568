"""Replay a live proxy's decision log through a fresh `ProxyCore` and compare the decisions.

The live proxy logs each input it fed its core (attempt, subscriber left, engine event, timer)
and what the core decided. Feeding the same inputs, at the same times, to the simulator's core
must give the same decisions: attach, refuse, create (dispatched or queued), cancel, dispatch
and drop, and with result retention what is kept, freed and served from it. A difference means
the live driver does not carry out the policy the simulator models. The log's schema is
records/decisionlog.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retrybench.conditions.config import ProxyPolicy
from retrybench.control.proxy import (
    Action,
    Attach,
    AttemptIn,
    Cancel,
    Create,
    Decision,
    Dispatch,
    Drop,
    ProxyCore,
    Release,
    Retain,
    Serve,
)
from retrybench.records.decisionlog import DecisionEvent, LoggedDecision

__all__ = ["Mismatch", "actions_of", "decision_of", "replay"]


@dataclass(frozen=True, slots=True)
class Mismatch:
    index: int  # the event's position in the log
    event: DecisionEvent
    expected: Any  # what the log says the live proxy decided
    replayed: Any  # what the replayed core decided


def decision_of(decision: Decision) -> LoggedDecision:
    """A decision as the log records it."""
    if isinstance(decision, Create):
        return {"decision": "create", "execution": decision.execution_id, "dispatch": decision.dispatch}
    if isinstance(decision, Attach):
        return {"decision": "attach", "execution": decision.execution_id}
    if isinstance(decision, Serve):
        return {"decision": "served-retained", "execution": decision.execution_id}
    return {"decision": "refuse", "status": decision.status}


def actions_of(actions: list[Action]) -> list[list[Any]]:
    """The actions that reach the engine, the queue or the retained responses, as [kind, execution
    id] pairs."""
    out: list[list[Any]] = []
    for action in actions:
        if isinstance(action, Cancel):
            out.append(["cancel", action.execution_id])
        elif isinstance(action, Dispatch):
            out.append(["dispatch", action.execution_id])
        elif isinstance(action, Drop):
            out.append(["drop", action.execution_id])
        elif isinstance(action, Retain):
            out.append(["retain", action.execution_id])
        elif isinstance(action, Release):
            out.append(["release", action.execution_id])
    return out


def replay(policy: ProxyPolicy, events: list[DecisionEvent]) -> tuple[dict[str, int], list[Mismatch]]:
    """Counts of decisions checked by kind, and every mismatch."""
    core = ProxyCore(policy)
    checked: dict[str, int] = {}
    mismatches: list[Mismatch] = []

    def check(index: int, event: DecisionEvent, expected: Any, replayed: Any, kind: str) -> None:
        checked[kind] = checked.get(kind, 0) + 1
        if expected != replayed:
            mismatches.append(Mismatch(index, event, expected, replayed))

    for index, event in enumerate(events):
        kind, now = event["ev"], event["t"]
        if kind == "attempt":
            attempt = AttemptIn(event["call"], event["attempt"], event["key"], event["prompt_tokens"],
                                event["max_tokens"], event.get("deadline_s"))
            decision = decision_of(core.on_attempt(attempt, now, engine_waiting=event["engine_waiting"]))
            expected = {k: event[k] for k in decision if k in event}
            check(index, event, expected, decision, decision["decision"])
            continue
        if kind == "left":
            actions = core.on_subscriber_left((event["call"], event["attempt"]), now)
        elif kind == "engine":
            actions = core.on_engine_event(event["execution"], event["kind"], now, event.get("bytes"))
        elif kind == "timer":
            actions = core.on_timer(event["execution"], now)
        elif kind == "expire":
            actions = core.expire(now)
        elif kind == "deadline":
            actions = core.on_deadline(event["execution"], now)
        else:
            continue
        replayed = actions_of(actions)
        for name, _ in replayed:
            checked[name] = checked.get(name, 0) + 1
        if event.get("actions", []) != replayed:
            mismatches.append(Mismatch(index, event, event.get("actions", []), replayed))
    return checked, mismatches
