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
CHAT = {"qwen2.5-7b-instruct": 2.7116780165612955, "qwen3-14b": 1.0900348364981833,
        "llama-3.1-8b-instruct": 1.830343580206447}
QWEN = "qwen2.5-7b-instruct"

# Full paper runs (base, 2.7x pulse, hold): (spec, run-log digest, engine-trace digest).
FULL_RUNS: list[tuple[RunSpec, str, str]] = [
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1),
     "be6d9a3ce21b36d0c548ed0b47b904bb3f758774dbf8aacb8a36af088bca8d66",
     "73d1f0f7d623919c579b47107249174db09928637312bd433240f2e5ce92269c"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-off", seed=1),
     "1a192faa25b54dfb1a9b5f430a98fbbf338a36d9875565cad574de9f712da78b",
     "431bfef63818863631157fa71d1bc6c3d92925ce0f589a2c77dba6c9c5614fe4"),
    (RunSpec(model=QWEN, condition="coalescing", seed=2),
     "25c238f680c46cf32e3d373378f93d8dd348a21ee7656b97e54aa070b8f3185f",
     "d31c0566a913f1526dd73fe432256a226d0d06d12119d00c59badaca4b16d41b"),
    (RunSpec(model=QWEN, condition="deferred-cancellation", seed=1),
     "93704a3e871a9def0a7c717bc1f807fde40a9ef184399da47c97d04fe8e376d8",
     "16e31b04556c946c835f8946c6ad9e946507627f6fa3586835643e49b1652a6c"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=3, max_batched_tokens=2048),
     "538857e3fbd9e11f281ff36c005ef89f43a6a460bf18209fa82a99e1372c64f2",
     "7d788136b7c18c6ea450ce1f8545062f2f73837dceb3567223ea1e41f4dc07f2"),
    (RunSpec(model="llama-3.1-8b-instruct", condition="retries-on-cancel-off", seed=1),
     "8927624f6279f40322719d8fa39312acce7dc279a65a5b7d66bdbd12eb1c6989",
     "7b29ab0274aec3c3613a4b1734e912a5723cfc9a274e3fc9b55939fff9912fc8"),
    (RunSpec(model="qwen3-14b", condition="engine-cap-338-cancel-on", seed=2),
     "de192a080890445a9adab2b9b772468ef9dad34f72d2a35d1abfb2bc6d577fac",
     "d77d550e00c2289a4587520710fdb8b846388723ab4c7cec801253131f481341"),
]

# Every condition of Table 1 on a short trace with a 15-s attempt deadline, so that the 60 s of
# pulse and hold already time attempts out, retry, cancel, coalesce, queue and refuse.
SHORT = WorkloadSpec(chat_calls_per_s=CHAT[QWEN], base_s=30, pulse_s=30, hold_s=60)
SHORT_SEED = 5
SHORT_DEADLINE_S = 15.0
SHORT_RUNS: dict[str, tuple[str, str]] = {  # condition -> (run-log digest, trace digest)
    "budget-first": ("0d835672cc8f59573c2684f0a83193c702237fb6bd4ea536667817fd795fcee4",
                     "2669fa7d8028b627b014ff1795027b71c5d42742a2401ef2d8800e5c5ac96217"),
    "coalescing": ("4cf75bc715cac3c95b0de78410245310f2daa08906ec64cfe608a1aaea7ffda9",
                   "d4b3221b9a610432035301cde29fbb21b71283b767b2535dd7a635d38c923aab"),
    "coalescing-retain": ("4b07ed009dbf6a679fda0926dd02b999b17de3e227cba6ef4aaeee85f3097e25",
                          "39d36240eb98abf57ba888530283e5a192552388cfee34bf56d050bde4de94c1"),
    "coalescing-cancel-on": ("c4b61903d26c9180fcfd7e39d4914f4244c8dc146f55a0f3757d80fd054f82f5",
                             "6541ce8fbb00720eb1edf8f6fd7530b522270d684cab2038fed15721010be7e8"),
    "deadline-check": ("c7902cc11b52229c4415a1c7281813101a0da4bca41571d522fe6fc4c8a2c6eb",
                       "8c959563b41827df58e7df2005fc97a1aaf21ae3a4ba69cb1a9484aff6a23fda"),
    "deferred-cancellation": ("4bfd997fb939b58ddad3ac84a553be5ab9633402516c02eea63cd8f04f1fe5ee",
                              "ddad488af1b4aad7675bc004f0d8ab062622dca29b86a1140ab1668aaf576cf2"),
    "engine-cap-100": ("42efed46d1620e3614b5881dc4975357eb5021ddbb5866d4a702993a8d09f1e0",
                       "18872cde8262731f8b107333266f5f6a3d5b294d814d5f5ab29a8919e220d493"),
    "engine-cap-338": ("e6011d94dc6793535451c377702878174aa53268299a1fe8fff60b12ab522268",
                       "3592dd7678ed45ac15bfc09aa054e021bae77ff56c5fc91f36410d920b12c9eb"),
    "engine-cap-338-cancel-on": ("512df529f510fcc3864641cb1b03f12da1b70ee6ea894aa2e2ebfd7842630bf6",
                                 "6541ce8fbb00720eb1edf8f6fd7530b522270d684cab2038fed15721010be7e8"),
    "lifo": ("23abbebc14951a1d17b412329bbb83ea1da87e6b38b44bd604cc910c7157b260",
             "ff8229577515b0e8b135c6f67920fd972f6d1356d3ff0ed3c5fd8fae1f6bdcd5"),
    "lookup-first": ("6ccb51a229b6378f19896c22d7e30ad76967d31b2389cf57d9f1f13247310021",
                     "6b47159d4ef2407981a0f0be3944662b783cfef7a5ec9da01ef2b15dfe13597b"),
    "lookup-first-retain": ("fc33567b268be739becf873a0fc2115a59e1cdf56c49a660d99245d07968d30b",
                            "39d36240eb98abf57ba888530283e5a192552388cfee34bf56d050bde4de94c1"),
    "no-control": ("f38a1e6d1be58a093e24c34298a627c9350f52839558b4153251619c77ae2d3d",
                   "dd50a8167a582748b88fdad9c64c5fc029bcef1934ca7ae41fa408f5628e7a65"),
    "proxy-cap": ("4f5ccd324739a6fa2082f77a218cc493a78d1de35dece5a65b9ffdff0ab591b7",
                  "2288d5a376c7ef6f9ac7b7e7b76f058595a2b6d0fd29e173659b6e3272c8bd55"),
    "retries-off-cancel-off": ("c1a9fb1826f04de97c0eed9b30c977c36132f64d555dcbede8b6efe8148cbccc",
                               "17373be5b4736e505341febf47a1217152282114dcfe5dfa10e247bc99b1ae15"),
    "retries-off-cancel-on": ("69ebbee187de9a75acafbda73dde67d1cc5b86b7af3cf4177ee32e45f16c00e9",
                              "9c4238469af6d97a1ec0663885761902e6bd1819614585235da001d938990e5a"),
    "retries-on-cancel-off": ("3fe4af628e553fdcf88ec79f89932db1ce81db114dd07542e795e6b908e860b3",
                              "dd50a8167a582748b88fdad9c64c5fc029bcef1934ca7ae41fa408f5628e7a65"),
    "retries-on-cancel-on": ("1e09ab92c596a47cbec1780f61a2737a2b4f859c296930514910eca7251723ed",
                             "6541ce8fbb00720eb1edf8f6fd7530b522270d684cab2038fed15721010be7e8"),
    "retry-budget": ("6fd0ca98f6a8b4c3534bf4f3364d346671f65edeb13be0440a3708c025cea408",
                     "ecfa2187114baed964b74248e4c186f917c3ccffec65f5af9b8bab48f6ea6163"),
    "retry-budget-cancel-on": ("b8b337a47c316019f76cc3599ea1dca2f1b08febee3437a81c233c0d7b8b8f51",
                               "ccf8af626f54ee7e1a7c7ffb26d26a40548fcc09d60a83e46a9ffaa414349b10"),
}

# calibrate() of Qwen2.5-7B-Instruct on trace seed 0 (one of the five C-hat averages).
CALIBRATION_SEED0 = "2d510662d01f6880d23eb2c3aba05868deb8accf716bdf6a589f0cf1e4a8dfe0"

# `retrybench run --model qwen2.5-7b-instruct --condition X --seed 77 --json` (C-hat as above): the
# sha256 of the summary's canonical JSON, minus wall_s and code_version.
RUN_JSON: dict[str, str] = {
    "retries-on-cancel-on": "318c16b8fec4068475cf4eefcb2d41418f9c6543ab9b6730dbe628837345e076",
    "retries-on-cancel-off": "8ce1ae75d21642671f67a363db4e48e84978680aa49840117648f88eceb78ce1",
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
