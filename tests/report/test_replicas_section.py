"""The replicas block's report section: one row per replica count, router and condition, one column group
per proxy tier, and sentences computed from the runs on where coalescing loses its effect."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

import pytest

from retrybench.plan.blocks import block_specs
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.context import run_file_name
from retrybench.report.meta import gather
from retrybench.report.render import render_html
from retrybench.report.replicas import replicas_section
from retrybench.report.runs import RunSet

META = {"engine": "sim", "wall_s": 1.0}
QWEN = "qwen2.5-7b-instruct"


@pytest.fixture(scope="module")
def template(results: list[Result]) -> dict[str, Any]:
    return dict(next(r for r in results if "error" not in r))


def fake(template: dict[str, Any], spec: RunSpec, recovered: bool, attached: float | None) -> Result:
    summary: dict[str, Any] = {**template, **asdict(spec), "spec": spec.as_dict(), "recovered": recovered,
                               "pulse_delivered_pct": 100.0 if recovered else 60.0, "retries_attached_pct": attached,
                               "chat": 2.71 * spec.replicas}
    return cast(Result, summary)


def coalescing_breaks_on_a_random_front(spec: RunSpec) -> tuple[bool, float | None]:
    """What the runs would show if coalescing needed every retry on its execution's instance."""
    if spec.condition in ("coalescing", "deferred-cancellation"):
        spread = spec.proxy_state == "per-instance" and spec.front == "random"
        return (not spread, 55.0 if spread else 98.0)
    return (spec.condition == "retry-budget", 0.0 if spec.condition == "no-control" else None)


def results_where(template: dict[str, Any], outcome: Any) -> list[Result]:
    return [fake(template, s, *outcome(s)) for s in block_specs("replicas", QWEN, runs=1)]


def test_the_section_says_where_coalescing_loses_its_effect(template: dict[str, Any]) -> None:
    section = replicas_section(RunSet(results_where(template, coalescing_breaks_on_a_random_front), runs=1))
    assert section is not None
    assert len(section["rows"]) == (1 + 4 + 4) * 4  # replica-count/router cells x conditions
    first = section["rows"][0]
    assert (first["replicas"], first["condition"]) == (1, "no-control")
    assert [t["recovered"] for t in section["rows"][1]["tiers"]] == ["0 of 1", "1 of 1", "1 of 1"]
    coalescing = section["sentences"][0]
    assert coalescing.startswith("Coalescing: with one state shared by the proxy instances 9 of 9 runs recovered")
    assert "it loses its effect (in every replica count and router)" in coalescing
    assert "A key-affine front restores it: 9 of 9 runs recovered (median 98% attached)" in coalescing
    assert "(the router did not change recovery)" in section["sentences"][-1]


def test_the_section_says_when_coalescing_keeps_its_effect(template: dict[str, Any]) -> None:
    section = replicas_section(RunSet(results_where(template, lambda s: (True, 97.0)), runs=1))
    assert section is not None
    assert section["sentences"][0].endswith("(median 97% attached): it keeps its effect.")


def test_each_run_has_its_own_file_and_the_page_shows_the_section(template: dict[str, Any]) -> None:
    results = results_where(template, coalescing_breaks_on_a_random_front)
    assert len({run_file_name(r) for r in results}) == len(results)
    context = build_context(results, {**gather(engine="sim", wall_s=1.0, command="test"), "chat_at_steps": []},
                            runs=1)
    assert context["replicas"] is not None
    assert [row["measured"] for row in context["setup"]["chat"]] == ["2.71"]  # a replica set's C-hat stays out
    html = render_html({**context, "real_engine": None})
    assert '<section id="replicas"' in html and "it loses its effect" in html


def test_no_replicas_runs_no_section(results: list[Result]) -> None:
    assert build_context(results, META)["replicas"] is None
