"""A traced vLLM's step times beside the simulated engine's, batch for batch.

The simulator prices a step from its composition (sequences, tokens computed, tokens sampled,
attention pairs, KV tokens read, the decodes' share): `EngineProfile.step_timer`. A traced vLLM
logs each step's composition and its start and end (realvllm/vllm_trace.py). Rebuilding the same
arguments from the trace and pricing them with the profile tells where the model's costs depart
from the engine's, by kind of step, rather than as one speed factor: the way to find why a
comparison disagrees before touching a constant. Pure: the caller reads the trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median

from retrybench.engine.kernel_steps import StepTimer
from retrybench.records.tracefile import TraceEvent

__all__ = ["StepClass", "StepSample", "classify", "step_samples", "summarize_classes"]



@dataclass(frozen=True, kw_only=True, slots=True)
class StepSample:
    """One traced step: its live duration and the model's, in wall seconds, and what it held."""

    live_s: float
    model_s: float
    prefill_tokens: int
    decodes: int
    seqs: int


def step_samples(events: Iterable[TraceEvent], timer: StepTimer, *, speed: float = 1.0,
                 time_scale: float = 1.0) -> list[StepSample]:
    """Every step of a trace with the profile's price for its batch: `timer`'s trace seconds divided
    by `speed` (the simulated engine made that much faster, as realvllm.simband scales it), times
    `time_scale` (a live run at time scale 0.1 spends a tenth of a wall second per trace second)."""
    prompt_len: dict[int, int] = {}
    computed: dict[int, int] = {}
    samples: list[StepSample] = []
    for event in events:
        kind = event.get("event")
        if kind == "queued":
            prompt_len[int(event["execution"])] = int(event["prompt_tokens"])
        elif kind == "preempted":
            computed.pop(int(event["execution"]), None)  # recomputed from its prefix-cache hit on return
        elif kind == "step":
            samples.append(_priced(event, prompt_len, computed, timer, speed, time_scale))
    return samples


def _priced(step: TraceEvent, prompt_len: Mapping[int, int], computed: dict[int, int], timer: StepTimer,
            speed: float, time_scale: float) -> StepSample:
    """The step's arguments to the step timer, as the simulated scheduler accumulates them, and its
    price; `computed` (tokens each execution has computed) moves on by the step."""
    for rid, hit in step.get("cached_tokens", {}).items():
        computed[int(rid)] = int(hit)
    seqs = tokens = sampled = context = decode_context = 0
    pairs = 0.0
    prefill = 0
    chunks: list[tuple[int, int]] = []
    for rid_text, n in step.get("prompt_tokens", {}).items():
        rid, n = int(rid_text), int(n)
        before = computed.get(rid, 0)
        seqs += 1
        tokens += n
        prefill += n
        sampled += 1 if before + n >= prompt_len.get(rid, before + n) else 0
        pairs += n * before + n * (n + 1) / 2
        context += before + n
        chunks.append((n, before))
        computed[rid] = before + n
    decodes = [int(rid) for rid in step.get("decode", [])]
    for rid in decodes:
        before = computed.get(rid, prompt_len.get(rid, 0))
        decode_context += before + 1
        computed[rid] = before + 1
    seqs += len(decodes)
    tokens += len(decodes)
    sampled += len(decodes)
    pairs += decode_context
    context += decode_context
    model_s = timer(seqs, tokens, sampled, pairs, context, decode_context, chunks) / speed * time_scale
    return StepSample(live_s=float(step["end_s"]) - float(step["start_s"]), model_s=model_s,
                      prefill_tokens=prefill, decodes=len(decodes), seqs=seqs)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepClass:
    """Steps of one kind: how many, their median live and modelled times, and the ratio of the sums."""

    name: str
    steps: int
    live_median_ms: float
    model_median_ms: float
    live_over_model: float  # sum of live times / sum of modelled times
    live_share_pct: float  # of all the trace's live step time


def classify(sample: StepSample) -> str:
    """A step's kind: decodes only (by batch size), or with prefill (by prefill tokens)."""
    if sample.prefill_tokens == 0:
        size = sample.decodes
        band = "1-15" if size < 16 else "16-63" if size < 64 else "64-191" if size < 192 else "192+"
        return f"decode only, {band} sequences"
    chunk = sample.prefill_tokens
    band = "<1K" if chunk < 1024 else "1K-4K" if chunk < 4096 else "4K-8K"
    return f"prefill {band} tokens" + (" + decodes" if sample.decodes else "")


def summarize_classes(samples: list[StepSample]) -> list[StepClass]:
    """Per kind of step (`classify`), in the order of their share of live time, largest first."""
    total = sum(s.live_s for s in samples) or 1.0
    groups: dict[str, list[StepSample]] = {}
    for sample in samples:
        groups.setdefault(classify(sample), []).append(sample)
    rows = [StepClass(name=name, steps=len(group), live_median_ms=1e3 * median(s.live_s for s in group),
                      model_median_ms=1e3 * median(s.model_s for s in group),
                      live_over_model=sum(s.live_s for s in group) / max(sum(s.model_s for s in group), 1e-12),
                      live_share_pct=100 * sum(s.live_s for s in group) / total)
            for name, group in groups.items()]
    return sorted(rows, key=lambda row: -row.live_share_pct)
