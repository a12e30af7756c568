"""The report page built from the fixture set: valid, self-contained HTML with every section, table and
figure, accessible (table headers, figure titles and alt text), and each run's JSON beside it."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from retrybench.records.results import Result

SECTIONS = ("summary", "table2", "table3", "figures", "checks", "blocks", "metadata")
FIGURES = ("figure1", "figure3", "figure4", "figure5", "figure6")
VOID = {"meta", "link", "br", "img", "hr", "input", "col", "area", "base", "wbr", "source", "path", "use", "stop",
        "rect", "circle", "ellipse", "line", "polyline", "polygon", "image"}


class _Page(HTMLParser):
    """Records ids, tag counts, attributes and nesting errors of one page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: dict[str, str] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.path: list[list[str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        self.path.append(list(self.stack))
        if attributes.get("id"):
            if attributes["id"] in self.ids:
                self.errors.append(f"duplicate id {attributes['id']}")
            self.ids[str(attributes["id"])] = tag
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.path.append(list(self.stack))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def page(built_report: Path) -> _Page:
    parsed = _Page()
    parsed.feed(built_report.read_text(encoding="utf-8"))
    parsed.close()
    return parsed


def _of(page: _Page, tag: str) -> list[dict[str, str | None]]:
    return [attrs for t, attrs in page.tags if t == tag]


def test_the_page_parses_with_balanced_tags(page: _Page) -> None:
    assert page.errors == []
    assert page.stack == []
    assert page.tags[0][0] == "html"


def test_every_section_and_figure_is_there(page: _Page) -> None:
    for name in SECTIONS:
        assert page.ids.get(name) == "section", name
    for name in FIGURES:
        assert page.ids.get(name) == "figure", name
    text = " ".join(page.text)
    for heading in ("Summary of findings", "Table 2.", "Table 3.", "Run metadata", "Runs per block"):
        assert heading in text


def test_the_summary_has_a_row_group_per_finding_with_a_verdict(page: _Page) -> None:
    keys = [str(a["id"]) for a in _of(page, "tbody") if str(a.get("id", "")).startswith("finding-")]
    assert keys == ["finding-finding1", "finding-finding2", "finding-finding3", "finding-finding4",
                    "finding-finding5", "finding-finding6", "finding-finding7", "finding-section64",
                    "finding-section65", "finding-section42-2x", "finding-section62-q338"]
    text = " ".join(page.text)
    assert "reproduced" in text and "not reproduced" in text and "uncertain in the paper" in text


def test_every_figure_is_an_inline_svg_with_a_title_and_alt_text(page: _Page) -> None:
    svgs = _of(page, "svg")
    beyond = ["figure-sdk"] if page.ids.get("sdk-clients") == "section" else []  # its section, when it has runs
    assert len(svgs) == len(FIGURES) + len(beyond)
    assert all(page.ids.get(name) == "figure" for name in beyond)
    for svg in svgs:
        assert svg.get("role") == "img"
        title_id, desc_id = str(svg["aria-labelledby"]).split()
        assert page.ids[title_id] == "title" and page.ids[desc_id] == "desc"


def test_every_table_has_a_caption_and_header_cells(page: _Page) -> None:
    tables = sum(1 for t, _ in page.tags if t == "table")
    assert tables >= 5  # summary, Tables 2 and 3, checks, a block, metadata
    assert sum(1 for t, _ in page.tags if t == "caption") == tables
    for attrs in _of(page, "th"):
        assert attrs.get("scope") in ("col", "row", "colgroup", "rowgroup"), attrs


def test_the_page_is_self_contained(page: _Page, built_report: Path) -> None:
    assert _of(page, "script") == []
    assert _of(page, "link") == []
    assert _of(page, "img") == []
    for attrs in _of(page, "a"):
        href = str(attrs.get("href"))
        assert href.startswith(("#", "runs/")), href
        if href.startswith("runs/"):
            assert (built_report.parent / href).is_file()
    text = built_report.read_text(encoding="utf-8")
    assert "http://" not in text.replace("http://www.w3.org/", "") and "https://" not in text
    assert "@import" not in text
    assert re.findall(r"url\((?!#)", text) == []  # only references within the page (clip paths)


def test_each_runs_summary_json_is_beside_the_report(built_report: Path, results: list[dict[str, Any]]) -> None:
    files = sorted((built_report.parent / "runs").glob("*.json"))
    assert len(files) == len(results)
    assert any("error" in json.loads(f.read_text()) for f in files)
    summary = json.loads((built_report.parent / "summary.json").read_text())
    assert {"summary", "meta", "blocks"} <= set(summary)


def test_the_metadata_names_engine_versions_and_commit(page: _Page) -> None:
    text = " ".join(page.text)
    for needle in ("simulated vLLM-V1 engine", "code version", "commit", "numpy", "matplotlib", "C-hat per engine",
                   "Qwen/Qwen2.5-7B-Instruct"):
        assert needle in text, needle


def test_the_2k_capacity_is_shown_beside_the_8k_one(results: list[Result]) -> None:
    from retrybench.report import build_context
    from retrybench.report.meta import gather
    from retrybench.report.render import render_html

    meta = {**gather(engine="sim", wall_s=1.0, command="test"),
            "chat_at_steps": [{"model": "qwen2.5-7b-instruct", "gpu": "h100", "max_batched_tokens": 2048,
                               "chat": 3.4534, "chat_8192": 2.8286}]}
    page = render_html(build_context(results, meta))
    assert "calibrated at 2,048-token steps" in page and "3.45" in page and "2.83" in page
