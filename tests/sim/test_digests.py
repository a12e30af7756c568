"""Pinned results: the simulator and the run summary must not move when the code is only made faster.

The digests were computed on each step model (the values are hard-coded, not recomputed): the roofline
model's (the sequential-phase step costs, pinned before the kernels model existed and unchanged by it)
and the kernels model's (the default, measured kernel tables). Each is the run log's digest
(RunLog.digest(): every call, attempt, execution, sample and counter), a digest of the engine trace
(the events Section 5's analysis reads), one calibration, and the whole `retrybench run --json` summary
of one run. A change that alters any of them changes what the simulator computes, which a speed-up must
not do; change a pinned value only together with a deliberate change of the model, and say so in the
commit.

Regenerate (after a deliberate change only): python3 tests/sim/test_digests.py [roofline|kernels]
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any

import pytest

from retrybench.calibration import store
from retrybench.calibration.simulated import calibrate
from retrybench.conditions.config import WorkloadSpec, available_conditions, load_condition
from retrybench.engine import profiles
from retrybench.engine.profiles import profile_for
from retrybench.plan.spec import RunSpec, engine_config_for
from retrybench.runs.executors import run_one
from retrybench.runs.simulate import simulate_spec
from retrybench.sim.run import simulate
from retrybench.traffic.workload import generate_trace

# C-hat of each model as calibrated by the code these digests were taken on; fixed here so that the
# runs do not depend on (or wait for) the calibration.
CHAT = {"qwen2.5-7b-instruct": 2.7098365167020377, "qwen3-14b": 1.0897938421538016,
        "llama-3.1-8b-instruct": 1.8299082582399067}
QWEN = "qwen2.5-7b-instruct"

# The roofline step model's digests (everything below up to KERNELS_*), then the kernels model's.
# Full paper runs (base, 2.7x pulse, hold): (spec, run-log digest, engine-trace digest).
FULL_RUNS: list[tuple[RunSpec, str, str]] = [
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1),
     "9f006d4c661b97cff0141bdcab733172d30ff6bd434ea99dd631e86127de6d3c",
     "3eec8fe2945f5db6b7d558235228dc210479f2cffa07264354b9481ef459d64f"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-off", seed=1),
     "4de8842dd8f524866392ab9e4c10225ccbcf6677246c36584b100c62418e6c4a",
     "166221ccfbc3bc98d918ea46198733c91e84ee4c841dbb413a47bd64db6177c8"),
    (RunSpec(model=QWEN, condition="coalescing", seed=2),
     "01c62e913763f47be70c2c800384f2d70144ef0c2f151ffecaf9e2613617a246",
     "d7518ec855d85fd0b0a87899936146968dcc63b1dd5fcb7bceb717fc3f3b3ff5"),
    (RunSpec(model=QWEN, condition="deferred-cancellation", seed=1),
     "a36654ef329c471d63760ca5e2ee39e6d2ae6817bdd46ea7ca6c0ba649bd5516",
     "9ffedca6f206dd34b8b0556836b0bcd080ed37a0cf7ff454444158b75ffbefde"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=3, max_batched_tokens=2048),
     "dfad400b6dd318219c8a22ebb39c22095247c5201423f5d5949cecf7b29347d2",
     "d5c5ab3df26438f7e868c1e5051048a301b52223fd0670b1ec8b0895d6446fc3"),
    (RunSpec(model="llama-3.1-8b-instruct", condition="retries-on-cancel-off", seed=1),
     "600be5ca71b546148466bc29251c7d0f1b1a51a666a3dd9c43eb1b69d6a4dd79",
     "9dcec8ada7766e0faa4fa0558cc04b6f2a01244850cc0ff7435a9857f0952d7f"),
    (RunSpec(model="qwen3-14b", condition="engine-cap-338-cancel-on", seed=2),
     "67f53a388da7deaf755ea20899f421b77d62462866f357af2167ace28363fd1c",
     "e1c9bc67c6b73755dc62ea6cee1094ed272a7404c5fa0bf93239a30ed4e8ae3c"),
]

# Every condition of Table 1 on a short trace with a 15-s attempt deadline, so that the 60 s of
# pulse and hold already time attempts out, retry, cancel, coalesce, queue and refuse.
SHORT = WorkloadSpec(chat_calls_per_s=CHAT[QWEN], base_s=30, pulse_s=30, hold_s=60)
SHORT_SEED = 5
SHORT_DEADLINE_S = 15.0
SHORT_RUNS: dict[str, tuple[str, str]] = {  # condition -> (run-log digest, trace digest)
    "budget-first": ("f87a16655d3e7523e0f00d14ff4e569adbaa6225f068b33a43e50ea44a808356",
                     "d27c17783cd03397cfe0f4ad9e8ffd803540eeca4f24b04fd43faf8db1c7f62f"),
    "coalescing": ("74deb2f0ba6935364d1e100d0a803f4657b49fda1adabca0bb1eaf629c6a2ae7",
                   "b81a94b2d78bca1583bad4ef5dcd8a215fbcc75e21fdf811aa267906f08ca6d2"),
    "coalescing-retain": ("066c41b3f2fc927b64d020354c64d585979a584da3add16703b2207cab4e4ddb",
                          "755929d9600e27a75cd7625286a636d45b52e038f2827af399e24c982e7d15de"),
    "coalescing-cancel-on": ("8fe5262f965779b3ebcddda0e42a57a100842997814e83d2929dc8e29098f5e0",
                             "4e316d8bbf1fd08d76d8bc39678f2598ee55a81316b6441035863cea4e69f51b"),
    "deadline-check": ("c334541d0e80c09ee1e72930a2bae7778ea16aef4d758a108286a9b908e0ab02",
                       "d9541eace6f4caefeacdb99b459140c4f0e7aa543cede2a4fd83055944b8d334"),
    "deadline-admission": ("2117a3b7e0c31c684f89cce33d4d88bd9e3ab688de6df2381e5a8d2eea8dc8c3",
                           "e3d4dc1ad1b44c5f907f5e2f28da58d493fafaed610558a79a3477d2b2f1d2ae"),
    "deadline-deferred": ("858d3bf7702b1c23c2b2535ca32cad448a78fa6921b78e533333ca1a36bf2fef",
                          "9dc65ffccb21891cc35a2753366ea0153ba2226fe5fb58d9c30dbf97d7d6bd11"),
    "deadline-propagation": ("b314e63a5ed3137c8e1650977161ef7b6bb85eb761aa70ef2d0a4ad57c426425",
                             "4e316d8bbf1fd08d76d8bc39678f2598ee55a81316b6441035863cea4e69f51b"),
    "deferred-cancellation": ("7663c639b23a0149a2dc2bd79a2e772909997311b04d6fdd3ff81258538a1208",
                              "9dc65ffccb21891cc35a2753366ea0153ba2226fe5fb58d9c30dbf97d7d6bd11"),
    "engine-cap-100": ("e11c124e520944161b10c38fc1a1f69576b4c9155137c1807e67abed6f67ac99",
                       "5ea65b7aa4f96c7bf8ea453b49d3ad1a993f1a96de5d0c9d3883148a35bfeb32"),
    "engine-cap-338": ("9a59fb64930a50b857a605629d3bbbb173f7c858e9a74bdfa259322ee26cd917",
                       "8ed261654c615fc7e43cf0e1fd6c01a2bb515864036ae8cb134ab6ceb44eab74"),
    "engine-cap-338-cancel-on": ("e7192050f8260686be20afc865a03f72c6c2d16edd32c7dd332dbae51d7de9d8",
                                 "4e316d8bbf1fd08d76d8bc39678f2598ee55a81316b6441035863cea4e69f51b"),
    "lifo": ("cdf452858f6ceee78d9941f4de7ad2d207c61341a92ae04e8a493fc1b939d27f",
             "a1e4f6d34e14c89b3c01073f74f582b252c0dc7c91a9e24136eb1db215f0129e"),
    "lookup-first": ("32f2eb7bd6f2c4781371fc75f46b316e50a135b7ea3df72c2d7ebf517d016ca3",
                     "9216ddbc9de25a37c1ec4cbd93853c13bc9e434294ecf75d2069f86fecb2f20d"),
    "lookup-first-retain": ("3f7ff539ec0fdf90d7c24d8855cb5b85ef6e570d1cc0992425d630d19be05622",
                            "755929d9600e27a75cd7625286a636d45b52e038f2827af399e24c982e7d15de"),
    "no-control": ("d64f4851f90b321efecf94029293dcf2fd04a86da73126f0e449a4835c9f4a07",
                   "99f4d395f7d203fd6eabd503c5498f44afdac978544c1506f814f0a500396c95"),
    "proxy-cap": ("a875ce70d64bcd1c67d26ccb0cf2920fae6879c0bc0bc433d804a43df683cc29",
                  "bdbc49fe5801adf26cb8a45f48a93bf77af2cd81df746ca7bacc74f0482e9a8f"),
    "retries-off-cancel-off": ("efbd7b27051e413882edf73b93f8fc54537216cac6285715f5bec23b7bb72970",
                               "148099da73f433a2bcf34ccbb1abf57fe48368de438efee19e5a220e9d846e1d"),
    "retries-off-cancel-on": ("7a6431985d64bb65cdbcaaeeaf0dbf21e511c87ddcb739c4ffafc16d33dccd82",
                              "67d57ddc49b509b912aa68f7a2e468622b5266afa0b42bf16e2b41c9056fc45d"),
    "retries-on-cancel-off": ("b0ef267ee3a9248a80f6e8f4736c9f737e9e8fbb6e2e6c5344085c920a1ca737",
                              "99f4d395f7d203fd6eabd503c5498f44afdac978544c1506f814f0a500396c95"),
    "retries-on-cancel-on": ("3690b9ef11edf46bb6cc178f7334ef40227887300cc31230de9a0f93213d2927",
                             "4e316d8bbf1fd08d76d8bc39678f2598ee55a81316b6441035863cea4e69f51b"),
    "retry-budget": ("03bc2ba947391dac4a8e5aca3632f0ae0636fa220b72a24bba885eef7780a0fe",
                     "52adaed4edbfdede1aaae8825670c9103a6242d713bed8bd3d76d96bb231e530"),
    "retry-budget-cancel-on": ("5c9b6aa960449c4cc3c5bf641829659672d110a475d77e37ee690be2037efe98",
                               "a4187cabe3c77f3a727d42a6b494210856513a3effca3ab73eef2fe341955d05"),
    # Beyond the paper: the rejection block's refusal policies and circuit breakers (docs/rejection.md).
    "reject-budget-429-bare": ("946e5e16fb91622cfc5d5fd110faa2c012d91ce8fc86907746e1b82730fdc54a",
                               "5e4ab475a583790abbbe1e11c5691ef033e449e0f660404770782dd342ee6b3e"),
    "reject-budget-503": ("acb175624a181cd8ab55d3a58fbb68597805fc60de427ee1e58fceee747cb7af",
                          "5e4ab475a583790abbbe1e11c5691ef033e449e0f660404770782dd342ee6b3e"),
    "reject-budget-529": ("905d2b3fc1a5352978bf72c748393b211b67aa7e405de27380daf3e1f15693c3",
                          "5e4ab475a583790abbbe1e11c5691ef033e449e0f660404770782dd342ee6b3e"),
    "reject-budget-no-retry": ("0c28bf6b6e6f84cb3aa22b8accacb86e0932eebc1b4574c38c2270926eb77862",
                               "52adaed4edbfdede1aaae8825670c9103a6242d713bed8bd3d76d96bb231e530"),
    "reject-cap-429": ("43263a8a8f47fd57245cf05ffb113b4abc63bc6483a27a1a2da69ed54461f249",
                       "4657965b186f1700f335bb9f03aa7bdfb669f559f7ae6500bd3dba9e596b468c"),
    "reject-cap-529": ("db5f92f5e284ea78aa553870e5fb8f7eeedb6d18d004b3b17703f3dc429676d5",
                       "8ed261654c615fc7e43cf0e1fd6c01a2bb515864036ae8cb134ab6ceb44eab74"),
    "reject-cap-no-retry": ("6e4d1529ed696711566d5e71f154fbaf79148a2ff2b50f4eef588949174aae9d",
                            "8ed261654c615fc7e43cf0e1fd6c01a2bb515864036ae8cb134ab6ceb44eab74"),
    "breaker-busy-faults": ("aa801e5f40f93ee7d039f670e49403f2d2c7205db4f4f45f460847e494d513f1",
                            "c15a509c77b57f04d5f26de05e27b1484a228b367d0972ba21133024986f45b2"),
    "breaker-errors-only": ("ed635a3f8c34480ccc8da3bede3450b0f1e49b3e41806299937ee38271151fa9",
                            "c15a509c77b57f04d5f26de05e27b1484a228b367d0972ba21133024986f45b2"),
}

# calibrate() of Qwen2.5-7B-Instruct on trace seed 0 (one of the five C-hat averages).
CALIBRATION_SEED0 = "32daebc4d157227e75e966c22587f1224a2ea914d98a1a2acf9027f60a1d368b"

# `retrybench run --model qwen2.5-7b-instruct --condition X --seed 77 --json` (C-hat as above): the
# sha256 of the summary's canonical JSON, minus wall_s and code_version.
RUN_JSON: dict[str, str] = {
    "retries-on-cancel-on": "e405dabed01e93e7b0c109dd0d53b415b32ae7a0dc7dc708faace42c63e7cab9",
    "retries-on-cancel-off": "c0294374f0371d668dfbb32912b985f7a6f7034990c981ba213b835346be7645",
}


# The kernels step model's: fewer runs, since the scheduler and proxy code they pass through is the
# roofline digests' too; what they add is the step prices.
KERNELS_FULL_RUNS: list[tuple[RunSpec, str, str]] = [
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1),
     "af4b8e86fee783459175a0fc32111df233510fbba5de60aa1f2bba81a00299c0",
     "3997b79ddb9cfbea362045ca8d089dc45b9074e10ea1f9d8f84b49080ed1b793"),
    (RunSpec(model=QWEN, condition="coalescing", seed=2),
     "71b0fab58dbbfc68bcc9f7b5e244fd59cdf1380e2c2973af50f583d3e3d8f1f6",
     "f95513e3263cfaeb615af648ae92d640b4e9407f65553140761484317d57a1c6"),
    (RunSpec(model="llama-3.1-8b-instruct", condition="retries-on-cancel-off", seed=1),
     "0dd93bb1d00424040eded10e93e8d8e9ca94235c26248ab4e7d78d52c4741d44",
     "9ffe2a63c3b183b286c194575e83f34f2fe553977094117e30be47400ae0c062"),
    (RunSpec(model="qwen3-14b", condition="engine-cap-338-cancel-on", seed=2),
     "86af788d3d50adbeba2883d7faf295dfd8c0bc1666aa43118b883530807dfc7d",
     "6eeb7ff82abf2a58d74059144b917fa583c47ad1d9101a41adf4d9e45a2fddd5"),
]
KERNELS_SHORT_RUNS: dict[str, tuple[str, str]] = {
    "coalescing": ("2d38ef576e00080ee32afcb1c44bfe9a9dd54916f2b23bb194c5ddc542365d94",
                   "d9e5e4b6228ea424cc963e34e11d68225f76a945d56d68a984d81afc434187b4"),
    "deferred-cancellation": ("df2eeac33ce8357de8e0e78b1817d7daeaca955831e0b5db305c6d53af7b23dd",
                              "bffee44fe5f92b94e44858c4487d907a289de8d52ab69ef97c6a98f92d534ec9"),
    "retries-on-cancel-on": ("42bbc208003d18aab0062ae9077b13cda3b614b5f6c8689e0a6991c61f1c447d",
                             "7ccf0f89d2fb131414d6260b05f8df2756f592b5989ae96cd65fb163f9ec8464"),
    "retry-budget": ("e5a408beecfeecd29ade90f529d5c7e490364bb916674a96df1f0181edf6d296",
                     "cc9b92fa43953a1715dccec6f01008cf90fcf7ceb633fdabeb80dea9e35a070c"),
}
KERNELS_CALIBRATION_SEED0 = "2c00c672617d46c816724d63206319c4ddca923c3f2bb8262f0fdd9505aecbad"
KERNELS_RUN_JSON = "fd1c26d07b31e66a9033c5526ad3aecf26e417e43cf60af40a7ff4a10feea4de"


@contextmanager
def step_model(name: str) -> Iterator[None]:
    """Every profile priced by `name` while the specs stay as a user gives them (step_model unset), so
    that a roofline run's record and digest are the ones pinned before the kernels model existed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(profiles, "default_step_model", lambda gpu: name)
        yield


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
                   trace=events, breaker=condition.breaker)
    return log.digest(), _sha(events)


def calibration_digest() -> str:
    return _sha(asdict(calibrate(profile_for(QWEN), seed=0)))


def run_json_digest(condition: str) -> str:
    """The summary `run --json` prints (run_one on a traced spec), without its timing and code hash."""
    spec = RunSpec(model=QWEN, condition=condition, seed=77, trace=True)
    with pytest.MonkeyPatch.context() as patch:  # C-hat as pinned above, not calibrated
        patch.setattr(store, "calibration_of", lambda *args, **kwargs: {"chat": CHAT[QWEN]})
        result = run_one(spec, use_cache=False)
    return _sha(json.loads(json.dumps({k: v for k, v in result.items() if k not in ("wall_s", "code_version")})))


@pytest.mark.parametrize(("spec", "log_digest", "trace_digest"), FULL_RUNS,
                         ids=[f"{s.model}-{s.condition}-seed{s.seed}-{s.max_batched_tokens}" for s, _, _ in FULL_RUNS])
def test_full_run_digests(spec: RunSpec, log_digest: str, trace_digest: str) -> None:
    with step_model("roofline"):
        assert full_run(spec) == (log_digest, trace_digest)


def test_every_condition_is_pinned() -> None:
    assert sorted(SHORT_RUNS) == available_conditions()


@pytest.mark.parametrize("condition", sorted(SHORT_RUNS))
def test_short_run_digests(condition: str) -> None:
    with step_model("roofline"):
        assert short_run(condition) == SHORT_RUNS[condition]


def test_calibration_digest() -> None:
    with step_model("roofline"):
        assert calibration_digest() == CALIBRATION_SEED0


@pytest.mark.parametrize("condition", sorted(RUN_JSON))
def test_run_json_summary(condition: str) -> None:
    with step_model("roofline"):
        assert run_json_digest(condition) == RUN_JSON[condition]


@pytest.mark.parametrize(("spec", "log_digest", "trace_digest"), KERNELS_FULL_RUNS,
                         ids=[f"{s.model}-{s.condition}-seed{s.seed}" for s, _, _ in KERNELS_FULL_RUNS])
def test_kernels_full_run_digests(spec: RunSpec, log_digest: str, trace_digest: str) -> None:
    with step_model("kernels"):
        assert full_run(spec) == (log_digest, trace_digest)


@pytest.mark.parametrize("condition", sorted(KERNELS_SHORT_RUNS))
def test_kernels_short_run_digests(condition: str) -> None:
    with step_model("kernels"):
        assert short_run(condition) == KERNELS_SHORT_RUNS[condition]


def test_kernels_calibration_digest() -> None:
    with step_model("kernels"):
        assert calibration_digest() == KERNELS_CALIBRATION_SEED0


def test_kernels_run_json_summary() -> None:
    with step_model("kernels"):
        assert run_json_digest("retries-on-cancel-on") == KERNELS_RUN_JSON


if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else "kernels"
    with step_model(model):
        for spec, _, _ in (KERNELS_FULL_RUNS if model == "kernels" else FULL_RUNS):
            print(spec, *full_run(spec))
        names = sorted(KERNELS_SHORT_RUNS) if model == "kernels" else available_conditions()
        print({name: short_run(name) for name in names})
        print(repr(calibration_digest()))
        print({name: run_json_digest(name) for name in ("retries-on-cancel-on", "retries-on-cancel-off")})
    sys.exit(0)
