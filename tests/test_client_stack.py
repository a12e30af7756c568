"""Stacked retry layers (docs/stacks.md): the [[layer]] profiles' parsing, the multiplication counted
exactly, the first-byte timeout, an outer timeout abandoning the inner layers, and a one-layer stack being
the RetryingClient itself."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.conditions.client_profiles import client_profile, client_stack, load_client_profile
from retrybench.conditions.client_stack import StackLayer
from retrybench.conditions.config import ClientPolicy, ConfigError
from retrybench.records.runlog import COMPLETED, ERROR, REFUSED_429, REFUSED_503, TIMED_OUT
from retrybench.traffic.client import CallDelivered, CallFailed, ClientAction, RetryingClient, SendAttempt
from retrybench.traffic.stack import StackedClient

pytestmark = pytest.mark.beyond

SEED = 7
NO_WAIT = dict(backoff="uniform", backoff_min_s=0.0, backoff_max_s=0.0)


def layer(name: str, retries: int, timeout_s: float = 100.0, kind: str = "total", **policy: object) -> StackLayer:
    fields: dict[str, object] = {**NO_WAIT, "max_retries": retries, "attempt_timeout_s": timeout_s, **policy}
    return StackLayer(name=name, policy=ClientPolicy(**fields), timeout_kind=kind)  # type: ignore[arg-type]


def stacked(*layers: StackLayer, seed: int = SEED) -> StackedClient:
    return StackedClient(layers, np.random.default_rng(seed))


def as_send(action: ClientAction) -> SendAttempt:
    assert isinstance(action, SendAttempt), action
    return action


def fail_until_done(client: StackedClient, outcome: str, call: int = 0, now: float = 0.0) -> tuple[int, ClientAction]:
    """Every wire attempt of one call ends with `outcome` at its send time: the wire attempts sent, the end."""
    action: ClientAction = client.start_call(call, now)
    sent = 0
    while isinstance(action, SendAttempt):
        sent += 1
        action = client.on_outcome(call, action.attempt_no, outcome, action.send_s)
    return sent, action


# -- the multiplication ---------------------------------------------------------------------------------

@pytest.mark.parametrize("outcome", [ERROR, REFUSED_503, REFUSED_429])
def test_two_retries_inside_three_make_twelve_wire_attempts(outcome: str) -> None:
    """(2+1) x (3+1) = 12 requests for a call that always fails: the SDK's retries times the application's."""
    client = stacked(layer("app", 3), layer("sdk", 2))
    sent, end = fail_until_done(client, outcome)
    assert sent == 12 and client.attempts_made(0) == 12
    assert isinstance(end, CallFailed) and end.reason == "attempts_exhausted"
    assert client.layer_attempts(0) == (4, 12)
    assert client.outstanding() == 0


def test_three_layers_multiply_and_wire_attempts_are_numbered_across_layers() -> None:
    client = stacked(layer("app", 4), layer("sdk", 2), layer("gateway", 2))
    action: ClientAction = client.start_call(3, 0.0)
    numbers = []
    while isinstance(action, SendAttempt):
        numbers.append(action.attempt_no)
        action = client.on_outcome(3, action.attempt_no, ERROR, action.send_s)
    assert numbers == list(range(45))
    assert client.layer_attempts(3) == (5, 15, 45)


def test_an_outcome_an_inner_layer_does_not_retry_reaches_the_outer_one() -> None:
    """A gateway that passes 429s on: only the SDK and the application retry them, (2+1) x (1+1) = 6."""
    client = stacked(layer("app", 1), layer("sdk", 2), layer("gateway", 2, retry_on="timed_out,refused_503,error"))
    sent, _ = fail_until_done(client, REFUSED_429)
    assert sent == 6 and client.layer_attempts(0) == (2, 6, 6)


def test_a_delivered_attempt_ends_the_call_in_every_layer() -> None:
    client = stacked(layer("app", 3), layer("sdk", 2))
    first = client.start_call(0, 0.0)
    second = as_send(client.on_outcome(0, first.attempt_no, ERROR, 1.0))
    assert client.on_outcome(0, second.attempt_no, COMPLETED, 2.0) == CallDelivered(0, 2.0)
    assert client.layer_attempts(0) == (1, 2) and client.outstanding() == 0
    with pytest.raises(ValueError, match="already ended"):
        client.on_outcome(0, second.attempt_no, ERROR, 3.0)


# -- timeouts -------------------------------------------------------------------------------------------

def test_the_wire_deadline_is_the_earliest_layers() -> None:
    client = stacked(layer("app", 1, timeout_s=60.0), layer("sdk", 1, timeout_s=600.0),
                     layer("gw", 1, 10.0, "first_byte"))
    assert client.start_call(0, 5.0) == SendAttempt(0, 0, 5.0, 15.0)


def test_a_first_byte_timeout_stops_cutting_once_the_first_token_arrived() -> None:
    client = stacked(layer("sdk", 1, timeout_s=600.0), layer("gateway", 1, 10.0, "first_byte"))
    send = client.start_call(0, 0.0)
    assert send.deadline_s == 10.0
    assert client.on_first_token(0, 0, 9.5) == 600.0  # now only the SDK's 600 s
    assert client.on_first_token(0, 0, 9.6) == 600.0  # a second report changes nothing


def test_a_first_byte_layer_alone_has_no_deadline_after_the_first_token() -> None:
    client = stacked(layer("gateway", 1, 10.0, "first_byte"))
    client.start_call(0, 0.0)
    assert client.on_first_token(0, 0, 1.0) == math.inf


def test_a_first_byte_timeout_before_the_first_token_is_the_gateways_to_retry() -> None:
    client = stacked(layer("sdk", 0, timeout_s=600.0), layer("gateway", 2, 10.0, "first_byte"))
    send = client.start_call(0, 0.0)
    retry = as_send(client.on_outcome(0, send.attempt_no, TIMED_OUT, send.deadline_s))
    assert (retry.attempt_no, retry.send_s, retry.deadline_s) == (1, 10.0, 20.0)
    assert client.layer_attempts(0) == (1, 2)


def test_the_first_byte_clock_restarts_with_each_attempt() -> None:
    """A first token on one attempt does not spare the next one: each gateway attempt waits anew."""
    client = stacked(layer("sdk", 1, timeout_s=600.0), layer("gateway", 1, 10.0, "first_byte"))
    send = client.start_call(0, 0.0)
    client.on_first_token(0, 0, 2.0)
    retry = as_send(client.on_outcome(0, send.attempt_no, ERROR, 50.0))
    assert retry.deadline_s == 60.0


def test_an_outer_timeout_abandons_the_inner_layers_and_the_outer_layer_decides() -> None:
    """The application's 60 s pass while the SDK's 600-s attempt waits: the application retries, with a fresh
    SDK call inside (its attempt 0 again), and the SDK's unused retries are never made."""
    client = stacked(layer("app", 1, timeout_s=60.0), layer("sdk", 2, timeout_s=600.0))
    send = client.start_call(0, 0.0)
    assert send.deadline_s == 60.0
    retry = as_send(client.on_outcome(0, 0, TIMED_OUT, 60.0))
    assert (retry.attempt_no, retry.send_s, retry.deadline_s) == (1, 60.0, 120.0)
    assert client.layer_attempts(0) == (2, 2)
    end = client.on_outcome(0, 1, TIMED_OUT, 120.0)
    assert end == CallFailed(0, 120.0, "attempts_exhausted") and client.attempts_made(0) == 2


def test_a_wait_past_an_outer_deadline_is_that_layers_timeout() -> None:
    """The SDK would wait 30 s to retry, but the application's attempt ends at 20 s: the application decides
    then, and no SDK retry is sent."""
    client = stacked(layer("app", 1, timeout_s=20.0), layer("sdk", 2, timeout_s=600.0, retry_after="positive-capped"))
    send = client.start_call(0, 0.0)
    retry = as_send(client.on_outcome(0, send.attempt_no, REFUSED_429, 1.0, retry_after_s=30.0))
    assert (retry.attempt_no, retry.send_s, retry.deadline_s) == (1, 20.0, 40.0)
    assert client.layer_attempts(0) == (2, 2)


# -- one layer is RetryingClient ------------------------------------------------------------------------

OUTCOMES = st.sampled_from([COMPLETED, TIMED_OUT, REFUSED_429, REFUSED_503, ERROR])


@settings(max_examples=60, deadline=None)
@given(profile=st.sampled_from(["paper", "openai-sdk", "anthropic-sdk", "tenacity-typical"]),
       seed=st.integers(0, 2**32 - 1), outcomes=st.lists(st.tuples(OUTCOMES, st.floats(0.0, 200.0),
                                                                 st.one_of(st.none(), st.floats(0.0, 200.0))),
                                                       min_size=1, max_size=40))
def test_a_one_layer_stack_gives_the_retrying_clients_attempts(profile: str, seed: int,
                                                               outcomes: list[tuple[str, float, float | None]]) -> None:
    policy = load_client_profile(profile)
    plain = RetryingClient(policy, np.random.default_rng([seed, 10]))
    stack = StackedClient([StackLayer(name="only", policy=policy)], np.random.default_rng([seed, 10]))
    calls = 3
    actions: dict[int, tuple[ClientAction, ClientAction]] = {
        i: (plain.start_call(i, float(i)), stack.start_call(i, float(i))) for i in range(calls)}
    for step, (outcome, after, retry_after) in enumerate(outcomes):
        i = step % calls
        a, b = actions[i]
        assert a == b
        if not isinstance(a, SendAttempt) or not isinstance(b, SendAttempt):
            continue
        now = a.send_s + min(after, a.deadline_s - a.send_s) if outcome != TIMED_OUT else a.deadline_s
        actions[i] = (plain.on_outcome(i, a.attempt_no, outcome, now, retry_after),
                      stack.on_outcome(i, b.attempt_no, outcome, now, retry_after))
        assert actions[i][0] == actions[i][1]
        assert plain.attempts_made(i) == stack.attempts_made(i) == stack.layer_attempts(i)[0]
    assert plain.outstanding() == stack.outstanding()


# -- the profiles ---------------------------------------------------------------------------------------

def test_the_shipped_stacks_are_their_profiles_layered() -> None:
    sdk, tenacity = load_client_profile("openai-sdk"), load_client_profile("tenacity-typical")
    layers = client_stack("sdk-in-tenacity-behind-gateway")
    assert layers is not None
    assert [(lay.name, lay.timeout_kind) for lay in layers] == [("tenacity", "total"), ("sdk", "total"),
                                                                 ("gateway", "first_byte")]
    assert layers[0].policy == tenacity and layers[1].policy == sdk
    assert (layers[2].timeout_s, layers[2].policy.max_retries) == (10.0, 2)
    assert client_stack("sdk-in-tenacity") == layers[:2]
    none = client_stack("sdk-in-tenacity-behind-gateway-no-retries")
    assert none is not None and none[2].policy.max_attempts == 1 and none[2].timeout_s == 10.0
    assert client_stack("openai-sdk") is None  # a [client] profile stays one policy
    assert client_profile("sdk-in-tenacity").policy == tenacity  # the outermost layer's, where one is wanted


def test_the_gateway_stack_multiplies_to_forty_five() -> None:
    layers = client_stack("sdk-in-tenacity-behind-gateway")
    assert layers is not None
    sent, _ = fail_until_done(StackedClient(layers, np.random.default_rng(SEED)), REFUSED_503)
    assert sent == 5 * 3 * 3


HEAD = 'description = "d"\nsource = "s"\n'


@pytest.mark.parametrize(("text", "message"), [
    ('[client]\nmax_retries = 1\n[[layer]]\nname = "a"\n', "mine.toml: give either [client] or [[layer]] tables"),
    ('layer = 3\n', "mine.toml: 'layer' must be an array of tables"),
    ('[[layer]]\nmax_retries = 1\n', "mine.toml [[layer]] 0: field 'name' must be a non-empty string"),
    ('[[layer]]\nname = "a"\n[[layer]]\nname = "a"\n', "mine.toml [[layer]] 1 ('a'): layer name 'a' used twice"),
    ('[[layer]]\nname = "gw"\ntimeout_kind = "idle"\n',
     "mine.toml [[layer]] 0 ('gw'): field 'timeout_kind' must be one of total, first_byte; got 'idle'"),
    ('[[layer]]\nname = "a"\n[[layer]]\nname = "gw"\nmax_retry = 2\n',
     "mine.toml [[layer]] 1 ('gw'): unknown field 'max_retry'"),
    ('[[layer]]\nname = "gw"\nmax_retries = 99\n', "mine.toml [[layer]] 0 ('gw'): max_retries must be in [0, 20]"),
    ('[[layer]]\nname = "gw"\nretry_on = "error"\n', "mine.toml [[layer]] 0 ('gw'): field 'retry_on' must be an array"),
])
def test_a_bad_stack_names_the_file_the_layer_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(HEAD + text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        client_profile(str(path))


def test_a_stack_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(HEAD + '[[layer]]\nname = "app"\nmax_retries = 3\n[[layer]]\nname = "gw"\n'
                    'timeout_kind = "first_byte"\nattempt_timeout_s = 10.0\nretry_on = ["timed_out"]\n')
    layers = client_stack(str(path))
    assert layers == (StackLayer(name="app", policy=ClientPolicy(max_retries=3)),
                      StackLayer(name="gw", timeout_kind="first_byte",
                                 policy=replace(ClientPolicy(), attempt_timeout_s=10.0, retry_on="timed_out")))


@pytest.mark.parametrize("name", ["sdk-in-tenacity", "sdk-in-tenacity-behind-gateway",
                                  "sdk-in-tenacity-behind-gateway-no-retries"])
def test_each_shipped_stack_says_how_many_requests_one_call_may_make(name: str) -> None:
    profile = client_profile(name)
    assert profile.source and len(profile.layers) >= 2
    most = math.prod(layer.policy.max_attempts for layer in profile.layers)
    assert re.search(rf"up to [^:]*= {most} requests for one call", profile.description), profile.description


def test_should_retry_false_stops_only_the_layers_that_obey_it() -> None:
    """`x-should-retry: false` reaches every layer with the outcome: an SDK that obeys it gives up at once, and
    an application wrapper that reads only the exception's type retries the SDK call (4 wire attempts: one per
    application attempt); with every layer obeying it the call ends after one."""
    def end_with_no_retry(client: StackedClient) -> tuple[int, ClientAction]:
        action: ClientAction = client.start_call(0, 0.0)
        sent = 0
        while isinstance(action, SendAttempt):
            sent += 1
            action = client.on_outcome(0, action.attempt_no, REFUSED_503, action.send_s, None, True)
        return sent, action

    mixed = stacked(layer("app", 3, honour_should_retry=False), layer("sdk", 2, honour_should_retry=True))
    sent, end = end_with_no_retry(mixed)
    assert sent == 4 and isinstance(end, CallFailed)
    obeying = stacked(layer("app", 3, honour_should_retry=True), layer("sdk", 2, honour_should_retry=True))
    sent, end = end_with_no_retry(obeying)
    assert sent == 1 and isinstance(end, CallFailed)
