"""The stacked-retries section's figure, in report.figures' style: per stack, executions and requests per
call under each control (log scale), each bar labelled with the runs that recovered."""

from __future__ import annotations

from retrybench.report.figures import COLOURS, HATCHES, _empty, _figure, _svg
from retrybench.report.stacks import StacksSection

__all__ = ["TITLE", "figure_stacks", "stack_figures"]

TITLE = "Stacked retries. Requests and executions per call, per stack and control"


def figure_stacks(section: StacksSection) -> str:
    bars = section["bars"]
    if not bars:
        return _empty(TITLE, "stacked-retries run")
    stacks = section["stacks"]
    top_all = max(max(b["wire_per_call"], b["executions_per_call"]) for b in bars)
    with _figure("figstacks", 7.2, 3.2, ncols=len(stacks)) as (fig, axes):
        for ax, stack in zip(axes, stacks, strict=True):
            mine = [b for b in bars if b["stack"] == stack]
            xs = range(len(mine))
            ax.bar([x - 0.2 for x in xs], [b["wire_per_call"] for b in mine], width=0.4, color=COLOURS[0],
                   hatch=HATCHES[1], edgecolor="white", label="requests per call" if stack == stacks[0] else None)
            ax.bar([x + 0.2 for x in xs], [b["executions_per_call"] for b in mine], width=0.4, color=COLOURS[1],
                   label="executions per call" if stack == stacks[0] else None)
            for x, b in zip(xs, mine, strict=True):
                top = max(b["wire_per_call"], b["executions_per_call"])
                ax.annotate(f"{b['recovered']}/{b['runs']}", (x, top), ha="center", va="bottom", fontsize=7)
            ax.set_yscale("log")
            ax.set_ylim(0.8, top_all * 2)  # one scale for every panel
            ticks = [t for t in (1, 2, 5, 10, 20, 50, 100) if t <= top_all * 2]
            ax.set_yticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xticks(list(xs), [b["control"] for b in mine], rotation=60, ha="right", fontsize=7)
            ax.set_title(stack.replace("-behind-", "\nbehind-"), fontsize=7)
        axes[0].set_ylabel("per call (mean over runs, log)\nlabels: runs recovered")
        fig.legend(loc="outside lower center", ncols=2, frameon=False)
        alt = "Bars per stack and control: " + "; ".join(
            f"{b['stack']}, {b['control']}: {b['wire_per_call']:.2f} requests and {b['executions_per_call']:.2f} "
            f"executions per call, {b['recovered']} of {b['runs']} runs recovered" for b in bars) + "."
        return _svg(fig, TITLE, alt)


def stack_figures(section: StacksSection | None) -> dict[str, str]:
    """The section's figure by the name `stacks` the template shows it under; nothing without the section."""
    return {"stacks": figure_stacks(section)} if section else {}
