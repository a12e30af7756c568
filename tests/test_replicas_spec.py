"""The deployment fields of RunSpec (replicas, router, proxy tier): defaults keep the paper's record and
cache key, values are checked, results read back to the spec; and the `replicas` block's plan."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict

import pytest

from retrybench.conditions.config import ConfigError
from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL, block_specs, blocks_plan
from retrybench.plan.spec import DEPLOYMENT_DEFAULTS, RunSpec
from retrybench.records.cache import code_version
from retrybench.report.runs import spec_of
from retrybench.sim.replica_runs import deployment_build, deployment_of, replica_profiles

PAPER_FIELDS = ("model", "condition", "seed", "gpu", "pulse_x", "max_batched_tokens", "mixed_prompts", "engine_cap",
                "trace", "token_scale")


def test_a_paper_spec_keeps_its_record_and_cache_key() -> None:
    spec = RunSpec(model=PRIMARY_MODEL, condition="coalescing", seed=1)
    record = spec.as_dict()
    assert tuple(record) == PAPER_FIELDS
    before = json.dumps({"spec": {k: asdict(spec)[k] for k in PAPER_FIELDS}, "code": code_version()}, sort_keys=True)
    assert spec.key() == hashlib.sha256(before.encode()).hexdigest()[:24]
    assert not spec.deployed


def test_a_deployment_spec_records_what_differs_and_reads_back() -> None:
    spec = RunSpec(model=PRIMARY_MODEL, condition="coalescing", seed=1, replicas=4, router="key-affine", proxies=2,
                   proxy_state="shared")
    record = spec.as_dict()
    assert {k: record[k] for k in DEPLOYMENT_DEFAULTS if k in record} == {
        "replicas": 4, "router": "key-affine", "proxies": 2, "proxy_state": "shared"}
    assert spec.deployed and spec.key() != RunSpec(model=PRIMARY_MODEL, condition="coalescing", seed=1).key()
    assert spec_of(json.loads(json.dumps({**record, "spec": record}))) == spec


def test_replica_gpus_name_one_gpu_per_replica() -> None:
    spec = RunSpec(model=PRIMARY_MODEL, condition="no-control", seed=1, replicas=2, replica_gpus="h100, h200")
    assert spec.gpus() == ("h100", "h200")
    assert [p.gpu_key for p in replica_profiles(spec)] == ["h100", "h200"]
    assert deployment_build(spec) == (PRIMARY_MODEL, ("h100", "h200"), "round-robin", False, 1.0)
    assert RunSpec(model=PRIMARY_MODEL, condition="no-control", seed=1, replicas=3).gpus() == ("h100",) * 3


@pytest.mark.parametrize(("fields", "message"), [
    ({"replicas": 0}, "replicas must be 1 to 64"),
    ({"replicas": 2, "router": "fastest"}, "router must be one of round-robin, least-outstanding"),
    ({"proxies": 0}, "proxies must be >= 1"),
    ({"proxies": 2, "proxy_state": "global"}, "proxy_state must be one of per-instance, shared"),
    ({"proxies": 2, "front": "round-robin"}, "front must be one of random, key-affine"),
    ({"replicas": 2, "replica_gpus": "h100,mi300x"}, "unknown GPU"),
    ({"replicas": 3, "replica_gpus": "h100,h200"}, "names 2 GPU"),
    ({"router": "key-affine"}, "needs replicas > 1"),
    ({"proxy_state": "shared"}, "need proxies > 1"),
    ({"front": "key-affine"}, "need proxies > 1"),
    ({"proxies": 2, "proxy_state": "shared", "front": "key-affine"}, "does not matter with shared"),
    ({"replicas": 2, "trace": True}, "one replica only"),
])
def test_bad_deployment_fields_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunSpec(model=PRIMARY_MODEL, condition="no-control", seed=1, **fields)  # type: ignore[arg-type]


def test_a_cap_derived_from_one_engine_s_c_hat_is_refused_for_several() -> None:
    spec = RunSpec(model=PRIMARY_MODEL, condition="engine-cap-338", seed=1, replicas=2)
    with pytest.raises(ConfigError, match="defined for one engine"):
        replica_profiles(spec, "auto")
    assert {p.engine.max_num_queued_reqs for p in replica_profiles(spec, 100)} == {100}


def test_the_deployment_a_spec_builds() -> None:
    spec = RunSpec(model=PRIMARY_MODEL, condition="no-control", seed=1, replicas=2, router="prefix-affine",
                   proxies=3, front="key-affine")
    deployment = deployment_of(spec)
    assert (deployment.router, deployment.proxies, deployment.cores, deployment.front) == ("prefix-affine", 3, 3,
                                                                                           "key-affine")
    shared = deployment_of(RunSpec(model=PRIMARY_MODEL, condition="no-control", seed=1, proxies=3,
                                   proxy_state="shared"))
    assert shared.cores == 1


def test_the_replicas_block_plan() -> None:
    block = BLOCKS["replicas"]
    assert not block.paper
    specs = block_specs("replicas", PRIMARY_MODEL)
    assert len(specs) == len(set(specs)) == 216  # (1 + 4 + 4 router cells) x 3 proxy tiers x 4 conditions x 2 runs
    assert Counter(s.replicas for s in specs) == {1: 24, 2: 96, 4: 96}
    assert {s.router for s in specs if s.replicas == 1} == {"round-robin"}
    assert {(s.proxy_state, s.front) for s in specs} == {("per-instance", "random"), ("shared", "random"),
                                                          ("per-instance", "key-affine")}
    assert {s.proxies for s in specs} == {2}
    assert {s.condition for s in specs} == {"no-control", "coalescing", "deferred-cancellation", "retry-budget"}
    assert {s.pulse_x for s in specs} == {2.7} and {s.seed for s in specs} == {1, 2}
    assert len(block_specs("replicas", PRIMARY_MODEL, runs=1)) == 108
    assert [name for name, _ in blocks_plan(["replicas"], [PRIMARY_MODEL], "h100", None)] == ["replicas"] * 216
