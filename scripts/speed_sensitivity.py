"""Recovery time against engine speed: does the paper's pattern of recovery times after pulses of 1.5, 2 and
2.7 C-hat (Table 3, and the diagnostic block) call for an engine that drains faster than its C-hat?

Every run keeps the trace at the model's own C-hat (the rates the paper's runs used) and only makes each
engine step `speed` times as fast, so a speed above 1 is an engine whose real capacity exceeds the C-hat its
calibration gave. This reads the runs; it never sets a parameter of the model.

    python scripts/speed_sensitivity.py [--seeds 1 2 3] [--speeds 1.0 1.05 1.1]
"""

from __future__ import annotations

import argparse
import sys

from retrybench.analysis.delivery import recovery
from retrybench.calibration.store import calibration_for
from retrybench.plan.spec import RunSpec
from retrybench.realvllm.simband import simulate_spec_at

# (condition, pulse): the paper's recovery time after the pulse, s (None: not within the hold), from
# Table 3 (Qwen2.5-7B; the other two models match it without retries) and Section 4.1.
PAPER = {("retries-off-cancel-off", 1.5): "240", ("retries-off-cancel-off", 2.0): "360",
         ("retries-off-cancel-off", 2.7): "480-540", ("retries-on-cancel-off", 1.5): "240",
         ("retries-on-cancel-off", 2.0): "- (Qwen2.5), 480-540 (others)", ("retries-off-cancel-on", 2.7): "360"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-7b-instruct")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--speeds", type=float, nargs="+", default=[1.0, 1.05, 1.1])
    args = parser.parse_args(argv)
    chat = float(calibration_for(args.model, "h100", False)["chat"])
    print(f"{args.model}: C-hat {chat:.4f} calls/s; recovery after the pulse, s, per seed {args.seeds} ('-': none)")
    print(f"{'condition':<24}{'pulse':>6}{'paper':>32}" + "".join(f"{f'speed {s:g}':>22}" for s in args.speeds))
    for (condition, pulse), paper in PAPER.items():
        cells = []
        for speed in args.speeds:
            times = []
            for seed in args.seeds:
                spec = RunSpec(model=args.model, condition=condition, seed=seed, pulse_x=pulse)
                result = recovery(simulate_spec_at(spec, chat=chat, speed=speed))
                times.append(f"{result.recovery_s:.0f}" if result.recovered else "-")
            cells.append(" ".join(times))
        print(f"{condition:<24}{pulse:>6}{paper:>32}" + "".join(f"{cell:>22}" for cell in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
