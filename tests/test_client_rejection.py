"""Each client profile against each refusal status and x-should-retry (beyond the paper): what the
pinned SDKs' _should_retry does (openai 3.63.0, anthropic 2.17.0), and the paper's client unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from retrybench.conditions.client_profiles import load_client_profile
from retrybench.records.runlog import REFUSED_429, REFUSED_503, REFUSED_529
from retrybench.traffic.client import SHOULD_RETRY_FALSE, CallFailed, RetryingClient, SendAttempt

pytestmark = pytest.mark.beyond

# profile -> whether it obeys x-should-retry: false
OBEYS = {"openai-sdk": True, "anthropic-sdk": True, "tenacity-typical": False, "paper": False}


def next_action(profile: str, outcome: str, no_retry: bool) -> SendAttempt | CallFailed:
    client = RetryingClient(load_client_profile(profile), np.random.default_rng(0))
    client.start_call(0, 0.0)
    action = client.on_outcome(0, 0, outcome, 1.0, None, no_retry)
    assert isinstance(action, SendAttempt | CallFailed)
    return action


@pytest.mark.parametrize("profile", sorted(OBEYS))
@pytest.mark.parametrize("outcome", [REFUSED_429, REFUSED_503, REFUSED_529])
def test_every_profile_retries_each_busy_status_without_the_header(profile: str, outcome: str) -> None:
    assert isinstance(next_action(profile, outcome, no_retry=False), SendAttempt)


@pytest.mark.parametrize("profile", sorted(OBEYS))
@pytest.mark.parametrize("outcome", [REFUSED_429, REFUSED_503, REFUSED_529])
def test_x_should_retry_false_ends_the_call_only_for_the_sdks(profile: str, outcome: str) -> None:
    action = next_action(profile, outcome, no_retry=True)
    if OBEYS[profile]:
        assert isinstance(action, CallFailed) and action.reason == SHOULD_RETRY_FALSE
    else:
        assert isinstance(action, SendAttempt)


@pytest.mark.parametrize("profile", ["openai-sdk", "anthropic-sdk"])
def test_the_sdks_wait_a_529s_retry_after_as_any_responses(profile: str) -> None:
    client = RetryingClient(load_client_profile(profile), np.random.default_rng(0))
    client.start_call(0, 0.0)
    action = client.on_outcome(0, 0, REFUSED_529, 1.0, 7.0)
    assert isinstance(action, SendAttempt) and action.send_s == pytest.approx(8.0)
