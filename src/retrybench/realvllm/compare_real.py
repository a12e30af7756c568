"""The simulator against a real vLLM (CPU build, tiny model, scaled trace), run so that it can be trusted.

1. Pin: the engine on one CPU, this process (load generator, and the proxy it starts) on another
   (realvllm.pinning), and record the harness's own CPU share of every live run.
2. Calibrate C-hat `calibrations` times (the paper's 300-s stages, one stage per live run, stopping
   at the first saturated one); their mean sets every run's rates, their spread may refuse the
   comparison (realvllm.comparison.band_of).
3. The capacity curve: completions per second and median TTFT at 0.5-1.5 x C-hat, live and simulated.
4. The scaled diagnostic on each condition, live, then simulated with the engine at the band's lowest
   and highest C-hat (realvllm.simband); a short 1.5 x C-hat speed probe after each live run measures the
   engine's capacity around it, and decides with the run's own saturated throughput whether it is VOID.

Every stage replays a trace of its own (calibration n, stage k: seed 100 n + k; curve point i: seed
1000 + i; probe j: seed 2000 + j). vLLM keeps its prefix cache from one stage to the next while the
simulator starts each stage cold, so two stages with one seed would send the same prompts to a warm
engine and a cold model (the leak a persistent engine has). Seeds rather than a cache reset, because
vLLM resets its cache only from its development endpoints and an external engine may not offer them.
The diagnostic's condition runs all replay the diagnostic's seed, as the paper's conditions replay one
trace; a run's prompts overflow the engine's cache many times, so the next run meets a cold one.
Every live stage records the prefix cache's queries and hits (vLLM's counters) beside the simulator's.

`runtime` "container" runs vLLM in the CPU image and each run's proxy in the proxy image
(scripts/build_image.py), on one Docker network, pinned as the processes are.

Everything lands in one JSON file (`real-engine.json`, typed in realvllm/record.py), which
`retrybench reproduce` shows as the report's "Real engine" section. Clocks run `time_scale` wall seconds
per trace second.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from retrybench.analysis import summarize
from retrybench.calibration.stages import (
    CALIBRATION_CLIENT,
    SATURATION_PER_S,
    STAGE_S,
    StageResult,
    calibration_from_log,
    stage_rate,
)
from retrybench.conditions.config import WorkloadSpec
from retrybench.loadgen.run import LiveRun, ProxyLauncher, proxy_process, run_live
from retrybench.plan.spec import RunSpec
from retrybench.realvllm.comparison import (
    Band,
    PrefixCache,
    SaturatedJson,
    SaturatedThroughput,
    StagePoint,
    band_of,
    capacity_check,
    compare_condition,
    prefix_cache_delta,
    saturated_throughput,
    stage_point,
)
from retrybench.realvllm.pinning import HarnessMeter, PinningPlan, pin_harness, pinning_plan
from retrybench.realvllm.record import (
    Calibration,
    CalibrationStage,
    ComparedMetrics,
    ConditionRow,
    CurvePoint,
    RealEngineRecord,
    SettingsJson,
    SpeedFitJson,
)
from retrybench.realvllm.simband import SpeedFit, simulate_calls_at, simulate_spec_at, speed_for_capacity
from retrybench.realvllm.tinymodel import make_tiny_model
from retrybench.realvllm.vllm import VllmArgs, cpu_env, for_cpu, vllm_process
from retrybench.records.atomicfile import write_atomic
from retrybench.records.results import Metrics
from retrybench.records.runlog import RunLog
from retrybench.serving.aio import metric_sums
from retrybench.serving.launch import free_port
from retrybench.traffic.workload import Trace, concat_calls, stage_trace

__all__ = ["CONDITIONS", "CURVE_LOADS", "FORMAT", "RESULT_FILE", "CompareSettings", "compare_real_engine"]

FORMAT = "retrybench-real-engine/2"  # 2: a seed per stage, prefix-cache counters, sustained rates, runtime
RESULT_FILE = "real-engine.json"
# The scaled diagnostic's conditions, with whether the paper's engine recovers under each.
CONDITIONS: dict[str, bool] = {"retries-on-cancel-on": False, "retries-off-cancel-on": True, "coalescing": True,
                               "deferred-cancellation": True, "retry-budget": True}
CURVE_LOADS = (0.5, 0.75, 1.0, 1.25, 1.5)
PROBE_LOAD = 1.5
CURVE_SEED = 1000  # curve point i replays seed CURVE_SEED + i
PROBE_SEED = 2000  # the speed probe after condition j replays seed PROBE_SEED + j
ENGINE_ALIAS = "vllm"  # the vLLM container's name on the Docker network


@dataclass(frozen=True, kw_only=True)
class CompareSettings:
    out: Path
    model: str = "tiny-llama"  # the simulated profile (`cpu` x `tiny-llama`, fitted to this engine)
    gpu: str = "cpu"
    time_scale: float = 0.1
    token_scale: float = 0.1
    seed: int = 1
    calibrations: int = 3
    first_stage: int = 2  # the first calibration starts at 0.2 x 1.5^2 = 0.45 calls/s
    max_stages: int = 9
    stage_s: float = STAGE_S
    curve_loads: tuple[float, ...] = CURVE_LOADS
    curve_stage_s: float = 120.0
    probe_s: float = 120.0
    conditions: tuple[str, ...] = tuple(CONDITIONS)
    pin: bool = True
    run_when_refused: bool = False  # go on after a refused calibration band (the data, marked refused)
    engine_start_timeout_s: float = 300.0
    runtime: Literal["process", "container"] = "process"
    vllm_image: str | None = None  # runtime "container": default the image scripts/build_image.py vllm builds
    proxy_image: str | None = None  # ... and scripts/build_image.py proxy
    log: Callable[[str], None] = field(default=print, compare=False)


def compare_real_engine(settings: CompareSettings, *, engine_url: str | None = None,
                        executable: str | None = None) -> RealEngineRecord:
    """Run the whole comparison and write `settings.out / RESULT_FILE`; return what it wrote. Starts
    vLLM serving a tiny model, as a process (`executable`, default vllm_locate's) or a container
    (`settings.runtime`), unless `engine_url` is given (then nothing is pinned: the engine was
    started elsewhere)."""
    started = time.monotonic()
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    available = frozenset(os.sched_getaffinity(0))
    plan = pinning_plan(available) if settings.pin and engine_url is None else PinningPlan(
        engine_cpus=None, harness_cpus=None,
        note="not pinned: " + ("the engine was started elsewhere" if engine_url else "pinning turned off"))
    settings.log(f"pinning: {plan.note}")
    record: RealEngineRecord = {"format": FORMAT, "settings": _settings_json(settings), "pinning": plan.to_json(),
                                "started_unix": time.time()}
    try:
        pin_harness(plan)
        if engine_url is not None:
            _live_part(settings, engine_url, proxy_process, record)
        elif settings.runtime == "container":
            with _containers(settings, plan) as (url, proxies):
                _live_part(settings, url, proxies, record)
        else:
            model = make_tiny_model(out / "tiny-llama")
            args = VllmArgs(model=str(model), port=free_port())
            with vllm_process(args, log_path=out / "vllm.log", executable=executable, env=plan.engine_env(),
                              cpus=plan.engine_cpus, start_timeout_s=settings.engine_start_timeout_s):
                _live_part(settings, f"http://127.0.0.1:{args.port}", proxy_process, record)
    finally:
        os.sched_setaffinity(0, available)
    if "band" in record and (record["band"]["refusal"] is None or settings.run_when_refused):
        _simulated_part(settings, record)
    record["wall_s"] = time.monotonic() - started
    record = _finite(record)  # the same record with lists for tuples and None for NaN
    write_atomic(out / RESULT_FILE, json.dumps(record, indent=1, allow_nan=False))
    return record


@contextmanager
def _containers(settings: CompareSettings, plan: PinningPlan) -> Iterator[tuple[str, ProxyLauncher]]:
    """The vLLM container (CPU image, tiny model, pinned to the engine's CPUs) on a Docker network of
    its own, and a launcher of proxy containers (pinned to the harness's CPUs) in front of it."""
    from retrybench.proxy.proxy_container import ContainerProxies
    from retrybench.realvllm.vllm import container_spec_for
    from retrybench.serving.containers import ServiceContainer, docker_network

    vllm_image = _image(settings.vllm_image, "vllm")
    proxy_image = _image(settings.proxy_image, "proxy")
    model = make_tiny_model(settings.out / "tiny-llama")
    args = for_cpu(VllmArgs(model=str(model)))
    results = settings.out / "vllm-results"
    results.mkdir(parents=True, exist_ok=True)
    spec = container_spec_for(args, results_dir=results, image=vllm_image, gpus=False,
                              env={**cpu_env(), **plan.engine_env()}, cpus=plan.engine_cpus, alias=ENGINE_ALIAS)
    with docker_network() as network, ServiceContainer(spec, log_path=settings.out / "vllm.log", network=network,
                                                       start_timeout_s=settings.engine_start_timeout_s) as engine:
        yield engine.url, ContainerProxies(image=proxy_image, network=network, upstream=f"http://{ENGINE_ALIAS}:8000",
                                           cpus=plan.harness_cpus)


def _image(given: str | None, kind: str) -> str:
    """`given`, or the tag of this checkout's `kind` image; either must be in the local Docker engine."""
    from retrybench.realvllm.images import image_tag
    from retrybench.realvllm.vllm_locate import source_root
    from retrybench.serving.containers import require_image

    if given is None:
        root = source_root()
        if root is None:
            raise FileNotFoundError(f"runtime 'container' names its {kind} image from the checkout: run from one "
                                    f"or pass the image")
        given = image_tag(kind, root.parent)
    require_image(given, f"python scripts/build_image.py {kind}")
    return given


def _finite(value: Any) -> Any:
    """NaN and infinities as None, so the file is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _settings_json(s: CompareSettings) -> SettingsJson:
    return {"out": str(s.out), "model": s.model, "gpu": s.gpu, "time_scale": s.time_scale,
            "token_scale": s.token_scale, "seed": s.seed, "calibrations": s.calibrations,
            "first_stage": s.first_stage, "max_stages": s.max_stages, "stage_s": s.stage_s,
            "curve_loads": list(s.curve_loads), "curve_stage_s": s.curve_stage_s, "probe_s": s.probe_s,
            "conditions": list(s.conditions), "pin": s.pin, "run_when_refused": s.run_when_refused,
            "engine_start_timeout_s": s.engine_start_timeout_s, "runtime": s.runtime,
            "vllm_image": s.vllm_image, "proxy_image": s.proxy_image}


# -- live -----------------------------------------------------------------------------------------


def _live_part(settings: CompareSettings, url: str, proxy: ProxyLauncher, record: RealEngineRecord) -> None:
    """Calibrations, then (unless refused) the capacity curve and the conditions, live."""
    calibrations = _calibrate(settings, url, proxy)
    record["calibrations"] = calibrations
    band = band_of([c["chat"] for c in calibrations], at_least=settings.calibrations)
    record["band"] = band.to_json()
    served = [c["service_per_s"] for c in calibrations if c["service_per_s"] is not None]
    # What the void rule compares a run's saturated completions/s with: the same measure in the
    # calibrations' saturated stages. C-hat (rate - waiting growth) reads higher on an engine whose
    # running batch (256 sequences) absorbs a backlog before its waiting queue grows.
    record["service_per_s"] = sum(served) / len(served) if served else band.mean
    settings.log(f"C-hat {', '.join(f'{c:.3f}' for c in band.chats)}: mean {band.mean:.3f}, spread "
                 f"{100 * band.spread:.1f}%" + (f"; REFUSED: {band.refusal}" if band.refusal else ""))
    if band.refusal is not None and not settings.run_when_refused:
        return
    record["capacity_curve"] = [_curve_point_live(settings, url, proxy, band, load, CURVE_SEED + i)
                                for i, load in enumerate(settings.curve_loads)]
    probe = (record["capacity_curve"][-1]["live_saturated"]
             if settings.curve_loads and settings.curve_loads[-1] == PROBE_LOAD else None)
    conditions: list[ConditionRow] = []
    for j, condition in enumerate(settings.conditions):
        row = _condition_live(settings, url, proxy, band, condition, probe, PROBE_SEED + j)
        probe = row["probe_after"]
        conditions.append(row)
    record["conditions"] = conditions


def _stage_trace(settings: CompareSettings, rate: float, duration_s: float, seed: int) -> Trace:
    spec = WorkloadSpec(chat_calls_per_s=1.0).scaled(settings.token_scale)
    return Trace(spec=spec, seed=seed, calls=concat_calls([stage_trace(rate, duration_s, seed, spec)]))


@dataclass(frozen=True, kw_only=True)
class _Stage:
    """One live stage: its run, the harness's CPU share, and the engine's prefix cache over it."""

    run: LiveRun
    cpu_pct: float
    prefix_cache: PrefixCache


def _stage_live(settings: CompareSettings, url: str, proxy: ProxyLauncher, workdir: Path, rate: float,
                duration_s: float, seed: int, chat: float) -> _Stage:
    """One constant-rate stage without retries or deadline, live."""
    spec = RunSpec(model=settings.model, condition="retries-off-cancel-off", seed=seed, gpu=settings.gpu,
                   token_scale=settings.token_scale)
    _wait_idle(url)
    before = _engine_counters(url)
    with HarnessMeter() as meter:
        run = run_live(spec, time_scale=settings.time_scale, workdir=workdir, chat=chat, engine_url=url,
                       trace=_stage_trace(settings, rate, duration_s, seed), client=CALIBRATION_CLIENT, proxy=proxy)
    return _Stage(run=run, cpu_pct=meter.pct, prefix_cache=prefix_cache_delta(before, _engine_counters(url)))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _engine_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10.0) as response:
        return metric_sums(response.read())


def _sim_prefix_cache(log: RunLog) -> PrefixCache:
    return PrefixCache(queries=int(log.counters.get("prefix_cache_queries_total", 0)),
                       hits=int(log.counters.get("prefix_cache_hits_total", 0)))


def _calibrate(settings: CompareSettings, url: str, proxy: ProxyLauncher) -> list[Calibration]:
    """`settings.calibrations` calibrations, each a climb of 300-s stages (x1.5) stopped at the first
    whose engine queue grows by SATURATION_PER_S; a later one starts two stages below where the
    previous one saturated. C-hat = that stage's rate - the queue's growth (Section 3.2)."""
    results: list[Calibration] = []
    first = settings.first_stage
    for n in range(settings.calibrations):
        stages: list[CalibrationStage] = []
        chat = None
        for k in range(first, first + settings.max_stages):
            rate = stage_rate(k)
            live = _stage_live(settings, url, proxy, settings.out / f"calibration-{n}" / f"stage-{k}", rate,
                               settings.stage_s, seed=100 * n + k, chat=1.0)
            stage = calibration_from_log(live.run.log, [(rate, 0.0, settings.stage_s)],
                                         threshold_per_s=-float("inf")).saturated
            point = stage_point(live.run.log, load_x=0.0, rate=rate, stage_s=settings.stage_s)
            stages.append(_stage_json(stage, index=k, seed=100 * n + k, live=live, point=point))
            settings.log(f"calibration {n + 1}: {rate:.3f} calls/s, queue growth {stage.growth_per_s:.3f}/s, "
                         f"sustained {_fmt(point.sustained.per_s)}/s, prefix hits "
                         f"{_fmt(live.prefix_cache.hit_pct, 1)}%, harness CPU {live.cpu_pct:.0f}%")
            if stage.growth_per_s >= SATURATION_PER_S:
                chat = rate - stage.growth_per_s
                first = max(k - 2, 0)
                break
        if chat is None:
            raise RuntimeError(f"calibration {n + 1}: no stage saturated up to {stages[-1]['rate_calls_per_s']:.3f} "
                               "calls/s; raise max_stages")
        results.append({"chat": chat, "stages": stages, "service_per_s": stages[-1]["saturated"]["per_s"]})
    return results


def _stage_json(stage: StageResult, *, index: int, seed: int, live: _Stage, point: StagePoint) -> CalibrationStage:
    return {"index": index, "rate_calls_per_s": stage.rate_calls_per_s, "start_s": stage.start_s, "end_s": stage.end_s,
            "calls": stage.calls, "growth_per_s": stage.growth_per_s, "median_ttft_s": stage.median_ttft_s,
            "median_e2e_s": stage.median_e2e_s, "seed": seed, "harness_cpu_pct": live.cpu_pct,
            "saturated": point.saturated.to_json(), "sustained": point.sustained.to_json(),
            "prefix_cache": live.prefix_cache.to_json()}


def _curve_point_live(settings: CompareSettings, url: str, proxy: ProxyLauncher, band: Band, load: float,
                      seed: int) -> CurvePoint:
    rate = load * band.mean
    live = _stage_live(settings, url, proxy, settings.out / "curve" / f"x{load:g}", rate, settings.curve_stage_s,
                       seed=seed, chat=band.mean)
    point = stage_point(live.run.log, load_x=load, rate=rate, stage_s=settings.curve_stage_s)
    settings.log(f"capacity curve {load:g} x C-hat: {point.completions_per_s:.3f} completions/s (sustained "
                 f"{_fmt(point.sustained.per_s)}), median TTFT {_fmt(point.median_ttft_s)} s, prefix hits "
                 f"{_fmt(live.prefix_cache.hit_pct, 1)}%, harness CPU {live.cpu_pct:.0f}%")
    return {"load_x": load, "rate_calls_per_s": rate, "seed": seed, "live": point.to_json(),
            "live_saturated": point.saturated.to_json(), "live_prefix_cache": live.prefix_cache.to_json(),
            "harness_cpu_pct": live.cpu_pct}


def _condition_live(settings: CompareSettings, url: str, proxy: ProxyLauncher, band: Band, condition: str,
                    probe_before: SaturatedJson | None, probe_seed: int) -> ConditionRow:
    spec = RunSpec(model=settings.model, gpu=settings.gpu, condition=condition, seed=settings.seed,
                   token_scale=settings.token_scale)
    _wait_idle(url)
    before = _engine_counters(url)
    with HarnessMeter() as meter:
        live = run_live(spec, time_scale=settings.time_scale, workdir=settings.out / condition, chat=band.mean,
                        engine_url=url, proxy=proxy)
    cache = prefix_cache_delta(before, _engine_counters(url))
    row = summarize(live.log)
    probe_stage = _stage_live(settings, url, proxy, settings.out / condition / "probe", PROBE_LOAD * band.mean,
                              settings.probe_s, seed=probe_seed, chat=band.mean)
    probe = saturated_throughput(probe_stage.run.log)
    during = saturated_throughput(live.log)
    ends = [e.fate for e in live.log.executions]
    settings.log(f"{condition}: live recovered={row['recovered']}, hold {row['hold_delivered_pct']}%, "
                 f"completed_x {row['completed_x']}; engine {during.per_s} completions/s saturated, probe "
                 f"{probe.per_s}; harness CPU {meter.pct:.0f}%")
    return {"condition": condition, "paper_recovers": CONDITIONS.get(condition), "live": _compared(row),
            "live_prefix_cache": cache.to_json(), "probe_seed": probe_seed,
            "harness_cpu_pct": meter.pct, "probe_harness_cpu_pct": probe_stage.cpu_pct, "saturated": during.to_json(),
            "probe_before": probe_before, "probe_after": probe.to_json(),
            "fates": {fate: ends.count(fate) for fate in sorted(set(ends))},
            "send_lateness_ms": live.load.meta.get("send_lateness")}


def _compared(row: Metrics) -> ComparedMetrics:
    return {"recovered": row["recovered"], "recovery_s": row["recovery_s"],
            "hold_delivered_pct": row["hold_delivered_pct"], "pulse_delivered_pct": row["pulse_delivered_pct"],
            "created_x": row["created_x"], "completed_x": row["completed_x"], "retry_share_pct": row["retry_share_pct"],
            "mean_waiting": row["mean_waiting"], "attempts": row["attempts"],
            "retries_attached": row["retries_attached"], "executions_cancelled": row["executions_cancelled"],
            "executions_created": row["executions_created"]}


def _wait_idle(url: str, timeout_s: float = 180.0) -> None:
    """Until the engine's running and waiting gauges read 0: a run must not inherit another's queue."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/metrics", timeout=10.0) as response:
            seen = metric_sums(response.read())
        if seen.get("vllm:num_requests_running", 0) + seen.get("vllm:num_requests_waiting", 0) == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the engine at {url} did not go idle within {timeout_s} s: running "
                       f"{seen.get('vllm:num_requests_running')}, waiting {seen.get('vllm:num_requests_waiting')}")


# -- simulated ------------------------------------------------------------------------------------


def _simulated_part(settings: CompareSettings, record: RealEngineRecord) -> None:
    """The simulator on the same inputs, its engine sped up or slowed down to calibrate at the band's
    lowest, mean and highest C-hat, and the verdicts."""
    band = band_of(record["band"]["chats"], at_least=settings.calibrations)
    fits = {name: speed_for_capacity(settings.model, settings.gpu, chat, token_scale=settings.token_scale)
            for name, chat in (("low", band.low), ("mean", band.mean), ("high", band.high))}
    record["sim_speeds"] = {"low": _fit_json(fits["low"]), "mean": _fit_json(fits["mean"]),
                            "high": _fit_json(fits["high"])}
    settings.log("simulated engine: " + ", ".join(f"{n} x{f.speed:.3f} (C-hat {f.chat:.3f} for {f.target:.3f})"
                                                  for n, f in fits.items()))
    for calibration in record.get("calibrations", []):
        for stage in calibration["stages"]:
            log = _simulate_stage(settings, stage["rate_calls_per_s"], settings.stage_s, stage["seed"],
                                  fits["mean"].speed, band.mean)
            point = stage_point(log, load_x=0.0, rate=stage["rate_calls_per_s"], stage_s=settings.stage_s)
            stage["sim_sustained"] = point.sustained.to_json()
            stage["sim_prefix_cache"] = _sim_prefix_cache(log).to_json()
    for curve_point in record.get("capacity_curve", []):
        seed = curve_point["seed"]
        log = _simulate_stage(settings, curve_point["rate_calls_per_s"], settings.curve_stage_s, seed,
                              fits["mean"].speed, band.mean)
        curve_point["sim"] = stage_point(log, load_x=curve_point["load_x"], rate=curve_point["rate_calls_per_s"],
                                         stage_s=settings.curve_stage_s).to_json()
        curve_point["sim_prefix_cache"] = _sim_prefix_cache(log).to_json()
    for row in record.get("conditions", []):
        run_spec = RunSpec(model=settings.model, gpu=settings.gpu, condition=row["condition"], seed=settings.seed,
                           token_scale=settings.token_scale)
        logs = {name: simulate_spec_at(run_spec, chat=band.mean, speed=fits[end].speed)
                for name, end in (("sim_low", "low"), ("sim_high", "high"))}
        row["sim_low"], row["sim_high"] = _compared(summarize(logs["sim_low"])), _compared(summarize(logs["sim_high"]))
        row["sim_prefix_cache"] = {"sim_low": _sim_prefix_cache(logs["sim_low"]).to_json(),
                                   "sim_high": _sim_prefix_cache(logs["sim_high"]).to_json()}
        measured = {"run": _throughput(row["saturated"])}
        if row["probe_before"] is not None:
            measured["probe before"] = _throughput(row["probe_before"])
        measured["probe after"] = _throughput(row["probe_after"])
        verdict = compare_condition(row["condition"], row["live"], row["sim_low"], row["sim_high"], band=band,
                                    capacity=capacity_check(measured, record["service_per_s"]))
        row["verdict"] = verdict.to_json()
        settings.log(f"{row['condition']}: {verdict.status} ({verdict.reason})")


def _simulate_stage(settings: CompareSettings, rate: float, duration_s: float, seed: int, speed: float,
                    chat: float) -> RunLog:
    """The simulator on a live stage's own trace, starting cold as every simulated run does."""
    trace = _stage_trace(settings, rate, duration_s, seed)
    return simulate_calls_at(trace.calls, model=settings.model, gpu=settings.gpu, speed=speed,
                             client=CALIBRATION_CLIENT, prefix_tokens=trace.spec.shared_prefix_tokens, seed=seed,
                             meta={"chat": chat})


def _fit_json(fit: SpeedFit) -> SpeedFitJson:
    return {"target": fit.target, "speed": fit.speed, "chat": fit.chat}


def _throughput(data: SaturatedJson) -> SaturatedThroughput:
    return SaturatedThroughput(saturated_s=data["saturated_s"], completions=data["completions"],
                               cancelled=data["cancelled"], per_s=data["per_s"])
