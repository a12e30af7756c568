"""The rejection section's figure (beyond the paper), in figures.py's style: retries sent per 1,000
calls for each refusal answer and client profile, one bar per profile, hatched as well as coloured."""

from __future__ import annotations

from retrybench.report.figures import COLOURS, HATCHES, _empty, _figure, _svg
from retrybench.report.sections import RejectionSection

__all__ = ["TITLE", "figure_rejection", "rejection_figures"]

TITLE = "Rejection. Retries sent per 1,000 calls, per refusal answer and client profile"


def figure_rejection(section: RejectionSection) -> str:
    """Horizontal bars: one group per condition (in the block's order), one bar per client profile."""
    bars = section["bars"]
    if not bars:
        return _empty(TITLE, "rejection run")
    conditions = list(dict.fromkeys(b["condition"] for b in bars))
    clients = list(dict.fromkeys(b["client"] for b in bars))
    height = 1.2 + 0.32 * len(conditions) * max(1, len(clients)) / 2
    width = 0.8 / len(clients)
    with _figure("figrejection", 7.2, height) as (fig, axes):
        ax = axes[0]
        for k, client in enumerate(clients):
            values = {b["condition"]: b["retries_per_1000"] for b in bars if b["client"] == client}
            ys = [i + (k - (len(clients) - 1) / 2) * width for i, c in enumerate(conditions) if c in values]
            xs = [values[c] for c in conditions if c in values]
            ax.barh(ys, xs, height=width, color=COLOURS[k % len(COLOURS)], hatch=HATCHES[k % len(HATCHES)],
                    edgecolor="white", label=client)
        ax.set_yticks(range(len(conditions)), conditions)
        ax.invert_yaxis()
        ax.set_xlabel("Retries sent per 1,000 calls (mean over runs)")
        fig.legend(loc="outside lower center", ncols=len(clients), frameon=False)
        alt = "Bars per condition and client: " + "; ".join(
            f"{b['condition']}, {b['client']}: {b['retries_per_1000']:.0f}" for b in bars) + "."
        return _svg(fig, TITLE, alt)


def rejection_figures(section: RejectionSection | None) -> dict[str, str]:
    """The section's figure by the name `rejection` the template shows it under; nothing without runs."""
    if not section:
        return {}
    return {"rejection": figure_rejection(section)}
