"""`--engine`: one parser for the command line and pytest, and one rule for engine URLs (plain http://)."""

from __future__ import annotations

import pytest

from retrybench.plan.engine_choice import ENGINE_NAMES, EngineChoice, engine_url, parse_engine


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_each_name_is_its_kind(name: str) -> None:
    choice = parse_engine(name)
    assert choice == EngineChoice(choice.kind) and str(choice) == name and choice.live == (name != "sim")


def test_a_url_is_kept_without_its_trailing_slash() -> None:
    choice = parse_engine("http://10.0.0.5:8000/")
    assert choice == EngineChoice("url", "http://10.0.0.5:8000") and str(choice) == "http://10.0.0.5:8000"
    assert choice.live
    assert engine_url("http://engine/v1") == "http://engine/v1"


@pytest.mark.parametrize(("text", "reason"), [
    ("https://10.0.0.5:8000", "https is not supported"),  # the proxy's upstream client speaks no TLS
    ("ftp://10.0.0.5", "is not an http:// URL"),
    ("http://", "is not an http:// URL"),
    ("http://host:99999", "out of range"),
    ("localhost:8000", "is not one of sim, engine-server, vllm-process, vllm-container or an http:// URL"),
    ("vllm", "is not one of"),
])
def test_what_is_refused_says_why(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_engine(text)


def test_a_command_names_the_engines_it_drives() -> None:
    assert parse_engine("engine-server", ("sim", "engine-server")).kind == "engine-server"
    with pytest.raises(ValueError, match="'vllm-process' is not one of sim or an http:// URL"):
        parse_engine("vllm-process", ("sim",))
