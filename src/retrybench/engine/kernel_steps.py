"""The `kernels` step model: one engine step's time from measured kernel costs plus the host's.

    t = fixed_s + per_seq_s * seqs                 host time (the only fitted part)
        + token_ops(tokens)                        every layer's GEMMs, norms, activation, embedding
        + lm_head(sampled)
        + sum over prefill chunks of attention(new tokens, prefix)
        + decode_attention(decodes, mean context)

all read from the model's kernel table on the GPU (engine/kernel_table.py). A step's kernels run one
after the other on one stream, so their times add. The decodes of a step run as one batch in the
database's measurements, each at the same context; a real batch's contexts differ, and decode attention
reads every decode's KV once, so the batch is priced at its mean context. Each prefill chunk is priced
at its own length and prefix, as vLLM's varlen attention runs it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Protocol

from retrybench.engine.kernel_table import DENSE_ROWS, DENSE_TOKENS, KernelTable

__all__ = ["ChunkList", "StepTimer", "kernel_step_timer"]

ChunkList = Sequence[tuple[int, int]]  # (new tokens, prefix) of each prefill chunk (and slow-path decode)


class StepTimer(Protocol):
    """One step's seconds from what the scheduler accumulates (see EngineProfile.step_time_s)."""

    def __call__(self, seqs: int, tokens: int, sampled: int, attention_pairs: float, context_tokens: int,
                 decode_context_tokens: int, chunks: ChunkList = (), /) -> float: ...


def kernel_step_timer(table: KernelTable, *, fixed_s: float, per_seq_s: float) -> StepTimer:
    """The step timer of `table` with these host costs, reading what the table works out once (KernelTable's
    dense lists and memos), so that pricing a step costs about what the roofline's formula does."""
    token_s, head_s = table.dense_tokens_s, table.dense_logits_s
    prefill_s, prefill_attention_s = table.prefill_memo_s, table.prefill_attention_s
    tokens_s, logits_s, decode_row_s = table.tokens_s, table.logits_s, table.decode_row_s
    decode_rows = table.decode_rows_s
    contexts = table.decode_context
    last = len(contexts) - 2

    def step_time_s(seqs: int, tokens: int, sampled: int, attention_pairs: float, context_tokens: int,
                    decode_context_tokens: int, chunks: ChunkList = ()) -> float:
        t = fixed_s + per_seq_s * seqs + (token_s[tokens] if tokens <= DENSE_TOKENS else tokens_s(tokens))
        if sampled:
            t += head_s[sampled] if sampled <= DENSE_ROWS else logits_s(sampled)
        for chunk in chunks:
            cost = prefill_s.get(chunk)
            if cost is None:
                cost = prefill_s[chunk] = prefill_attention_s(*chunk)
            t += cost
        decodes = seqs - len(chunks)
        if decodes > 0:  # the decode count's row of the table, read linearly at the mean context
            row = decode_rows.get(decodes) or decode_row_s(decodes)
            context = decode_context_tokens / decodes
            i = bisect_right(contexts, context) - 1
            i = 0 if i < 0 else (last if i > last else i)
            value = row[i] + (context - contexts[i]) * (row[i + 1] - row[i]) / (contexts[i + 1] - contexts[i])
            if value > 0.0:
                t += value
        return t

    return step_time_s
