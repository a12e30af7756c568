"""A sweep's page: phase diagrams of recovery and hold delivery, the critical values, every run.

It reads only the sweep's document (what sweep.json holds), so the page can be redrawn from that file
alone. One self-contained HTML file, in the reproducibility report's style: its stylesheet inline, the
figures as inline SVG drawn with the report's matplotlib settings, no scripts.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

import jinja2

from retrybench.report.heatmap import SEED, HeatMap, draw_heatmap, ordered

__all__ = ["phase_diagram", "render_page"]


def phase_diagram(document: Mapping[str, Any], metric: str, title: str, scale: tuple[float, float],
                  legend: str) -> str:
    """One panel per condition: `metric` (mean over the runs in a cell) over the first axis (x) and the
    second axis or the seed (y); probed cells only, for a boundary search."""
    rows = [r for r in document["rows"] if r.get("error") is None]
    names = [a["name"] for a in document["axes"]]
    x = document["find"]["axis"] if document.get("find") else names[0]
    y = next((n for n in names if n != x), SEED)
    declared = {a["name"]: ordered(list(a["values"])) for a in document["axes"]} | {SEED: list(document["seeds"])}
    xs = list(document["find"]["grid"]) if document.get("find") else declared[x]
    averaged = [n for n in names if n not in (x, y)] + ([SEED] if y != SEED else [])
    # Each seed's boundary is marked where the rows are the seeds (the bars of a map over two axes would
    # stand for several cells at once).
    spec = HeatMap(rows=rows, boundaries=document.get("boundaries", []) if y == SEED else [], x=x, y=y, xs=xs,
                   ys=declared[y], panel="condition", panels=list(document["conditions"]),
                   seeds=list(document["seeds"]))
    return draw_heatmap(spec, metric, title, scale, legend,
                        note=f", averaged over {', '.join(averaged)}" if averaged else "")


_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters["show"] = lambda value: "-" if value is None else value
_PAGE = _ENV.from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>retrybench sweep</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{{ css }}</style></head>
<body><main>
<h1>retrybench sweep</h1>
<p class="lede"><code>{{ doc.command }}</code></p>
<p>{{ doc.rows | length }} runs on {{ doc.model }} ({{ doc.gpu }}), conditions {{ doc.conditions | join(", ") }},
seeds {{ doc.seeds | join(", ") }}; executor {{ doc.executor }}; {{ "%.1f" | format(doc.wall_s) }} s wall;
code {{ doc.code_version }}.</p>
<table><caption>Axes</caption><thead><tr><th>axis</th><th>values</th></tr></thead><tbody>
{% for axis in doc.axes %}<tr><td>{{ axis.name }}</td><td>{{ axis["values"] | map("string") | join(", ") }}</td></tr>
{% endfor %}</tbody></table>
{% if doc.find %}<p>Boundary search along <strong>{{ doc.find.axis }}</strong> until
<strong>{{ doc.find.until }}</strong>, resolution {{ doc.find.resolution }}: bisection per cell between the axis'
bounds, assuming the outcome is monotone along it; only the probed runs are drawn.</p>{% endif %}
{% if doc.spreads %}
<h2>Critical {{ doc.boundary_axis }}</h2>
<p>Per condition{% if doc.axes | length > 1 %} and other axes{% endif %}: the {{ doc.boundary_axis }} from which
runs are {{ doc.until }} (the grid value where it first holds), over seeds.</p>
<table class="runs"><thead><tr>{% for k in spread_keys %}<th>{{ k }}</th>{% endfor %}<th>seeds found</th>
<th>critical min</th><th>max</th><th>mean</th><th>per seed</th></tr></thead><tbody>
{% for s in doc.spreads %}<tr>{% for k in spread_keys %}<td>{{ s[k] }}</td>{% endfor %}
<td>{{ s.found }} of {{ s.seeds }}</td><td class="measured">{{ s.critical_min | show }}</td>
<td>{{ s.critical_max | show }}</td><td>{{ s.critical_mean | show }}</td>
<td>{% for b in s.by_seed %}seed {{ b.seed }}: {{ b.critical if b.status == "found" else status_words[b.status] }}
{%- if not loop.last %}; {% endif %}{% endfor %}</td></tr>
{% endfor %}</tbody></table>
{% endif %}
<h2>Phase diagrams</h2>
<figure>{{ recovery | safe }}<figcaption>Share of runs recovered per cell{% if doc.spreads and not doc.axes[1:] %};
a black bar marks each seed's boundary{% endif %}.</figcaption></figure>
<figure>{{ hold | safe }}<figcaption>Hold cohort delivered (%), mean per cell.</figcaption></figure>
<h2>Runs</h2>
<details><summary>{{ doc.rows | length }} runs (also in sweep.json)</summary>
<table class="runs"><thead><tr>{% for k in row_keys %}<th>{{ k }}</th>{% endfor %}</tr></thead><tbody>
{% for r in doc.rows %}<tr>{% for k in row_keys %}<td>{{ r.get(k) | show }}</td>
{% endfor %}</tr>
{% endfor %}</tbody></table></details>
</main></body></html>
""")

# A cell's boundary status, in words (bisect.Boundary.status, or "failed").
STATUS_WORDS = {"found": "found", "everywhere": "everywhere in range", "nowhere": "nowhere in range",
                "non-monotone": "not monotone", "failed": "a run failed"}
_ROW_KEYS = ("recovered", "recovery_s", "hold_delivered_pct", "pulse_delivered_pct", "primary_timely_pct",
             "created_x", "completed_x", "retry_share_pct", "error")
_SPREAD_FIELDS = ("axis", "seeds", "found", "critical_min", "critical_max", "critical_mean", "by_seed")


def render_page(document: Mapping[str, Any]) -> str:
    """The sweep's page from its document."""
    css = (resources.files("retrybench.report") / "templates" / "report.css").read_text()
    axes = [a["name"] for a in document["axes"]]
    spreads = document.get("spreads") or []
    spread_keys = [k for k in (spreads[0] if spreads else {}) if k not in _SPREAD_FIELDS]
    recovery = phase_diagram(document, "recovered", "Recovered runs per cell", (0.0, 1.0), "share recovered")
    hold = phase_diagram(document, "hold_delivered_pct", "Hold delivered per cell", (0.0, 100.0),
                         "hold delivered (%)")
    return _PAGE.render(doc=document, css=css, recovery=recovery, hold=hold, spread_keys=spread_keys,
                        row_keys=["condition", "seed", *axes, *_ROW_KEYS], status_words=STATUS_WORDS)
