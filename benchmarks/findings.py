"""Helpers of the finding tests: each test asserts one registered claim (retrybench.claims) on the
paper's runs, computed once and then read from the cache (or live, with `pytest --engine`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from fixtures.engine_runs import active
from fixtures.report import note_run

from retrybench.claims import Case, Claim, all_subjects
from retrybench.plan.blocks import paper_runs
from retrybench.plan.spec import RunSpec
from retrybench.records.results import RunSummary
from retrybench.runs.executors import run_one

__all__ = ["PRIMARY", "Record", "assert_claim", "cases", "result"]

PRIMARY = "qwen2.5-7b-instruct"

Record = Callable[..., None]
# A (model, seed), or a (model, seed, steps), on which the simulator does not reproduce a claim: the
# measured numbers, the reason of a strict xfail.
Known = Mapping[tuple[Any, ...], str]


def result(model: str, condition: str, seed: int, **overrides: Any) -> RunSummary:
    """One run's summary on the simulated engine (or live, with `pytest --engine`), computed once and
    then read from the cache; noted as used by the current test, for `pytest --report`."""
    spec = RunSpec(model=model, condition=condition, seed=seed, **overrides)
    live = active()  # pytest --engine ENGINE: run it live on that engine instead
    run = live.result(spec) if live is not None else run_one(spec)
    note_run(run)
    return run


def _paper_pairs(block: str, models: tuple[str, ...]) -> list[tuple[str, int]]:
    return [(model, seed) for model in models for seed in range(1, paper_runs(block, model) + 1)]


def cases(claim: Claim, known: Known | None = None) -> list[Any]:
    """The claim's cases on the paper's run counts, one test each. Each is marked with the claim's id
    (for `pytest --report`) and grouped so that one xdist worker computes every condition of one trace;
    `known` turns the runs the simulator does not reproduce into strict xfails with their measured numbers."""
    params = []
    for case in all_subjects((claim,), _paper_pairs):
        s = case.subject
        group = s.block or claim.block
        marks: list[Any] = [pytest.mark.claim(claim.id), pytest.mark.xdist_group(f"{group}-{s.model}-{s.seed}")]
        reason = next((known[key] for key in ((s.model, s.seed), (s.model, s.seed, s.steps), (s.model, s.seed, s.block))
                       if known and key in known), None)
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(case, id=str(case), marks=marks))
    return params


def assert_claim(case: Case, record: Record) -> None:
    """Checks the case's claim on its runs, records every figure beside the paper's, and asserts it."""
    outcome = case.claim.check(case.subject, result)
    for name, measured in outcome.measured.items():
        record(name, measured, outcome.paper.get(name))
    assert outcome.held, f"{case.claim.id} ({case.subject.label()}): {outcome.explain()}"
