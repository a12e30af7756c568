"""`retrybench reproduce`: every block of Table 1 and beyond, the boundary maps, then the HTML report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from retrybench.cli.display import console, show
from retrybench.cli.options import (
    CommaList,
    Command,
    engine_option,
    executor_options,
    flat,
    gpu_option,
    jobs_option,
    json_option,
    option,
    out_option,
    renamed,
    runs_option,
)

if TYPE_CHECKING:
    from retrybench.plan.engine_choice import EngineChoice
    from retrybench.report.sections import ReportContext

__all__ = ["reproduce"]

PAPER_GPUS = ("h100", "h200")  # the GPUs the paper's models have fitted profiles for


@click.command(cls=Command, retired=[renamed("model", "--models"), renamed("block", "--blocks")])
@engine_option("sim", help="sim (the simulated engine, in parallel on every core), or the base URL of a running "
                           "OpenAI-compatible engine: each run then goes live through the proxy, in real time "
                           "(947+ s), one at a time.")
@gpu_option(type=click.Choice(PAPER_GPUS))
@option("model", "models", type=CommaList(), multiple=True, callback=flat, metavar="MODEL[,MODEL...]",
        help="The paper's models to run, repeated or comma-separated (default: all three of them).")
@runs_option("paper (the paper's run counts: 137 runs) or N runs of every block on every model.")
@out_option("Where the report (index.html) and each run's summary JSON go.", default=Path("retrybench-report"),
            show_default=True)
@executor_options
@jobs_option("Parallel processes, or a local Ray's CPUs (default: cores).")
@click.option("--unseen-seeds", is_flag=True,
              help="Also replay every block on the ten unseen seeds (101-110; about 550 more simulations) and "
                   "report, per claim and model, on how many of them it held.")
@json_option("Print one JSON object instead of the verdict table: the run results (runs), every paper figure "
             "scored (scores), with --unseen-seeds the robustness table (robustness) and, with margins, each "
             "claim's verdict on each model with its margin (margins: margin robust or knife-edge, flips_at the "
             "engine speeds that flip it). The report is written all the same.")
@click.option("--real-engine", "real_engine", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A compare-real-engine result for the report's Real engine section "
                                 "(default: OUT/real-engine.json when there).")
@option("block", "blocks", type=CommaList(), multiple=True, callback=flat, default=("all",), show_default=True,
        metavar="BLOCK[,BLOCK...]",
        help="Blocks, repeated or comma-separated: block names (`retrybench block --help` lists them); table1: Table "
             "1's alone; all: Table 1's and those beyond the paper but replicas (216 runs, 4-5 min on 2 cores: add "
             "it by name, e.g. all,replicas); boundaries: the boundary maps beyond the paper (part of all).")
@click.option("--margins/--no-margins", default=None,
              help="Rerun Table 1's blocks with every engine step 5% faster and 5% slower (the trace still at the "
                   "calibrated C-hat) and mark each verdict robust (the same at engine speeds 0.95, 1 and 1.05) or "
                   "knife-edge (naming the speeds that flip it): twice those blocks' runs again. Default: on when "
                   "those runs are all cached, else off; --margins runs what is missing, --no-margins skips them.")
@click.option("--no-boundaries", is_flag=True,
              help="Skip the boundary maps (critical pulse per condition and model, deferral W x pulse, engine "
                   "cap Q x pulse; a few hundred bisection runs) that --block all computes.")
def reproduce(engine: EngineChoice, gpu: str, models: tuple[str, ...], runs: int | None, out: Path, executor: str,
              address: str | None, jobs: int | None, unseen_seeds: bool, as_json: bool, real_engine: Path | None,
              blocks: tuple[str, ...], margins: bool | None, no_boundaries: bool) -> None:
    """Every block of Table 1 (the paper's 137 runs by default), then the HTML reproducibility report:
    per finding the paper's claim and figures, this run's, and a verdict. Resumable: results are cached
    by spec and code version, so an interrupted reproduction picks up where it stopped; Ctrl-C stops the
    runs, says how many are cached and exits with status 130."""
    from retrybench.plan.blocks import PAPER_MODELS
    from retrybench.runs.display import RichDisplay
    from retrybench.runs.reproduce import Interrupted, ReproduceError, ReproduceRequest, plan_reproduction
    from retrybench.runs.reproduce import reproduce as run_reproduction

    request = ReproduceRequest(out=out, models=tuple(models) or PAPER_MODELS, gpu=gpu, blocks=",".join(blocks),
                               runs=runs, unseen_seeds=unseen_seeds, boundaries=not no_boundaries, margins=margins,
                               engine=engine,
                               executor=executor, jobs=jobs, address=address, real_engine=real_engine,
                               command=" ".join(["retrybench", *sys.argv[1:]]))
    try:
        plan = plan_reproduction(request)
        outcome = run_reproduction(plan, RichDisplay(console()))
    except ReproduceError as error:
        raise click.UsageError(str(error)) from error
    except Interrupted as stop:
        console().print(str(stop), soft_wrap=True)
        sys.exit(130)
    if outcome.context is None:  # no report: jinja2 or matplotlib missing
        show(outcome.results, as_json)
        return
    if as_json:
        click.echo(json.dumps(outcome.json_output()))
    else:
        _print_verdicts(outcome.context)
    console().print(f"{len(plan.blocks)} runs ({len(outcome.results)} distinct) in {outcome.wall_s:.0f} s; "
                    f"report: {outcome.page}")
    if outcome.failed:
        sys.exit(1)


def _print_verdicts(context: ReportContext) -> None:
    from rich.table import Table

    table = Table("finding", "verdict", "checks held", "paper figures: within / near / off", title="reproduction")
    for row in context["summary"]:
        scores = row["scores"]
        margin = _margin(row.get("margin"), row.get("flips_at", []))
        table.add_row(row["title"], row["verdict"] + (f" ({margin})" if margin else ""),
                      f"{row['passed']} of {row['checks']}",
                      f"{scores['within']} / {scores['near']} / {scores['off']}")
    console().print(table)
    total = context["scores"]["tally"]
    console().print(f"paper figures: {total['within']} of {total['scored']} within the paper's band, "
                    f"{total['near']} near, {total['off']} off")
    margins = context.get("margins")
    if margins is not None:
        edges = [f"{r['claim']} on {r['model']} (flips at {' and '.join(f'{s:g}' for s in r['flips_at'])})"
                 for r in margins["rows"] if r["margin"] == "knife-edge"]
        listed = ": " + "; ".join(edges) if edges else ""
        console().print(f"claim verdicts: {margins['reproduced']} of {margins['judged']} reproduced, "
                        f"{margins['reproduced_robust']} of them robust to a 5% engine-speed change; "
                        f"{margins['knife_edge']} knife-edge{listed}", soft_wrap=True)
    if context["robustness"] is not None:
        weak = [f"{r['claim']} on {r['model']} ({r['held']} of {r['evaluated']})"
                for r in context["robustness"]["rows"] if r["robust"] == "not robust"]
        listed = ": " + "; ".join(weak) if weak else ""
        console().print(f"unseen seeds: {len(weak)} claim-model pairs not robust{listed}")


def _margin(kind: str | None, flips_at: list[float]) -> str:
    """A margin in words: robust, knife-edge at the speeds that flip it, or nothing (no verdict to hold)."""
    if kind is None:
        return ""
    return kind + (f" at engine speed {' and '.join(f'{s:g}' for s in flips_at)}" if flips_at else "")
