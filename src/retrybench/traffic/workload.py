"""The paper's open-loop trace: Poisson arrivals per phase, long shared-prefix prompts, lognormal replies.

A trace is fully determined by (spec, seed), so runs can be replayed and compared call by call;
token ids are derived from the seed on demand instead of being stored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from retrybench.conditions.config import ConfigError, WorkloadSpec
from retrybench.records.atomicfile import write_atomic

__all__ = ["Call", "Trace", "concat_calls", "generate_trace", "load_trace", "poisson_arrivals", "save_trace",
           "stage_trace"]

FORMAT = "retrybench-trace/1"
PHASES = ("base", "pulse", "hold", "stage")
MAX_PROMPT_TOKENS = 30_000
MAX_RESPONSE_TOKENS = 8_192
_TOKEN_LOW, _TOKEN_HIGH = 100, 30_000  # valid ids for any vocabulary of at least 30000 tokens


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """One logical call: what the client wants, independent of how many attempts it takes."""

    index: int
    call_id: str  # sent as Idempotency-Key by live clients, so it must be stable across replays
    arrival_s: float
    prompt_tokens: int
    response_tokens: int
    phase: str


@dataclass(frozen=True, kw_only=True)
class Trace:
    """The calls of one run plus what is needed to rebuild their token ids."""

    spec: WorkloadSpec
    seed: int
    calls: tuple[Call, ...]

    def shared_prefix_ids(self) -> list[int]:
        """The prefix every prompt starts with, so prefix caching sees the paper's sharing."""
        return list(_prefix(self.seed, self.spec.shared_prefix_tokens))

    def prompt_token_ids(self, index: int) -> list[int]:
        """Token ids of one call's prompt, rebuilt from the seed so traces need not store them."""
        n_suffix = max(self.calls[index].prompt_tokens - self.spec.shared_prefix_tokens, 0)
        rng = np.random.default_rng([self.seed, 1, index])
        tail: list[int] = rng.integers(_TOKEN_LOW, _TOKEN_HIGH, n_suffix).tolist()
        return self.shared_prefix_ids() + tail

    def phase_bounds(self) -> dict[str, tuple[float, float]]:
        """[start, end) of each phase in seconds, for per-phase analysis."""
        s = self.spec
        return {
            "base": (0.0, s.base_s),
            "pulse": (s.base_s, s.pulse_end_s),
            "hold": (s.pulse_end_s, s.hold_end_s),
        }

    @property
    def end_s(self) -> float:
        """When the last phase ends; runs measure up to here."""
        return self.spec.hold_end_s


@lru_cache(maxsize=16)
def _prefix(seed: int, n: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng([seed, 0]).integers(_TOKEN_LOW, _TOKEN_HIGH, n).tolist())


def _call(
    seed: int, index: int, arrival_s: float, prompt_tokens: int, response_tokens: int, phase: str
) -> Call:
    return Call(index=index, call_id=f"call-{seed}-{index:06d}", arrival_s=arrival_s,
                prompt_tokens=prompt_tokens, response_tokens=response_tokens, phase=phase)  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_seed(seed: int) -> None:
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def poisson_arrivals(rng: np.random.Generator, rate: float, start: float, end: float) -> list[float]:
    """Arrivals strictly inside [start, end): exponential gaps drawn from the phase start.

    Gaps are drawn in units of expected arrivals and scaled once accepted, so tiny rates cannot overflow.
    """
    times: list[float] = []
    t = start
    while rate > 0 and end > t:
        span = (end - t) * rate
        units = np.cumsum(rng.standard_exponential(min(int(span * 1.1) + 16, 1 << 20)))
        accepted = t + units[units < span] / rate
        times.extend(accepted[accepted < end].tolist())
        if len(accepted) < len(units):
            break
        t = float(accepted[-1])
    return times


def _calls(
    seed: int, times: list[float], phases: list[str], rng: np.random.Generator, spec: WorkloadSpec
) -> list[Call]:
    """Attach prompt and response lengths; both prompt kinds are always drawn, so mixing moves no draw."""
    n = len(times)
    long = rng.normal(spec.prompt_tokens_mean, spec.prompt_tokens_sd, n)
    short = rng.normal(spec.short_prompt_tokens_mean, 0.1 * spec.short_prompt_tokens_mean, n)
    pick_short = rng.random(n) < 0.5
    raw = np.where(pick_short, short, long) if spec.mixed_prompts else long
    prompts = np.clip(np.rint(raw), spec.shared_prefix_tokens + 16, MAX_PROMPT_TOKENS).astype(np.int64)
    replies = rng.lognormal(math.log(spec.response_tokens_median), spec.response_sigma, n)
    responses = np.clip(np.rint(replies), 1, MAX_RESPONSE_TOKENS).astype(np.int64)
    columns = zip(times, prompts.tolist(), responses.tolist(), phases, strict=True)
    return [_call(seed, i, *column) for i, column in enumerate(columns)]


def generate_trace(spec: WorkloadSpec, seed: int) -> Trace:
    """The paper's base / pulse / hold trace; uses its own generator, never the global RNG."""
    _check_seed(seed)
    rng = np.random.default_rng([seed, 2])
    base, pulse = spec.base_rate_x * spec.chat_calls_per_s, spec.pulse_rate_x * spec.chat_calls_per_s
    times: list[float] = []
    phases: list[str] = []
    bounds = Trace(spec=spec, seed=seed, calls=()).phase_bounds()
    for name, rate in (("base", base), ("pulse", pulse), ("hold", base)):
        phase_times = poisson_arrivals(rng, rate, *bounds[name])
        times += phase_times
        phases += [name] * len(phase_times)
    return Trace(spec=spec, seed=seed, calls=tuple(_calls(seed, times, phases, rng, spec)))


def stage_trace(
    rate_calls_per_s: float, duration_s: float, seed: int, spec: WorkloadSpec, start_s: float = 0.0
) -> list[Call]:
    """Constant-rate calls for calibration stages, with the trace's prompt and response distributions."""
    _check_seed(seed)
    if not (0 <= rate_calls_per_s < math.inf and 0 <= duration_s < math.inf):
        raise ValueError(f"need finite rate >= 0 and duration >= 0, got {rate_calls_per_s}, {duration_s}")
    rng = np.random.default_rng([seed, 3, int(start_s)])
    times = poisson_arrivals(rng, rate_calls_per_s, start_s, start_s + duration_s)
    return _calls(seed, times, ["stage"] * len(times), rng, spec)


def concat_calls(parts: list[list[Call]]) -> tuple[Call, ...]:
    """Join call lists in order, renumbering so indices and Idempotency-Keys stay unique."""
    flat = [c for part in parts for c in part]
    return tuple(
        replace(c, index=i, call_id=f"{c.call_id.rsplit('-', 1)[0]}-{i:06d}") for i, c in enumerate(flat)
    )


def save_trace(trace: Trace, path: Path) -> None:
    """One JSON file without token ids (they follow from the seed); written atomically."""
    data = {
        "format": FORMAT,
        "seed": trace.seed,
        "spec": asdict(trace.spec),
        "calls": [[c.index, c.arrival_s, c.prompt_tokens, c.response_tokens, c.phase] for c in trace.calls],
    }
    write_atomic(Path(path), json.dumps(data, allow_nan=False))


_SPEC_TYPES: dict[str, Callable[[Any], bool]] = {
    "bool": lambda v: isinstance(v, bool),
    "int": _is_int,
    "float": lambda v: _is_int(v) or isinstance(v, float),
}


def _good_row(row: Any, i: int, spec: WorkloadSpec, last_s: float) -> bool:
    if not (isinstance(row, list) and len(row) == 5):
        return False
    index, t, prompt, reply, phase = row
    return (
        _is_int(index) and index == i and _SPEC_TYPES["float"](t) and math.isfinite(t) and t >= last_s
        and _is_int(prompt) and prompt >= spec.shared_prefix_tokens
        and _is_int(reply) and reply >= 1 and phase in PHASES
    )  # fmt: skip


def load_trace(path: Path) -> Trace:
    """Read a saved trace, checking every field so a bad file fails here and not mid-run."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object at top level")
    for key in ("format", "seed", "spec", "calls"):
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    if data["format"] != FORMAT:
        raise ValueError(f"{path}: wrong format {data['format']!r}, expected {FORMAT!r}")
    seed, spec_data, rows = data["seed"], data["spec"], data["calls"]
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"{path}: bad seed {seed!r}, expected a non-negative integer")
    if not isinstance(spec_data, dict):
        raise ValueError(f"{path}: spec must be an object")
    for f in fields(WorkloadSpec):
        if f.name not in spec_data:
            raise ValueError(f"{path}: spec is missing key {f.name!r}")
        if not _SPEC_TYPES[str(f.type)](spec_data[f.name]):
            raise ValueError(
                f"{path}: bad value for spec.{f.name}: {spec_data[f.name]!r} (expected {f.type})"
            )
    try:
        spec = WorkloadSpec(**spec_data)
    except (TypeError, ConfigError) as error:
        raise ValueError(f"{path}: bad spec: {error}") from error
    if not isinstance(rows, list):
        raise ValueError(f"{path}: calls must be a list")
    calls: list[Call] = []
    for i, row in enumerate(rows):
        if not _good_row(row, i, spec, calls[-1].arrival_s if calls else -math.inf):
            raise ValueError(f"{path}: bad value in calls[{i}]: {row!r}")
        calls.append(_call(seed, i, float(row[1]), row[2], row[3], row[4]))
    return Trace(spec=spec, seed=seed, calls=tuple(calls))
