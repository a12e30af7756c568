"""`retrybench sweep --axis`: values read exactly and typed by their field, every invalid axis or value
refused before any run with a message that names the field and what it allows; overrides carried by
RunSpec without moving the cache key of a spec that has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from retrybench.cli.main import main
from retrybench.plan.spec import RunSpec, condition_for
from retrybench.runs import executors
from retrybench.sweep.axes import AxisError, parse_axes, parse_axis


def test_a_range_is_inclusive_and_exact() -> None:
    axis = parse_axis("pulse_x=1.0:3.0:0.1")
    assert len(axis.values) == 21 and axis.values[0] == 1.0 and axis.values[-1] == 3.0
    assert 2.7 in axis.values  # exactly the paper's pulse, not 2.7000000000000006
    assert axis.values[17] == 2.7 and str(axis.step) == "0.1"


def test_values_take_their_fields_types() -> None:
    assert parse_axis("engine_cap=50:400:25").values == tuple(range(50, 401, 25))
    assert parse_axis("engine_cap=none,100").values == (None, 100)
    assert parse_axis("proxy.defer_s=0,1,2,5,10,30").values == (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
    assert parse_axis("proxy.budget_ratio=0.05,0.1,0.2").values == (0.05, 0.1, 0.2)
    assert parse_axis("max_batched_tokens=2048,4096,8192").values == (2048, 4096, 8192)
    assert parse_axis("gpu=h100,h200").values == ("h100", "h200")
    assert parse_axis("proxy.coalescing=true,false").values == (True, False)
    assert parse_axis("client.max_retries=0:3:1").values == (0, 1, 2, 3)
    assert parse_axis("proxy.cancellation=off,immediate").values == ("off", "immediate")
    axis = parse_axis("proxy.defer_s=0,10")
    assert axis.is_override and axis.numeric and not parse_axis("pulse_x=2").is_override


@pytest.mark.parametrize(("text", "named", "allowed"), [
    ("pulse_x=120", "pulse_x", "[0, 100]"),
    ("pulse_x=1:300:0.5", "pulse_x", "[0, 100]"),
    ("engine_cap=0", "engine_cap", ">= 1"),
    ("max_batched_tokens=8", "max_batched_tokens", "[16, 1048576]"),
    ("max_batched_tokens=2048.5", "max_batched_tokens", "whole number"),
    ("proxy.budget_ratio=0.05,20", "proxy.budget_ratio", "[0, 10]"),
    ("client.attempt_timeout_s=0", "client.attempt_timeout_s", "> 0"),
    ("proxy.cancellation=sometimes", "proxy.cancellation", "off, immediate, deferred"),
    ("model=gpt-5", "model", "qwen2.5-7b-instruct"),
    ("gpu=mi300x", "gpu", "h200"),
    ("proxy.coalescing=maybe", "proxy.coalescing", "true or false"),
    ("proxy.nonsense=1", "proxy.nonsense", "proxy.defer_s"),
    ("speed=1", "speed", "pulse_x"),
    ("model=1:3:1", "model", "numeric"),
    ("pulse_x=3:1:0.5", "pulse_x", "STOP >= START"),
    ("pulse_x=1:3:0", "pulse_x", "STEP > 0"),
    ("pulse_x=1,2,1", "pulse_x", "repeated"),
    ("pulse_x", "pulse_x", "NAME=V1,V2"),
])
def test_invalid_axes_name_the_field_and_what_it_allows(text: str, named: str, allowed: str) -> None:
    with pytest.raises(AxisError) as raised:
        parse_axis(text)
    assert named in str(raised.value) and allowed in str(raised.value)


def test_an_axis_is_given_once() -> None:
    with pytest.raises(AxisError, match="pulse_x given more than once"):
        parse_axes(["pulse_x=1,2", "pulse_x=3"])


def test_a_spec_without_overrides_keeps_its_record_and_key() -> None:
    plain = RunSpec(model="qwen2.5-7b-instruct", condition="coalescing", seed=2)
    assert "overrides" not in plain.as_dict() and "client" not in plain.as_dict()
    overridden = RunSpec(model="qwen2.5-7b-instruct", condition="coalescing", seed=2,
                         overrides=(("proxy.defer_s", 2.0),))
    assert overridden.as_dict()["overrides"] == {"proxy.defer_s": 2.0}
    assert overridden.key() != plain.key()


def test_overrides_reach_the_condition() -> None:
    spec = RunSpec(model="qwen3-14b", condition="deferred-cancellation", seed=1,
                   overrides=(("client.attempt_timeout_s", 60.0), ("proxy.defer_s", 2.0)))
    condition = condition_for(spec)
    assert condition.proxy.defer_s == 2.0 and condition.client.attempt_timeout_s == 60.0
    assert condition.proxy.cancellation == "deferred"  # the rest stays the condition's


def _refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """The usage error of a sweep that must fail before any run."""
    def no_runs(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr(executors, "compute", no_runs)
    monkeypatch.setattr(executors, "plan_runs", no_runs)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.exists()
    return " ".join(result.output.split())


def test_the_command_refuses_before_any_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _refused(tmp_path, monkeypatch, "--condition", "no-control", "--axis", "proxy.budget_ratio=0.1,20")
    assert "proxy.budget_ratio" in message and "[0, 10]" in message
    # Valid alone, refused by the condition: lifo needs a proxy queue, which no-control has not.
    message = _refused(tmp_path, monkeypatch, "--condition", "no-control,proxy-cap", "--axis",
                       "proxy.queue_order=fifo,lifo")
    assert "condition no-control" in message and "max_outstanding" in message
    message = _refused(tmp_path, monkeypatch, "--condition", "no-control,nope", "--axis", "pulse_x=2")
    assert "unknown condition 'nope'" in message
    message = _refused(tmp_path, monkeypatch, "--condition", "no-control", "--axis", "proxy.order=budget-first",
                       "--find", "proxy.order")
    assert "--find proxy.order" in message and "numeric" in message
    message = _refused(tmp_path, monkeypatch, "--condition", "no-control", "--axis", "pulse_x=1,2,3",
                       "--find", "pulse_x")
    assert "--resolution" in message
    message = _refused(tmp_path, monkeypatch, "--condition", "no-control", "--model", "qwen3-14b", "--axis",
                       "model=qwen3-14b,llama-3.1-8b-instruct")
    assert "--model and --axis model" in message
