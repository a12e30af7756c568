"""The deadlines section's figure: the hold cohort delivered per control, one marker per run (filled: it
recovered; a cross: it did not), drawn as the report's other figures are (report.figures)."""

from __future__ import annotations

from retrybench.report.deadlines import DeadlinesSection
from retrybench.report.figures import COLOURS, _empty, _figure, _svg

__all__ = ["TITLE", "deadline_figures", "figure_deadlines"]

TITLE = "Deadlines 1. Hold cohort delivered per control at the paper's pulse"


def figure_deadlines(section: DeadlinesSection) -> str:
    points = section["points"]
    if not points:
        return _empty(TITLE, "deadlines run")
    conditions = [row["condition"] for row in section["rows"]]
    with _figure("figdeadlines", 7.2, 0.9 + 0.3 * len(conditions)) as (fig, axes):
        ax = axes[0]
        for k, condition in enumerate(conditions):
            mine = [p for p in points if p["condition"] == condition]
            for j, p in enumerate(mine):
                y = k + (j - (len(mine) - 1) / 2) * 0.15  # runs one above the other
                colour = COLOURS[k % len(COLOURS)]
                ax.scatter([p["hold_pct"]], [y], s=30, marker="o" if p["recovered"] else "x", color=colour, zorder=3)
        ax.set_yticks(range(len(conditions)), conditions)
        ax.invert_yaxis()  # the table's order, top to bottom
        ax.set(xlabel="Hold cohort delivered (%)", xlim=(-3, 103))
        ax.grid(axis="x", linewidth=0.4, alpha=0.5)
        alt = "Hold cohort delivered per run: " + "; ".join(
            f"{p['condition']} run {p['seed']} {p['hold_pct']:.1f}% "
            f"({'recovered' if p['recovered'] else 'not recovered'})" for p in points) + "."
        return _svg(fig, TITLE, alt)


def deadline_figures(section: DeadlinesSection | None) -> dict[str, str]:
    """The section's figure under the name `deadlines` the template shows it under; nothing without it."""
    return {"deadlines": figure_deadlines(section)} if section else {}
