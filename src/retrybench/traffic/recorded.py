"""A recorded workload as a run's trace: its arrivals, optionally rescaled to a multiple of C-hat, with
bursts laid over it the way the paper's pulse is made (Poisson arrivals at X x C-hat for a while).

A burst's calls take their prompt and output lengths from rows of the file drawn at random (with
replacement), so the bursts look like the recorded traffic rather than like the paper's 12K-token
prompts. Like the paper's trace, the result is fully determined by (file, options, seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retrybench.conditions.config import WorkloadSpec
from retrybench.traffic.workload import Call, Trace, poisson_arrivals
from retrybench.traffic.workload_file import RecordedWorkload, Row

__all__ = ["MAX_RATE_X", "Pulse", "parse_pulse", "recorded_trace", "rescaled"]

MAX_RATE_X = 100.0  # the paper's trace allows rates up to 100 x C-hat too


@dataclass(frozen=True, slots=True)
class Pulse:
    """A burst: extra arrivals at `x` times C-hat for `duration_s` seconds from `at_s`."""

    at_s: float
    duration_s: float
    x: float

    def __post_init__(self) -> None:
        if not (0 <= self.at_s < math.inf):
            raise ValueError(f"a pulse starts at a finite time >= 0 s, got {self.at_s:g}")
        if not (0 < self.duration_s < math.inf):
            raise ValueError(f"a pulse lasts a finite time > 0 s, got {self.duration_s:g}")
        if not (0 < self.x <= MAX_RATE_X):
            raise ValueError(f"a pulse's rate is in (0, {MAX_RATE_X:g}] x C-hat, got {self.x:g}")

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.at_s, self.duration_s, self.x)


def parse_pulse(text: str) -> Pulse:
    """`AT:DURATION:X` (seconds, seconds, multiple of C-hat), e.g. `300:107:2.7`."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"{text!r}: give AT:DURATION:X, e.g. 300:107:2.7")
    try:
        at_s, duration_s, x = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r}: AT, DURATION and X are numbers, e.g. 300:107:2.7") from None
    try:
        return Pulse(at_s, duration_s, x)
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from None


def rescaled(rows: Sequence[Row], rate_calls_per_s: float) -> tuple[Row, ...]:
    """The rows with their arrival times stretched or compressed so that their mean rate (rows over the
    last arrival) is `rate_calls_per_s`; order and gaps' proportions are kept."""
    span = rows[-1].arrival_s if rows else 0.0
    if span <= 0:
        raise ValueError("every call arrives at 0 s: the file has no rate to rescale")
    if not (0 < rate_calls_per_s < math.inf):
        raise ValueError(f"the target rate must be finite and > 0, got {rate_calls_per_s:g}")
    factor = len(rows) / (span * rate_calls_per_s)
    return tuple(Row(line=r.line, arrival_s=r.arrival_s * factor, prompt_tokens=r.prompt_tokens,
                     output_tokens=r.output_tokens, prefix_tokens=r.prefix_tokens, call_id=r.call_id) for r in rows)


def _bursts(rows: Sequence[Row], pulses: Sequence[Pulse], chat: float, seed: int) -> list[tuple[float, Row]]:
    """Each pulse's arrivals with the row each one copies its lengths from; one generator, pulse by pulse."""
    rng = np.random.default_rng([seed, 4])
    found: list[tuple[float, Row]] = []
    for pulse in pulses:
        times = poisson_arrivals(rng, pulse.x * chat, pulse.at_s, pulse.end_s)
        picks = rng.integers(0, len(rows), len(times)).tolist()
        found += [(t, rows[i]) for t, i in zip(times, picks, strict=True)]
    return found


def _phases_spec(chat: float, prefix: int, rate: float, pulses: Sequence[Pulse], end_s: float) -> WorkloadSpec:
    """The trace's phases for the analysis: the pulse from the first burst's start to the last one's end
    (none: an empty pulse at 0), the hold from there to the last arrival."""
    start = min((p.at_s for p in pulses), default=0.0)
    stop = max((p.end_s for p in pulses), default=0.0)
    return WorkloadSpec(chat_calls_per_s=chat, base_rate_x=min(rate / chat, MAX_RATE_X),
                        pulse_rate_x=max((p.x for p in pulses), default=0.0), base_s=start, pulse_s=stop - start,
                        hold_s=max(end_s - stop, 0.0), shared_prefix_tokens=prefix,
                        prompt_tokens_mean=max(WorkloadSpec.prompt_tokens_mean, prefix + 16.0),
                        short_prompt_tokens_mean=max(WorkloadSpec.short_prompt_tokens_mean, prefix + 16.0))


def recorded_trace(workload: RecordedWorkload, *, chat: float, seed: int, rate_x: float | None = None,
                   pulses: Sequence[Pulse] = ()) -> Trace:
    """The run's trace: the file's calls (phase "base"), at `rate_x` x C-hat when given, with each pulse's
    calls (phase "pulse") merged in by arrival; ids are the file's `call_id` or generated as the paper's."""
    rows = rescaled(workload.rows, rate_x * chat) if rate_x is not None else workload.rows
    timed = [(r.arrival_s, 0, r, "base") for r in rows]
    timed += [(t, 1, r, "pulse") for t, r in _bursts(rows, pulses, chat, seed)]
    timed.sort(key=lambda item: (item[0], item[1]))
    given = {r.call_id: r.line for r in rows if r.call_id is not None}
    calls: list[Call] = []
    for index, (arrival_s, _, row, phase) in enumerate(timed):
        call_id = row.call_id if phase == "base" and row.call_id is not None else f"call-{seed}-{index:06d}"
        if call_id in given and (phase != "base" or row.call_id is None):
            raise ValueError(f"{workload.name}: line {given[call_id]}: call_id {call_id!r} is the id generated "
                             f"for call {index}: give every row a call_id, or none that looks like call-SEED-N")
        calls.append(Call(index=index, call_id=call_id, arrival_s=arrival_s, prompt_tokens=row.prompt_tokens,
                          response_tokens=row.output_tokens, phase=phase))
    end_s = max([rows[-1].arrival_s, *(p.end_s for p in pulses)])
    rate = len(rows) / rows[-1].arrival_s if rows[-1].arrival_s > 0 else MAX_RATE_X * chat
    spec = _phases_spec(chat, workload.prefix_tokens, rate, pulses, end_s)
    return Trace(spec=spec, seed=seed, calls=tuple(calls))
