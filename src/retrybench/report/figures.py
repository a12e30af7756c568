"""The paper's figures redrawn from the report's data with matplotlib, as inline SVG.

Each function takes the figure's part of the context and returns an `<svg>` element with a title and
a description (its alt text). Series differ by line style, marker and hatch as well as colour, so the
figures read in grey print. Output is deterministic: no date, ids salted by the figure's name.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from html import escape
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, no GUI toolkit

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from retrybench.report.sections import Fig1, Fig3, Fig4, Fig5, Fig5Bar, Fig6, FigSdk, Figures

__all__ = ["draw_figures", "figure1", "figure3", "figure4", "figure5", "figure6", "figure_sdk"]

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
LINES = ("-", "--", "-.", ":")
HATCHES = ("", "//", "..", "xx")
_STYLE: dict[str, float | str | bool] = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                                         "axes.spines.right": False}


def _rc(name: str) -> Any:  # Any: matplotlib types rc keys as a Literal of every known key
    return {**_STYLE, "svg.hashsalt": name}


@contextmanager
def _figure(name: str, width: float, height: float, ncols: int = 1) -> Iterator[tuple[Figure, list[Axes]]]:
    with plt.rc_context(_rc(name)):
        fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False, layout="constrained")
        try:
            yield fig, list(axes[0])
        finally:
            plt.close(fig)


def _svg(fig: Figure, title: str, alt: str) -> str:
    buffer = io.StringIO()
    with plt.rc_context(_rc(title)):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    svg = text[text.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)  # RDF boilerplate, namespace URLs
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    # matplotlib's ids (figure_1, axes_1, patch_2 ...) repeat in every figure: one page needs them unique.
    prefix = slug.split("-")[0] + slug.split("-")[1] + "-"
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'(url\(#|href="#)([^)"]+)', lambda m: f"{m.group(1)}{prefix}{m.group(2)}", svg)
    head = (f'<svg role="img" aria-labelledby="{slug}-title {slug}-desc" '
            f'class="figure-svg"')
    svg = svg.replace("<svg", head, 1)
    close = svg.index(">") + 1
    return (svg[:close] + f'<title id="{slug}-title">{escape(title)}</title><desc id="{slug}-desc">{escape(alt)}</desc>'
            + svg[close:])


def _empty(title: str, what: str) -> str:
    return (f'<p class="no-data" role="note">{escape(title)}: no {escape(what)} in this run set, so the figure '
            "is not drawn.</p>")


def figure1(data: Fig1) -> str:
    title = "Figure 1. Calls delivered per 60 s and the waiting queue, diagnostic conditions"
    if not data["lines"]:
        return _empty(title, "diagnostic run")
    with _figure("figure1", 7.2, 2.8, ncols=2) as (fig, (left, right)):
        for i, line in enumerate(data["lines"]):
            colour, dashes = COLOURS[i], LINES[i % len(LINES)]
            delivered = line["delivered_per_60s"]
            left.step([60 * k for k in range(len(delivered))], delivered, where="post", label=line["condition"],
                      color=colour, linestyle=dashes, linewidth=1.4)
            step = line["waiting_step_s"]
            right.plot([step * k for k in range(len(line["waiting"]))], line["waiting"], color=colour,
                       linestyle=dashes, linewidth=1.4)
        left.set(title="(a) Calls delivered per 60 s", xlabel="Time since run start (s)", ylabel="calls")
        right.set(title="(b) Executions waiting (proxy + engine)", xlabel="Time since run start (s)",
                  ylabel="executions")
        fig.legend(loc="outside lower center", ncols=2, frameon=False)
        alt = (f"Two line charts over time for {data['model']} run {data['seed']}, one line per condition "
               f"({', '.join(x['condition'] for x in data['lines'])}): calls delivered per 60-s window, and "
               "executions waiting in the proxy and the engine. Peak waiting per condition: "
               + "; ".join(f"{x['condition']} {max(x['waiting'] or [0])}" for x in data["lines"]) + ".")
        return _svg(fig, title, alt)


def figure3(data: Fig3) -> str:
    title = "Figure 3. Execution rates over 347-947 s, diagnostic block"
    bars = data["bars"]
    if not bars:
        return _empty(title, "diagnostic run")
    kinds = (([b["created_x"] for b in bars], "created at the proxy"),
             ([b["accepted_x"] for b in bars], "accepted by vLLM"), ([b["completed_x"] for b in bars], "completed"))
    with _figure("figure3", 7.2, 2.6) as (fig, (ax,)):
        height = 0.26
        for k, (rates, name) in enumerate(kinds):
            ys = [i + (k - 1) * height for i in range(len(bars))]
            ax.barh(ys, rates, height=height, color=COLOURS[k], hatch=HATCHES[k],
                    edgecolor="black", linewidth=0.5, label=name)
        ax.set_yticks(range(len(bars)), [b["condition"] for b in bars])
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linestyle=":", linewidth=1)
        ax.set(xlabel="Executions per second over 347-947 s (multiples of C-hat)")
        fig.legend(loc="outside lower center", ncols=3, frameon=False)
        alt = "Horizontal bars per condition, means over runs: " + "; ".join(
            f"{b['condition']}: created {b['created_x']:.2f}, accepted {b['accepted_x']:.2f}, completed "
            f"{b['completed_x']:.2f} times C-hat" for b in bars) + "."
        return _svg(fig, title, alt)


def figure4(data: Fig4) -> str:
    title = "Figure 4. Computed prompt tokens per tracing run"
    bars = data["bars"]
    if not bars:
        return _empty(title, "tracing run")
    parts = (([b["body"] for b in bars], "aborted, body (before the abort)"),
             ([b["in_flight"] for b in bars], "aborted, in flight at the abort"),
             ([b["not_aborted"] for b in bars], "not aborted"))
    with _figure("figure4", 7.2, 0.6 + 0.26 * len(bars)) as (fig, (ax,)):
        left = [0.0] * len(bars)
        ys = range(len(bars))
        for k, (widths, name) in enumerate(parts):
            ax.barh(ys, widths, left=left, color=COLOURS[k], hatch=HATCHES[k], edgecolor="black", linewidth=0.5,
                    label=name)
            left = [a + w for a, w in zip(left, widths, strict=True)]
        ax.plot([b["missed"] for b in bars], list(ys), linestyle="none", marker="D", color="black",
                markerfacecolor="white", label="missed by the prompt-token counter")
        ax.set_yticks(list(ys), [b["label"] for b in bars])
        ax.invert_yaxis()
        ax.set(xlabel="Share of computed prompt tokens (%)", xlim=(0, 100))
        fig.legend(loc="outside lower center", ncols=2, frameon=False)
        alt = "Stacked bars, one per tracing run: " + "; ".join(
            f"{b['label']}: aborted {b['body'] + b['in_flight']:.1f}% ({b['in_flight']:.1f}% in flight), "
            f"missed {b['missed']:.1f}%" for b in bars) + "."
        return _svg(fig, title, alt)


def _cohort_share(bar: Fig5Bar, cohort: str, kind: str) -> float:
    shares = {("primary", "timely"): bar["primary_timely"], ("primary", "late"): bar["primary_late"],
              ("primary", "undelivered"): bar["primary_undelivered"], ("pulse", "timely"): bar["pulse_timely"],
              ("pulse", "late"): bar["pulse_late"], ("pulse", "undelivered"): bar["pulse_undelivered"]}
    return shares[cohort, kind]


def figure5(data: Fig5) -> str:
    title = "Figure 5. Delivery of the primary and pulse cohorts per condition"
    groups = data["groups"]
    if not groups:
        return _empty(title, "Section 6 run")
    labels = [f"{g['block']}: {b['condition']}" for g in groups for b in g["bars"]]
    bars = [b for g in groups for b in g["bars"]]
    kinds = (("timely", "delivered within 120 s"), ("late", "delivered late (by 840 s)"),
             ("undelivered", "not delivered"))
    with _figure("figure5", 7.2, 0.9 + 0.2 * len(bars), ncols=2) as (fig, axes):
        for ax, cohort in zip(axes, ("primary", "pulse"), strict=True):
            left = [0.0] * len(bars)
            for k, (kind, name) in enumerate(kinds):
                widths = [_cohort_share(b, cohort, kind) for b in bars]
                ax.barh(range(len(bars)), widths, left=left, color=COLOURS[k], hatch=HATCHES[k],
                        edgecolor="black", linewidth=0.4, label=name if cohort == "primary" else None)
                left = [a + w for a, w in zip(left, widths, strict=True)]
            ax.set(title=f"{cohort} cohort", xlabel="Share of offered calls (%)", xlim=(0, 100))
            ax.set_yticks(range(len(bars)), labels if cohort == "primary" else [""] * len(bars))
            ax.invert_yaxis()
        fig.legend(loc="outside lower center", ncols=3, frameon=False)
        alt = "Stacked bars per block and condition: " + "; ".join(
            f"{name}: primary {b['primary_timely']:.1f}% within 120 s, {b['primary_late']:.1f}% late; pulse "
            f"{b['pulse_timely']:.1f}% within 120 s, {b['pulse_late']:.1f}% late"
            for name, b in zip(labels, bars, strict=True)) + "."
        return _svg(fig, title, alt)


def figure6(data: Fig6) -> str:
    title = "Figure 6. Delivery against creation rate at the proxy, every run"
    points = data["points"]
    if not points:
        return _empty(title, "run")
    with _figure("figure6", 7.2, 3.2) as (fig, (ax,)):
        for recovered, marker, colour, name in ((True, "o", COLOURS[0], "recovered"),
                                                (False, "x", COLOURS[1], "not recovered")):
            chosen = [p for p in points if p["recovered"] is recovered]
            ax.scatter([p["created_x"] for p in chosen], [p["primary_timely_pct"] for p in chosen], marker=marker,
                       s=22, color=colour, facecolors=colour if recovered else None, linewidths=1.0,
                       label=f"{name} ({len(chosen)})")
        ax.axvline(1.0, color="black", linestyle=":", linewidth=1, label="C-hat")
        ax.set(xlabel="Execution creation rate at the proxy over 347-947 s (multiples of C-hat)",
               ylabel="Primary cohort delivered\nwithin 120 s (%)", ylim=(-3, 103))
        ax.legend(loc="upper right", frameon=False)
        ok = [p for p in points if p["recovered"]]
        above = [p for p in ok if p["created_x"] >= 1.0]
        alt = (f"Scatter of {len(points)} runs: {len(ok)} recovered, all but {len(above)} of them left of "
               "the dotted C-hat line; creation rates range "
               f"{min(p['created_x'] for p in points):.2f}-{max(p['created_x'] for p in points):.2f} times C-hat.")
        return _svg(fig, title, alt)


def figure_sdk(data: FigSdk) -> str:
    """Beyond the paper: one panel per condition, one line per client profile across the pulse sizes."""
    title = "SDK clients. Hold delivered per client profile, condition and pulse"
    series, conditions = data["series"], data["conditions"]
    if not series:
        return _empty(title, "sdk-clients run")
    clients = list(dict.fromkeys(s["client"] for s in series))
    with _figure("figsdk", 7.2, 2.9, ncols=len(conditions)) as (fig, axes):
        for ax, condition in zip(axes, conditions, strict=True):
            for s in (s for s in series if s["condition"] == condition):
                k = clients.index(s["client"])
                dodge = (k - (len(clients) - 1) / 2) * 0.05  # clients that coincide stay visible side by side
                xs = [p["pulse_x"] + dodge for p in s["points"]]
                ax.plot(xs, [p["hold_pct"] for p in s["points"]], color=COLOURS[k], linestyle=LINES[k % len(LINES)],
                        linewidth=1.2, label=s["client"] if condition == conditions[0] else None)
                for x, p in zip(xs, s["points"], strict=True):  # filled: every run recovered; open: some; x: none
                    whole, none = p["recovered"] == 1, p["recovered"] == 0
                    ax.scatter([x], [p["hold_pct"]], s=24, marker="x" if none else "o",
                               color=COLOURS[k], facecolors=COLOURS[k] if whole or none else "white", zorder=3)
            ax.set(title=condition, xlabel="Pulse (× C-hat)", ylim=(-3, 103))
            ax.set_xticks(sorted({p["pulse_x"] for s in series for p in s["points"]}))
        axes[0].set_ylabel("Hold delivered (%)\nmean over runs")
        fig.legend(loc="outside lower center", ncols=len(clients), frameon=False)
        alt = "Lines per condition and client: " + "; ".join(
            f"{s['condition']}, {s['client']}: " + ", ".join(
                f"{p['pulse_x']:g} C-hat {p['hold_pct']:.1f}% ({p['recovered'] * 100:.0f}% of runs recovered)"
                for p in s["points"]) for s in series) + "."
        return _svg(fig, title, alt)


def draw_figures(figures: Figures) -> dict[str, str]:
    """Every figure of the report as an inline SVG, by the name the template shows it under."""
    return {"fig1": figure1(figures["fig1"]), "fig3": figure3(figures["fig3"]), "fig4": figure4(figures["fig4"]),
            "fig5": figure5(figures["fig5"]), "fig6": figure6(figures["fig6"]), "sdk": figure_sdk(figures["sdk"])}
