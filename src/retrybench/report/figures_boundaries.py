"""The boundary maps of the report's "Boundaries" section, drawn as the sweep page draws its phase
diagrams (report.heatmap): share of runs recovered per probed cell, each seed's boundary as a bar,
the paper's own runs as stars."""

from __future__ import annotations

from retrybench.report.boundaries import BoundariesSection, MapDocument
from retrybench.report.heatmap import HeatMap, draw_heatmap

__all__ = ["TITLES", "boundary_figures", "draw_map"]

TITLES = {
    "pulse": "Boundaries 1. Recovery over the pulse, per Table 1 condition and model",
    "deferral": "Boundaries 2. Recovery over the pulse and the deferral window W",
    "engine-cap": "Boundaries 3. Recovery over the engine cap Q and the pulse",
}


def draw_map(doc: MapDocument) -> str:
    """One map (a document of report.boundaries' section) as an inline SVG."""
    spec = HeatMap(rows=doc["rows"], boundaries=doc["boundaries"], x=doc["x"], y=doc["y"], xs=doc["xs"],
                   ys=doc["ys"], panel=doc["panel"], panels=doc["panels"], seeds=doc["seeds"], points=doc["points"],
                   points_label="the paper's runs", annotate=len(doc["xs"]) <= 12, y_ticks=24,
                   labels_every_panel=doc["y"] != "condition")
    seeds = ", ".join(str(s) for s in doc["seeds"])
    return draw_heatmap(spec, "recovered", TITLES.get(doc["name"], doc["name"]), (0.0, 1.0), "share recovered",
                        note=f", probed cells only, over seeds {seeds}; bars mark each seed's boundary")


def boundary_figures(section: BoundariesSection | None) -> dict[str, str]:
    """Each map of the section drawn, by the name `boundaries_<map>` the template shows it under;
    nothing where the report has no such section."""
    if not section:
        return {}
    return {f"boundaries_{name.replace('-', '_')}": draw_map(doc) for name, doc in section["maps"].items()}
