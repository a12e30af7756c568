"""The load generator's openai-SDK driver: the SDK's own retries through the real proxy, each attempt read
off the wire into the run log's records (stub upstream, loopback, real time)."""

from __future__ import annotations

import itertools

import pytest
from fixtures.stack import ProxyStack, policy, run_stack
from fixtures.stub_upstream import StubUpstream

from retrybench.conditions.config import ClientPolicy, WorkloadSpec
from retrybench.loadgen.sdk_driver import SdkLoadSettings, run_sdk_load
from retrybench.records.runlog import COMPLETED, TIMED_OUT
from retrybench.traffic.workload import Call, Trace

pytestmark = pytest.mark.live
pytest.importorskip("openai")


def trace(arrivals: list[float]) -> Trace:
    calls = tuple(Call(index=i, call_id=f"call-{i}", arrival_s=t, prompt_tokens=40, response_tokens=55,
                       phase="base") for i, t in enumerate(arrivals))
    return Trace(spec=WorkloadSpec(chat_calls_per_s=1.0, shared_prefix_tokens=0), seed=0, calls=calls)


def test_the_sdks_retries_are_recorded_attempt_by_attempt_and_retention_answers_the_late_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 5.5-s response, a 1-s SDK timeout, the SDK's jitter drawn as none: attempts over [0, 1],
    [1.5, 2.5], [3.5, 4.5] s time out, the one at 6.5 s is served the response the proxy kept at 5.5 s."""
    base_client = pytest.importorskip("openai._base_client")
    monkeypatch.setattr(base_client, "random", lambda: 0.0)

    async def test(s: ProxyStack[StubUpstream]) -> None:
        settings = SdkLoadSettings(target=s.url, client=ClientPolicy(attempt_timeout_s=1.0, max_retries=6),
                                   extra_body={"stub": {"interval_ms": 100}})
        result = await run_sdk_load(trace([0.0, 0.2]), settings)
        for call in result.calls:
            assert call.delivered_s is not None and call.failed_s is None, call
            assert call.attempts == 4, call
        for index in (0, 1):
            attempts = sorted((a for a in result.attempts if a.call_index == index), key=lambda a: a.attempt_no)
            assert [a.attempt_no for a in attempts] == [0, 1, 2, 3]
            assert [a.outcome for a in attempts] == [TIMED_OUT] * 3 + [COMPLETED]
            assert attempts[-1].retained, "the late retry was not served the kept response"
            gaps = [later.sent_s - earlier.sent_s for earlier, later in itertools.pairwise(attempts)]
            # the SDK's own schedule: 1 s of attempt, then 0.5, 1 and 2 s of backoff
            assert gaps == pytest.approx([1.5, 2.0, 3.0], abs=0.4), gaps
        assert s.upstream.requests == 2  # each call computed once

    run_stack(policy("coalescing", retain_s=30.0), test, StubUpstream())
