"""The package's import rules (docs/architecture.md), checked on the source with `ast`.

Every module under src/retrybench is parsed, nothing is imported. An import statement is one of:
- *module-level*: run when the module is imported, including `if TYPE_CHECKING:` blocks (a type-only
  edge is still a dependency between the two modules, and a cycle through it is still a cycle);
- *lazy*: inside a function body, run only when the function is called.

Module-level edges must not form a cycle. Both kinds obey the layer table: a layer may import only the
layers `MAY_IMPORT` lists for it; `LAZY_ONLY` grants a few extra edges to lazy imports alone. The
tables below are the ones docs/architecture.md prints: change both together.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = "retrybench"
SRC = Path(__file__).resolve().parents[1] / "src"

# -- the rules (docs/architecture.md) -----------------------------------------------------------------

# Layer -> the modules in it. An entry names a module and, when it is a package, everything under it;
# the root package matches itself only. A module belongs to the layer of its longest matching entry.
LAYERS: dict[str, tuple[str, ...]] = {
    "leaf": (ROOT, "retrybench.gcpause", "retrybench.records", "retrybench.conditions", "retrybench.claims.paper",
             "retrybench.plan.engine_choice", "retrybench.realvllm.vllm_locate", "retrybench.realvllm.tinymodel"),
    "core": ("retrybench.analysis", "retrybench.traffic", "retrybench.control", "retrybench.engine",
             "retrybench.calibration.stages"),
    "domain": ("retrybench.plan",),
    "claims": ("retrybench.claims",),
    "sim": ("retrybench.sim",),
    "calibration": ("retrybench.calibration",),
    "runs": ("retrybench.runs",),
    "serving": ("retrybench.serving",),
    "proxy": ("retrybench.proxy",),
    "engine_server": ("retrybench.engine_server",),
    "loadgen": ("retrybench.loadgen",),
    "realvllm": ("retrybench.realvllm",),
    "report": ("retrybench.report",),
    "sweep": ("retrybench.sweep",),
    "reproduce": ("retrybench.runs.reproduce",),
    "assess": ("retrybench.assess",),
    "doctor": ("retrybench.cli.doctor",),
    "cli": ("retrybench.cli", "retrybench.__main__"),
}

# Layer -> the layers it may import (itself included where listed), module-level or lazily.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "leaf": frozenset({"leaf"}),
    "core": frozenset({"leaf", "core"}),
    "domain": frozenset({"leaf", "core", "domain"}),
    "claims": frozenset({"leaf", "core", "domain", "claims"}),
    "sim": frozenset({"leaf", "core", "domain", "sim"}),
    "calibration": frozenset({"leaf", "core", "domain", "sim", "calibration"}),
    "runs": frozenset({"leaf", "core", "domain", "sim", "calibration", "runs"}),
    "serving": frozenset({"leaf", "core", "serving"}),
    "proxy": frozenset({"leaf", "core", "serving", "proxy"}),
    "engine_server": frozenset({"leaf", "core", "serving", "engine_server"}),
    "loadgen": frozenset({"leaf", "core", "domain", "serving", "proxy", "engine_server", "loadgen"}),
    "realvllm": frozenset({"leaf", "core", "domain", "sim", "calibration", "serving", "proxy", "loadgen", "realvllm"}),
    "report": frozenset({"leaf", "core", "domain", "claims", "report"}),
    "sweep": frozenset({"leaf", "core", "domain", "runs", "report", "sweep"}),
    "reproduce": frozenset({"leaf", "core", "domain", "calibration", "runs", "report", "sweep", "reproduce"}),
    "assess": frozenset({"leaf", "core", "domain", "calibration", "runs", "report", "sweep", "assess"}),
    "doctor": frozenset(),  # only STDLIB_ONLY modules, below
    "cli": frozenset(LAYERS),
}

LIVE = frozenset({"serving", "proxy", "engine_server", "loadgen", "realvllm"})  # the wings over real HTTP

# (layer, layer) edges allowed only as lazy imports: the run service starts a live run, and the calibration
# a live calibration, on request.
LAZY_ONLY: frozenset[tuple[str, str]] = frozenset({("runs", "loadgen"), ("calibration", "loadgen")})

# Modules that import nothing but the standard library and each other (lazily included), so that they,
# and doctor, which may import only these, work on a base install with no dependency at all.
STDLIB_ONLY: frozenset[str] = frozenset({
    ROOT, "retrybench.gcpause", "retrybench.records", "retrybench.records.atomicfile", "retrybench.records.cache",
    "retrybench.records.runlog", "retrybench.records.tracefile", "retrybench.records.decisionlog",
    "retrybench.conditions", "retrybench.conditions.config", "retrybench.claims.paper", "retrybench.plan.engine_choice",
    "retrybench.realvllm.vllm_locate",
})
STDLIB_ONLY_LAYERS: frozenset[str] = frozenset({"doctor"})

# Third-party packages of the optional extras ([live], [container], [fit], and vLLM itself): only these
# layers may import them, even lazily, so that the base install never needs them.
EXTRAS: dict[str, frozenset[str]] = {
    "aiohttp": LIVE,
    "prometheus_client": LIVE,
    "uvloop": LIVE,
    "testcontainers": frozenset({"serving"}),
    "docker": frozenset({"serving"}),
    "vllm": frozenset({"realvllm"}),
    "scipy": frozenset(),
    "ray": frozenset({"runs"}),
}

# The test side: the package never imports it.
TEST_SIDE: frozenset[str] = frozenset({"pytest", "hypothesis", "fixtures", "benchmarks", "tests", "findings",
                                       "conftest"})

# -- the graph ----------------------------------------------------------------------------------------

MODULE_LEVEL, LAZY = "module-level", "lazy"


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # the importing module
    target: str  # a retrybench module, or the top-level name of any other package
    kind: str  # MODULE_LEVEL or LAZY
    line: int

    def where(self) -> str:
        return f"{self.source}:{self.line} imports {self.target} ({self.kind})"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path | None]:
    """Every module and package of retrybench -> its file (None: a namespace package, no __init__)."""
    found: dict[str, Path | None] = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        found[_module_name(path)] = path
        for parent in path.relative_to(SRC).parents:
            if parent.parts:
                found.setdefault(".".join(parent.parts), None)
    return found


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind: lazy when inside a function (or lambda) at any depth."""
    def walk(node: ast.AST, lazy: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, LAZY if lazy else MODULE_LEVEL
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from walk(child, inner)
    yield from walk(tree, False)


def _resolve(name: str) -> str:
    """The retrybench module an import of `name` loads (its longest known prefix), or `name` if none."""
    known = modules()
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return name


def _targets(statement: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names]
    base = statement.module or ""
    if statement.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (statement.level - 1)]
        base = ".".join([*package, base] if base else package)
    if not base.startswith(ROOT):
        return [base]
    # `from pkg import name` loads the submodule pkg.name when there is one, else only pkg.
    known = modules()
    names = [f"{base}.{alias.name}" for alias in statement.names]
    return [name if name in known else base for name in names]


@cache
def imports() -> tuple[Import, ...]:
    found: list[Import] = []
    for module, path in modules().items():
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for statement, kind in _statements(tree):
            for target in _targets(statement, module, path.name == "__init__.py"):
                if target.split(".")[0] == "__future__":
                    continue
                resolved = _resolve(target) if target.split(".")[0] == ROOT else target.split(".")[0]
                if resolved != module:
                    found.append(Import(module, resolved, kind, statement.lineno))
    return tuple(found)


def internal(kinds: frozenset[str] = frozenset({MODULE_LEVEL, LAZY})) -> list[Import]:
    return [edge for edge in imports() if edge.target.split(".")[0] == ROOT and edge.kind in kinds]


def external() -> list[Import]:
    return [edge for edge in imports() if edge.target.split(".")[0] != ROOT]


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, entries in LAYERS.items():
        for entry in entries:
            matches = module == entry or (entry != ROOT and module.startswith(entry + "."))
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), layer)
    return None if best is None else best[1]


def find_cycle(edges: list[Import]) -> list[Import] | None:
    """One cycle of the graph, as its edges in order, or None (a depth-first search)."""
    graph: dict[str, list[Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    done: set[str] = set()
    stack: list[str] = []  # the nodes on the current path
    path: list[Import] = []  # path[i] goes from stack[i] to stack[i + 1]

    def visit(node: str) -> list[Import] | None:
        stack.append(node)
        for edge in sorted(graph.get(node, []), key=lambda e: (e.target, e.line)):
            if edge.target in stack:
                return [*path[stack.index(edge.target):], edge]
            if edge.target not in done:
                path.append(edge)
                found = visit(edge.target)
                if found is not None:
                    return found
                path.pop()
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            found = visit(node)
            if found is not None:
                return found
    return None


# -- the tests ----------------------------------------------------------------------------------------


def test_the_package_is_found() -> None:
    assert "retrybench.engine.scheduler" in modules()
    assert any(edge.target == "retrybench.engine.kv" for edge in internal())


def test_the_tables_agree() -> None:
    assert set(MAY_IMPORT) == set(LAYERS)
    assert {layer for pair in LAZY_ONLY for layer in pair} <= set(LAYERS)
    assert all(layer_of(module) == "leaf" for module in STDLIB_ONLY), "every stdlib-only module is a leaf"
    assert all(layers <= set(LAYERS) for layers in EXTRAS.values())


def test_every_module_has_a_layer() -> None:
    missing = sorted(module for module in modules() if layer_of(module) is None)
    assert not missing, f"modules in no layer of docs/architecture.md (add them to LAYERS and the doc): {missing}"


def test_every_import_of_retrybench_resolves() -> None:
    unknown = [edge.where() for edge in internal() if edge.target not in modules()]
    assert not unknown, "imports of modules that do not exist:\n" + "\n".join(unknown)


def test_no_module_level_import_cycle() -> None:
    cycle = find_cycle(internal(frozenset({MODULE_LEVEL})))
    if cycle is not None:
        steps = [cycle[0].source, *(f"{edge.target} (line {edge.line} of {edge.source})" for edge in cycle)]
        pytest.fail("module-level import cycle: " + " -> ".join(steps), pytrace=False)


def test_find_cycle_reports_the_path() -> None:
    edges = [Import("a", "b", MODULE_LEVEL, 1), Import("b", "c", MODULE_LEVEL, 2), Import("c", "b", MODULE_LEVEL, 3),
             Import("c", "d", MODULE_LEVEL, 4)]
    cycle = find_cycle(edges)
    assert cycle is not None
    assert [(edge.source, edge.target) for edge in cycle] == [("b", "c"), ("c", "b")]
    assert find_cycle([Import("a", "b", MODULE_LEVEL, 1), Import("a", "c", MODULE_LEVEL, 1),
                       Import("b", "c", MODULE_LEVEL, 1)]) is None


def _layer_violation(edge: Import) -> str | None:
    source, target = layer_of(edge.source), layer_of(edge.target)
    if source is None or target is None or source in STDLIB_ONLY_LAYERS:
        return None  # reported by test_every_module_has_a_layer / test_stdlib_only_modules
    if target in MAY_IMPORT[source]:
        return None
    if edge.kind == LAZY and (source, target) in LAZY_ONLY:
        return None
    if (source, target) in LAZY_ONLY:
        return f"{edge.where()}: {source} may import {target} only inside a function"
    return f"{edge.where()}: layer {source} may not import layer {target}"


@pytest.mark.parametrize("layer", sorted(set(LAYERS) - STDLIB_ONLY_LAYERS))
def test_layer_imports_only_what_it_may(layer: str) -> None:
    problems = [problem for edge in internal() if layer_of(edge.source) == layer
                and (problem := _layer_violation(edge)) is not None]
    assert not problems, "\n".join(problems)


def test_stdlib_only_modules() -> None:
    """STDLIB_ONLY modules and the STDLIB_ONLY_LAYERS (doctor) import nothing else, even lazily."""
    stdlib = sys.stdlib_module_names
    problems = []
    for edge in imports():
        if edge.source not in STDLIB_ONLY and layer_of(edge.source) not in STDLIB_ONLY_LAYERS:
            continue
        if edge.target.split(".")[0] == ROOT:
            if edge.target not in STDLIB_ONLY:
                problems.append(f"{edge.where()}: not a stdlib-only retrybench module")
        elif edge.target not in stdlib:
            problems.append(f"{edge.where()}: not in the standard library")
    assert not problems, "\n".join(problems)


def test_extras_only_where_allowed() -> None:
    problems = [f"{edge.where()}: only {sorted(EXTRAS[edge.target]) or 'scripts'} may import it"
                for edge in external() if edge.target in EXTRAS
                and layer_of(edge.source) not in EXTRAS[edge.target]]
    assert not problems, "\n".join(problems)


def test_the_package_never_imports_the_test_side() -> None:
    problems = [edge.where() for edge in external() if edge.target in TEST_SIDE]
    assert not problems, "\n".join(problems)


def test_the_test_knows_lazy_and_type_checking_imports() -> None:
    tree = ast.parse(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import json\n"
        "def f() -> None:\n    import csv\n"
        "class C:\n    import re\n    def m(self) -> None:\n        import glob\n")
    kinds = {statement.names[0].name: kind for statement, kind in _statements(tree)}
    assert kinds == {"os": MODULE_LEVEL, "TYPE_CHECKING": MODULE_LEVEL, "json": MODULE_LEVEL, "csv": LAZY,
                     "re": MODULE_LEVEL, "glob": LAZY}
