"""Pinned results: the simulator and the run summary must not move when the code is only made faster.

The digests were computed on the code before the speed-up work (the values are hard-coded, not
recomputed): the run log's digest (RunLog.digest(): every call, attempt, execution, sample and
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
CHAT = {"qwen2.5-7b-instruct": 2.8285726931688133, "qwen3-14b": 1.090200616117957,
        "llama-3.1-8b-instruct": 1.8303257577861978}
QWEN = "qwen2.5-7b-instruct"

# Full paper runs (base, 2.7x pulse, hold): (spec, run-log digest, engine-trace digest).
FULL_RUNS: list[tuple[RunSpec, str, str]] = [
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1),
     "0f575628578b8150d2f90da6287dda74c8f531d7599d8ad5230c71aba1583538",
     "5892aaeddfde7d2a5a19e7313cd574ee84c762daeed9a02b3630a34121a079d6"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-off", seed=1),
     "7c71f151c9c21f7d2a207a8f92c43d54be4993a0420e8c5f2b26095eaa5253c5",
     "3a43d118aeac7550fa91166ebcbde3fdbe8f4630f5bcd8537b38a2106492c4fe"),
    (RunSpec(model=QWEN, condition="coalescing", seed=2),
     "aaa58ba90d02d6b83249b7a7d47ccaaf0b69e9f357b5559e72c68f08b37d6826",
     "edee5b7e617280531be321f1aab3bf372b1f3892f2d51a0d6b4f0cd6e41ebedf"),
    (RunSpec(model=QWEN, condition="deferred-cancellation", seed=1),
     "6fd144b533d4c5671330db95425114c1d4bafbef05d4059ca1205a73d09e38a5",
     "b3da45a9e681aa73e376f938041dd8c28336b7bc4605d7df386b139e100cb9fd"),
    (RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=3, max_batched_tokens=2048),
     "4be04da805c7f577ab95a0bc17e9bed98327e8248f653c09c0d22e414169a586",
     "bd987b1e6dadc29237816943f13ae744563987dcbf4208b44aa21ccbdb7469a0"),
    (RunSpec(model="llama-3.1-8b-instruct", condition="retries-on-cancel-off", seed=1),
     "eb5437b039b0a03defba4f670e2f7aebcda3a00f30b3af8685034e19c02b1401",
     "502ef5450fbd0a1a1b0ff5b5a45dd95b0591b176cb165f2badbb2f4b0d56e869"),
    (RunSpec(model="qwen3-14b", condition="engine-cap-338-cancel-on", seed=2),
     "7029d78671129bb41d930653ecd1132933949cbdc53f98c13a91ea74b1bd9ddf",
     "482d1685035b236fd5e8ef4ac6c2df58230d69fbe34ca85237ea810951e1eaf0"),
]

# Every condition of Table 1 on a short trace with a 15-s attempt deadline, so that the 60 s of
# pulse and hold already time attempts out, retry, cancel, coalesce, queue and refuse.
SHORT = WorkloadSpec(chat_calls_per_s=CHAT[QWEN], base_s=30, pulse_s=30, hold_s=60)
SHORT_SEED = 5
SHORT_DEADLINE_S = 15.0
SHORT_RUNS: dict[str, tuple[str, str]] = {  # condition -> (run-log digest, trace digest)
    "budget-first": ("5474069cb883523d19d10d539130fff5ec31de294d761bf91b973ce8cc61b509",
                     "7877027c2ccfe4c6832be11a0fa1dc2f0898e9446c263160b08e115455228e47"),
    "coalescing": ("aed85293900f0cb6253e8e329a61218467c85e288dca86875bffb28885df3d36",
                   "0b7f16240780e8bf8d1414161be955a678f8e85f7ac232fe9b5fe71232a0b150"),
    "coalescing-cancel-on": ("a48723e7d520e7e9af2a52b96b200960d7707ba49ce0ac07d09676c4e23ed9e3",
                             "4e51e27607163a223f44ac846cdc3deb8a83a767be7edd96915c44add91ab249"),
    "deadline-check": ("5d9bdab7e759d253f4bc61174bf82f77ee2fbe74aaa9b7a7e1e413f22bb1edfa",
                       "38a50114e1b8b58b7ea4a8052b7edb27efebee91f363481631b300ebf0ac0681"),
    "deferred-cancellation": ("471cff2a2435a4d8eed15d605b6a8379ef84edf07ed6c1fba72e8ab29411d462",
                              "061d947b260e417a7b28d85cbfa04181f6570d479c3cd42e6614fc49a597599c"),
    "engine-cap-100": ("c11c5f9b9e7c1240b6c509a03cf06edcb0274ba4b0bfffe43433a6138aa68eae",
                       "3352aaba519c1f2f3f843e360aad333d51dc030990d503001469a67219f3b022"),
    "engine-cap-338": ("beaaf98c183eff5ccc1847eb1be3b0b575016470c83c3030e5b660ce12d88f46",
                       "725f55bf48166c551aef1c016ec95dcd48a2962ccd285044efd58312c4fa2f4b"),
    "engine-cap-338-cancel-on": ("aadd05ea8eead508c5bfa8e5e6c247dfbd98ee67ced3a6b1a1d80c7667095074",
                                 "4e51e27607163a223f44ac846cdc3deb8a83a767be7edd96915c44add91ab249"),
    "lifo": ("a3fc2a3cd6fbc0fbcb49fd9886357896453cf8ed9a36578d4c0ff0fc47044a6f",
             "282a90b105f4e9b2504cf90a0e30cd57243d66131d4e2cccfd3cb1b441a9755a"),
    "lookup-first": ("9d7c52e5ef4e0fb4e2c4d5380a7bc3f7617204c3f29479783d0d9501e06398f1",
                     "18728d8bd43f948e10e6c0e4bfcaa0d59990b4f7e4e630316181132cc7c1db55"),
    "no-control": ("587f01cc558ddbe7184b4595203cc996499a6b2bfbfc7df0a856c696ce538a3d",
                   "807dfc0a25d39bbd75c6c4a9d5d5434071c20956f41d899369ebe01afda5316d"),
    "proxy-cap": ("29dfbce275cd968f77c2b9421016cbf32174fd3ac3ca5c3a1d1e27ebe0ebdced",
                  "fee1b66cd4124840914084d9574928d2e606d391b557e7049778d350dc43ce5e"),
    "retries-off-cancel-off": ("0a34229b8860a097a0a496735148b9f5db3f711066c2a6dbd2b402f713c80575",
                               "0244e01c33b2bd7264550d0a631517d5df2557538a1587c203f67e189fea9071"),
    "retries-off-cancel-on": ("57296aa4ee286715b590809e1b5eef7940e08cd1ea3b54421069e5ae9f484e81",
                              "b0569e88f15ec9fdc6ca1b6e9245347490af515bc478404e9ce010730f99743e"),
    "retries-on-cancel-off": ("c365b0bcc4d2d2073822206adbecf8bb43ae997d6087f6e65d92ccce677e430b",
                              "807dfc0a25d39bbd75c6c4a9d5d5434071c20956f41d899369ebe01afda5316d"),
    "retries-on-cancel-on": ("4b8960515a14668b8ece60a71d953a70320dd9ad431f7dd974bda39f2545afcd",
                             "4e51e27607163a223f44ac846cdc3deb8a83a767be7edd96915c44add91ab249"),
    "retry-budget": ("ce5d5323addb30e00ca6151cdfa9931daa825a416248d99781fc85b08afd74ae",
                     "1acc70dc04d419cafea19be82bae7e540525af938bcec5cc1d5421122684ac45"),
    "retry-budget-cancel-on": ("f464638ac460c6f256f23722193516411085a6fc65cb41ae699e1b45ff85790d",
                               "9a35f0ed4b9bc73bacbee3ecc84b674a977445874084c9f3a7c8367a74f7c906"),
}

# calibrate() of Qwen2.5-7B-Instruct on trace seed 0 (one of the five C-hat averages).
CALIBRATION_SEED0 = "6cbd32d25efa17639f83cec1b3e2bf34627393734de64ec4c6f58c8d0aef1756"

# `retrybench run --model qwen2.5-7b-instruct --condition X --seed 77 --json` (C-hat as above): the
# sha256 of the summary's canonical JSON, minus wall_s and code_version.
RUN_JSON: dict[str, str] = {
    "retries-on-cancel-on": "fb09fdce9ccc4af9f017e345894276fc8f427707dbb77fbe466e61dbd59cfe40",
    "retries-on-cancel-off": "73a0ebecc0e691357d111e1f693c04198e77253ed43255503b530d058582c9aa",
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
