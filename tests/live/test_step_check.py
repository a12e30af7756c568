"""A traced vLLM's steps priced by the simulated profile (realvllm/step_check.py), on a hand-made trace."""

from __future__ import annotations

import pytest

from retrybench.engine.kernel_steps import ChunkList
from retrybench.realvllm.step_check import StepSample, classify, step_samples, summarize_classes

CALLS: list[tuple[int, int, int, float, int, int]] = []
CHUNKS: list[list[tuple[int, int]]] = []


def timer(seqs: int, tokens: int, sampled: int, pairs: float, context: int, decode_context: int,
          chunks: ChunkList = (), /) -> float:
    """Records its arguments; one trace second per token."""
    CALLS.append((seqs, tokens, sampled, pairs, context, decode_context))
    CHUNKS.append(list(chunks))
    return float(tokens)


TRACE = [
    {"event": "queued", "execution": 0, "prompt_tokens": 6},
    {"event": "queued", "execution": 1, "prompt_tokens": 4},
    # execution 0 admitted with a 2-token prefix hit, computes 3 of its 4 missing prompt tokens
    {"event": "step", "start_s": 0.0, "end_s": 0.5, "prompt_tokens": {"0": 3}, "decode": [], "cached_tokens": {"0": 2}},
    # execution 0 ends its prompt (samples its first token); execution 1 computes its whole prompt
    {"event": "step", "start_s": 0.5, "end_s": 1.5, "prompt_tokens": {"0": 1, "1": 4}, "decode": [],
     "cached_tokens": {"1": 0}},
    {"event": "step", "start_s": 1.5, "end_s": 1.6, "prompt_tokens": {}, "decode": [0, 1], "cached_tokens": {}},
]


def test_each_step_is_priced_with_the_arguments_the_simulated_scheduler_accumulates() -> None:
    CALLS.clear()
    CHUNKS.clear()
    samples = step_samples(TRACE, timer, speed=2.0, time_scale=0.1)
    assert CALLS == [
        (1, 3, 0, 3 * 2 + 3 * 4 / 2, 5, 0),  # 3 new tokens after 2 computed: pairs 3 x 2 + 6
        (2, 5, 2, (1 * 5 + 1) + (0 + 4 * 5 / 2), 6 + 4, 0),
        (2, 2, 2, 7 + 5, 12, 12),  # decodes at context 6 + 1 and 4 + 1
    ]
    assert CHUNKS == [[(3, 2)], [(1, 5), (4, 0)], []]  # each prefill chunk with its prefix
    assert [s.live_s for s in samples] == pytest.approx([0.5, 1.0, 0.1])
    assert [s.model_s for s in samples] == pytest.approx([3 / 2 * 0.1, 5 / 2 * 0.1, 2 / 2 * 0.1])
    assert [(s.prefill_tokens, s.decodes, s.seqs) for s in samples] == [(3, 0, 1), (5, 0, 2), (0, 2, 2)]


def test_steps_are_grouped_by_kind_with_the_ratio_of_their_sums() -> None:
    samples = [StepSample(live_s=0.2, model_s=0.1, prefill_tokens=5000, decodes=10, seqs=15),
               StepSample(live_s=0.4, model_s=0.3, prefill_tokens=6000, decodes=0, seqs=5),
               StepSample(live_s=0.1, model_s=0.2, prefill_tokens=0, decodes=200, seqs=200)]
    assert classify(samples[0]) == "prefill 4K-8K tokens + decodes"
    assert classify(samples[1]) == "prefill 4K-8K tokens"
    assert classify(samples[2]) == "decode only, 192+ sequences"
    rows = summarize_classes(samples)
    assert [r.name for r in rows] == ["prefill 4K-8K tokens", "prefill 4K-8K tokens + decodes",
                                      "decode only, 192+ sequences"]
    assert rows[2].live_over_model == pytest.approx(0.5) and rows[0].live_share_pct == pytest.approx(400 / 7)
