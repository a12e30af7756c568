"""A run's trace, whichever workload its spec names: the paper's generated one, or a recorded file
replayed (docs/workloads.md).

The file is read and checked twice: when the spec is built (so a bad file is refused before any run) and
when the run computes its trace, in whichever process or cluster node that is; the second read must find
the digest the spec carries, so a cached result always belongs to the file's content.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from retrybench.conditions.config import ConfigError
from retrybench.engine.profiles import GPUS
from retrybench.plan.spec import RunSpec
from retrybench.traffic.recorded import Pulse, recorded_trace
from retrybench.traffic.workload import Trace, generate_trace
from retrybench.traffic.workload_file import RecordedWorkload, WorkloadFileError, read_workload

__all__ = ["WorkloadFields", "check_lengths", "trace_for", "workload_fields"]


class WorkloadFields(TypedDict, total=False):
    """RunSpec's recorded-workload fields; none of them for the paper's trace."""

    workload_file: str
    workload_digest: str
    workload_format: str
    rate_x: float | None
    pulses: tuple[tuple[float, float, float], ...]


def check_lengths(workload: RecordedWorkload, max_model_len: int) -> None:
    """WorkloadFileError at the first row whose prompt and output exceed the engine's max model length:
    the engine would refuse it, and shortening it would replay a different call."""
    for row in workload.rows:
        if row.prompt_tokens + row.output_tokens > max_model_len:
            raise WorkloadFileError(f"{workload.name}: line {row.line}: prompt_tokens: {row.prompt_tokens} prompt "
                                    f"+ {row.output_tokens} output tokens exceed the engine's max model length "
                                    f"({max_model_len})")


def _max_model_len(gpus: Sequence[str]) -> int:
    return min(GPUS[gpu].engine_defaults().max_model_len for gpu in gpus)


def workload_fields(path: Path, fmt: str | None, *, gpus: Sequence[str], rate_x: float | None = None,
                    pulses: Sequence[Pulse] = ()) -> WorkloadFields:
    """RunSpec's recorded-workload fields for the file at `path` read as `fmt` (None: from its header), once
    it has been read and checked whole; WorkloadFileError names the file, line and field of a bad row."""
    workload, digest = read_workload(path, fmt)
    check_lengths(workload, _max_model_len(gpus))
    if rate_x is not None and workload.duration_s <= 0:
        raise WorkloadFileError(f"{path}: every call arrives at 0 s: the file has no rate for --rate-x to rescale")
    return {"workload_file": str(path), "workload_digest": digest, "workload_format": workload.format,
            "rate_x": rate_x, "pulses": tuple(p.as_tuple() for p in pulses)}


def _recorded(spec: RunSpec) -> RecordedWorkload:
    assert spec.workload_file is not None
    workload, digest = read_workload(Path(spec.workload_file), spec.workload_format)
    if digest != spec.workload_digest:
        raise ConfigError(f"{spec.workload_file}: the file changed since the run was specified (its digest is "
                          f"{digest[:12]}, the run's {str(spec.workload_digest)[:12]})")
    check_lengths(workload, _max_model_len(spec.gpus()))
    return workload


def trace_for(spec: RunSpec, chat: float) -> Trace:
    """The calls of the run of `spec` at C-hat `chat`: the paper's trace, or the spec's recorded workload
    with its rescaling and bursts."""
    if spec.workload_file is None:
        return generate_trace(spec.workload(chat), spec.seed)
    pulses = [Pulse(*p) for p in spec.pulses]
    return recorded_trace(_recorded(spec), chat=chat, seed=spec.seed, rate_x=spec.rate_x, pulses=pulses)
