"""A request inside the simulated engine, as the scheduler (scheduler.py) sees it.

Its status, its prompt and output progress, and the KV blocks it holds. While it decodes in the
scheduler's decode group its counters are not stepped one by one but derived from the group's
`DecodeClock` (why and how: scheduler.py's docstring). Its underscored fields are that bookkeeping,
written only by the scheduler; the rest of the engine reads the public fields and properties.
"""

from __future__ import annotations

from retrybench.engine.kv import Owner

__all__ = ["ABORTED", "FINISHED", "RUNNING", "WAITING", "DecodeClock", "Request", "cdiv"]

WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"


class DecodeClock:
    """Decode-group steps so far: `scheduled` were built, the first `processed` of them applied.
    Each lazy request points at its scheduler's clock (with the block size) to derive its counters."""

    __slots__ = ("block_size", "processed", "scheduled")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.scheduled = 0
        self.processed = 0


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers."""
    return -(-a // b)


class Request:
    """One execution inside the engine.

    While in the decode group (`_clock` set) it is scheduled in every decode-group step from
    `_lazy_from` to `_lazy_to` (the one with its last token); the underscored counters hold their
    values at joining, or at the output of a batch built before it, and the public properties add
    the steps since.
    """

    __slots__ = (
        "_anon",
        "_clock",
        "_lazy_from",
        "_lazy_to",
        "_num_computed",
        "_out",
        "_out_scheduled",
        "aborted_in_flight_tokens",
        "admitted",
        "arrival_s",
        "chain",
        "computed_prompt_tokens",
        "epoch",
        "first_scheduled_step",
        "first_token",
        "max_tokens",
        "own",
        "own_k",
        "preemptions",
        "prefill_len",
        "prefix_k",
        "prompt_len",
        "recomputed_tokens",
        "rid",
        "status",
        "uncounted_preemptions",
    )

    def __init__(self, rid: int, prompt_len: int, max_tokens: int, own: Owner, arrival_s: float) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.own = own  # this prompt's own cacheable blocks (shared by every attempt of a call)
        self.arrival_s = arrival_s
        self.status = WAITING
        self._num_computed = 0  # tokens whose KV is computed or scheduled to be
        self.prefill_len = prompt_len  # after a preemption: prompt + outputs so far
        self._out = 0  # output tokens produced (batches processed)
        self._out_scheduled = 0  # output tokens that scheduled batches will produce
        self.epoch = 0  # bumped by preemption: outputs of older batches are discarded
        self.prefix_k = 0  # references to the shared-prefix owner's blocks [0, k)
        self.own_k = 0  # references to the own owner's blocks [0, k)
        self._anon = 0  # private blocks holding no hittable content
        self.chain = True  # False once a block could not be registered (duplicate content)
        self.admitted = False
        self.first_token = False
        self.first_scheduled_step: int | None = None
        self.computed_prompt_tokens = 0  # computed, not from cache; recomputation included
        self.recomputed_tokens = 0  # of which computed again after a preemption
        self.aborted_in_flight_tokens = 0
        self.preemptions = 0
        self.uncounted_preemptions = 0  # vLLM reports a preemption with the request's next output
        self._clock: DecodeClock | None = None  # set while in the decode group
        self._lazy_from = 0
        self._lazy_to = 0

    def _scheduled_lazily(self) -> int:
        """Decode-group steps that scheduled a token of it since it joined."""
        clock = self._clock
        if clock is None:
            return 0
        return min(clock.scheduled, self._lazy_to + 1) - self._lazy_from

    def _processed_lazily(self) -> int:
        """Of those, the steps whose output was applied."""
        clock = self._clock
        if clock is None:
            return 0
        return min(max(clock.processed - self._lazy_from, 0), self._lazy_to + 1 - self._lazy_from)

    @property
    def num_computed(self) -> int:
        return self._num_computed + self._scheduled_lazily()

    @property
    def out_scheduled(self) -> int:
        return self._out_scheduled + self._scheduled_lazily()

    @property
    def out(self) -> int:
        return self._out + self._processed_lazily()

    @property
    def anon(self) -> int:
        # A decoder takes a new private block whenever its token count crosses a block boundary.
        clock = self._clock
        if clock is None:
            return self._anon
        size = clock.block_size
        return self._anon + cdiv(self.num_computed, size) - cdiv(self._num_computed, size)

    @property
    def blocks(self) -> int:
        return self.prefix_k + self.own_k + self.anon
