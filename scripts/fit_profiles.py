"""Fit the step-cost constants of the H100 profile to the paper's calibration figures only.

Targets (paper Section 3.2 and Table 2), each measured by the simulated calibration itself
(repeated on five traces and averaged, as every run uses it):
1. Qwen2.5-7B-Instruct's C-hat (2.78 calls/s) and median time to first token (0.31 s) and to
   last token (4.5 s) at 1.52 calls/s fix the GPU's fixed step cost, its memory efficiency and
   Qwen2.5-7B's GEMM efficiency (Nelder-Mead on log errors);
2. Qwen3-14B's and Llama-3.1-8B-Instruct's C-hat (1.09, 1.83) fix their GEMM efficiencies
   (bisection), everything else shared.
per_seq_s and attention_eff stay at their priors. No finding's outcome enters the fit. The H200
has no calibration figures in the paper, so it takes the H100's constants with its own memory
size and bandwidth.

    python scripts/fit_profiles.py [--write]
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

from scipy.optimize import minimize

from retrybench.engine.profiles import StepCosts, profile_for
from retrybench.sim.calibrate import calibrate_repeated

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "src" / "retrybench" / "paper_values.toml"
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


def measure(model: str, costs: StepCosts) -> tuple[float, float, float]:
    """The repeated calibration (the mean over its traces), as every run uses it."""
    calibration = calibrate_repeated(profile_for(model, "h100", costs=costs))
    return calibration.chat_calls_per_s, calibration.median_ttft_s, calibration.median_e2e_s


def shared(x: list[float]) -> StepCosts:
    return StepCosts(fixed_s=math.exp(x[0]), per_seq_s=PRIORS["per_seq_s"],
                     compute_eff=1 / (1 + math.exp(-x[1])), attention_eff=PRIORS["attention_eff"],
                     memory_eff=1 / (1 + math.exp(-x[2])))


def fit_primary(goal: dict[str, float], evals: int) -> StepCosts:
    def loss(x: list[float]) -> float:
        chat, ttft, e2e = measure(PRIMARY, shared(list(x)))
        value = (math.log(chat / goal[PRIMARY]) ** 2 + math.log(ttft / goal["ttft"]) ** 2
                 + math.log(e2e / goal["e2e"]) ** 2)
        print(f"{value:.5f} chat={chat:.3f} ttft={ttft:.3f} e2e={e2e:.3f}", flush=True)
        return value

    start = [math.log(3e-5), math.log(0.63 / 0.37), math.log(0.89 / 0.11)]
    result = minimize(loss, start, method="Nelder-Mead", options={"maxfev": evals, "xatol": 1e-3})
    return shared(list(result.x))


def fit_compute_eff(model: str, base: StepCosts, target: float) -> float:
    low, high = 0.3, 0.95
    for _ in range(11):
        mid = (low + high) / 2
        chat = measure(model, replace(base, compute_eff=mid))[0]
        print(f"{model} compute_eff={mid:.4f} chat={chat:.3f}", flush=True)
        low, high = (mid, high) if chat < target else (low, mid)
    return (low + high) / 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write src/retrybench/engine/fitted.toml")
    parser.add_argument("--max-evals", type=int, default=80)
    args = parser.parse_args()
    goal = paper()
    base = fit_primary(goal, args.max_evals)
    effs = {PRIMARY: base.compute_eff}
    for model in OTHERS:
        effs[model] = fit_compute_eff(model, base, goal[model])
    print("fitted:", base, effs)
    for model, eff in effs.items():
        chat, ttft, e2e = measure(model, replace(base, compute_eff=eff))
        print(f"  {model:24s} C-hat paper {goal[model]:.3f} model {chat:.3f} ({100 * (chat / goal[model] - 1):+.1f}%)")
        if model == PRIMARY:
            print(f"  {'':24s} TTFT paper {goal['ttft']:.3f} model {ttft:.3f};"
                  f" E2E paper {goal['e2e']:.2f} model {e2e:.2f}")
    if args.write:
        lines = ["# Step-cost constants per GPU, written by scripts/fit_profiles.py from the paper's calibration",
                 "# figures only (Section 3.2). per_seq_s and attention_eff are priors. The H200 takes the H100's",
                 "# constants (the paper has no H200 figures)."]
        for gpu in ("h100", "h200"):
            lines += ["", f"[gpu.{gpu}]", f"fixed_s = {base.fixed_s:.6g}", f"per_seq_s = {base.per_seq_s:.6g}",
                      f"attention_eff = {base.attention_eff:.6g}", f"memory_eff = {base.memory_eff:.6g}",
                      "", f"[gpu.{gpu}.compute_eff]"]
            lines += [f'"{model}" = {eff:.6g}' for model, eff in effs.items()]
        FITTED.write_text("\n".join(lines) + "\n")
        print(f"wrote {FITTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
