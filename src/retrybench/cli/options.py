"""The command line's vocabulary and the option declarations its commands share.

One option name per concept across commands (VOCABULARY), vLLM's and GuideLLM's names where the concept
is theirs (`--max-num-queued-reqs`, `--max-num-batched-tokens`, `--target`). The rules:
- several values of one concept go in the same option, repeated or comma-separated (`--condition a,b`);
- `--seed` is always a value (several: `--seed 1,2,3` or `--seed 1-10`);
- `--out` is always a directory; a command that writes one file takes it as its argument;
- `--json` always prints one JSON document on stdout instead of the human-readable output.

A spelling an earlier release used still works for one release (`Retired`): hidden from --help, rewritten
to the current one before parsing (so it behaves exactly as before), with one line on stderr naming the
new spelling.

Declaring a command imports nothing heavy: choices that live behind numpy (the blocks, the router
policies) are loaded when a command's help or arguments need them (`LazyChoice`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from retrybench.conditions.client_profiles import available_client_profiles, client_profile
from retrybench.conditions.config import ConfigError, available_conditions
from retrybench.engine.profiles import GPUS, MODELS
from retrybench.plan.engine_choice import EngineChoice, EngineKind, parse_engine

__all__ = [
    "GPU_CHOICE",
    "MODEL_CHOICE",
    "RUNS",
    "SEEDS",
    "TIME_SCALE_HELP",
    "VOCABULARY",
    "Argument",
    "CommaList",
    "Command",
    "Concept",
    "LazyChoice",
    "Retired",
    "VocabularyOption",
    "as_argument",
    "client_option",
    "condition_option",
    "engine_option",
    "executor_options",
    "flat",
    "gpu_option",
    "jobs_option",
    "json_option",
    "max_num_batched_tokens_option",
    "max_num_queued_reqs_option",
    "model_option",
    "option",
    "out_option",
    "renamed",
    "runs_option",
    "seed_option",
    "seeds_counted",
    "time_scale_option",
    "token_scale_option",
    "workload_options",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Concept:
    """One thing options name: its one spelling, and the spellings earlier releases used for it."""

    canonical: str
    meaning: str
    retired: tuple[str, ...] = ()


VOCABULARY: dict[str, Concept] = {
    "engine": Concept("--engine", "the engine: sim, one started per run, or the http:// URL of a running one "
                      "(the proxy's upstreams, the engine compare-real-engine measures)",
                      ("--engine-url", "--upstream")),
    "target": Concept("--target", "where load is sent (GuideLLM's name): the proxy's URL, or an engine's"),
    "condition": Concept("--condition", "a Table 1 condition or a policy TOML file; several repeated or "
                         "comma-separated", ("--conditions", "--policy")),
    "model": Concept("--model", "the model (its engine profile); several repeated or comma-separated", ("--models",)),
    "block": Concept("--block", "a block of runs; several repeated or comma-separated", ("--blocks",)),
    "gpu": Concept("--gpu", "the GPU profile of the simulated engine"),
    "seed": Concept("--seed", "a seed value; several as 1,2,3 or 1-10", ("--seeds",)),
    "runs": Concept("--runs", "runs (traces) per block: paper (the paper's counts) or N"),
    "out": Concept("--out", "the directory a command writes into", ("--workdir",)),
    "json": Concept("--json", "print one JSON document on stdout instead of the human-readable output"),
    "jobs": Concept("--jobs", "parallel processes"),
    "executor": Concept("--executor", "where simulated runs execute: local (a process pool) or ray"),
    "address": Concept("--address", "a running Ray cluster's address"),
    "time-scale": Concept("--time-scale", "wall seconds per model second"),
    "token-scale": Concept("--token-scale", "every prompt and reply length times this"),
    "step-model": Concept("--step-model", "how the simulated engine prices a step: kernels or roofline"),
    "max-num-queued-reqs": Concept("--max-num-queued-reqs", "the engine's queue cap (vLLM's name)", ("--engine-cap",)),
    "max-num-batched-tokens": Concept("--max-num-batched-tokens", "the engine's token budget per step (vLLM's name)",
                                      ("--max-batched-tokens",)),
    "engine-connect-timeout": Concept("--engine-connect-timeout", "the proxy's limit to connect to the engine",
                                      ("--upstream-connect-timeout",)),
    "workload": Concept("--workload", "a recorded workload file replayed in place of the paper's base load"),
    "workload-format": Concept("--workload-format", "the format of the --workload file"),
    "rate-x": Concept("--rate-x", "the --workload file's arrival rate rescaled to this multiple of C-hat"),
    "pulse": Concept("--pulse", "a burst over the --workload file: AT:DURATION:X"),
    "engine-idle-timeout": Concept("--engine-idle-timeout", "the proxy's limit on an engine's silence",
                                   ("--upstream-idle-timeout",)),
}


# -- retired spellings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retired:
    """A spelling of an earlier release: `old` becomes `new` (an option, or the metavar of the command's
    argument, which then takes the value), its value rewritten by `value` where the meaning changed."""

    old: str
    new: str
    value: Callable[[str], str] | None = None

    @property
    def to_argument(self) -> bool:
        return not self.new.startswith("-")

    def notice(self, command_path: str) -> str:
        new = f"the {self.new} argument" if self.to_argument else self.new
        return (f"{command_path}: {self.old} is deprecated, use {new} (the old spelling will be removed in the "
                "next release)")


def renamed(concept: str, old: str) -> Retired:
    """`old`, the retired spelling of a concept of VOCABULARY, now its canonical one."""
    if old not in VOCABULARY[concept].retired:
        raise ValueError(f"{old} is not a retired spelling of {concept}")
    return Retired(old, VOCABULARY[concept].canonical)


def as_argument(old: str, metavar: str) -> Retired:
    """`old FILE`, an option of an earlier release, now the command's argument `metavar`."""
    return Retired(old, metavar)


def _first_n_seeds(text: str) -> str:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise click.BadParameter(f"{text!r} is not a whole number >= 1", param_hint="'--seeds'")
    return f"1-{count}"


def seeds_counted() -> Retired:
    """`--seeds N`, the first N trace seeds, now `--seed 1-N`."""
    return Retired("--seeds", VOCABULARY["seed"].canonical, _first_n_seeds)


class Command(click.Command):
    """A command that still accepts its retired spellings and documents its arguments."""

    def __init__(self, *args: Any, retired: Sequence[Retired] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retired = tuple(retired)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, list(self.current_spelling(ctx, args)))

    def current_spelling(self, ctx: click.Context, args: Sequence[str]) -> Iterator[str]:
        """`args` with each retired spelling (`--old V` or `--old=V`) rewritten, noticed once on stderr."""
        retired = {r.old: r for r in self.retired}
        noticed: set[str] = set()
        rest = iter(args)
        for token in rest:
            if token == "--":
                yield token
                yield from rest
                return
            old, eq, inline = token.partition("=")
            found = retired.get(old)
            if found is None:
                yield token
                continue
            if old not in noticed and not ctx.resilient_parsing:
                click.echo(found.notice(ctx.command_path), err=True)
                noticed.add(old)
            value = inline if eq else next(rest, None)
            if not found.to_argument:
                yield found.new
            if value is not None and found.value is not None:
                try:
                    value = found.value(value)
                except click.BadParameter as error:
                    error.ctx = ctx
                    raise
            if value is not None:
                yield value

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(param.make_metavar(ctx), param.help + _choices(param)) for param in self.get_params(ctx)
                if isinstance(param, Argument)]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)


def _choices(param: click.Parameter) -> str:
    return f" One of: {', '.join(map(str, param.type.choices))}." if isinstance(param.type, click.Choice) else ""


class Argument(click.Argument):
    """A positional argument with help text (shown under Arguments by `Command`)."""

    def __init__(self, param_decls: Sequence[str], help: str, **attrs: Any) -> None:
        super().__init__(param_decls, **attrs)
        self.help = help


# -- option types -------------------------------------------------------------------------------------

if TYPE_CHECKING:
    _Choice = click.Choice[str]
else:
    _Choice = click.Choice


class LazyChoice(_Choice):
    """A choice whose values are computed when first needed (parsing or help), not when declared."""

    def __init__(self, load: Callable[[], Iterable[str]]) -> None:
        self._load = load
        self.case_sensitive = True

    @cached_property
    def choices(self) -> Sequence[str]:  # type: ignore[override]
        return tuple(self._load())


class CommaList(click.ParamType):  # type: ignore[type-arg]
    """Comma-separated values (the option may also be repeated); `flat` joins the repetitions."""

    name = "list"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(item.strip() for item in str(value).split(",") if item.strip())


def flat(ctx: click.Context, param: click.Parameter, value: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The values of a repeated comma-separated option, in order."""
    return tuple(item for given in value for item in given)


class Runs(click.ParamType):  # type: ignore[type-arg]
    """`--runs`: `paper` (None: the paper's counts) or a whole number >= 1."""

    name = "paper|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        if value == "paper":
            return None
        try:
            runs = int(value)
        except ValueError:
            runs = 0
        if runs < 1:
            self.fail(f"must be 'paper' or a whole number >= 1, got {value!r}", param, ctx)
        return runs


class Seeds(click.ParamType):  # type: ignore[type-arg]
    """Seed values: `3`, `1,2,3`, `1-10` or a mix (`1-3,7`), each >= 0, in order, each once."""

    name = "SEEDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        seeds: dict[int, None] = {}
        for part in str(value).split(","):
            first, dash, last = part.strip().partition("-")
            try:
                low, high = int(first), int(last if dash else first)
            except ValueError:
                self.fail(f"{part.strip()!r} is neither a seed nor a range of seeds (1-10)", param, ctx)
            if low < 0 or high < low:
                self.fail(f"{part.strip()!r}: seeds are >= 0 and a range goes up", param, ctx)
            seeds.update(dict.fromkeys(range(low, high + 1)))
        if not seeds:
            self.fail("give at least one seed", param, ctx)
        return tuple(seeds)


RUNS = Runs()
SEEDS = Seeds()
MODEL_CHOICE = click.Choice(sorted(MODELS))
GPU_CHOICE = click.Choice(sorted(GPUS))
TIME_SCALE_HELP = ("Wall seconds per model second: 1 is real time, 0.1 runs every clock, deadline and "
                   "policy timer ten times faster. Engine server, proxy and load generator must agree.")


# -- the shared declarations --------------------------------------------------------------------------


class VocabularyOption(click.Option):
    """An option spelled as its concept's canonical name in VOCABULARY."""

    def __init__(self, *args: Any, concept: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.concept = concept


def option(concept: str, *decls: str, **attrs: Any) -> Callable[[F], F]:
    """click.option spelled as VOCABULARY's name for `concept`; `decls` may name the parameter."""
    return click.option(VOCABULARY[concept].canonical, *decls, cls=VocabularyOption, concept=concept, **attrs)


def model_option(help: str = "The model: its engine profile and C-hat.", **attrs: Any) -> Callable[[F], F]:
    attrs.setdefault("required", True)
    return option("model", type=MODEL_CHOICE, help=help, **attrs)


def gpu_option(help: str = "The GPU profile of the simulated engine.", **attrs: Any) -> Callable[[F], F]:
    return option("gpu", type=attrs.pop("type", GPU_CHOICE), default="h100", show_default=True, help=help, **attrs)


def seed_option(help: str, default: int = 1) -> Callable[[F], F]:
    return option("seed", type=click.IntRange(min=0), default=default, show_default=True, help=help)


def time_scale_option(help: str = TIME_SCALE_HELP, **attrs: Any) -> Callable[[F], F]:
    attrs.setdefault("type", click.FloatRange(min=1e-3, max=1e3))
    return option("time-scale", default=attrs.pop("default", 1.0), show_default=True, help=help, **attrs)


def token_scale_option(help: str) -> Callable[[F], F]:
    return option("token-scale", type=click.FloatRange(min=1e-3, max=1.0), default=1.0, show_default=True, help=help)


def step_model_option() -> Callable[[F], F]:
    """`--step-model`: how the simulated engine prices a step (engine.profiles.STEP_MODELS)."""
    return option("step-model", type=click.Choice(["kernels", "roofline"]), default=None,
                  help="How the simulated engine prices a step: kernels (measured vLLM kernel times, the default "
                       "where the database has the GPU) or roofline (rooflines with efficiency priors, for "
                       "comparison; the CPU build's only model).")


def jobs_option(help: str = "Parallel processes (default: cores).") -> Callable[[F], F]:
    return option("jobs", type=click.IntRange(min=1), default=None, help=help)


def executor_options(f: F) -> F:
    """`--executor local|ray` and `--address`: where a command's simulated runs execute."""
    f = option("address", default=None, help="--executor ray: a running cluster's address (default: a local Ray).")(f)
    return option("executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                  help="local: a process pool on this machine; ray: one Ray task per run "
                       "(pip install 'retrybench[ray]'). A live --engine runs one run after another instead.")(f)


def json_option(help: str) -> Callable[[F], F]:
    return option("json", "as_json", is_flag=True, help=help)


def runs_option(help: str) -> Callable[[F], F]:
    return option("runs", type=RUNS, default="paper", show_default=True, help=help)


def out_option(help: str, *decls: str, **attrs: Any) -> Callable[[F], F]:
    return option("out", *decls, type=click.Path(file_okay=False, path_type=Path), help=help, **attrs)


def max_num_queued_reqs_option(help: str) -> Callable[[F], F]:
    return option("max-num-queued-reqs", type=click.IntRange(min=1), default=None, help=help)


def max_num_batched_tokens_option(help: str) -> Callable[[F], F]:
    return option("max-num-batched-tokens", type=click.IntRange(min=16), default=8192, show_default=True, help=help)


class PulseText(click.ParamType):  # type: ignore[type-arg]
    """`--pulse AT:DURATION:X`, checked when parsed (traffic.recorded.parse_pulse)."""

    name = "AT:DURATION:X"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from retrybench.traffic.recorded import Pulse, parse_pulse

        if isinstance(value, Pulse):
            return value
        try:
            return parse_pulse(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


def workload_options(f: F) -> F:
    """`--workload FILE`, `--workload-format`, `--rate-x` and `--pulse` (repeatable): a recorded workload in
    place of the paper's trace (docs/workloads.md)."""
    f = option("pulse", "pulses", type=PulseText(), multiple=True, metavar="AT:DURATION:X",
               help="With --workload, repeatable: a burst of Poisson arrivals at X times C-hat for DURATION s from "
                    "AT s, each call's prompt and output lengths those of a random row of the file (default: no "
                    "burst).")(f)
    f = option("rate-x", type=click.FloatRange(min=0, min_open=True, max=100), default=None,
               help="With --workload: stretch or compress its arrival times so its mean rate is X times C-hat "
                    "(default: the times as recorded).")(f)
    f = option("workload-format", type=click.Choice(["own", "azure", "burstgpt"]), default=None,
               help="The --workload file's format (default: detected from its header).")(f)
    return option("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                  help="Replay this recorded workload (CSV or JSONL: the project's own columns, Azure's LLM "
                       "inference trace or BurstGPT's) in place of the paper's trace and pulse; docs/workloads.md.")(f)


def _engine(*allowed: EngineKind) -> Callable[[click.Context, click.Parameter, str], EngineChoice]:
    """The `--engine` callback of a command that drives `allowed`: the engine named, or a usage error."""
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> EngineChoice:
        try:
            return parse_engine(value, allowed)
        except ValueError as error:
            raise click.BadParameter(str(error), ctx, param) from error

    return parse


def engine_option(*allowed: EngineKind, help: str) -> Callable[[F], F]:
    """`--engine`: one of `allowed` (default sim) or an http:// URL, parsed to an EngineChoice."""
    return option("engine", default="sim", show_default=True, callback=_engine(*allowed), help=help,
                  metavar="|".join([*allowed, "URL"]))


def condition_option(*decls: str, help: str = "A Table 1 condition", listed: bool = True,
                     several: bool = False, **attrs: Any) -> Callable[[F], F]:
    """`--condition`: a condition or policy TOML file (with `several`: repeatable and comma-separated);
    `listed`: the help goes on with the conditions' names."""
    if listed:
        help = f"{help}: {', '.join(available_conditions())}, or the path of a policy TOML file."
    if several:
        attrs.update(type=CommaList(), multiple=True, callback=flat, metavar="NAME[,NAME...]")
    return option("condition", *decls, help=help, **attrs)


def _client_profile(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The `--client` callback: a known profile (or a profile's TOML file), checked before any run."""
    if value is None:
        return None
    try:
        client_profile(value)
    except ConfigError as error:
        raise click.BadParameter(str(error), ctx, param) from error
    return value


def client_option() -> Callable[[F], F]:
    return click.option("--client", "client", default=None, callback=_client_profile,
                        help=f"A client profile ({', '.join(available_client_profiles())}; docs/clients.md) or the "
                             "path of a profile TOML file, in place of the condition's client (default: the "
                             "condition's).")
