"""Tests for the trace generator: determinism, phase rates, length distributions and the file format."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from retrybench.conditions.config import WorkloadSpec
from retrybench.traffic.workload import (
    Call,
    Trace,
    concat_calls,
    generate_trace,
    load_trace,
    save_trace,
    stage_trace,
)

SPEC = WorkloadSpec(chat_calls_per_s=2.78)
# A long hold gives ~33k calls for distribution checks.
BIG = WorkloadSpec(chat_calls_per_s=2.78, hold_s=20_000.0)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate_trace(SPEC, 7)


@pytest.fixture(scope="module")
def big() -> Trace:
    return generate_trace(BIG, 11)


def test_same_seed_same_trace(trace: Trace) -> None:
    assert generate_trace(SPEC, 7) == trace


def test_different_seed_different_trace(trace: Trace) -> None:
    other = generate_trace(SPEC, 8)
    assert other.calls != trace.calls
    assert other.shared_prefix_ids() != trace.shared_prefix_ids()


def test_does_not_touch_global_rng() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()  # type: ignore[index]
    generate_trace(SPEC, 1)
    assert np.array_equal(np.random.get_state()[1], before)  # type: ignore[index]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_phase_counts_match_rates(seed: int) -> None:
    t = generate_trace(SPEC, seed)
    expected = {"base": 0.6 * 2.78 * 120, "pulse": 2.7 * 2.78 * 107, "hold": 0.6 * 2.78 * 720}
    assert {k: round(v) for k, v in expected.items()} == {"base": 200, "pulse": 803, "hold": 1201}
    for phase, mean in expected.items():
        count = sum(c.phase == phase for c in t.calls)
        assert abs(count - mean) < 5 * math.sqrt(mean), (phase, count, mean)


def test_arrivals_sorted_and_inside_phases(trace: Trace) -> None:
    times = [c.arrival_s for c in trace.calls]
    assert times == sorted(times)
    bounds = trace.phase_bounds()
    assert bounds == {"base": (0.0, 120.0), "pulse": (120.0, 227.0), "hold": (227.0, 947.0)}
    assert trace.end_s == 947.0
    for c in trace.calls:
        start, end = bounds[c.phase]
        assert start <= c.arrival_s < end
    assert [c.index for c in trace.calls] == list(range(len(trace.calls)))
    assert trace.calls[5].call_id == "call-7-000005"


def test_empty_phases() -> None:
    spec = WorkloadSpec(chat_calls_per_s=1.0, base_rate_x=0.0, pulse_s=0.0)
    assert generate_trace(spec, 0).calls == ()


def test_prompt_length_distribution(big: Trace) -> None:
    lengths = np.array([c.prompt_tokens for c in big.calls])
    assert len(lengths) > 30_000
    assert abs(lengths.mean() - 12_000) < 30
    assert abs(lengths.std() - 1_200) < 40
    assert lengths.min() >= 2_016 and lengths.max() <= 30_000


def test_response_length_distribution(big: Trace) -> None:
    lengths = np.array([c.response_tokens for c in big.calls])
    assert abs(np.median(lengths) - 300) < 9
    assert abs(lengths.mean() - 400) < 10
    assert lengths.min() >= 1 and lengths.max() <= 8_192


def test_prompt_token_ids(trace: Trace) -> None:
    prefix = trace.shared_prefix_ids()
    assert len(prefix) == SPEC.shared_prefix_tokens
    ids = [trace.prompt_token_ids(i) for i in range(3)]
    for i, tokens in enumerate(ids):
        assert len(tokens) == trace.calls[i].prompt_tokens
        assert tokens[: len(prefix)] == prefix
        assert all(100 <= t < 30_000 for t in tokens)
    assert ids[0][len(prefix) :] != ids[1][len(prefix) :]
    assert generate_trace(SPEC, 7).prompt_token_ids(1) == ids[1]


def test_save_load_round_trip(trace: Trace, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    save_trace(trace, path)
    assert load_trace(path) == trace
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temp file left behind
    data = json.loads(path.read_text())
    assert data["format"] == "retrybench-trace/1" and data["seed"] == 7
    assert len(data["calls"][0]) == 5


def _write(tmp_path: Path, trace: Trace, edit: Any) -> Path:
    path = tmp_path / "t.json"
    save_trace(trace, path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.update(format="retrybench-trace/0"), "wrong format"),
        (lambda d: d.pop("format"), "missing key 'format'"),
        (lambda d: d.pop("calls"), "missing key 'calls'"),
        (lambda d: d.pop("seed"), "missing key 'seed'"),
        (lambda d: d["spec"].pop("hold_s"), "spec is missing key 'hold_s'"),
        (lambda d: d["spec"].update(mixed_prompts="yes"), "bad value for spec.mixed_prompts"),
        (lambda d: d["spec"].update(shared_prefix_tokens=2000.5), "bad value for spec.shared_prefix_tokens"),
        (lambda d: d.update(calls={}), "calls must be a list"),
        (lambda d: d["calls"][2].__setitem__(1, d["calls"][1][1] - 1.0), r"bad value in calls\[2\]"),
        (lambda d: d["calls"][0].__setitem__(2, 10), r"bad value in calls\[0\]"),
        (lambda d: d["spec"].update(chat_calls_per_s=-1), "bad spec.*chat_calls_per_s"),
        (lambda d: d["spec"].update(bogus=1), "bad spec"),
        (lambda d: d.update(seed=-3), "bad seed"),
        (lambda d: d["calls"][3].__setitem__(4, "burst"), r"bad value in calls\[3\]"),
        (lambda d: d["calls"][2].__setitem__(0, 9), r"bad value in calls\[2\]"),
        (lambda d: d["calls"][4].__setitem__(1, -1.0), r"bad value in calls\[4\]"),
        (lambda d: d["calls"][1].pop(), r"bad value in calls\[1\]"),
    ],
)
def test_load_rejects_bad_files(trace: Trace, tmp_path: Path, edit: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_trace(_write(tmp_path, trace, edit))


def test_load_rejects_non_json(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_trace(path)


def test_mixed_prompts_about_half_short() -> None:
    t = generate_trace(replace(BIG, mixed_prompts=True), 3)
    lengths = np.array([c.prompt_tokens for c in t.calls])
    short = lengths < 7_500
    n = len(lengths)
    assert abs(short.sum() - n / 2) < 5 * math.sqrt(n / 4)
    assert abs(lengths[short].mean() - 3_000) < 15
    assert abs(lengths[short].std() - 300) < 15
    assert abs(lengths[~short].mean() - 12_000) < 40
    # Same arrivals as the unmixed trace: only the prompt choice changes.
    plain = generate_trace(BIG, 3)
    assert [c.arrival_s for c in t.calls] == [c.arrival_s for c in plain.calls]
    assert t.prompt_token_ids(0)[:2_000] == plain.shared_prefix_ids()


def test_bad_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        generate_trace(SPEC, -1)


@settings(max_examples=40, deadline=None, database=None)
@given(
    rate=st.floats(0.0, 20.0),
    duration=st.floats(0.0, 60.0),
    start=st.floats(0.0, 1_000.0),
    seed=st.integers(0, 2**32),
)
@example(rate=2.2250738585072014e-308, duration=1.0, start=0.0, seed=0)  # once overflowed 1/rate
def test_stage_trace_properties(rate: float, duration: float, start: float, seed: int) -> None:
    calls = stage_trace(rate, duration, seed, SPEC, start_s=start)
    assert calls == stage_trace(rate, duration, seed, SPEC, start_s=start)
    times = [c.arrival_s for c in calls]
    assert times == sorted(times)
    assert all(start <= t < start + duration for t in times)
    assert all(c.phase == "stage" for c in calls)
    assert all(2_016 <= c.prompt_tokens <= 30_000 and 1 <= c.response_tokens <= 8_192 for c in calls)
    assert [c.index for c in calls] == list(range(len(calls)))


def test_stage_trace_rate() -> None:
    calls = stage_trace(5.0, 400.0, 1, SPEC, start_s=30.0)
    assert abs(len(calls) - 2_000) < 5 * math.sqrt(2_000)


def test_concat_calls_renumbers() -> None:
    a = stage_trace(2.0, 20.0, 4, SPEC, start_s=0.0)
    b = stage_trace(2.0, 20.0, 4, SPEC, start_s=20.0)
    joined = concat_calls([a, b])
    assert len(joined) == len(a) + len(b)
    assert [c.index for c in joined] == list(range(len(joined)))
    assert len({c.call_id for c in joined}) == len(joined)
    assert joined[len(a)] == replace(b[0], index=len(a), call_id=f"call-4-{len(a):06d}")
    assert all(isinstance(c, Call) for c in joined)


@settings(max_examples=20, deadline=None, database=None)
@given(seed=st.integers(0, 10_000), pulse_x=st.floats(0.0, 5.0), mixed=st.booleans())
def test_generate_small_traces(seed: int, pulse_x: float, mixed: bool) -> None:
    spec = WorkloadSpec(
        chat_calls_per_s=1.5, pulse_rate_x=pulse_x, base_s=10.0, pulse_s=5.0, hold_s=10.0, mixed_prompts=mixed
    )
    t = generate_trace(spec, seed)
    assert t == generate_trace(spec, seed)
    for c in t.calls:
        start, end = t.phase_bounds()[c.phase]
        assert start <= c.arrival_s < end
        assert len(t.prompt_token_ids(c.index)) == c.prompt_tokens


def test_a_scaled_workload_shortens_every_length_and_keeps_phases_and_rates() -> None:
    from retrybench.conditions.config import WorkloadSpec

    spec = WorkloadSpec(chat_calls_per_s=2.0)
    small = spec.scaled(0.1)
    assert (small.prompt_tokens_mean, small.prompt_tokens_sd, small.shared_prefix_tokens) == (1200.0, 120.0, 200)
    assert (small.response_tokens_median, small.response_tokens_mean, small.short_prompt_tokens_mean) == (30.0, 40.0,
                                                                                                           300.0)
    assert (small.chat_calls_per_s, small.pulse_rate_x, small.hold_end_s) == (2.0, 2.7, spec.hold_end_s)
    assert spec.scaled(1.0) is spec
    with pytest.raises(ValueError, match="token scale"):
        spec.scaled(0.0)
