"""Client profiles against the real SDKs: each profile's waits replay the SDK's own backoff function with the
same random draws, its Retry-After rules and retried outcomes are the SDK's, and the loader and the
policy's validation name what is allowed."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import random
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from retrybench.conditions.client_profiles import available_client_profiles, client_profile, load_client_profile
from retrybench.conditions.config import ClientPolicy, ConfigError
from retrybench.records.runlog import ERROR, REFUSED_429, REFUSED_503, TIMED_OUT
from retrybench.traffic.client import CallFailed, ClientAction, RetryingClient, SendAttempt

SEED = 2024
PROFILES = ("anthropic-sdk", "openai-sdk", "paper", "tenacity-typical")
STACKS = ("sdk-in-tenacity", "sdk-in-tenacity-behind-gateway", "sdk-in-tenacity-behind-gateway-no-retries")
PACKAGES = {"openai-sdk": "openai", "anthropic-sdk": "anthropic", "tenacity-typical": "tenacity"}


def _sdk(name: str) -> ModuleType:
    """The SDK module, or a skip that says why the replay cannot run."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not importable: install the dev extra (pip install -e '.[dev]') to replay its backoff")


def _draws(n: int = 64) -> list[float]:
    """The uniforms in [0, 1) a fresh client generator seeded SEED yields, in order."""
    return [float(u) for u in np.random.default_rng(SEED).random(n)]


def _as_send(action: ClientAction) -> SendAttempt:
    assert isinstance(action, SendAttempt), action
    return action


def _sends_after_failures(policy: ClientPolicy, outcome: str, retry_after_s: float | None = None,
                          now: float = 10.0) -> list[tuple[float, float]]:
    """(time the attempt failed, next send time) for each retry of one call whose attempts all end with
    `outcome` at their send time (or `now` for the first)."""
    client = RetryingClient(policy, np.random.default_rng(SEED))
    send = client.start_call(0, now)
    pairs: list[tuple[float, float]] = []
    while True:
        action = client.on_outcome(0, send.attempt_no, outcome, send.send_s, retry_after_s)
        if not isinstance(action, SendAttempt):
            return pairs
        pairs.append((send.send_s, action.send_s))
        send = action


# -- the SDKs' own backoff, replayed ------------------------------------------------------------------


def _stainless_waits(module: ModuleType, client: Any, max_retries: int,
                     monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits an openai/anthropic client computes before each retry, its random() fed our draws."""
    draws = iter(_draws())
    monkeypatch.setattr(module, "random", lambda: next(draws))
    options = importlib.import_module(f"{module.__name__.split('.')[0]}._models").FinalRequestOptions(
        method="post", url="/v1/chat/completions")
    assert options.get_max_retries(client.max_retries) == max_retries
    # request() passes remaining_retries = max_retries - retries_taken (retries_taken 0 before the first retry).
    return [client._calculate_retry_timeout(max_retries - taken, options, None) for taken in range(max_retries)]


def _openai_client() -> Any:
    return _sdk("openai").OpenAI(api_key="x", base_url="http://127.0.0.1:9")


def _anthropic_client() -> Any:
    return _sdk("anthropic").Anthropic(api_key="x", base_url="http://127.0.0.1:9")


@pytest.mark.parametrize(("profile", "make", "package"), [
    ("openai-sdk", _openai_client, "openai"), ("anthropic-sdk", _anthropic_client, "anthropic")])
@pytest.mark.parametrize("outcome", [TIMED_OUT, REFUSED_503, REFUSED_429, ERROR])
def test_sdk_profile_waits_are_the_sdks_own(profile: str, make: Callable[[], Any], package: str, outcome: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sdk_client = make()
    policy = load_client_profile(profile)
    assert policy.max_retries == sdk_client.max_retries
    waits = _stainless_waits(importlib.import_module(f"{package}._base_client"), sdk_client, policy.max_retries,
                             monkeypatch)
    pairs = _sends_after_failures(policy, outcome)
    assert len(pairs) == len(waits) == 2
    assert [failed + wait for (failed, _), wait in zip(pairs, waits, strict=True)] == [s for _, s in pairs]


@pytest.mark.parametrize(("profile", "package"), [("openai-sdk", "openai"), ("anthropic-sdk", "anthropic")])
def test_sdk_profile_constants_are_the_sdks(profile: str, package: str) -> None:
    constants = importlib.import_module(f"{_sdk(package).__name__}._constants")
    policy = load_client_profile(profile)
    assert policy.max_retries == constants.DEFAULT_MAX_RETRIES
    assert policy.attempt_timeout_s == constants.DEFAULT_TIMEOUT.read
    assert (policy.backoff_base_s, policy.backoff_cap_s) == (constants.INITIAL_RETRY_DELAY, constants.MAX_RETRY_DELAY)
    if package == "openai":
        assert policy.retry_after_cap_s == constants.MAX_RETRY_AFTER_DELAY


def test_anthropic_non_streamed_timeout_stays_the_default() -> None:
    """A non-streamed Messages call keeps 600 s (the profile's attempt deadline) at this trace's reply lengths."""
    client = _anthropic_client()
    deadline = load_client_profile("anthropic-sdk").attempt_timeout_s
    assert client._calculate_nonstreaming_timeout(4096, None).read == deadline


def _tenacity_wait(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], float]:
    """wait_random_exponential(multiplier=1, max=60) by attempt number, its random() fed our draws."""
    tenacity = _sdk("tenacity")
    draws = iter(_draws())

    class Fed(random.Random):
        def random(self) -> float:
            return next(draws)

    monkeypatch.setattr(importlib.import_module("tenacity.wait"), "random", SimpleNamespace(uniform=Fed().uniform))
    wait = tenacity.wait_random_exponential(multiplier=1, max=60)

    def at(attempt_number: int) -> float:
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
        state.attempt_number = attempt_number
        return float(wait(state))

    return at


@pytest.mark.parametrize("outcome", [TIMED_OUT, REFUSED_429, REFUSED_503, ERROR])
def test_tenacity_profile_waits_are_wait_random_exponentials(outcome: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wait = _tenacity_wait(monkeypatch)
    policy = load_client_profile("tenacity-typical")
    waits = [wait(n) for n in range(1, policy.max_attempts)]
    pairs = _sends_after_failures(policy, outcome, retry_after_s=5.0 if outcome == REFUSED_429 else None)
    assert [failed + w for (failed, _), w in zip(pairs, waits, strict=True)] == [s for _, s in pairs]


def test_tenacity_profile_stops_where_stop_after_attempt_5_does() -> None:
    tenacity = _sdk("tenacity")
    stop = tenacity.stop_after_attempt(5)
    states = [tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={}) for _ in range(6)]
    for number, state in enumerate(states, start=1):
        state.attempt_number = number
    first_stop = next(s.attempt_number for s in states if stop(s))
    assert load_client_profile("tenacity-typical").max_attempts == first_stop == 5
    assert len(_sends_after_failures(load_client_profile("tenacity-typical"), TIMED_OUT)) == 4


def test_paper_profile_is_the_paper_client_and_its_uniform_draws() -> None:
    policy = load_client_profile("paper")
    assert policy == ClientPolicy()
    expected = np.random.default_rng(SEED).uniform(0.25, 3.0, 3).tolist()
    pairs = _sends_after_failures(policy, TIMED_OUT)
    assert [failed + w for (failed, _), w in zip(pairs, expected, strict=True)] == [s for _, s in pairs]


# -- Retry-After ---------------------------------------------------------------------------------------


def _headers(value: str) -> Any:
    return importlib.import_module("httpx2").Headers({"retry-after": value})


def _retry_decision(policy: ClientPolicy, retry_after_s: float, outcome: str = REFUSED_429) -> float | str:
    """What the client does after a first attempt refused with `retry_after_s`: the wait, or why it gave up."""
    client = RetryingClient(policy, np.random.default_rng(SEED))
    client.start_call(0, 0.0)
    action = client.on_outcome(0, 0, outcome, 1.0, retry_after_s)
    if isinstance(action, CallFailed):
        return action.reason
    return _as_send(action).send_s - 1.0


@pytest.mark.parametrize("retry_after_s", [0.0, 0.5, 30.0, 60.0, 119.5, 120.0, 120.5, 600.0])
def test_openai_retry_after_rule_is_the_sdks(retry_after_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    sdk_client = _openai_client()
    module = importlib.import_module("openai._base_client")
    response = importlib.import_module("httpx2").Response(429, headers=_headers(repr(retry_after_s)))
    ours = _retry_decision(load_client_profile("openai-sdk"), retry_after_s)
    if not sdk_client._should_retry(response):
        assert ours == "retry_after_too_long"
        return
    draws = iter(_draws())
    monkeypatch.setattr(module, "random", lambda: next(draws))
    options = importlib.import_module("openai._models").FinalRequestOptions(method="post", url="/x")
    assert ours == pytest.approx(sdk_client._calculate_retry_timeout(2, options, response.headers), abs=1e-12)


@pytest.mark.parametrize("retry_after_s", [0.0, 0.5, 30.0, 120.0, 600.0, 1e7])
def test_anthropic_retry_after_rule_is_the_sdks(retry_after_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    sdk_client = _anthropic_client()
    module = importlib.import_module("anthropic._base_client")
    draws = iter(_draws())
    monkeypatch.setattr(module, "random", lambda: next(draws))
    options = importlib.import_module("anthropic._models").FinalRequestOptions(method="post", url="/x")
    assert sdk_client._should_retry(importlib.import_module("httpx2").Response(429))
    expected = sdk_client._calculate_retry_timeout(2, options, _headers(repr(retry_after_s)))
    assert _retry_decision(load_client_profile("anthropic-sdk"), retry_after_s) == pytest.approx(expected, abs=1e-12)


def test_retry_after_ms_is_read_first_by_both_sdks() -> None:
    """The drivers pass Retry-After-Ms before Retry-After (loadgen/loadgen.py), as the SDKs parse them."""
    headers = importlib.import_module("httpx2").Headers({"retry-after-ms": "1500", "retry-after": "9"})
    assert _openai_client()._parse_retry_after_header(headers) == 1.5
    assert _anthropic_client()._parse_retry_after_header(headers) == 1.5


RULES: dict[str, dict[float, float | str]] = {  # retry_after_s -> wait (or reason), cap 60 s; "b" = own backoff
    "cap-or-give-up": {0.0: 0.0, 30.0: 30.0, 60.0: 60.0, 61.0: "retry_after_too_long"},
    "positive-cap-or-give-up": {0.0: "b", 30.0: 30.0, 60.0: 60.0, 61.0: "retry_after_too_long"},
    "positive-cap-or-backoff": {0.0: "b", 30.0: 30.0, 60.0: 60.0, 61.0: "b"},
    "positive-capped": {0.0: "b", 30.0: 30.0, 60.0: 60.0, 61.0: 60.0},
    "ignore": {0.0: "b", 30.0: "b", 60.0: "b", 61.0: "b"},
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_retry_after_rule(rule: str) -> None:
    policy = ClientPolicy(backoff="exponential", jitter="none", backoff_base_s=0.5, retry_after=rule,
                          retry_after_cap_s=60.0)
    for retry_after_s, expected in RULES[rule].items():
        assert _retry_decision(policy, retry_after_s) == (0.5 if expected == "b" else expected), retry_after_s


def test_the_paper_honours_retry_after_on_429_only_and_the_sdks_on_any_response() -> None:
    paper = ClientPolicy()
    assert 0.25 <= float(_retry_decision(paper, 30.0, REFUSED_503)) < 3.0
    assert _retry_decision(load_client_profile("openai-sdk"), 30.0, REFUSED_503) == 30.0
    assert _retry_decision(load_client_profile("anthropic-sdk"), 30.0, REFUSED_503) == 30.0


# -- retried outcomes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "status", "outcome"), [
    (_openai_client, 429, REFUSED_429), (_openai_client, 503, REFUSED_503), (_openai_client, 500, ERROR),
    (_anthropic_client, 429, REFUSED_429), (_anthropic_client, 503, REFUSED_503), (_anthropic_client, 500, ERROR)])
def test_the_sdks_retry_the_statuses_behind_each_retried_outcome(make: Callable[[], Any], status: int,
                                                                 outcome: str) -> None:
    response = importlib.import_module("httpx2").Response(status)
    profile = "openai-sdk" if make is _openai_client else "anthropic-sdk"
    assert make()._should_retry(response) is (outcome in load_client_profile(profile).retried_outcomes) is True


def test_the_sdks_do_not_retry_a_plain_client_error() -> None:
    """Why "error" is an approximation: a 400 is not retried, but the simulator and proxy never send one."""
    response = importlib.import_module("httpx2").Response(400)
    assert not _openai_client()._should_retry(response)
    assert not _anthropic_client()._should_retry(response)


def test_an_outcome_not_retried_ends_the_call_without_drawing() -> None:
    policy = ClientPolicy(retry_on="refused_429")
    client = RetryingClient(policy, np.random.default_rng(SEED))
    client.start_call(0, 0.0)
    assert client.on_outcome(0, 0, TIMED_OUT, 120.0) == CallFailed(0, 120.0, "attempts_exhausted")
    client.start_call(1, 0.0)
    first = _as_send(client.on_outcome(1, 0, REFUSED_429, 1.0))
    assert first.send_s - 1.0 == pytest.approx(np.random.default_rng(SEED).uniform(0.25, 3.0))


@pytest.mark.parametrize(("jitter", "low", "high"), [("reduce", 0.75, 1.0), ("full", 0.0, 1.0), ("none", 1.0, 1.0)])
def test_exponential_waits_stay_in_their_envelope(jitter: str, low: float, high: float) -> None:
    policy = ClientPolicy(backoff="exponential", backoff_base_s=0.5, backoff_cap_s=8.0, jitter=jitter,
                          max_retries=8)
    pairs = _sends_after_failures(policy, TIMED_OUT)
    delays = [min(0.5 * 2**k, 8.0) for k in range(8)]
    for (failed, send), delay in zip(pairs, delays, strict=True):
        assert delay * low - 1e-9 <= send - failed <= delay * high + 1e-9
    if jitter == "none":
        assert [send - failed for failed, send in pairs] == delays


# -- validation and the loader -----------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "message"), [
    ({"backoff": "linear"}, "backoff must be one of uniform, exponential; got 'linear'"),
    ({"jitter": "half"}, "jitter must be one of reduce, full, none; got 'half'"),
    ({"retry_after": "obey"}, "retry_after must be one of cap-or-give-up, positive-cap-or-give-up"),
    ({"retry_on": "timed_out,refused_404"}, "retry_on must list distinct outcomes from timed_out, refused_429"),
    ({"retry_on": "error, error"}, "retry_on must list distinct outcomes"),
    ({"jitter_fraction": 1.5}, "jitter_fraction must be in [0, 1], got 1.5"),
    ({"backoff_base_s": -1.0}, "backoff_base_s must be >= 0"),
    ({"backoff_cap_s": -1.0}, "backoff_cap_s must be >= 0"),
])
def test_invalid_settings_name_the_field_and_what_is_allowed(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ClientPolicy(**changes)


def test_the_shipped_profiles() -> None:
    assert available_client_profiles() == sorted(PROFILES + STACKS)


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_says_what_it_is_and_where_it_was_read(name: str) -> None:
    profile = client_profile(name)
    assert profile.name == name and len(profile.description) > 40 and profile.source
    package = PACKAGES.get(name)
    if package is None:
        return
    match = re.match(rf"{package} (\S+) \(PyPI\): ", profile.source)
    assert match, profile.source
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed: the cited version cannot be compared")
    assert match.group(1) == installed, f"{name} was read from {package} {match.group(1)}; {installed} is installed"


@pytest.mark.parametrize("name", PROFILES)
def test_a_profile_survives_a_json_round_trip(name: str) -> None:
    """The live load generator logs asdict(policy) as JSON; read back, it must be the same policy."""
    policy = load_client_profile(name)
    assert ClientPolicy(**json.loads(json.dumps(asdict(policy)))) == policy


def test_tenacity_profile_says_it_is_a_typical_configuration() -> None:
    text = client_profile("tenacity-typical")
    assert "not a library default" in text.description and "typical" in text.source


def test_an_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown client profile 'botocore'; known: anthropic-sdk, openai-sdk, "
                                          "paper, sdk-in-tenacity"):
        load_client_profile("botocore")


def test_a_profile_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('description = "d"\nsource = "s"\n[client]\nmax_retries = 1\nretry_on = ["refused_429"]\n')
    policy = load_client_profile(str(path))
    assert policy == ClientPolicy(max_retries=1, retry_on="refused_429")
    assert policy.retried_outcomes == ("refused_429",)


@pytest.mark.parametrize(("text", "message"), [
    ('source = "s"\n', "'description' must be a non-empty string"),
    ('description = "d"\n', "'source' must be a non-empty string"),
    ('description = "d"\nsource = "s"\nclients = 1\n',
     "unknown key 'clients'; allowed: client, description, layer, source"),
    ('description = "d"\nsource = "s"\n[client]\nmax_retry = 1\n', "unknown field 'max_retry'"),
    ('description = "d"\nsource = "s"\n[client]\nretry_on = "error"\n', "field 'retry_on' must be an array"),
    ('description = "d"\nsource = "s"\n[client]\nretry_on = ["error,timed_out"]\n', "must be an array of outcomes"),
    ('description = "d"\nsource = "s"\n[client]\nretry_on = ["oops"]\n', "mine.toml [client]: retry_on must list"),
    ('description = "d"\nsource = "s"\n[client]\nbackoff = "fib"\n', "mine.toml [client]: backoff must be one of"),
])
def test_a_bad_profile_file_names_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_client_profile(str(path))
