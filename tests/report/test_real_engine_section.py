"""The report's Real engine section (report/real_engine.py) from a compare-real-engine result."""

from __future__ import annotations

from typing import Any

import pytest

from retrybench.report.real_engine import real_engine_section
from retrybench.report.render import _environment

RESULT: dict[str, Any] = {
    "format": "retrybench-real-engine/2", "wall_s": 1500.0, "settings": {"runtime": "container"},
    "pinning": {"note": "engine on CPU 0, harness (load generator and proxy) on CPU 1"},
    "band": {"chats": [2.0, 2.05, 2.1], "mean": 2.05, "low": 2.0, "high": 2.1, "spread": 0.0488, "refusal": None},
    "calibrations": [{"chat": 2.0, "stages": [{"harness_cpu_pct": 9.0}, {"harness_cpu_pct": 13.0}]}],
    "capacity_curve": [{"load_x": 1.5, "rate_calls_per_s": 3.075, "harness_cpu_pct": 12.0,
                        "live": {"completions_per_s": 2.01, "median_ttft_s": 3.2, "sustained": {"per_s": 1.98}},
                        "sim": {"completions_per_s": 2.04, "median_ttft_s": 2.9, "sustained": {"per_s": None}},
                        "live_prefix_cache": {"hit_pct": 10.5}, "sim_prefix_cache": {"hit_pct": 10.7}}],
    "conditions": [{
        "condition": "coalescing", "paper_recovers": True, "harness_cpu_pct": 14.0,
        "live": {"recovered": False, "hold_delivered_pct": 25.4, "completed_x": 0.55},
        "sim_low": {"recovered": True, "hold_delivered_pct": 99.0, "completed_x": 0.95},
        "sim_high": {"recovered": True, "hold_delivered_pct": 100.0, "completed_x": 0.96},
        "saturated": {"per_s": 2.02}, "probe_after": {"per_s": 1.99},
        "verdict": {"status": "disagree", "reason": "recovered: live did not recover", "capacity": {"status": "ok"}},
    }],
}


def test_the_section_shows_the_band_the_curve_and_each_verdict() -> None:
    section = real_engine_section(RESULT)
    assert section["chats"] == "2.000, 2.050, 2.100" and section["spread_pct"] == "4.9"
    assert section["calibration_cpu"] == "13"
    assert section["curve"][0]["live_cps"] == "2.010" and section["curve"][0]["sim_ttft"] == "2.900"
    assert section["curve"][0]["live_sustained"] == "1.980" and section["curve"][0]["sim_sustained"] == "–"
    assert section["curve"][0]["live_hits"] == "10.5" and section["runtime"] == "container"
    row = section["conditions"][0]
    assert row["recovered"] == "no / yes–yes" and row["hold"] == "25.4 / 99.0–100.0"
    assert row["status"] == "disagree" and row["capacity"] == "ok"


def test_the_page_renders_the_section_only_when_given() -> None:
    template = _environment().from_string(
        '{% if real_engine is defined and real_engine %}{{ real_engine.conditions[0].status }}{% endif %}')
    assert template.render(real_engine=real_engine_section(RESULT)) == "disagree"
    assert template.render() == ""


def test_another_file_is_refused() -> None:
    with pytest.raises(ValueError, match="retrybench-real-engine/2"):
        real_engine_section({"format": "something else"})
