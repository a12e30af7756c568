"""Fit the step-cost constants of the H100 profile to the paper's calibration figures only.

Targets (paper Section 3.2 and Table 2), each measured by the simulated calibration itself
(repeated on five traces and averaged, as every run uses it):
1. Qwen2.5-7B-Instruct's C-hat (2.78 calls/s) and median time to first token (0.31 s) and to
   last token (4.5 s) at 1.52 calls/s fix the GPU's fixed step cost, its memory efficiency (of KV
   reads) and Qwen2.5-7B's linear_scale (Nelder-Mead on log errors);
2. Qwen3-14B's and Llama-3.1-8B-Instruct's C-hat (1.09, 1.83) fix their linear_scale (bisection),
   everything else shared.
The GEMM and elementwise costs themselves come from the measured layer profile (engine/profiles.py);
linear_scale is a model's departure from it (prior 1). per_seq_s and attention_eff stay at their
priors. No finding's outcome enters the fit. The H200 has no calibration figures in the paper, so
it takes the H100's constants with its own memory size and bandwidth.

With `--layer-profile CSV` (what scripts/profile_steps.py measured on this GPU, for any model's shapes),
the fit reads the GEMM and elementwise costs from that table instead of the packaged H100 profile; with
`--write` the table is stored beside fitted.toml, which names it, and every run then uses it.

With `--gpu cpu --targets FILE`, the same three constants are fitted for vLLM's CPU build serving
the tiny Llama, to a live calibration of that real engine (`retrybench calibrate --engine URL
--token-scale S --time-scale T`, whose JSON FILE holds its C-hat and its median TTFT and E2E at
the stage nearest 1.52/2.78 of C-hat, where the paper reports them), on the same scaled workload.

    python scripts/fit_profiles.py [--write]
    python scripts/fit_profiles.py --layer-profile h100-qwen2.5-7b.csv [--write]
    python scripts/fit_profiles.py --gpu cpu --targets calibration.json [--write]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from retrybench.calibration.simulated import calibrate_repeated
from retrybench.calibration.stages import LATENCY_SHARE
from retrybench.conditions.config import WorkloadSpec
from retrybench.engine.layer_table import LayerTable, format_layer_table, layer_table_from_steps
from retrybench.engine.profiles import GPUS, MODELS, EngineProfile, StepCosts, profile_for

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "src" / "retrybench" / "claims" / "paper_values.toml"
FITTED = ROOT / "src" / "retrybench" / "engine" / "fitted.toml"
PRIMARY = "qwen2.5-7b-instruct"
OTHERS = ("qwen3-14b", "llama-3.1-8b-instruct")
PRIORS = {"per_seq_s": 2e-5, "attention_eff": 0.5}


def paper() -> dict[str, float]:
    data = tomllib.loads(PAPER.read_text())
    out = {m: float(data["capacity"][m]) for m in (PRIMARY, *OTHERS)}
    out["ttft"] = float(data["calibration"]["direct_median_ttft_s"])
    out["e2e"] = float(data["calibration"]["direct_median_e2e_s"])
    return out


def engine_profile(model: str, costs: StepCosts, gpu: str, layer_profile: LayerTable | None,
                   step_model: str = "roofline") -> EngineProfile:
    """The profile the fit measures: fitted.toml's, with `costs` and, where given, another layer table."""
    profile = profile_for(model, gpu, costs=costs, step_model=step_model)
    if layer_profile is None:
        return profile
    return replace(profile, gpu=replace(profile.gpu, layer_profile=layer_profile))


def measure(model: str, costs: StepCosts, gpu: str = "h100", token_scale: float = 1.0,
            latency_rate: float = 1.52, layer_profile: LayerTable | None = None,
            step_model: str = "roofline") -> tuple[float, float, float]:
    """The repeated calibration (the mean over its traces), as every run uses it."""
    spec = WorkloadSpec(chat_calls_per_s=1.0).scaled(token_scale)
    calibration = calibrate_repeated(engine_profile(model, costs, gpu, layer_profile, step_model), spec=spec,
                                     latency_rate=latency_rate)
    return calibration.chat_calls_per_s, calibration.median_ttft_s, calibration.median_e2e_s


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def table_from_step_profile(path: Path, gpu: str) -> tuple[str, LayerTable]:
    """The model a profile_steps.py CSV measured and its layer table, read against `gpu`'s figures (the
    CSV names its device but not its peaks, so the GPU it ran on is given)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise SystemExit(f"{path} has no rows")
    models, dtypes = sorted({row["model"] for row in rows}), sorted({row["dtype"] for row in rows})
    if len(models) != 1 or len(dtypes) != 1 or models[0] not in MODELS or dtypes[0] not in DTYPE_BYTES:
        raise SystemExit(f"{path}: expected one known model and dtype, found {models} in {dtypes}")
    key, model = models[0], MODELS[models[0]]
    devices = {row["device"] for row in rows}
    if gpu not in GPUS or GPUS[gpu].layer_profile is None:
        raise SystemExit(f"--layer-profile needs a GPU whose steps are read from a table, not {gpu!r}")
    print(f"layer table from {path}: {key} measured on {', '.join(sorted(devices))}, read as the {GPUS[gpu].name}")
    try:
        table = layer_table_from_steps(rows, peak_flops=GPUS[gpu].bf16_flops_per_s,
                                       bandwidth=GPUS[gpu].bandwidth_bytes_per_s, hidden=model.hidden,
                                       intermediate=model.intermediate, layer_params=model.layer_params // model.layers,
                                       dtype_bytes=DTYPE_BYTES[dtypes[0]])
    except ValueError as error:
        raise SystemExit(f"{path}: {error}") from error
    return key, table


def shared(x: list[float], priors: dict[str, float] = PRIORS) -> StepCosts:
    return StepCosts(fixed_s=math.exp(x[0]), per_seq_s=priors["per_seq_s"],
                     linear_scale=math.exp(x[1]), attention_eff=priors["attention_eff"],
                     memory_eff=1 / (1 + math.exp(-x[2])))


def fit_primary(goal: dict[str, float], evals: int, model: str = PRIMARY, gpu: str = "h100",
                token_scale: float = 1.0, start: tuple[float, float, float] = (3e-5, 1.0, 0.85),
                priors: dict[str, float] = PRIORS, layer_profile: LayerTable | None = None) -> StepCosts:
    latency_rate = LATENCY_SHARE * goal[model] if gpu == "cpu" else 1.52

    def loss(x: list[float]) -> float:
        try:
            chat, ttft, e2e = measure(model, shared(list(x), priors), gpu, token_scale, latency_rate, layer_profile)
        except ValueError as error:  # no stage saturated: far too fast
            print(f"  {error}", flush=True)
            return 1e3
        value = (math.log(chat / goal[model]) ** 2 + math.log(ttft / goal["ttft"]) ** 2
                 + math.log(e2e / goal["e2e"]) ** 2)
        print(f"{value:.5f} chat={chat:.3f} ttft={ttft:.3f} e2e={e2e:.3f}", flush=True)
        return value

    fixed, scale, memory = start
    x0 = [math.log(fixed), math.log(scale), math.log(memory / (1 - memory))]
    result = minimize(loss, x0, method="Nelder-Mead", options={"maxfev": evals, "xatol": 1e-3})
    return shared(list(result.x), priors)


def fit_linear_scale(model: str, base: StepCosts, target: float,
                     layer_profile: LayerTable | None = None) -> float:
    """Bisection on log scale: a larger linear_scale means slower GEMMs, a lower C-hat."""
    low, high = math.log(0.4), math.log(2.5)
    for _ in range(11):
        mid = (low + high) / 2
        chat = measure(model, replace(base, linear_scale=math.exp(mid)), layer_profile=layer_profile)[0]
        print(f"{model} linear_scale={math.exp(mid):.4f} chat={chat:.3f}", flush=True)
        low, high = (low, mid) if chat < target else (mid, high)
    return math.exp((low + high) / 2)


VIDUR_TABLE = ("engine/h100_llama2_7b_layer_ms.csv, Vidur's H100 operator profile; linear_scale 1 is that profile "
               "as measured for Llama-2-7B's shapes")


def h100_comment(table: str = VIDUR_TABLE) -> list[str]:
    """fitted.toml's comment on the H100's constants, naming the layer table they were fitted over."""
    text = ("Step-cost constants of the H100, written by scripts/fit_profiles.py from the paper's calibration "
            "figures only (Section 3.2): fixed_s, memory_eff (of KV reads) and each model's linear_scale. "
            f"Priors, not fitted: the GEMM and elementwise costs ({table}); per_seq_s, 20 us of host work per "
            "scheduled request that asynchronous scheduling does not hide (Vidur's cpu_overheads for vLLM V0, "
            "whose scheduling is synchronous: 43 us per sequence); attention_eff 0.5 of the bf16 peak "
            "(FlashAttention-2 reaches about 0.35 of an H100's, FlashAttention-3 0.6-0.75, in their papers).")
    return [f"# {line}" for line in textwrap.wrap(text, 104)]

CPU_MODEL = "tiny-llama"


def per_sequence_cost(trace: Path, time_scale: float) -> float:
    """Seconds per scheduled execution per step, in trace seconds: the least-squares fit of the real
    engine's step times (from the tracing plugin) to fixed + per prompt token + per execution. On a
    GPU this is a small prior; on vLLM's CPU build it dominates a decode step, so it is measured."""
    rows = []
    for line in trace.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "step":
            prompt = sum(event["prompt_tokens"].values())
            executions = len(event["prompt_tokens"]) + len(event["decode"])
            rows.append((event["end_s"] - event["start_s"], 1.0, prompt, executions))
    data = np.asarray(rows)
    coef = np.linalg.lstsq(data[:, 1:], data[:, 0], rcond=None)[0]
    print(f"from {len(rows)} traced steps (wall): fixed {coef[0]:.3g} s, per prompt token {coef[1]:.3g} s, "
          f"per execution {coef[2]:.3g} s")
    return float(coef[2]) / time_scale


def fit_cpu(targets: Path, trace: Path, evals: int, write: bool) -> int:
    """The CPU build's constants, fitted to a live calibration of it, with its per-execution cost
    measured from the calibration's engine trace."""
    data = json.loads(targets.read_text())
    goal = {CPU_MODEL: float(data["chat"]), "ttft": float(data["median_ttft_s"]), "e2e": float(data["median_e2e_s"])}
    scale = float(data["token_scale"])
    print(f"targets (live, time scale {data['time_scale']}, token scale {scale}): {goal}")
    per_seq_s = per_sequence_cost(trace, float(data["time_scale"]))
    priors = {"per_seq_s": per_seq_s, "attention_eff": PRIORS["attention_eff"]}
    costs = fit_primary(goal, evals, CPU_MODEL, "cpu", scale, start=(3e-2, 3.0, 0.3), priors=priors)
    chat, ttft, e2e = measure(CPU_MODEL, costs, "cpu", scale, LATENCY_SHARE * goal[CPU_MODEL])
    print("fitted:", costs)
    print(f"  C-hat live {goal[CPU_MODEL]:.3f} model {chat:.3f}; TTFT live {goal['ttft']:.3f} model {ttft:.3f}; "
          f"E2E live {goal['e2e']:.3f} model {e2e:.3f}")
    if write:
        write_section("cpu", costs, {CPU_MODEL: costs.linear_scale},
                      [f"# vLLM's CPU build (2 cores) serving the tiny Llama, in trace seconds at time scale "
                       f"{data['time_scale']} with token",
                       f"# scale {scale}: fitted to a live calibration of the real engine "
                       f"(C-hat {goal[CPU_MODEL]:.3f}, TTFT {goal['ttft']:.3f} s, E2E {goal['e2e']:.3f} s)",
                       "# by scripts/fit_profiles.py --gpu cpu; per_seq_s from its engine trace; attention_eff "
                       "a prior."])
    return 0


def fit_kernel_host(goal: dict[str, float], evals: int, write: bool) -> int:
    """The `kernels` step model's host costs (fixed and per sequence), its only fitted part: to Qwen2.5-7B's
    C-hat, median TTFT and E2E (Nelder-Mead on log errors), the kernels' times read from the database."""

    def costs(x: list[float]) -> StepCosts:
        return StepCosts(fixed_s=math.exp(x[0]), per_seq_s=math.exp(x[1]), linear_scale=1.0, attention_eff=1.0,
                         memory_eff=1.0)

    def loss(x: list[float]) -> float:
        chat, ttft, e2e = measure(PRIMARY, costs(list(x)), step_model="kernels")
        value = (math.log(chat / goal[PRIMARY]) ** 2 + math.log(ttft / goal["ttft"]) ** 2
                 + math.log(e2e / goal["e2e"]) ** 2)
        print(f"{value:.5f} fixed={math.exp(x[0]) * 1e6:.1f}us per_seq={math.exp(x[1]) * 1e6:.2f}us chat={chat:.3f} "
              f"ttft={ttft:.3f} e2e={e2e:.3f}", flush=True)
        return value

    result = minimize(loss, [math.log(6e-4), math.log(2e-5)], method="Nelder-Mead",
                      options={"maxfev": evals, "xatol": 1e-3})
    host = costs(list(result.x))
    print(f"fitted: fixed_s {host.fixed_s:.6g}, per_seq_s {host.per_seq_s:.6g}")
    for model in (PRIMARY, *OTHERS):
        chat, ttft, e2e = measure(model, host, step_model="kernels")
        print(f"  {model:24s} C-hat paper {goal[model]:.3f} model {chat:.3f} ({100 * (chat / goal[model] - 1):+.1f}%)"
              f"; TTFT {ttft:.3f} s, E2E {e2e:.2f} s")
    if write:
        text = FITTED.read_text()
        start = text.index("[kernels.h100]")
        FITTED.write_text(text[:start] + f"[kernels.h100]\nfixed_s = {host.fixed_s:.6g}\n"
                          f"per_seq_s = {host.per_seq_s:.6g}\n")
        print(f"wrote [kernels.h100] to {FITTED}")
    return 0


def write_section(gpu: str, costs: StepCosts, effs: dict[str, float], comment: list[str],
                  layer_profile: str | None = None) -> None:
    """Replace one GPU's tables in fitted.toml, keeping the others."""
    text = FITTED.read_text()
    blocks = text.split("\n\n")
    kept = [b for b in blocks if f"[gpu.{gpu}]" not in b and f"[gpu.{gpu}.linear_scale]" not in b
            and not (b.startswith("#") and f"[gpu.{gpu}]" in b)]
    section = [*comment, f"[gpu.{gpu}]", f"fixed_s = {costs.fixed_s:.6g}", f"per_seq_s = {costs.per_seq_s:.6g}",
               f"attention_eff = {costs.attention_eff:.6g}", f"memory_eff = {costs.memory_eff:.6g}",
               *([f'layer_profile = "{layer_profile}"'] if layer_profile else []), "",
               f"[gpu.{gpu}.linear_scale]", *[f'"{model}" = {eff:.6g}' for model, eff in effs.items()]]
    FITTED.write_text("\n\n".join(b.strip("\n") for b in [*kept, "\n".join(section)]) + "\n")
    print(f"wrote [gpu.{gpu}] to {FITTED}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write src/retrybench/engine/fitted.toml")
    parser.add_argument("--max-evals", type=int, default=80)
    parser.add_argument("--gpu", choices=("h100", "cpu"), default="h100")
    parser.add_argument("--step-model", choices=("roofline", "kernels"), default="roofline",
                        help="kernels: fit the host costs of the measured-kernel step model (the H100's)")
    parser.add_argument("--targets", type=Path, help="--gpu cpu: the JSON of a live calibration")
    parser.add_argument("--trace", type=Path, help="--gpu cpu: the engine trace of that calibration")
    parser.add_argument("--layer-profile", type=Path,
                        help="a CSV of scripts/profile_steps.py measured on this GPU: fit over its GEMM and "
                             "elementwise costs instead of the packaged H100 profile")
    args = parser.parse_args()
    if args.step_model == "kernels":
        if args.gpu != "h100" or args.layer_profile is not None:
            parser.error("--step-model kernels fits the H100's host costs; its kernels come from the database")
        return fit_kernel_host(paper(), args.max_evals, args.write)
    if args.gpu == "cpu" and args.layer_profile is not None:
        parser.error("--layer-profile is for a GPU's fit: the CPU build's steps are a plain roofline")
    if args.gpu == "cpu":
        if args.targets is None or args.trace is None:
            parser.error("--gpu cpu needs --targets (the JSON `retrybench calibrate --engine URL` prints) and "
                         "--trace (the tracing plugin's trace of that calibration)")
        return fit_cpu(args.targets, args.trace, args.max_evals, args.write)
    layer_profile, stored, comment = None, None, h100_comment()
    if args.layer_profile is not None:
        measured, layer_profile = table_from_step_profile(args.layer_profile, args.gpu)
        stored = FITTED.parent / f"{args.gpu}_{measured}_layer_ms.csv"
        comment = h100_comment(f"engine/{stored.name}, measured on this GPU; linear_scale 1 is the table as measured "
                               f"for {measured}'s shapes")
    goal = paper()
    base = fit_primary(goal, args.max_evals, layer_profile=layer_profile)
    effs = {PRIMARY: base.linear_scale}
    for model in OTHERS:
        effs[model] = fit_linear_scale(model, base, goal[model], layer_profile)
    print("fitted:", base, effs)
    for model, eff in effs.items():
        chat, ttft, e2e = measure(model, replace(base, linear_scale=eff), layer_profile=layer_profile)
        print(f"  {model:24s} C-hat paper {goal[model]:.3f} model {chat:.3f} ({100 * (chat / goal[model] - 1):+.1f}%)")
        if model == PRIMARY:
            print(f"  {'':24s} TTFT paper {goal['ttft']:.3f} model {ttft:.3f};"
                  f" E2E paper {goal['e2e']:.2f} model {e2e:.2f}")
    if args.write:
        if layer_profile is not None and stored is not None:
            stored.write_text(format_layer_table(layer_profile, [
                f"Measured by scripts/profile_steps.py ({args.layer_profile.name}), read as the "
                f"{GPUS[args.gpu].name}."]))
        name = stored.name if stored is not None else None
        write_section("h100", base, effs, comment, name)
        write_section("h200", base, effs, ["# The H200 takes the H100's constants (the paper has no H200 figures)."],
                      name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
