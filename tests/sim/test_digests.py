"""Pinned results: the simulator and the run summary must not move when the code is only made faster.

The digests were computed on the current engine model, the sequential-phase step costs (the values
are hard-coded, not recomputed): the run log's digest (RunLog.digest(): every call, attempt, execution, sample and
counter), a digest of the engine trace (the events Section 5's analysis reads), one calibration, and
the whole `retrybench run --json` summary of one run. A change that alters any of them changes what
the simulator computes, which a speed-up must not do; change a pinned value only together with a
deliberate change of the model, and say so in the commit.

Regenerate (after a deliberate change only): python3 tests/sim/test_digests.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, replace
from typing import Any

import pytest

from retrybench import runner
from retrybench.config import WorkloadSpec, available_conditions, load_condition
from retrybench.engine.profiles import profile_for
from retrybench.runner import run_one, simulate_spec
from retrybench.sim.calibrate import calibrate
from retrybench.sim.run import simulate
from retrybench.spec import RunSpec, engine_config_for
from retrybench.workload import generate_trace

# C-hat of each model as calibrated by the code these digests were taken on; fixed here so that the
# runs do not depend on (or wait for) the calibration.
CHAT = {"qwen2.5-7b-instruct": 2.7116906833687042, "qwen3-14b": 1.0900243919376884,
        "llama-3.1-8b-instruct": 1.8303346467738533}
QWEN = "qwen2.5-7b-instruct"

# Full paper runs (base, 2.7x pulse, hold): (spec, run-log digest, engine-trace digest).
FULL_RUNS: list[tuple[RunSpec, str, str]] = [
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1),
     "44f00f732fd92b31d91add11f6eff468792d5244b1ecbb5614adf23ea6555b45",
     "4f92251f568ba436751452f733c4766e48329d2979b5220a6bfc307ccde5b144"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-off", seed=1),
     "b4c991140aacf40a78ba93ec9b83dd65a71eade314ac80e7bf6890fe83e949b8",
     "f3e2597fe528d8b2ed4f5571999af13030ce9cdb02bdb23bff1a1667347c4b6a"),
    (RunSpec(model=QWEN, condition="coalescing", seed=2),
     "43a51342bc5610be0330fef037aaad1b7b4e7f5e87f0bad7d3ac88e6d0f362f2",
     "90d9f3f933cfe02ab066b7acfec4219558ee55f422e6d8a5cddfabf50d8877d2"),
    (RunSpec(model=QWEN, condition="deferred-cancellation", seed=1),
     "e59fd72e5d1e540eb4ada52538f52f729cc2dd184ab9cc58ed2706c67092513a",
     "635bae9f48fd1167497b684713acf8035c6d830dfabd5cc4970c75d2b73b2086"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=3, max_batched_tokens=2048),
     "3a4900f8dda84bee8bb9795b5dbc781567390162fa3743e68ad605286242e469",
     "aa2578ff01365d127d6b09c15ea6005c0347612a8438d9820159ef36a53a154d"),
    (RunSpec(model="llama-3.1-8b-instruct", condition="retries-on-cancel-off", seed=1),
     "559e4f86fd1b0271fe9e350a93ff73118a70b3914eccb3618935b39a86016701",
     "427447342b75b1ad98a87a0689d10ce28e87b589d4bf7a291e88a6eb00a585db"),
    (RunSpec(model="qwen3-14b", condition="engine-cap-338-cancel-on", seed=2),
     "a121a0c57c3d399b0976750765cd9f55461bdde4bd093c130c084e1e31c2cb8f",
     "4cfd1ddc719f2738b24ca79d88216be104d9d9b5ad8728b3fa1fa92aff16201e"),
]

# Every condition of Table 1 on a short trace with a 15-s attempt deadline, so that the 60 s of
# pulse and hold already time attempts out, retry, cancel, coalesce, queue and refuse.
SHORT = WorkloadSpec(chat_calls_per_s=CHAT[QWEN], base_s=30, pulse_s=30, hold_s=60)
SHORT_SEED = 5
SHORT_DEADLINE_S = 15.0
SHORT_RUNS: dict[str, tuple[str, str]] = {  # condition -> (run-log digest, trace digest)
    "budget-first": ("247577aa780ad5e748f2175e198a34e25580d7c60663684fd0500662f1daa003",
                     "40d78dcece2a80da1dbf1c108635a04ed429d1aca0aa3a7b899ca4ea89c88e05"),
    "coalescing": ("c489619446778ec22fbef4d00d1d342b2f2fcaf7ad8ef60200a7365296dd1c55",
                   "7d44453b9d9c34c79ad33dfad796309c425531a0828d678e961152ea38dfe65b"),
    "coalescing-retain": ("22695c552c7691f65c5ac6c110f274e17a0dd42ae22eca3b05a1e41bc5a49cef",
                          "d96ee0cab7fb5b94ea348273ad314651a75371e63dfdbc5c17f13a95828334fc"),
    "coalescing-cancel-on": ("da0b9848010dd2a4590c17ff45f045c9abdecd99353ba97fc1d03234804ec4b1",
                             "8605b15c2474be86e6b43930edda8c59c1abbb181055887cf30264283c18208b"),
    "deadline-check": ("f45451d5555f20a1d9b53d6286e02533f052239c2de80d08badec18688936634",
                       "88fd684979e6859cb2a5803c8be986150ac6c58e3bfa36aecfbf5e7abed2d1ea"),
    "deferred-cancellation": ("fd333ccf5e74c1d51a82324cbda5feef04df472b0f019f84bdf4a22c52d6d975",
                              "f900be3ea3adf5669271f4940d1ff77456018b8c9da112aa9bdec534182549cf"),
    "engine-cap-100": ("bbca9c8dd1d51a7fa58c5246cf2e7a503fd5d0445997ae466480c414df8113f0",
                       "e00a5f0d8a6f56be5f22d7f73f2facbb6334cda8df95170e922fa7847e68d862"),
    "engine-cap-338": ("fc6e7b727dc0b468a80cddf5a083b0cb36bea4578ad3a4307f7363efa4819c3a",
                       "9f417fcd5313fe76f18f112ef678415ba0581a56225afe3770ad57cb4aa7430f"),
    "engine-cap-338-cancel-on": ("9d152285aa38002be207db393ca93f4385b488cc6172aec99dd3db49bd9a09a9",
                                 "8605b15c2474be86e6b43930edda8c59c1abbb181055887cf30264283c18208b"),
    "lifo": ("63d40f907e25c295cc1e20b4570f1fd745aeb1dcb88789af2181640d08e8802f",
             "730ebdb93a1a76c23e804da2b88e48568f6d6220b52806ed954bf50a64bd1e44"),
    "lookup-first": ("fe388bf3ee072a049f670fc8faf972599031e858880c09b5668b2277e964f7ce",
                     "1f88dab4e74b57ce33aacd2adb1a1641cf8f1f1720070ed5d9950a814fd8c840"),
    "lookup-first-retain": ("478517f4e30018e24ef1d6ffce744a3d1e464d7983d4b709b818aeda93e00d4b",
                            "d96ee0cab7fb5b94ea348273ad314651a75371e63dfdbc5c17f13a95828334fc"),
    "no-control": ("1582b9dafda1e92b3d03f2fbea87ae1103a0296200b65f89d23d3f9c1c89f996",
                   "9e8de7a6e7564752ce5684c99e47ee1bebef6cae5ea7ea41353f80e2a586245c"),
    "proxy-cap": ("f7be9e92f744eb0b393893fe284946a88faa28158304d04c39ecc6594e23d60a",
                  "8ee4ae47cd672798b492c9c782980293ea779ceebcfa56cc2dea9367b13e01c7"),
    "retries-off-cancel-off": ("2a918f6755464a9b2f564eac0218e88feb3af3df2e7e2c761b393f11d64565fe",
                               "fd5c635591a87e48e65a03d40911f511f858141650461c3e8eadfc0821622613"),
    "retries-off-cancel-on": ("e692e5dc8a0496de8f896812aeb339e5f19677f8d668c80e26fde2a47a4b18b8",
                              "8fddf4071c78e0d9d2f818c29b4e92810f3545869b39a5561dedfd91a274e85b"),
    "retries-on-cancel-off": ("98794d14a739ca6f9e56f16d6509d1750a81eb30451c24644a8602371fdb56a2",
                              "9e8de7a6e7564752ce5684c99e47ee1bebef6cae5ea7ea41353f80e2a586245c"),
    "retries-on-cancel-on": ("aaf19d9775f4ef676a3c308c40d5d18e649acea2c5d5363197bcc271fd0a5271",
                             "8605b15c2474be86e6b43930edda8c59c1abbb181055887cf30264283c18208b"),
    "retry-budget": ("603d9625567cb606a0d7f7b250052802724b0046136a8eb2ee9e90146a7d154d",
                     "e0460a4894ed557017fd967fb11fcf4a872e002f01450b2aafe37810ab52d55e"),
    "retry-budget-cancel-on": ("5f81a7090550fc756de7e137b5ac55f80cd4f53e3883295335776c3bd2cbd0d7",
                               "ee016227ac031421c64a1888d5c32f01fcdd27328f0c92f77f95af8778c49876"),
}

# calibrate() of Qwen2.5-7B-Instruct on trace seed 0 (one of the five C-hat averages).
CALIBRATION_SEED0 = "13b46e19cafe0e0a0847c14db6a681405e95d067fc9b1b8fdf637a06cbb4757a"

# `retrybench run --model qwen2.5-7b-instruct --condition X --seed 77 --json` (C-hat as above): the
# sha256 of the summary's canonical JSON, minus wall_s and code_version.
RUN_JSON: dict[str, str] = {
    "retries-on-cancel-on": "63628b5dfe81e9175f8bac5df778711865dfc51892979665a0175f190cbf8c7f",
    "retries-on-cancel-off": "9df60d458ab2262d01fc7be5ddd935fd3367ebd42051bea73f5bc116f0edd3f8",
}


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def full_run(spec: RunSpec) -> tuple[str, str]:
    events: list[dict[str, Any]] = []
    log = simulate_spec(spec, CHAT[spec.model], trace=events)
    return log.digest(), _sha(events)


def short_run(condition_name: str) -> tuple[str, str]:
    """One condition on the short trace, with the engine arguments a paper run of it would get."""
    condition = load_condition(condition_name)
    spec = RunSpec(model=QWEN, condition=condition_name, seed=SHORT_SEED)
    engine, _cap = engine_config_for(spec, condition, CHAT[QWEN])
    events: list[dict[str, Any]] = []
    log = simulate(profile_for(QWEN, "h100", engine), generate_trace(SHORT, SHORT_SEED).calls,
                   client=replace(condition.client, attempt_timeout_s=SHORT_DEADLINE_S), proxy=condition.proxy,
                   seed=SHORT_SEED, meta={"short": condition_name}, prefix_tokens=SHORT.shared_prefix_tokens,
                   trace=events)
    return log.digest(), _sha(events)


def calibration_digest() -> str:
    return _sha(asdict(calibrate(profile_for(QWEN), seed=0)))


def run_json_digest(condition: str) -> str:
    """The summary `run --json` prints (run_one on a traced spec), without its timing and code hash."""
    spec = RunSpec(model=QWEN, condition=condition, seed=77, trace=True)
    with pytest.MonkeyPatch.context() as patch:  # C-hat as pinned above, not calibrated
        patch.setattr(runner, "calibration_for", lambda *args, **kwargs: {"chat": CHAT[QWEN]})
        result = run_one(spec, use_cache=False)
    return _sha(json.loads(json.dumps({k: v for k, v in result.items() if k not in ("wall_s", "code_version")})))


@pytest.mark.parametrize(("spec", "log_digest", "trace_digest"), FULL_RUNS,
                         ids=[f"{s.model}-{s.condition}-seed{s.seed}-{s.max_batched_tokens}" for s, _, _ in FULL_RUNS])
def test_full_run_digests(spec: RunSpec, log_digest: str, trace_digest: str) -> None:
    assert full_run(spec) == (log_digest, trace_digest)


def test_every_condition_is_pinned() -> None:
    assert sorted(SHORT_RUNS) == available_conditions()


@pytest.mark.parametrize("condition", sorted(SHORT_RUNS))
def test_short_run_digests(condition: str) -> None:
    assert short_run(condition) == SHORT_RUNS[condition]


def test_calibration_digest() -> None:
    assert calibration_digest() == CALIBRATION_SEED0


@pytest.mark.parametrize("condition", sorted(RUN_JSON))
def test_run_json_summary(condition: str) -> None:
    assert run_json_digest(condition) == RUN_JSON[condition]


if __name__ == "__main__":
    for spec, _, _ in FULL_RUNS:
        print(spec, *full_run(spec))
    print({name: short_run(name) for name in available_conditions()})
    print(repr(calibration_digest()))
    print({name: run_json_digest(name) for name in ("retries-on-cancel-on", "retries-on-cancel-off")})
    sys.exit(0)
