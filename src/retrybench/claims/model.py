"""What a claim of the paper is, the runs it is checked on, and what checking it yields.

A claim is checked on one subject (a model and trace seed, sometimes with a condition, pulse or step
size) by one predicate. The predicate fetches the runs it reads through `Check.run`, records each
figure beside the paper's (`Check.figure`) and states each part of the claim (`Check.expect`). The
finding tests and the report both evaluate claims this way, so a test's assertion and a report's
verdict cannot drift apart. Pure: the caller supplies the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from retrybench.records.results import RunSummary

__all__ = ["Case", "Check", "Claim", "Fetch", "Figure", "MissingFigure", "Outcome", "Pairs", "Part", "Row", "Subject",
           "Variant", "all_subjects", "number"]


class Fetch(Protocol):
    """Returns the summary of one run: a simulated run, a live one, or one read from a report's files.
    Raises when the run is missing or failed (the report turns that into a check not evaluated)."""

    def __call__(self, model: str, condition: str, seed: int, **overrides: Any) -> RunSummary: ...


class MissingFigure(ValueError):
    """A figure a claim compares is absent from the run (None: nothing to measure it on)."""


def number(name: str, value: float | None) -> float:
    """A figure a claim compares; None fails the check with the figure's name rather than a TypeError."""
    if value is None:
        raise MissingFigure(f"{name} is missing from the run")
    return float(value)


Pairs = Callable[[str, tuple[str, ...]], list[tuple[str, int]]]
"""(block, models) -> the (model, seed) runs of that block to check: the paper's counts in the tests,
the runs present in the report."""


@dataclass(frozen=True, kw_only=True)
class Subject:
    """What one check of a claim is about: a model's trace seed, and the claim's variant for it."""

    model: str
    seed: int
    block: str = ""  # the block whose runs are read (only where a claim spans blocks: Section 6.5)
    condition: str = ""
    pulse_x: float | None = None
    steps: int | None = None  # max batched tokens per step

    def label(self) -> str:
        """How the report names it: model, run, and the variant."""
        extra = [self.block, self.condition,
                 f"pulse {self.pulse_x}" if self.pulse_x is not None else "",
                 f"{self.steps} tokens" if self.steps is not None else ""]
        return ", ".join([f"{self.model} run {self.seed}", *(e for e in extra if e)])

    def test_id(self) -> str:
        """How a test's node id names it."""
        extra = [self.block, self.condition, f"pulse{self.pulse_x}" if self.pulse_x is not None else "",
                 str(self.steps) if self.steps is not None else ""]
        return "-".join([f"{self.model}-run{self.seed}", *(e for e in extra if e)])


@dataclass(frozen=True)
class Variant:
    """One variant of a claim per (model, seed): a condition, pulse or step size it is checked at."""

    condition: str = ""
    pulse_x: float | None = None
    steps: int | None = None


# A figure a check measured or the paper gives: a number, an outcome, words ("more than half") or None
# where there is none; a [low, high] range or a list of numbers; numbers or outcomes by name.
Figure = bool | float | str | None | Sequence[float | None] | Mapping[str, bool | float | None]


@dataclass(frozen=True)
class Part:
    """One stated part of a claim and whether it held."""

    text: str
    held: bool


@dataclass(frozen=True)
class Outcome:
    """A claim checked on one subject: its parts, and the measured figures beside the paper's."""

    parts: tuple[Part, ...]
    measured: Mapping[str, Figure]
    paper: Mapping[str, Figure]

    @property
    def held(self) -> bool:
        return all(p.held for p in self.parts)

    def explain(self) -> str:
        """Which parts failed, with the measured figures: an assertion's message."""
        failed = "; ".join(p.text for p in self.parts if not p.held) or "none"
        figures = ", ".join(f"{k}={v!r}" for k, v in self.measured.items())
        return f"failed: {failed} (measured: {figures})"


class Check:
    """The context a claim's predicate runs in: the runs, the subject, the thresholds, and what it found."""

    def __init__(self, claim: Claim, subject: Subject, fetch: Fetch) -> None:
        self.claim = claim
        self.subject = subject
        self.thresholds = claim.thresholds
        self._fetch = fetch
        self._parts: list[Part] = []
        self._measured: dict[str, Figure] = {}
        self._paper: dict[str, Figure] = {}

    def run(self, condition: str, **overrides: Any) -> RunSummary:
        """The subject's run under `condition` (and overrides such as pulse_x or max_batched_tokens)."""
        return self._fetch(self.subject.model, condition, self.subject.seed, **overrides)

    def figure(self, name: str, measured: Figure, paper: Figure = None) -> None:
        """A figure the check measured, beside the paper's (None where the paper gives none)."""
        self._measured[name] = measured
        if paper is not None:
            self._paper[name] = paper

    def expect(self, text: str, held: bool) -> None:
        """One part of the claim, stated in words, and whether it held."""
        self._parts.append(Part(text, bool(held)))

    def outcome(self) -> Outcome:
        if not self._parts:
            raise AssertionError(f"claim {self.claim.id} stated nothing to check")
        return Outcome(tuple(self._parts), dict(self._measured), dict(self._paper))


Predicate = Callable[[Check], None]
Expand = Callable[["Claim", Pairs], list[Subject]]


@dataclass(frozen=True, kw_only=True)
class Row:
    """A row of the report's summary: a finding (or section) of the paper."""

    key: str  # finding1 .. finding7, section64, section65, or an uncertain case
    title: str
    claim: str
    uncertain: bool = False  # the paper draws no conclusion: its claims are recorded, never a verdict


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One claim of the paper, checked the same way by its finding test and by the report."""

    id: str  # stable: the report's rows, headlines and pinned verdicts name it
    row: Row
    section: str
    wording: str  # the paper's claim, as the report states it
    block: str  # the block of Table 1 whose runs it reads
    models: tuple[str, ...]  # the models it is claimed for
    variants: tuple[Variant, ...] = (Variant(),)
    thresholds: Mapping[str, float] = field(default_factory=dict)
    predicate: Predicate
    expand: Expand | None = None  # subjects other than (model, seed) x variants (Section 6.5)

    def subjects(self, pairs: Pairs) -> list[Subject]:
        """The subjects this claim is checked on, for the given runs of its block."""
        if self.expand is not None:
            return self.expand(self, pairs)
        return [Subject(model=model, seed=seed, condition=v.condition, pulse_x=v.pulse_x, steps=v.steps)
                for model, seed in pairs(self.block, self.models) for v in self.variants]

    def check(self, subject: Subject, fetch: Fetch) -> Outcome:
        """The claim on one subject; raises what `fetch` raises for a missing or failed run."""
        check = Check(self, subject, fetch)
        self.predicate(check)
        return check.outcome()

    @property
    def recorded_only(self) -> bool:
        """A case the paper draws no conclusion on: its check only tells that the runs were classified."""
        return self.row.uncertain


@dataclass(frozen=True)
class Case:
    """One finding test's parameter: the claim and the subject it is checked on."""

    claim: Claim
    subject: Subject

    def __str__(self) -> str:
        return self.subject.test_id()


def all_subjects(claims: Iterable[Claim], pairs: Pairs) -> list[Case]:
    """Every (claim, subject) of these claims on the given runs."""
    return [Case(c, s) for c in claims for s in c.subjects(pairs)]
