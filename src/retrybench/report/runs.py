"""The runs a report is built from: run results (results.RunSummary, or a failed run's record), each
placed in the blocks of Table 1 whose run specs it matches.

A simulated run's result depends only on its spec, so one result can serve two blocks (the diagnostic
block's retries-on run at 2.7 C-hat is also a trigger-sweep run); it is then listed in both, as the
paper counts it (137 runs by condition). Runs of the blocks beyond the paper are entries of their own
(`beyond`), never counted among Table 1's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from retrybench.plan.blocks import BLOCKS, TABLE1, block_specs
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result, RunSummary, is_failed

__all__ = ["Entry", "MissingRun", "RunFailed", "RunSet", "spec_of"]

_SPEC_FIELDS = tuple(asdict(RunSpec(model="m", condition="c", seed=0)))


def spec_of(result: Mapping[str, Any]) -> RunSpec:
    """The run spec a result (or a failed run's record) was computed from."""
    source = result.get("spec", result)  # a result's top-level engine_cap is the resolved one
    given = {k: source[k] for k in _SPEC_FIELDS if k in source}
    if isinstance(given.get("overrides"), dict):  # as_dict writes the sorted pairs as an object
        given["overrides"] = tuple(sorted(given["overrides"].items()))
    return RunSpec(**given)


class MissingRun(LookupError):
    """A claim needs a run that this set does not hold (not selected, or not run)."""


class RunFailed(RuntimeError):
    """A claim needs a run that failed; the message is the run's error."""


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One run of one block: the paper's unit of counting."""

    block: str
    result: Result

    @property
    def spec(self) -> RunSpec:
        return spec_of(self.result)

    @property
    def failed(self) -> bool:
        return is_failed(self.result)

    @property
    def summary(self) -> RunSummary | None:
        """The run's summary, or None for a failed run."""
        return None if is_failed(self.result) else self.result


class RunSet:
    """Run results indexed by spec, and the block entries they make up."""

    def __init__(self, results: Iterable[Result], runs: int | None = None, first_seed: int = 1) -> None:
        """`runs`: how many runs (seeds first_seed..first_seed + runs - 1) each block has; None for the
        paper's counts. A result is a block's run only within that count (seed 3 of the diagnostic block
        is not a trigger-sweep run, though its spec is one of the sweep's at more runs)."""
        self._by_spec: dict[RunSpec, Result] = {spec_of(result): result for result in results}
        self.runs = runs
        self.entries = _entries(self._by_spec, runs, first_seed, list(TABLE1))  # Table 1's runs
        self.beyond = _entries(self._by_spec, runs, first_seed, [n for n in BLOCKS if n not in TABLE1])

    def __len__(self) -> int:
        return len(self._by_spec)

    @property
    def results(self) -> list[Result]:
        return list(self._by_spec.values())

    def find(self, model: str, condition: str, seed: int, **overrides: Any) -> Result | None:
        """The result of this spec (RunSpec's defaults for what is not given), or None."""
        return self._by_spec.get(RunSpec(model=model, condition=condition, seed=seed, **overrides))

    def run(self, model: str, condition: str, seed: int, **overrides: Any) -> RunSummary:
        """Like find, but raises MissingRun or RunFailed: what a claim check needs (a claims.Fetch)."""
        found = self.find(model, condition, seed, **overrides)
        if found is None:
            raise MissingRun(f"{model} {condition} seed {seed} {overrides or ''}".strip())
        if is_failed(found):
            raise RunFailed(f"{model} {condition} seed {seed}: {found['error']}")
        return found

    def summaries(self, block: str | None = None) -> list[RunSummary]:
        """The summaries of the block entries that did not fail (of one block, or of all)."""
        entries = self.entries if block is None else self.block_entries(block)
        return [e.summary for e in entries if e.summary is not None]

    def block_entries(self, block: str) -> list[Entry]:
        return [e for e in (self.entries if block in TABLE1 else self.beyond) if e.block == block]

    def pairs(self, block: str, models: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """(model, seed) of the block's runs present here, models in the block's order."""
        wanted = tuple(models) if models is not None else BLOCKS[block].models
        present = {(e.spec.model, e.spec.seed) for e in self.block_entries(block)}
        return sorted((p for p in present if p[0] in wanted), key=lambda p: (wanted.index(p[0]), p[1]))


def _entries(by_spec: Mapping[RunSpec, Result], runs: int | None, first_seed: int, names: list[str]
             ) -> list[Entry]:
    """Every (block, result) whose spec is one of the named blocks', in BLOCKS' order."""
    specs = list(by_spec)
    entries = []
    for name, block in BLOCKS.items():
        if name not in names:
            continue
        for model in block.models:
            gpus = sorted({s.gpu for s in specs if s.model == model})
            for gpu in gpus:
                for spec in block_specs(name, model, runs=runs, gpu=gpu, first_seed=first_seed):
                    if spec in by_spec:
                        entries.append(Entry(block=name, result=by_spec[spec]))
    return entries
