"""A real vLLM beside the simulator: `retrybench compare-real-engine` and `make-tiny-model`."""

from __future__ import annotations

from pathlib import Path

import click

from retrybench.cli.display import console
from retrybench.cli.options import (
    Argument,
    Command,
    condition_option,
    option,
    out_option,
    renamed,
    seed_option,
    time_scale_option,
)

__all__ = ["compare_real_engine", "make_tiny_model"]


@click.command("compare-real-engine", cls=Command,
               retired=[renamed("condition", "--conditions"), renamed("engine", "--engine-url")])
@out_option("Where real-engine.json, the engine's log and every live run's logs go.", required=True)
@click.option("--calibrations", type=click.IntRange(min=1), default=3, show_default=True,
              help="Live calibrations of the engine, whose spread says whether it held its speed.")
@condition_option("conditions", several=True, listed=False,
                  help="Conditions to compare, repeated or comma-separated (default: retries-on-cancel-on, "
                       "retries-off-cancel-on, coalescing, deferred-cancellation, retry-budget).")
@click.option("--loads", default=None,
              help="Capacity-curve loads in multiples of C-hat (default 0.5,0.75,1,1.25,1.5; none: no curve).")
@click.option("--stage-s", type=click.FloatRange(min=10), default=300.0, show_default=True,
              help="Trace seconds of each calibration stage.")
@click.option("--curve-stage-s", type=click.FloatRange(min=10), default=120.0, show_default=True,
              help="Trace seconds of each capacity-curve stage and speed probe.")
@click.option("--first-stage", type=click.IntRange(min=0), default=2, show_default=True,
              help="The first calibration's first stage: 0.2 x 1.5^N calls/s.")
@time_scale_option(type=click.FloatRange(min=0.001), default=0.1,
                   help="Wall seconds per trace second of every live run and calibration.")
@option("engine", "engine_url", default=None, metavar="URL",
        help="The base URL of an engine already running (then nothing is pinned); default: start vLLM with a "
             "tiny model.")
@click.option("--no-pin", is_flag=True, help="Leave the engine and this process on every CPU.")
@click.option("--run-when-refused", is_flag=True,
              help="Go on when the calibrations spread too far (every verdict is then 'refused').")
@click.option("--runtime", type=click.Choice(["process", "container"]), default="process", show_default=True,
              help="Run vLLM and each run's proxy as processes, or as the containers of the images "
                   "scripts/build_image.py builds (on one Docker network, pinned the same way).")
@click.option("--vllm-image", default=None, help="--runtime container: the vLLM image (default: this checkout's).")
@click.option("--proxy-image", default=None, help="--runtime container: the proxy image (default: this checkout's).")
def compare_real_engine(out: Path, calibrations: int, conditions: tuple[str, ...], loads: str | None, stage_s: float,
                        curve_stage_s: float, first_stage: int, time_scale: float, engine_url: str | None,
                        no_pin: bool, run_when_refused: bool, runtime: str, vllm_image: str | None,
                        proxy_image: str | None) -> None:
    """The simulator against a real vLLM (CPU build, tiny model, scaled trace): pinned CPUs, repeated
    calibrations, the capacity curve and the scaled diagnostic, verdicts only where the engine held its
    speed. Writes OUT/real-engine.json; `retrybench reproduce --out OUT` then shows it."""
    from retrybench.conditions.config import available_conditions
    from retrybench.realvllm.compare_real import CONDITIONS, CURVE_LOADS, RESULT_FILE, CompareSettings
    from retrybench.realvllm.compare_real import compare_real_engine as run_comparison

    chosen = conditions or tuple(CONDITIONS)
    unknown = [c for c in chosen if c not in available_conditions()]
    if unknown:
        raise click.UsageError(f"unknown condition(s) {', '.join(unknown)}")
    if runtime == "container" and engine_url is not None:
        raise click.UsageError("--engine names an engine already running: --runtime container starts its own")
    curve = CURVE_LOADS if loads is None else () if loads.strip() == "none" else tuple(
        float(x) for x in loads.split(","))
    settings = CompareSettings(out=out, calibrations=calibrations, conditions=chosen, curve_loads=curve,
                               runtime="container" if runtime == "container" else "process",
                               vllm_image=vllm_image, proxy_image=proxy_image,
                               stage_s=stage_s, curve_stage_s=curve_stage_s, probe_s=curve_stage_s,
                               first_stage=first_stage, time_scale=time_scale, pin=not no_pin,
                               run_when_refused=run_when_refused, log=lambda line: console().print(line))
    record = run_comparison(settings, engine_url=engine_url)
    statuses = [f"{row['condition']}: {row['verdict']['status']}" for row in record.get("conditions", [])
                if "verdict" in row]
    summary = "; ".join(statuses) or record["band"]["refusal"]
    console().print(f"{summary}; {out / RESULT_FILE} in {record['wall_s']:.0f} s")


@click.command("make-tiny-model", cls=Command)
@click.argument("directory", cls=Argument, type=click.Path(file_okay=False, path_type=Path),
                help="Where the model goes: a new or empty directory (or one this command wrote before).")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True, help="Decoder layers.")
@click.option("--hidden", type=click.IntRange(min=8), default=256, show_default=True,
              help="Hidden size (the MLP's is twice it).")
@click.option("--vocab", type=click.IntRange(min=30_100), default=32_000, show_default=True,
              help="At least the workload's token ids (below 30,000) plus the special tokens.")
@click.option("--max-positions", type=click.IntRange(min=256), default=32_768, show_default=True,
              help="The longest sequence the model takes (its max_position_embeddings).")
@seed_option("Seeds the random weights.", default=0)
def make_tiny_model(directory: Path, layers: int, hidden: int, vocab: int, max_positions: int, seed: int) -> None:
    """Write a tiny Llama with random weights and a word-level tokenizer for `vllm serve DIRECTORY`
    (no download, no torch): the real-engine tests measure scheduling, not text."""
    from retrybench.realvllm.tinymodel import TinyLlama
    from retrybench.realvllm.tinymodel import make_tiny_model as make

    try:
        shape = TinyLlama(layers=layers, hidden=hidden, intermediate=2 * hidden, vocab=vocab,
                          max_positions=max_positions, seed=seed)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    if directory.exists() and any(directory.iterdir()) and not (directory / "config.json").exists():
        raise click.UsageError(f"{directory} holds other files; give an empty or new directory")
    make(directory, shape)
    console().print(f"tiny Llama ({layers} layers, hidden {hidden}, vocabulary {vocab}) -> {directory}")
