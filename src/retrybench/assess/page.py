"""An assessment's JSON document and its page: one self-contained HTML file (the report's stylesheet inline,
no scripts, no figures), drawn from the document alone so that it can be redrawn from assess.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from retrybench.assess.run import AssessOutcome
from retrybench.records.atomicfile import write_atomic
from retrybench.records.cache import code_version

__all__ = ["JSON_FILE", "PAGE_FILE", "document", "render_page", "write_outputs"]

JSON_FILE = "assess.json"
PAGE_FILE = "index.html"


def document(outcome: AssessOutcome) -> dict[str, Any]:
    """What assess.json holds: the setup, C-hat, the burst, the verdict, per control its outcome, every run
    at the setup's burst."""
    setup = outcome.request.setup
    return {
        "command": outcome.request.command, "code_version": code_version(),
        "setup": {"model": setup.model, "gpu": setup.gpu, "token_scale": setup.token_scale, "client": setup.client,
                  **setup.recorded},
        "seeds": list(setup.seeds), "chat": outcome.chat, "burst": outcome.burst, "verdict": outcome.verdict,
        "keeps_up": [o.control for o in outcome.outcomes if o.keeps_up],
        "controls": [o.record() for o in outcome.outcomes], "notes": list(outcome.notes),
        "wall_s": round(outcome.wall_s, 1), "search_runs": outcome.search_runs, "runs": outcome.results,
    }


_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                          loader=jinja2.FunctionLoader(
                              lambda name: (resources.files("retrybench.report") / "templates" / name).read_text()))
_ENV.filters["show"] = lambda value, spec="": "-" if value is None else (format(value, spec) if spec else value)
RUN_KEYS = ("condition", "seed", "recovered", "recovery_s", "pulse_delivered_pct", "hold_delivered_pct",
            "primary_delivered_pct", "created_x", "retry_share_pct", "calls", "error")


def render_page(doc: Mapping[str, Any]) -> str:
    """The page from an assessment's document."""
    css = (resources.files("retrybench.report") / "templates" / "report.css").read_text()
    return _ENV.get_template("assess.html.j2").render(doc=doc, css=css, run_keys=RUN_KEYS)


def write_outputs(outcome: AssessOutcome, out: Path) -> tuple[Path, Path]:
    """OUT/assess.json and OUT/index.html; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    doc = document(outcome)
    data, page = out / JSON_FILE, out / PAGE_FILE
    write_atomic(data, json.dumps(doc, indent=1))
    write_atomic(page, render_page(doc))
    return data, page
