"""Several engine replicas and proxy instances in one run (sim.deployment): one replica behind one
instance replays simulate() exactly; with coalescing, retries spread over instances with their own
state find nothing to attach to, where a shared state or a key-affine front keeps them together."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from retrybench.analysis import summarize
from retrybench.calibration.stages import deployment_stage_plan
from retrybench.conditions.config import ClientPolicy, WorkloadSpec, load_condition
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.records.runlog import RunLog
from retrybench.sim.deployment import Deployment, simulate_deployment
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, generate_trace

# A short trace with a 15-s attempt deadline (as the digest tests' short runs), at twice one engine's
# rate for two replicas.
CHAT = 2.7
SPEC = WorkloadSpec(chat_calls_per_s=2 * CHAT, base_s=20, pulse_s=30, hold_s=40, pulse_rate_x=2.7)
DEADLINE_S = 15.0
META: dict[str, Any] = {"chat": 2 * CHAT, "pulse_start_s": 20.0, "pulse_end_s": 50.0, "hold_end_s": 90.0,
                        "attempt_timeout_s": DEADLINE_S, "delivery_horizon_s": 840.0}


@cache
def calls() -> tuple[Call, ...]:
    return generate_trace(SPEC, 4).calls


@cache
def qwen() -> EngineProfile:
    return profile_for("qwen2.5-7b-instruct")


def client_of(condition: str) -> ClientPolicy:
    return replace(load_condition(condition).client, attempt_timeout_s=DEADLINE_S)


@cache
def deployed(condition: str, replicas: int, deployment: Deployment) -> RunLog:
    return simulate_deployment([qwen()] * replicas, calls(), client=client_of(condition),
                               proxy=load_condition(condition).proxy, seed=4, meta=dict(META),
                               deployment=deployment, prefix_tokens=SPEC.shared_prefix_tokens)


@pytest.mark.parametrize("condition", ["coalescing", "deferred-cancellation", "retry-budget", "lifo"])
def test_one_replica_behind_one_instance_is_the_single_engine_run(condition: str) -> None:
    single = simulate(qwen(), calls(), client=client_of(condition), proxy=load_condition(condition).proxy, seed=4,
                      meta=dict(META), prefix_tokens=SPEC.shared_prefix_tokens)
    assert deployed(condition, 1, Deployment()).digest() == single.digest()


PER_INSTANCE = Deployment(proxies=2)
SHARED = Deployment(proxies=2, shared_state=True)
KEY_AFFINE = Deployment(proxies=2, front="key-affine")


def test_retries_on_another_instance_find_nothing_to_attach_to() -> None:
    runs = {name: summarize(deployed("coalescing", 2, d))
            for name, d in (("per-instance", PER_INSTANCE), ("shared", SHARED), ("key-affine", KEY_AFFINE))}
    assert runs["shared"]["retries"] > 50, "the pulse must time attempts out"
    attached = {name: r["retries_attached_pct"] or 0.0 for name, r in runs.items()}
    created = {name: r["executions_created"] for name, r in runs.items()}
    # A random front over two instances sends about half the retries to the instance without the call's
    # execution: they create one there instead of attaching.
    assert attached["shared"] > 90 and attached["key-affine"] > 90, attached
    assert attached["per-instance"] < attached["shared"] - 15, attached
    assert created["per-instance"] > 1.3 * created["shared"], created
    assert created["per-instance"] > 1.3 * created["key-affine"], created


def test_a_key_affine_front_coalesces_as_a_shared_state_does() -> None:
    """Every attempt of a call reaches one instance, so that instance's table holds the call's execution."""
    shared, affine = (summarize(deployed("coalescing", 2, d)) for d in (SHARED, KEY_AFFINE))
    assert affine["retries_attached"] == pytest.approx(shared["retries_attached"], rel=0.1)


def test_every_replica_works_and_execution_ids_are_unique() -> None:
    for router in ("round-robin", "least-outstanding", "key-affine", "prefix-affine"):
        log = deployed("coalescing", 2, replace(PER_INSTANCE, router=router))
        ids = [e.execution_id for e in log.executions]
        assert ids == list(range(len(ids)))
        routed = log.meta["routed"]
        assert len(routed) == 2 and min(routed) > 0.3 * sum(routed), (router, routed)
        assert all(c.delivered_s is not None or c.failed_s is not None for c in log.calls)


def test_a_deployment_run_repeats_exactly() -> None:
    again = simulate_deployment([qwen()] * 2, calls(), client=client_of("coalescing"),
                                proxy=load_condition("coalescing").proxy, seed=4, meta=dict(META),
                                deployment=PER_INSTANCE, prefix_tokens=SPEC.shared_prefix_tokens)
    assert again.digest() == deployed("coalescing", 2, PER_INSTANCE).digest()


def test_the_trace_is_kept_for_one_replica_only() -> None:
    with pytest.raises(ValueError, match="one replica only"):
        simulate_deployment([qwen()] * 2, calls()[:5], client=client_of("coalescing"),
                            proxy=load_condition("coalescing").proxy, seed=4, meta={}, deployment=Deployment(),
                            trace=[])


def test_deployment_calibration_stages_scale_with_the_replicas() -> None:
    one, four = deployment_stage_plan(1), deployment_stage_plan(4)
    assert len(one) == len(four)
    assert [r * 4 for r, _, _ in one] == pytest.approx([r for r, _, _ in four])
    assert [(s, e) for _, s, e in one] == [(s, e) for _, s, e in four]


def test_bad_deployments_are_refused() -> None:
    with pytest.raises(ValueError, match="router must be one of"):
        Deployment(router="random")
    with pytest.raises(ValueError, match="front must be one of"):
        Deployment(front="least-outstanding")
    with pytest.raises(ValueError, match="proxies must be >= 1"):
        Deployment(proxies=0)
