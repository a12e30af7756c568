"""The report's context -> one self-contained HTML file (inline CSS and SVG, no scripts, no external
resources), written with each run's summary JSON beside it. The only module here that writes files."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import jinja2

from retrybench.records.atomicfile import write_atomic
from retrybench.records.results import Result
from retrybench.report.context import run_file_name
from retrybench.report.figures import draw_figures
from retrybench.report.figures_boundaries import boundary_figures
from retrybench.report.figures_deadlines import deadline_figures
from retrybench.report.figures_rejection import rejection_figures
from retrybench.report.figures_stacks import stack_figures
from retrybench.report.sections import ReportContext

__all__ = ["render_html", "write_report"]

RUNS_DIR = "runs"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("retrybench.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env


def render_html(context: ReportContext) -> str:
    """The report page: the context's data with its figures drawn."""
    figures = (draw_figures(context["figures"]) | boundary_figures(context.get("boundaries"))
               | deadline_figures(context.get("deadlines")) | stack_figures(context.get("stacks"))
               | rejection_figures(context.get("rejection")))
    template = _environment().get_template("report.html.j2")
    return template.render(**context, svg=figures, runs_dir=RUNS_DIR)


def write_report(out: Path, context: ReportContext, results: Iterable[Result],
                 page_name: str = "index.html") -> Path:
    """Write out/<page_name>, out/summary.json (the page's data) and out/runs/<run>.json (one per run,
    failed ones with their error); return the page's path."""
    for result in results:
        write_atomic(out / RUNS_DIR / run_file_name(result), json.dumps(result, sort_keys=True, indent=1))
    write_atomic(out / "summary.json", json.dumps({k: v for k, v in context.items() if k != "figures"},
                                                   sort_keys=True, indent=1, default=str))
    page = out / page_name
    write_atomic(page, render_html(context))
    return page
