"""The run-spec fields of `--workload`, `--workload-format`, `--rate-x` and `--pulse`, or a usage error
naming the file, line and field before any run starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from retrybench.plan.engine_choice import EngineChoice
    from retrybench.plan.recorded import WorkloadFields
    from retrybench.traffic.recorded import Pulse

__all__ = ["workload_spec_fields"]


def workload_spec_fields(workload: Path | None, workload_format: str | None, rate_x: float | None,
                         pulses: Sequence[Pulse], *, gpus: Sequence[str], engine: EngineChoice) -> WorkloadFields:
    """RunSpec's fields for the options as given: none for the paper's trace. The engine server models the
    paper's shared prefix on every prompt, so a recorded workload runs on the simulated engine or a real one."""
    if workload is None:
        given = [name for name, value in (("--workload-format", workload_format), ("--rate-x", rate_x),
                                          ("--pulse", pulses or None)) if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} go with --workload (the paper's trace has --pulse-x)")
        return {}
    if engine.kind == "engine-server":
        raise click.UsageError("--workload runs on the simulated engine (sim) or a running engine's URL: the "
                               "engine server models the paper's 2,000-token shared prefix on every prompt")
    from retrybench.plan.recorded import workload_fields

    try:
        return workload_fields(workload, workload_format, gpus=gpus, rate_x=rate_x, pulses=pulses)
    except ValueError as error:  # WorkloadFileError
        raise click.BadParameter(str(error), param_hint="'--workload'") from error
