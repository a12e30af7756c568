"""The HTML reproducibility report: for each finding, the paper's claim and figures beside this run's,
and a verdict; Tables 2 and 3 and Figures 1 and 3-6 redrawn from the runs.

context.py builds the report's data (pure), figures.py draws it (matplotlib, inline SVG), render.py
writes the page with each run's summary JSON beside it; meta.py reads the environment.
"""

from __future__ import annotations

from retrybench.report.context import build_context
from retrybench.report.render import render_html, write_report

__all__ = ["build_context", "render_html", "write_report"]
