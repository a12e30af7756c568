"""What one scheduler step produces: the `Batch` the engine core runs, and the `Counters` that the
batches' outputs advance (vLLM's Prometheus counters, served by the engine server's /metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retrybench.engine.request import Request

__all__ = ["Batch", "Counters"]


@dataclass(slots=True)
class Batch:
    """One engine step. `entries` are prefill chunks (and the rare decode scheduled on the slow
    path): (request, tokens, samples a token, epoch at scheduling); `decode` holds the decodes.

    Decodes of the decode group are kept as the group's members (`decoders`, each with one token,
    `finals` those whose last token this is) until the scheduler turns them into plain
    (request, epoch) pairs (`explicit_decode`)."""

    step_id: int
    entries: list[tuple[Request, int, bool, int]]
    prompt_tokens: list[int]  # per entry, prompt tokens computed (0 for decode)
    seqs: int = 0
    tokens: int = 0
    sampled: int = 0
    attention_pairs: float = 0.0
    context_tokens: int = 0
    decode_context_tokens: int = 0  # of those, the context of the decodes (one query token each)
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (tokens, prefix) of each entry
    explicit_decode: list[tuple[Request, int]] = field(default_factory=list)  # (request, epoch): one token each
    preempted: list[int] = field(default_factory=list)
    admitted: list[tuple[int, int]] = field(default_factory=list)  # (rid, prefix-cache hit tokens)
    decoders: list[Request] | None = None  # the decode group's members scheduled in this step
    finals: list[Request] | None = None  # of those, the ones whose last token this is
    group_step: int = -1  # the decode clock's step number, when the decode group was scheduled
    dropped: int = 0  # decoders aborted since: their outputs are discarded
    start_s: float = 0.0  # set by the engine core when it issues the batch
    end_s: float = 0.0

    @property
    def decode(self) -> list[tuple[Request, int]]:
        """(request, epoch) of every decode (one token each), in running order."""
        if self.decoders is None:
            return self.explicit_decode
        # A member's epoch cannot change while its batch is pending (see Scheduler._preempt).
        return self.explicit_decode + [(request, request.epoch) for request in self.decoders]

    def decode_rids(self) -> list[int]:
        """The decoding executions' ids, in running order (for the trace)."""
        rids = [request.rid for request, _epoch in self.explicit_decode]
        if self.decoders is not None:
            rids += [request.rid for request in self.decoders]
        return rids


@dataclass(slots=True)
class Counters:
    """vLLM's Prometheus counters, kept with vLLM's rules (see docs/vllm-v1-semantics.md)."""

    prompt_tokens_total: int = 0  # full prompt length, at the first output token, first admission only
    prefix_cache_queries_total: int = 0  # full prompt length, at first admission
    prefix_cache_hits_total: int = 0
    num_preemptions_total: int = 0  # counted with the preempted request's next output
    generation_tokens_total: int = 0
