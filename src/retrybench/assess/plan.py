"""The runs `retrybench assess` needs on one setup (model, GPU, workload, client): every control of Table 1
and the retention policies at the setup's burst, and the burst grid each control's critical burst is
searched on. Pure: specs in, specs out; nothing runs here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.config import BreakerPolicy, ClientPolicy, ProxyPolicy, load_condition
from retrybench.plan.blocks import BLOCKS, TABLE1
from retrybench.plan.recorded import WorkloadFields
from retrybench.plan.spec import PAPER_PULSE_X, RunSpec

__all__ = ["BEYOND_CONTROLS", "PAPER_GRID", "AssessSetup", "Grid", "assess_specs", "burst_grids", "burst_of",
           "controls", "with_burst"]

BASELINE = "no-control"
Grid = tuple[Decimal, Decimal, Decimal]  # low, high, step (x C-hat)
# The paper trace's pulse grid: reproduce's pulse map (sweep/boundaries.py PULSE_AXIS), so that the two
# share their runs through the cache.
PAPER_GRID: Grid = (Decimal("1.0"), Decimal("3.0"), Decimal("0.25"))
# A recorded workload's bursts come on top of its own load: their grid starts lower.
RECORDED_LOW = Decimal("0.25")
STEP = Decimal("0.25")
# Beyond the paper: the blocks whose controls an assessment may add (`--also`): the deadline controls
# (docs/deadlines.md) and the refusal answers and circuit breakers (docs/rejection.md).
BEYOND_CONTROLS = ("deadlines", "rejection")


@dataclass(frozen=True)
class AssessSetup:
    """The deployment asked about: model, GPU, token scale, client profile (None: each control's own),
    the recorded workload's RunSpec fields (empty: the paper's trace, with its pulse at `pulse_x` x C-hat)
    and the trace seeds; `also` names the blocks beyond the paper whose controls are assessed too
    (BEYOND_CONTROLS)."""

    model: str
    gpu: str = "h100"
    token_scale: float = 1.0
    client: str | None = None
    recorded: WorkloadFields = field(default_factory=lambda: WorkloadFields())
    seeds: tuple[int, ...] = (1, 2)
    pulse_x: float = PAPER_PULSE_X
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [name for name in self.also if name not in BEYOND_CONTROLS]
        if unknown:
            raise ValueError(f"unknown block(s) {', '.join(unknown)} to assess too; "
                             f"known: {', '.join(BEYOND_CONTROLS)}")

    def spec(self, condition: str, seed: int) -> RunSpec:
        """The run of `condition` on this setup at its own burst."""
        return RunSpec(model=self.model, gpu=self.gpu, condition=condition, seed=seed, token_scale=self.token_scale,
                       client=self.client, pulse_x=self.pulse_x, **self.recorded)


def _candidates(also: Sequence[str] = ()) -> list[str]:
    """No control first, then every condition of Table 1 and of the retention block, in Table 1's order (then
    those of the blocks in `also`), the retries-off ones last: under a client profile they are the retries-on
    ones, named so."""
    names = [BASELINE]
    for block in [*TABLE1.values(), BLOCKS["retention"], *(BLOCKS[name] for name in also)]:
        names += [c for c in block.conditions if c not in names]
    return sorted(names, key=lambda name: name.startswith("retries-off"))


def controls(client: str | None = None, also: Sequence[str] = ()) -> dict[str, tuple[str, ...]]:
    """Each distinct control -> every condition name that runs the same policies on this setup (under
    `client`, a profile that replaces each condition's client, the retries-off conditions are the
    retries-on ones): the runs would be identical, so each is run once, under its first name."""
    replaced: ClientPolicy | None = load_client_profile(client) if client is not None else None
    groups: dict[tuple[ClientPolicy, ProxyPolicy, int | str | None, BreakerPolicy | None], list[str]] = {}
    for name in _candidates(also):
        condition = load_condition(name)
        key = (replaced or condition.client, condition.proxy, condition.engine_cap, condition.breaker)
        groups.setdefault(key, []).append(name)
    return {members[0]: tuple(members) for members in groups.values()}


def assess_specs(setup: AssessSetup, names: Sequence[str]) -> list[RunSpec]:
    """Every control in `names` on every seed of the setup, at the setup's burst."""
    return [setup.spec(name, seed) for name in names for seed in setup.seeds]


def burst_of(setup: AssessSetup) -> float | None:
    """The setup's burst in multiples of C-hat: the paper trace's pulse, or the largest --pulse over a recorded
    workload (None: a recorded workload without a burst)."""
    if not setup.recorded:
        return setup.pulse_x
    return max((x for _, _, x in setup.recorded.get("pulses", ())), default=None)


def burst_grids(setup: AssessSetup) -> tuple[Grid, ...]:
    """(low, high, step) of each stage of the burst search: first the paper's pulse map grid (a recorded
    workload's starting lower, and either reaching past the setup's own burst where that is larger), then
    one as long again above it for the controls that survived the whole first one; () where there is no
    burst to size."""
    burst = burst_of(setup)
    if burst is None:
        return ()
    low, high, step = PAPER_GRID if not setup.recorded else (RECORDED_LOW, PAPER_GRID[1], STEP)
    wanted = Decimal(str(burst))
    if wanted >= high:
        high = (wanted / step).to_integral_value(rounding="ROUND_CEILING") * step + Decimal(1)
    return (low, high, step), (high, 2 * high, step)


def with_burst(spec: RunSpec, x: float) -> RunSpec:
    """`spec` with its burst at `x` x C-hat: the paper's pulse, or every --pulse of a recorded workload
    (their start and length kept)."""
    if spec.workload_file is None:
        return replace(spec, pulse_x=x)
    return replace(spec, pulses=tuple((at, duration, x) for at, duration, _ in spec.pulses))
