"""The report's data, section by section: the shapes context.py (and replicas.py, boundaries.py,
real_engine.py) build, and figures.py, render.py and the templates read. Plain dicts at run time (the
page's summary.json holds them as they are), declared here so that a mistyped key is a type error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict

from retrybench.report.boundaries import BoundariesSection
from retrybench.report.deadlines import DeadlinesSection
from retrybench.report.margins import MarginsSection
from retrybench.report.real_engine import RealEngineSection
from retrybench.report.stacks import StacksSection

__all__ = ["BlockRow", "BlockSection", "CheckRow", "Counts", "FailedRow", "Fig1", "Fig1Line", "Fig3", "Fig3Bar", "Fig4",
           "Fig4Bar", "Fig5", "Fig5Bar", "Fig5Group", "Fig6", "Fig6Point", "FigSdk", "Figures", "HeadlineFigure",
           "ReplicasRow", "ReplicasSection", "ReportContext", "RetentionRow", "RobustnessRow", "RobustnessSection",
           "ScoredRow", "Scores", "SdkClientRow", "SdkPoint", "SdkSeries", "Setup", "SetupChat", "SummaryRow",
           "Table2Cell", "Table2Row", "Table3Cell", "Table3Row", "Tally", "TestVerdict", "TierCell"]

Tally = dict[str, int]  # figures per mark (within, near, off) and how many were scored


class Counts(TypedDict):
    runs: int
    unique: int
    failed: int
    recovered: int
    paper_runs: int
    paper_recovered: int


class HeadlineFigure(TypedDict):
    name: str
    paper: str
    measured: str


class TestVerdict(TypedDict):
    """A finding's verdict from the outcomes of the finding tests asserting its claims."""

    verdict: str
    reasons: list[str]
    tally: Tally | None
    basis: str


class SummaryRow(TestVerdict):
    """One finding: its claim, headline figures, checks and verdict."""

    key: str
    title: str
    claim: str
    figures: list[HeadlineFigure]
    checks: int
    passed: int
    scores: NotRequired[Tally]
    figures_note: NotRequired[str]
    margin: NotRequired[str | None]  # robust or knife-edge over the engine-speed band (margins.py); None: none
    flips_at: NotRequired[list[float]]  # the speeds at which the verdict flips


class ScoredRow(TypedDict):
    row: str
    claim: str
    subject: str
    name: str
    measured: str
    paper: str
    mark: str
    symbol: str


class Scores(TypedDict):
    tally: Tally
    figures: list[ScoredRow]


class RobustnessRow(TypedDict):
    claim: str
    finding: str
    wording: str
    model: str
    held: int
    evaluated: int
    failed_seeds: list[int]
    not_evaluated_seeds: list[int]
    robust: str


class RobustnessSection(TypedDict):
    seeds: list[int]
    not_robust: int
    scores: Tally
    scores_by_finding: dict[str, Tally]
    rows: list[RobustnessRow]


class CheckRow(TypedDict):
    finding: str
    claim: str
    id: str
    subject: str
    thresholds: str
    held: str
    measured: str
    paper: str


class Table2Cell(TypedDict):
    retries: str
    cancellation: str
    paper: str
    measured: str
    runs: int


class Table2Row(TypedDict):
    model: str
    chat_paper: str
    chat_measured: str
    cells: list[Table2Cell]


class Table3Cell(TypedDict):
    pulse_x: float
    measured: str
    paper: str


class Table3Row(TypedDict):
    model: str
    retries: str
    cells: list[Table3Cell]


class Fig1Line(TypedDict):
    condition: str
    delivered_per_60s: list[int]
    waiting: list[int]
    waiting_step_s: int


class Fig1(TypedDict):
    model: str
    seed: int | None
    lines: list[Fig1Line]


class Fig3Bar(TypedDict):
    condition: str
    runs: int
    created_x: float
    accepted_x: float
    completed_x: float


class Fig3(TypedDict):
    model: str
    bars: list[Fig3Bar]


class Fig4Bar(TypedDict):
    label: str
    body: float
    in_flight: float
    not_aborted: float
    missed: float


class Fig4(TypedDict):
    model: str
    bars: list[Fig4Bar]
    conditions: int


class Fig5Bar(TypedDict):
    condition: str
    recovered: bool
    runs: int
    primary_timely: float
    primary_late: float
    primary_undelivered: float
    pulse_timely: float
    pulse_late: float
    pulse_undelivered: float


class Fig5Group(TypedDict):
    block: str
    bars: list[Fig5Bar]


class Fig5(TypedDict):
    model: str
    groups: list[Fig5Group]


class Fig6Point(TypedDict):
    block: str
    condition: str
    model: str
    seed: int
    created_x: float
    primary_timely_pct: float
    recovered: bool


class Fig6(TypedDict):
    points: list[Fig6Point]


class SdkPoint(TypedDict):
    pulse_x: float
    runs: int
    hold_pct: float
    recovered: float


class SdkSeries(TypedDict):
    condition: str
    client: str
    points: list[SdkPoint]


class FigSdk(TypedDict):
    conditions: list[str]
    series: list[SdkSeries]


class Figures(TypedDict):
    fig1: Fig1
    fig3: Fig3
    fig4: Fig4
    fig5: Fig5
    fig6: Fig6
    sdk: FigSdk


class BlockRow(TypedDict):
    model: str
    seed: int
    pulse_x: float
    steps: int
    condition: str
    cells: list[str]
    error: str | None
    file: str


class BlockSection(TypedDict):
    name: str
    section: str
    paper: bool  # a block of the paper's Table 1, or beyond it
    models: list[str]
    rows: list[BlockRow]
    columns: list[str]
    seeds: list[int]
    paper_runs: dict[str, int]


class RetentionRow(TypedDict):
    model: str
    condition: str
    retained: bool
    runs: int
    recovered: str
    pulse_delivered_pct: str
    retries_refused: int
    gave_up: int
    served_retained: int
    executions_created: int
    calls_delivered: int


class SdkClientRow(TypedDict):
    model: str
    pulse_x: float
    client: str
    condition: str
    runs: int
    recovered: str
    hold_delivered_pct: str
    pulse_delivered_pct: str
    executions_per_delivered_call: str


class TierCell(TypedDict):
    recovered: str
    pulse: str
    attached: str


class ReplicasRow(TypedDict):
    replicas: int
    router: str
    condition: str
    chat: str
    tiers: list[TierCell]


class ReplicasSection(TypedDict):
    tiers: list[str]
    rows: list[ReplicasRow]
    sentences: list[str]
    proxies: str
    runs: int
    proxy_tiers: int


class RejectionRow(TypedDict):
    group: str  # "retry budget", "engine cap" or "circuit breaker"
    condition: str
    answer: str  # the refusal's status and headers, in words
    client: str
    runs: int
    refused: str  # attempts refused per 1,000 calls (mean over runs)
    retries: str  # retries sent per 1,000 calls
    failed_pct: str  # calls given up
    timely_pct: str  # the primary cohort's timely share
    recovered: str
    drain_to_full_service_s: str  # breaker rows only


class RejectionBar(TypedDict):
    condition: str
    client: str
    retries_per_1000: float


class RejectionSection(TypedDict):
    rows: list[RejectionRow]
    bars: list[RejectionBar]
    answer: str
    runs: int


class SetupChat(TypedDict):
    model: str
    gpu: str
    prompts: str
    measured: str
    paper: str


class Setup(TypedDict):
    chat: list[SetupChat]
    gpus: list[str]
    models: list[str]
    code_versions: list[str]
    run_wall_s: float


class FailedRow(TypedDict):
    spec: str
    block: str
    error: str


class ReportContext(TypedDict):
    """Everything the report shows."""

    meta: Mapping[str, object]  # report/meta.py's RunMeta, or what a test passes
    source: str  # "reproduce" or "pytest"
    counts: Counts
    summary: list[SummaryRow]
    scores: Scores
    robustness: RobustnessSection | None
    checks: list[CheckRow]
    table2: list[Table2Row]
    table3: list[Table3Row]
    figures: Figures
    blocks: list[BlockSection]
    retention: list[RetentionRow]
    sdk_clients: list[SdkClientRow]
    sdk_verdicts: list[str]
    replicas: ReplicasSection | None
    setup: Setup
    failed: list[FailedRow]
    tests: list[Mapping[str, object]] | None  # the finding tests' outcomes (pytest --report)
    files: list[str]
    real_engine: NotRequired[RealEngineSection | None]
    margins: NotRequired[MarginsSection | None]  # the verdicts over the engine-speed band (None: not run)
    boundaries: NotRequired[BoundariesSection]
    stacks: NotRequired[StacksSection | None]  # the stacked-retries block (report/stacks.py)
    deadlines: NotRequired[DeadlinesSection | None]  # the deadlines block (None: not run)
    rejection: NotRequired[RejectionSection | None]  # beyond the paper: report/rejection.py
