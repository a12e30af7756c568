"""A traced vLLM's step times beside the simulated engine's, by kind of step (realvllm/step_check.py).

    python scripts/step_check.py TRACE.jsonl [--model tiny-llama] [--gpu cpu] [--speed S] [--time-scale T]

TRACE is what the tracing plugin writes (`--scheduler-cls retrybench.realvllm.vllm_trace.TracingScheduler`,
RETRYBENCH_VLLM_TRACE). `--speed` is the simulated engine's speed factor the comparison used (its
real-engine.json's `sim_speeds`), `--time-scale` the live run's. Prints, per kind of step, how many there
were, their median live and modelled times, the ratio of the sums and the share of live time; then the
totals. Where the totals agree but the kinds do not, the model's costs cancel on this engine's mix.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retrybench.engine.profiles import profile_for
from retrybench.realvllm.step_check import step_samples, summarize_classes
from retrybench.records.tracefile import read_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--gpu", default="cpu")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--time-scale", type=float, default=0.1)
    args = parser.parse_args()
    _, events = read_trace(args.trace)
    samples = step_samples(events, profile_for(args.model, args.gpu).step_timer(), speed=args.speed,
                           time_scale=args.time_scale)
    print("| kind of step | steps | live median (ms) | model median (ms) | live / model | share of live time |")
    print("|---|---|---|---|---|---|")
    for row in summarize_classes(samples):
        print(f"| {row.name} | {row.steps} | {row.live_median_ms:.1f} | {row.model_median_ms:.1f} | "
              f"{row.live_over_model:.2f} | {row.live_share_pct:.1f}% |")
    live, model = sum(s.live_s for s in samples), sum(s.model_s for s in samples)
    print(f"| all | {len(samples)} | | | {live / model:.3f} | live {live:.2f} s, model {model:.2f} s |")


if __name__ == "__main__":
    main()
