"""The command line's vocabulary (retrybench.cli.options), checked on click's command tree, sweep included:
every option and argument says what it is, one concept has one spelling across commands, and every
spelling of an earlier release is hidden, still accepted with the same meaning, and noticed on stderr.

A retired spelling is checked by invoking the command both ways with its work replaced by a recorder: the
command receives the same values, so nothing expensive runs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from retrybench.cli.main import COMMANDS, main
from retrybench.cli.options import (
    RUNS,
    SEEDS,
    VOCABULARY,
    Argument,
    CommaList,
    Command,
    Retired,
    VocabularyOption,
)

MODEL = "qwen2.5-7b-instruct"


def commands() -> dict[str, click.Command]:
    ctx = click.Context(main)
    found = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def visible_options(command: click.Command) -> Iterator[click.Option]:
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            yield param


def retired(command: click.Command) -> tuple[Retired, ...]:
    assert isinstance(command, Command)
    return command.retired


def help_text(name: str) -> str:
    result = CliRunner().invoke(main, [name, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_tree_holds_every_registered_command_declared_as_a_vocabulary_command() -> None:
    found = commands()
    assert set(found) == set(COMMANDS) and "sweep" in found
    assert all(isinstance(command, Command) for command in found.values())
    listing = CliRunner().invoke(main, ["--help"])
    assert listing.exit_code == 0 and all(summary in listing.output for _, summary in COMMANDS.values())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_and_argument_has_help_and_shows_its_default(name: str) -> None:
    command = commands()[name]
    for param in command.params:
        if isinstance(param, click.Argument):
            assert isinstance(param, Argument) and param.help, f"{name} {param.name}: an argument without help"
            continue
        assert isinstance(param, click.Option)
        assert param.help, f"{name} {param.opts}: an option without help"
        default = param.to_info_dict()["default"]  # None where there is none
        if default not in (None, False, ()) and not param.is_flag:
            assert param.show_default, f"{name} {param.opts}: default {default!r} not shown"
    text = help_text(name)
    assert all(param.make_metavar(click.Context(command)) in text for param in command.params
               if isinstance(param, click.Argument))


def test_the_vocabulary_table_is_consistent() -> None:
    canonical = [concept.canonical for concept in VOCABULARY.values()]
    retired_names = [name for concept in VOCABULARY.values() for name in concept.retired]
    assert len(set(canonical)) == len(canonical), "two concepts with one spelling"
    assert len(set(retired_names)) == len(retired_names), "a retired spelling of two concepts"
    assert not set(canonical) & set(retired_names), "a spelling both current and retired"


def test_each_concept_has_one_visible_spelling_across_commands() -> None:
    canonical = {concept.canonical: key for key, concept in VOCABULARY.items()}
    retired_names = {name for concept in VOCABULARY.values() for name in concept.retired}
    spellings: dict[str, set[str]] = {}
    problems = []
    for name, command in commands().items():
        for param in visible_options(command):
            names = [*param.opts, *param.secondary_opts]
            problems += [f"{name}: {n} is a retired spelling" for n in names if n in retired_names]
            if isinstance(param, VocabularyOption):
                spellings.setdefault(param.concept, set()).update(names)
            else:
                problems += [f"{name}: {n} names {canonical[n]} but is not declared as it" for n in names
                             if n in canonical]
    for concept, spelled in spellings.items():
        if spelled != {VOCABULARY[concept].canonical}:
            problems.append(f"{concept} is spelled {sorted(spelled)}")
    assert not problems, "\n".join(problems)
    assert {"engine", "condition", "seed", "out", "json", "max-num-queued-reqs"} <= set(spellings)


def test_every_retired_spelling_is_in_the_table_and_hidden() -> None:
    problems = []
    for name, command in commands().items():
        visible = {n for param in visible_options(command) for n in param.opts}
        text = help_text(name)
        for old in retired(command):
            if old.to_argument:
                metavars = [p.make_metavar(click.Context(command)) for p in command.params
                            if isinstance(p, click.Argument)]
                if old.new not in metavars or old.old in visible:
                    problems.append(f"{name}: {old.old} -> {old.new} names no argument, or is still an option")
            elif not any(old.old in c.retired and old.new == c.canonical for c in VOCABULARY.values()):
                problems.append(f"{name}: {old.old} -> {old.new} is not in VOCABULARY")
            if f"{old.old} " in text or f"{old.old}," in text:
                problems.append(f"{name}: {old.old} shows in --help")
    assert not problems, "\n".join(problems)


# (command, old spelling): the arguments with it, and the same with the current spelling.
def retired_cases(tmp: Path) -> dict[tuple[str, str], tuple[list[str], list[str]]]:
    trace = tmp / "trace.json"  # loadgen checks that it exists: the test writes it
    run = ["--condition", "coalescing", "--model", MODEL]
    proxy = ["--engine", "http://127.0.0.1:9"]
    sweep = ["--condition", "no-control", "--axis", "pulse_x=2", "--out", str(tmp)]
    loadgen = ["--trace", str(trace), "--target", "http://127.0.0.1:9"]
    return {
        ("run", "--engine-cap"): ([*run, "--engine-cap", "5"], [*run, "--max-num-queued-reqs", "5"]),
        ("run", "--max-batched-tokens"): ([*run, "--max-batched-tokens", "2048"],
                                          [*run, "--max-num-batched-tokens", "2048"]),
        ("run", "--workdir"): ([*run, "--workdir", str(tmp)], [*run, "--out", str(tmp)]),
        ("calibrate", "--workdir"): (["--model", MODEL, f"--workdir={tmp}"], ["--model", MODEL, "--out", str(tmp)]),
        ("reproduce", "--models"): (["--models", "qwen3-14b,qwen2.5-7b-instruct"],
                                    ["--model", "qwen3-14b", "--model", "qwen2.5-7b-instruct"]),
        ("reproduce", "--blocks"): (["--blocks", "diagnostic,tracing"],
                                    ["--block", "diagnostic", "--block", "tracing"]),
        ("sweep", "--seeds"): ([*sweep, "--seeds", "3"], [*sweep, "--seed", "1-3"]),
        ("proxy", "--upstream"): (["--upstream", "http://a:1", "--upstream", "http://b:2"],
                                  ["--engine", "http://a:1", "--engine", "http://b:2"]),
        ("proxy", "--policy"): ([*proxy, "--policy", "coalescing"], [*proxy, "--condition", "coalescing"]),
        ("proxy", "--upstream-connect-timeout"): ([*proxy, "--upstream-connect-timeout", "3"],
                                                 [*proxy, "--engine-connect-timeout", "3"]),
        ("proxy", "--upstream-idle-timeout"): ([*proxy, "--upstream-idle-timeout", "0"],
                                              [*proxy, "--engine-idle-timeout", "0"]),
        ("compare-real-engine", "--conditions"): (["--out", str(tmp), "--conditions", "coalescing,retry-budget"],
                                                  ["--out", str(tmp), "--condition", "coalescing,retry-budget"]),
        ("compare-real-engine", "--engine-url"): (["--out", str(tmp), "--engine-url", "http://a:1"],
                                                  ["--out", str(tmp), "--engine", "http://a:1"]),
        ("make-trace", "--out"): (["--model", MODEL, "--out", str(tmp / "t.json")],
                                  ["--model", MODEL, str(tmp / "t.json")]),
        ("loadgen", "--out"): ([*loadgen, "--out", str(tmp / "r.json")], [*loadgen, str(tmp / "r.json")]),
    }


def _received(name: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], str]:
    """The values the command's body would receive for `args` (its body replaced), and what went to stderr."""
    received: list[dict[str, Any]] = []
    with monkeypatch.context() as patch:
        patch.setattr(commands()[name], "callback", lambda **values: received.append(values))
        result = CliRunner().invoke(main, [name, *args])
    assert result.exit_code == 0, result.output
    assert len(received) == 1
    return received[0], result.stderr


def test_every_retired_spelling_is_covered_here(tmp_path: Path) -> None:
    in_tree = {(name, old.old) for name, command in commands().items() for old in retired(command)}
    assert set(retired_cases(tmp_path)) == in_tree


@pytest.mark.parametrize("case", sorted(retired_cases(Path("tmp"))), ids="{0[0]} {0[1]}".format)
def test_a_retired_spelling_means_what_it_meant_and_says_so(case: tuple[str, str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    name, old = case
    (tmp_path / "trace.json").write_text("{}")
    old_args, new_args = retired_cases(tmp_path)[case]
    before, noticed = _received(name, old_args, monkeypatch)
    now, quiet = _received(name, new_args, monkeypatch)
    assert before == now
    assert quiet == ""
    [spelling] = [r for r in retired(commands()[name]) if r.old == old]
    assert noticed.splitlines() == [spelling.notice(f"main {name}")]
    assert f"{old} is deprecated, use " in noticed


def test_a_retired_spelling_goes_through_the_command_s_own_checks(tmp_path: Path) -> None:
    refused = CliRunner().invoke(main, ["compare-real-engine", "--out", str(tmp_path), "--runtime", "container",
                                        "--engine-url", "http://127.0.0.1:9"])
    assert refused.exit_code == 2 and "--engine names an engine already running" in refused.stderr
    assert "--engine-url is deprecated, use --engine" in refused.stderr
    route = CliRunner().invoke(main, ["proxy", "--upstream", "http://127.0.0.1:9", "--route", "key-affine"])
    assert route.exit_code == 2 and "needs several --engine" in route.stderr
    seeds = CliRunner().invoke(main, ["sweep", "--condition", "no-control", "--axis", "pulse_x=2", "--out",
                                      str(tmp_path), "--seeds", "0"])
    assert seeds.exit_code == 2 and "Invalid value for '--seeds'" in seeds.stderr
    missing = CliRunner().invoke(main, ["make-trace", "--model", MODEL, "--out"])
    assert missing.exit_code == 2 and "Missing argument 'TRACE_FILE'" in missing.stderr


def test_seeds_runs_and_lists_parse_as_documented() -> None:
    assert SEEDS.convert("3", None, None) == (3,)
    assert SEEDS.convert("1-3,7,2", None, None) == (1, 2, 3, 7)
    for bad in ("x", "3-1", "-1", ""):
        with pytest.raises(click.BadParameter):
            SEEDS.convert(bad, None, None)
    assert RUNS.convert("paper", None, None) is None and RUNS.convert("4", None, None) == 4
    for bad in ("0", "many"):
        with pytest.raises(click.BadParameter):
            RUNS.convert(bad, None, None)
    assert CommaList().convert(" a, b,,c ", None, None) == ("a", "b", "c")


def test_argument_help_is_shown_with_its_choices() -> None:
    text = help_text("block")
    assert "Arguments:" in text and "NAME" in text and "diagnostic" in text


LOADED = """
import sys
{statement}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "rich", "matplotlib", "jinja2")
               or m.startswith(("retrybench.runs", "retrybench.sim", "retrybench.analysis", "retrybench.plan.spec",
                                "retrybench.report", "retrybench.sweep")))
print("HEAVY", heavy)
"""


def _loaded_by(statement: str) -> str:
    done = subprocess.run([sys.executable, "-c", LOADED.format(statement=statement)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_group_s_help_imports_no_command() -> None:
    out = _loaded_by("from retrybench.cli.main import main\n"
                     "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                     "print('COMMANDS', sorted(m for m in sys.modules if m.startswith('retrybench.cli.') "
                     "and m != 'retrybench.cli.main'))")
    assert "HEAVY []" in out and "COMMANDS []" in out, out


@pytest.mark.parametrize("module", sorted({module for module, _ in COMMANDS.values()}))
def test_declaring_commands_imports_nothing_heavy(module: str) -> None:
    assert "HEAVY []" in _loaded_by(f"import {module}")
