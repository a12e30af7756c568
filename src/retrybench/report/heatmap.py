"""Heat maps of run outcomes over two axes, one panel per value of a third: the phase diagrams of a
sweep's page and the report's boundary maps, drawn the one way.

A map is plain data, as a sweep's document holds it: rows (one per run, with its axis values and
metrics) and boundaries (one per cell searched along the horizontal axis, `sweep.run`'s rows). Each
panel shows the mean of a metric per cell over the runs in it (cells no run probed stay grey), a bar
between the two grid values that bracket each seed's boundary, and any points given (the paper's runs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrybench.report.figures import _figure, _svg

__all__ = ["SEED", "HeatMap", "draw_heatmap", "label", "ordered"]

SEED = "seed"
ANNOTATE_MAX_CELLS = 150  # cells per panel up to which each cell's value is printed in it
UNPROBED = "#f2f2f2"  # the face colour where no run fell


def label(value: Any) -> str:
    """An axis value as a tick label: `none`, 2.7 (not 2.7000), or the text."""
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def ordered(values: Sequence[Any]) -> list[Any]:
    """Numbers ascending, anything else as given."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return list(values)


@dataclass(frozen=True)
class HeatMap:
    """What to draw: `metric` over `x` (horizontal, values `xs`) and `y` (vertical, values `ys`), one
    panel per value of `panel` in `panels`. `seeds` split each row into one band per seed, for the
    boundary bars (a whole row where `y` is the seed itself). `points`: marks at {panel, x, y} with a
    legend `points_label`."""

    rows: Sequence[Mapping[str, Any]]
    boundaries: Sequence[Mapping[str, Any]]
    x: str
    y: str
    xs: Sequence[Any]
    ys: Sequence[Any]
    panel: str
    panels: Sequence[Any]
    seeds: Sequence[int]
    points: Sequence[Mapping[str, Any]] = ()
    points_label: str = ""
    annotate: bool = True
    y_ticks: int = 12  # labels on the vertical axis at most (every other one past it)
    labels_every_panel: bool = True  # else the vertical axis' labels on the first panel only


def _matrix(rows: Sequence[Mapping[str, Any]], x: str, y: str, xs: Sequence[Any], ys: Sequence[Any],
            metric: str) -> np.ndarray:
    """The mean of `metric` per (y, x) cell over the rows that have it (recovered as 0/1); NaN where none."""
    xs, ys = list(xs), list(ys)
    total, count = np.zeros((len(ys), len(xs))), np.zeros((len(ys), len(xs)))
    for row in rows:
        value = row.get(metric)
        if value is None or row[x] not in xs or row[y] not in ys:
            continue
        i, j = ys.index(row[y]), xs.index(row[x])
        total[i, j] += float(value)
        count[i, j] += 1
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _ticks(ax: Any, xs: Sequence[Any], ys: Sequence[Any], y_ticks: int, y_labels: bool) -> None:
    every = max(1, math.ceil(len(xs) / 10))
    ax.set_xticks(range(0, len(xs), every), [label(v) for v in xs[::every]], rotation=45 if every == 1 and
                  len(xs) > 6 else 0)
    every_y = max(1, math.ceil(len(ys) / y_ticks))
    ax.set_yticks(range(0, len(ys), every_y), [label(v) for v in ys[::every_y]] if y_labels else [])


def _position(value: Any, values: Sequence[Any]) -> float | None:
    """Where `value` falls on an axis drawn at indices 0, 1, ...: its index, or between two numeric
    values by linear interpolation; None off the axis."""
    values = list(values)
    if value in values:
        return float(values.index(value))
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in [value, *values])
    if not numeric or not values or not min(values) <= value <= max(values):
        return None
    return float(np.interp(float(value), [float(v) for v in values], range(len(values))))


def _boundary_marks(ax: Any, spec: HeatMap, panel: Any) -> None:
    """A bar between the two grid values that bracket each cell's boundary, in its seed's band of the row."""
    xs, ys, seeds = list(spec.xs), list(spec.ys), list(spec.seeds)
    for b in spec.boundaries:
        if b.get(spec.panel) != panel or b["status"] != "found" or b["axis"] != spec.x:
            continue
        row = b["seed"] if spec.y == SEED else b.get(spec.y)
        if row not in ys or b["seed"] not in seeds or any(v not in xs for v in b["bracket"]):
            continue
        low, high = (xs.index(v) for v in b["bracket"])
        i = ys.index(row)
        band = (0, 1) if spec.y == SEED else (seeds.index(b["seed"]), len(seeds))
        bottom = i - 0.5 + band[0] / band[1]
        ax.plot([(low + high) / 2] * 2, [bottom, bottom + 1 / band[1]], color="black", linewidth=2.2,
                solid_capstyle="butt")


def _points(ax: Any, spec: HeatMap, panel: Any, legend: bool) -> bool:
    """The marks of `spec.points` on this panel; whether any was drawn."""
    drawn = False
    for point in spec.points:
        if point.get("panel") != panel:
            continue
        x, y = _position(point["x"], spec.xs), _position(point["y"], spec.ys)
        if x is None or y is None:
            continue
        ax.scatter([x], [y], marker="*", s=90, facecolors="white", edgecolors="#D55E00", linewidths=1.2, zorder=4,
                   label=spec.points_label if legend and not drawn else None)
        drawn = True
    return drawn


def draw_heatmap(spec: HeatMap, metric: str, title: str, scale: tuple[float, float], legend: str,
                 note: str = "") -> str:
    """The map as an inline SVG: one panel per `spec.panels`, a shared colour scale. The alt text says
    what is drawn (`note` follows the axes: what is averaged, say), then each panel's runs and the
    metric's range."""
    rows = [r for r in spec.rows if r.get("error") is None]
    xs, ys, panels = list(spec.xs), list(spec.ys), list(spec.panels)
    width = min(3.0 * len(panels) + 1.2, 14.0)
    with _figure(title, width, 1.2 + min(0.28 * len(ys), 4.5), ncols=len(panels)) as (fig, axes):
        image = None
        marked = False
        for k, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
            grid = _matrix([r for r in rows if r.get(spec.panel) == panel], spec.x, spec.y, xs, ys, metric)
            image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="cividis",
                              vmin=scale[0], vmax=scale[1], interpolation="nearest")
            ax.set_facecolor(UNPROBED)  # cells no run probed
            if spec.annotate and grid.size <= ANNOTATE_MAX_CELLS:
                for (i, j), value in np.ndenumerate(grid):
                    if not np.isnan(value):
                        share = (value - scale[0]) / (scale[1] - scale[0])
                        ax.text(j, i, f"{value:.2g}" if scale[1] <= 1 else f"{value:.0f}", ha="center",
                                va="center", fontsize=6.5, color="black" if share > 0.55 else "white")
            _boundary_marks(ax, spec, panel)
            marked = _points(ax, spec, panel, legend=not marked) or marked
            _ticks(ax, xs, ys, spec.y_ticks, y_labels=k == 0 or spec.labels_every_panel)
            ax.set(title=label(panel), xlabel=spec.x)
        axes[0].set_ylabel(spec.y)
        if image is not None:
            fig.colorbar(image, ax=axes, label=legend, shrink=0.9)
        if marked:
            fig.legend(loc="outside lower center", frameon=False)
        alt = (f"Heat maps, one per {spec.panel} ({', '.join(label(p) for p in panels)}), of {legend} over {spec.x} "
               f"(horizontal) and {spec.y} (vertical){note}. "
               + "; ".join(_alt_panel(rows, spec.panel, p, metric) for p in panels) + ".")
        return _svg(fig, title, alt)


def _alt_panel(rows: Sequence[Mapping[str, Any]], panel_key: str, panel: Any, metric: str) -> str:
    chosen = [r for r in rows if r.get(panel_key) == panel and r.get(metric) is not None]
    if not chosen:
        return f"{label(panel)}: no runs"
    values = [float(r[metric]) for r in chosen]
    return f"{label(panel)}: {len(chosen)} runs, {metric} {min(values):.3g}-{max(values):.3g}"
