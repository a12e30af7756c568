"""The live stack over real HTTP: `retrybench proxy`, `engine-server` and `loadgen`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from retrybench.cli.display import console
from retrybench.cli.options import (
    Argument,
    Command,
    LazyChoice,
    as_argument,
    condition_option,
    gpu_option,
    max_num_queued_reqs_option,
    model_option,
    option,
    renamed,
    seed_option,
    time_scale_option,
)

if TYPE_CHECKING:
    from retrybench.proxy.proxy_config import Value
    from retrybench.proxy.proxy_settings import ProxySettings

__all__ = ["engine_server", "loadgen", "proxy"]


def _router_policies() -> tuple[str, ...]:
    from retrybench.control.router import ROUTER_POLICIES

    return ROUTER_POLICIES


@click.command(cls=Command, retired=[renamed("engine", "--upstream"), renamed("condition", "--policy"),
                                     renamed("engine-connect-timeout", "--upstream-connect-timeout"),
                                     renamed("engine-idle-timeout", "--upstream-idle-timeout")])
@option("engine", "upstreams", multiple=True, metavar="URL",
        help="The engine's base URL, e.g. http://127.0.0.1:8001 (required here, in --config or in "
             "RETRYBENCH_PROXY_ENGINE). Repeat it for several engine replicas: --route then picks one per execution.")
@click.option("--route", type=LazyChoice(_router_policies), default=None,
              help="How executions are spread over several --engine (default round-robin): round-robin, "
                   "least-outstanding (fewest streams open from this proxy), key-affine (rendezvous hashing "
                   "of the call key: every attempt of a call to the same replica) or prefix-affine (vLLM's "
                   "and SGLang's cache-aware policy). Refused with one --engine. docs/replicas.md.")
@click.option("--prefix-tokens", type=click.IntRange(min=0), default=2000, show_default=True,
              help="The shared system prompt's length in tokens, as --route prefix-affine describes prompts.")
@condition_option("policy_name", default="no-control", show_default=True,
                  help="The condition whose proxy policy to apply (in --config also a table of the policy's fields)")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="The port to listen on (0: any free one).")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=4 << 20, show_default=True,
              help="The largest request body accepted; past it a request gets a 413.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every decision as JSONL (for run logs and conformance replay).")
@time_scale_option()
@click.option("--retain-s", type=click.FloatRange(min=0), default=None,
              help="Keep each completed response this many seconds for retries of its call that arrive "
                   "late (overrides the policy's retain_s; 0 keeps nothing).")
@click.option("--retain-max-bytes", type=click.IntRange(min=0), default=None,
              help="The most bytes all retained responses may hold (the oldest go first).")
@option("engine-connect-timeout", "connect_timeout_s", type=click.FloatRange(min=0), default=10.0,
        show_default=True, help="Seconds to open a connection to the engine, else 504 (0: no limit).")
@option("engine-idle-timeout", "idle_timeout_s", type=click.FloatRange(min=0), default=1800.0, show_default=True,
        help="Seconds an execution may go without progress from the engine (a response head, a whole "
             "chunk) before it fails with 504, or an SSE error event mid-stream (0: no limit). Scaled by "
             "--time-scale. Long on purpose: under overload an engine legitimately sends nothing for "
             "minutes while a request waits in its queue (vLLM sends a stream's head, then nothing until "
             "the first token), and a live paper run lasts 947 s.")
@click.option("--max-executions", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Executions the proxy holds at once (queued or streaming); past it an attempt gets a 503 "
                   "naming the limit.")
@click.option("--max-subscribers", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Attempts attached to one execution; past it a retry gets a 503 naming the limit.")
@click.option("--max-replay-bytes", type=click.IntRange(min=0), default=64 << 20, show_default=True,
              help="An execution's output kept for retries to attach; past it no retry attaches (503) and "
                   "nothing of it is retained.")
@click.option("--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds a SIGTERM waits for the calls in flight (new calls get a 503 with Retry-After, /ready "
                   "answers 503) before it ends what is left with an error event; scaled by --time-scale. "
                   "SIGINT, or a second signal, stops at once.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A TOML file with any of these options as keys (--drain-timeout is drain_timeout; the "
                   "condition by name or as a table); RETRYBENCH_PROXY_<KEY> environment variables override "
                   "it, flags override both. docs/examples/proxy.toml.")
@click.option("--print-config", is_flag=True,
              help="Print the configuration the proxy would run with (as TOML --config reads) and exit.")
@click.pass_context
def proxy(ctx: click.Context, /, config_path: Path | None, print_config: bool, **_: object) -> None:
    """Serve the overload-control proxy in front of an OpenAI-compatible engine (or several replicas)."""
    from dataclasses import asdict

    from retrybench.cli.proxy_config_cli import configured, effective_toml
    from retrybench.conditions.config import ConfigError as PolicyError
    from retrybench.proxy.proxy_config import ConfigError
    from retrybench.proxy.proxy_server import serve_forever

    try:
        values, given = configured(ctx, config_path)
        settings = _proxy_settings(values, given.get("condition"))
    except (ConfigError, PolicyError) as error:
        raise click.UsageError(str(error)) from error
    if print_config:
        click.echo(effective_toml(ctx, values, asdict(settings.policy)), nl=False)
        return
    serve_forever(settings, values["host"], values["port"])


def _proxy_settings(values: dict[str, Any], condition: Value | None) -> ProxySettings:
    """The settings from the configured values (each parameter's, by name); raises ConfigError (either
    kind) naming what is wrong and, for the policy, where it was set."""
    from dataclasses import replace

    from retrybench.conditions.config import load_condition, proxy_policy_from_table
    from retrybench.proxy.proxy_config import ConfigError
    from retrybench.proxy.proxy_settings import ProxySettings

    upstreams: tuple[str, ...] = tuple(values["upstreams"])
    route: str | None = values["route"]
    if not upstreams:
        raise ConfigError("no engine: give --engine, `engine` in --config or RETRYBENCH_PROXY_ENGINE")
    where = "--condition" if condition is None else f"{condition.origin}: condition"
    policy_name = values["policy_name"]
    policy = (proxy_policy_from_table(policy_name, where) if isinstance(policy_name, dict)
              else load_condition(policy_name).proxy)
    # Beyond the paper: a named condition's [breaker] (a table given inline holds a proxy policy only).
    breaker = None if isinstance(policy_name, dict) else load_condition(policy_name).breaker
    retain_s, retain_max_bytes = values["retain_s"], values["retain_max_bytes"]
    if retain_s is not None:
        policy = replace(policy, retain_s=retain_s)
    if retain_max_bytes is not None:
        policy = replace(policy, retain_max_bytes=retain_max_bytes)
    if route is not None and len(upstreams) == 1:
        raise ConfigError(f"--route {route} needs several --engine: one engine takes every execution")
    try:
        return ProxySettings(upstream=upstreams[0], more_upstreams=upstreams[1:], route=route or "round-robin",
                             prefix_tokens=values["prefix_tokens"], policy=policy,
                             max_body_bytes=values["max_body_bytes"], log_path=values["log_path"],
                             time_scale=values["time_scale"],
                             upstream_connect_timeout_s=values["connect_timeout_s"] or None,
                             upstream_idle_timeout_s=values["idle_timeout_s"] or None,
                             max_executions=values["max_executions"], max_subscribers=values["max_subscribers"],
                             max_replay_bytes=values["max_replay_bytes"], drain_timeout_s=values["drain_timeout_s"],
                             breaker=breaker)
    except ValueError as error:
        raise ConfigError(str(error)) from error


@click.command("engine-server", cls=Command)
@model_option()
@gpu_option()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8001, show_default=True,
              help="The port to listen on (0: any free one).")
@time_scale_option()
@max_num_queued_reqs_option("vLLM's queue cap: refuse with 503 when waiting + running would exceed it.")
@click.option("--stream-interval", type=click.IntRange(min=1), default=1, show_default=True,
              help="Output tokens per streamed chunk (vLLM's --stream-interval).")
@click.option("--sync-scheduling", is_flag=True, help="One batch in flight (vLLM's CPU platform).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the scheduler trace as JSONL.")
def engine_server(model: str, gpu: str, host: str, port: int, time_scale: float, max_num_queued_reqs: int | None,
                  stream_interval: int, sync_scheduling: bool, trace_path: Path | None) -> None:
    """Serve the simulated engine over HTTP in wall-clock time (vLLM's API subset: CPU stand-in)."""
    from retrybench.engine_server.engine_server import EngineServerSettings, serve_forever

    settings = EngineServerSettings(model=model, gpu=gpu, time_scale=time_scale,
                                    max_num_queued_reqs=max_num_queued_reqs, stream_interval=stream_interval,
                                    async_scheduling=not sync_scheduling, trace_path=trace_path)
    serve_forever(settings, host, port)


@click.command(cls=Command, retired=[as_argument("--out", "RUN_LOG")])
@click.argument("run_log", cls=Argument, metavar="RUN_LOG", type=click.Path(dir_okay=False, path_type=Path),
                help="Where to write the attempts as a run log (JSON, written atomically).")
@click.option("--trace", "trace_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="A saved trace (retrybench-trace/1, as make-trace writes it).")
@option("target", required=True, metavar="URL",
        help="Base URL where the load goes (GuideLLM's --target): the proxy or an engine, e.g. http://127.0.0.1:8000.")
@condition_option(default="retries-on-cancel-on", show_default=True, listed=False,
                  help="The Table 1 condition (or TOML file) whose client policy to use.")
@seed_option("Seeds the retry jitter.", default=0)
@time_scale_option()
@click.option("--driver", type=click.Choice(["builtin", "openai-sdk"]), default="builtin", show_default=True,
              help="builtin: the project's retrying client decides every retry; openai-sdk: each call goes "
                   "through the official openai SDK, which retries on its own (real time only; the policy "
                   "gives it only its timeout and retry count).")
def loadgen(run_log: Path, trace_file: Path, target: str, condition: str, seed: int, time_scale: float,
            driver: str) -> None:
    """Replay a trace open-loop against TARGET with a retrying client; write the attempts to RUN_LOG."""
    from retrybench.conditions.config import ConfigError, load_condition
    from retrybench.loadgen.loadgen import LoadgenSettings, run_loadgen
    from retrybench.traffic.workload import load_trace

    try:
        client = load_condition(condition).client
        trace = load_trace(trace_file)
    except (ConfigError, ValueError) as error:
        raise click.UsageError(str(error)) from error
    if driver == "openai-sdk":
        if time_scale != 1.0:
            raise click.UsageError("--driver openai-sdk runs in real time: the SDK sleeps its backoff on the wall "
                                   "clock (leave --time-scale at 1)")
        from retrybench.loadgen.sdk_driver import MissingSdk, SdkLoadSettings, run_sdk_loadgen

        try:
            sdk = run_sdk_loadgen(trace, SdkLoadSettings(target=target, client=client), run_log)
        except MissingSdk as error:
            raise click.ClickException(str(error)) from error
        console().print(f"{len(sdk.calls)} calls, {len(sdk.attempts)} attempts through the openai SDK")
        return
    settings = LoadgenSettings(target=target, client=client, seed=seed, time_scale=time_scale)
    result = run_loadgen(trace, settings, run_log)
    lateness = result.meta["send_lateness"]
    console().print(f"{len(result.calls)} calls, {len(result.attempts)} attempts; send lateness "
                    f"p50 {lateness['p50_ms']:.3f} ms, p99 {lateness['p99_ms']:.3f} ms")
