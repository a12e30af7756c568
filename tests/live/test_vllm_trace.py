"""The tracing plugin's recorder, driven with stand-ins for vLLM's requests and scheduler outputs.

The real scheduler subclass is exercised against a real vLLM in test_vllm_real.py; here the
recorder's bookkeeping is checked event by event, and its trace is read by the same analysis
that reads simulated traces.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures.waiting import until_sync

from retrybench.analysis.prompt_work import prompt_work
from retrybench.realvllm import vllm_trace
from retrybench.realvllm.vllm_trace import TraceRecorder, check_vllm_version
from retrybench.records.tracefile import read_trace


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(rid: str, prompt: int) -> Any:
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_computed_tokens=0, num_output_tokens=0,
                           status=SimpleNamespace(name="WAITING"), is_finished=lambda: False)


def finish(req: Any, status: str) -> None:
    req.status = SimpleNamespace(name=status)
    req.is_finished = lambda: True


def schedule(recorder: TraceRecorder, requests: dict[str, Any], tokens: dict[str, int], new: dict[str, int],
             preempted: set[str] | None = None) -> Any:
    """What vLLM's schedule() leaves: computed tokens advanced, a SchedulerOutput-like object."""
    for rid, n in tokens.items():
        requests[rid].num_computed_tokens += n
    output = SimpleNamespace(num_scheduled_tokens=dict(tokens), preempted_req_ids=preempted or set(),
                             scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=h)
                                                 for r, h in new.items()])
    recorder.scheduled(output, requests)
    return output


@pytest.fixture
def traced(tmp_path: Path) -> tuple[TraceRecorder, Clock, Path]:
    clock = Clock()
    path = tmp_path / "trace.jsonl"
    return TraceRecorder(path, {"max_num_batched_tokens": 64}, clock=clock), clock, path


def test_a_completed_and_an_aborted_execution(traced: tuple[TraceRecorder, Clock, Path]) -> None:
    recorder, clock, path = traced
    a, b = request("cmpl-a", 100), request("cmpl-b", 80)
    live = {"cmpl-a": a, "cmpl-b": b}
    recorder.queued(a)
    recorder.queued(b)
    a.num_computed_tokens = 32  # a prefix-cache hit of 32 tokens
    out0 = schedule(recorder, live, {"cmpl-a": 64}, new={"cmpl-a": 32})
    clock.now += 0.5
    recorder.step_done(out0, live)
    out1 = schedule(recorder, live, {"cmpl-a": 4, "cmpl-b": 60}, new={"cmpl-b": 0})
    clock.now += 0.25
    # b's client leaves while step 1 is in flight: the core aborts it before processing the output.
    recorder.aborted([b])
    finish(b, "FINISHED_ABORTED")
    del live["cmpl-b"]
    a.num_output_tokens = 1
    recorder.step_done(out1, {"cmpl-a": a})
    a.num_computed_tokens += 1
    a.num_output_tokens = 2
    finish(a, "FINISHED_LENGTH_CAPPED")
    out2 = schedule(recorder, {"cmpl-a": a}, {"cmpl-a": 1}, new={})
    clock.now += 0.1
    recorder.step_done(out2, {"cmpl-a": a})
    recorder.close()

    header, events = read_trace(path)
    assert header["engine"] == "vllm" and header["max_num_batched_tokens"] == 64
    kinds = [(e["event"], e.get("execution")) for e in events if e["event"] not in ("step", "step_done")]
    assert kinds == [("queued", 0), ("queued", 1), ("abort_requested", 1), ("aborted", 1), ("first_token", 0),
                     ("finished", 0), ("trace_end", -1)]
    steps = [e for e in events if e["event"] == "step"]
    assert [s["prompt_tokens"] for s in steps] == [{"0": 64}, {"0": 4, "1": 60}, {}]
    assert [s["decode"] for s in steps] == [[], [], [0]]
    assert steps[0]["cached_tokens"] == {"0": 32} and steps[1]["cached_tokens"] == {"1": 0}
    assert [round(s["end_s"] - s["start_s"], 6) for s in steps] == [0.5, 0.25, 0.1]
    aborted = next(e for e in events if e["event"] == "aborted")
    assert aborted["in_flight_prompt_tokens"] == 60 and aborted["computed_prompt_tokens"] == 60
    assert aborted["unscheduled"] is False
    done = [e for e in events if e["event"] == "step_done"]
    assert [d["dropped"] for d in done] == [[], [1], []]
    assert [e["request_id"] for e in events if e["event"] == "queued"] == ["cmpl-a", "cmpl-b"]

    work = prompt_work(events)
    assert work.computed_tokens == 128 and work.aborted_in_flight_tokens == 60 and work.aborted_executions == 1


def test_an_execution_aborted_while_waiting_is_unscheduled(traced: tuple[TraceRecorder, Clock, Path]) -> None:
    recorder, _clock, path = traced
    c = request("cmpl-c", 50)
    recorder.queued(c)
    recorder.aborted([c])
    recorder.close()
    _header, events = read_trace(path)
    aborted = next(e for e in events if e["event"] == "aborted")
    assert aborted == {**aborted, "computed_prompt_tokens": 0, "in_flight_prompt_tokens": 0, "unscheduled": True}


def test_preemptions_are_logged_with_the_step(traced: tuple[TraceRecorder, Clock, Path]) -> None:
    recorder, clock, path = traced
    a = request("cmpl-a", 10)
    recorder.queued(a)
    out = schedule(recorder, {"cmpl-a": a}, {"cmpl-a": 10}, new={"cmpl-a": 0})
    clock.now += 0.1
    recorder.step_done(out, {"cmpl-a": a})
    a.num_computed_tokens = 0  # preempted: vLLM resets its progress
    out = schedule(recorder, {"cmpl-a": a}, {}, new={}, preempted={"cmpl-a"})
    recorder.close()
    _header, events = read_trace(path)
    assert ("preempted", 0) in [(e["event"], e.get("execution")) for e in events]


def test_the_recorder_reports_its_own_time(traced: tuple[TraceRecorder, Clock, Path]) -> None:
    recorder, clock, path = traced
    recorder.queued(request("cmpl-a", 10))
    clock.now += 2.0
    recorder.close()
    end = json.loads(path.read_text().splitlines()[-1])
    assert end["event"] == "trace_end" and end["wall_s"] == 2.0 and end["self_time_s"] >= 0.0


@pytest.mark.parametrize("version", ["0.30.0", "0.32.0", "0.34.1"])
def test_supported_versions_pass(version: str) -> None:
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.29.9", "0.35.0", "1.0.0", "dev"])
def test_other_versions_are_refused_unless_asked(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.30-0\.34"):
        check_vllm_version(version)
    monkeypatch.setenv("RETRYBENCH_TRACE_ANY_VLLM", "1")
    check_vllm_version(version)


def test_the_scheduler_classes_need_vllm() -> None:
    import retrybench.realvllm.vllm_trace as plugin

    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError):
            _ = plugin.TracingScheduler
    with pytest.raises(AttributeError):
        _ = plugin.NoSuchScheduler


def test_the_trace_is_flushed_and_the_overhead_noted_while_vllm_runs(traced: tuple[TraceRecorder, Clock, Path]
                                                                      ) -> None:
    """vLLM may end its engine process without shutting the scheduler down: what was recorded must
    already be on disk, with a recent note of the recorder's own time."""
    recorder, clock, path = traced
    recorder.queued(request("cmpl-a", 10))
    clock.now += 6.0  # past STATS_S
    # The flusher thread runs every 0.25 s; a loaded machine delays it.
    until_sync(lambda: '"trace_stats"' in path.read_text(), "the flusher thread to write the trace_stats note",
               seen=path.read_text)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in lines[1:]] == ["queued", "trace_stats"]
    assert lines[-1]["wall_s"] == 6.0
    recorder.close()


def test_flush_puts_every_recorded_event_on_disk_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracing scheduler flushes when the engine goes idle, so that a reader who sees vLLM's
    gauges at 0 finds the whole trace on disk without waiting for the flusher thread."""
    monkeypatch.setattr(vllm_trace, "FLUSH_S", 3600.0)  # the flusher thread stays out of the way
    path = tmp_path / "trace.jsonl"
    recorder = TraceRecorder(path, {"max_num_batched_tokens": 64}, clock=Clock())
    recorder.queued(request("cmpl-a", 10))
    recorder.aborted([request("cmpl-a", 10)])
    recorder.flush()
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()[1:]]
    assert events[:3] == ["queued", "abort_requested", "aborted"]
    recorder.close()
