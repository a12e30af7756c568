"""Joining a live run's records: scrapes resampled to whole trace seconds, proxy decisions to executions."""

from __future__ import annotations

from retrybench.loadgen.assemble import Scrape, assemble_run_log, merge_proxy_logs, resample
from retrybench.records.decisionlog import DecisionLogHeader
from retrybench.serving.aio import metric_sums
from retrybench.serving.openai_api import call_digest


def scrape(at: float, waiting: int) -> Scrape:
    return Scrape(at_unix=at, engine_waiting=waiting, engine_running=1, proxy_waiting=0, prompt_tokens_total=10,
                  prefix_cache_queries_total=20)


def proxy_header(t0_unix: float, time_scale: float = 0.1) -> DecisionLogHeader:
    return {"t0_unix": t0_unix, "time_scale": time_scale, "upstream": "http://127.0.0.1:8000", "policy": {}}


def test_each_trace_second_takes_the_latest_scrape_before_it() -> None:
    scrapes = [scrape(100.00, 0), scrape(100.09, 5), scrape(100.21, 7)]
    samples = resample(scrapes, t0_unix=100.0, time_scale=0.1, end_s=3.0)  # trace s 0, 1, 2 at 100.0/.1/.2
    assert samples.engine_waiting == [0, 5, 5]
    assert resample(scrapes, 100.0, 0.1, 4.0).engine_waiting == [0, 5, 5, 7]


def test_metric_sums_add_label_sets() -> None:
    text = b'vllm:num_requests_waiting{engine="0"} 3.0\nvllm:num_requests_waiting{engine="1"} 2.0\n# HELP x\n'
    assert metric_sums(text) == {"vllm:num_requests_waiting": 5.0}


def test_proxy_decisions_become_executions_on_the_trace_clock() -> None:
    # The proxy started 0.5 wall s after the load generator's t0, at time scale 0.1: +5 trace s.
    events = [
        {"ev": "attempt", "t": 1.0, "call": 0, "attempt": 0, "call_id": call_digest("c-1"), "client_attempt": "0",
         "prompt_tokens": 50, "decision": "create", "execution": 0, "dispatch": True},
        {"ev": "engine", "t": 2.0, "execution": 0, "kind": "first_token", "actions": []},
        {"ev": "left", "t": 3.0, "call": 0, "attempt": 0, "actions": [["cancel", 0]]},
        {"ev": "end", "t": 3.0, "execution": 0, "fate": "cancelled"},
    ]
    log = assemble_run_log(load_meta={"time_scale": 0.1, "t0_unix": 1000.0}, calls=[], attempts=[],
                           call_ids=["c-0", "c-1"], proxy_header=proxy_header(1000.5), proxy_events=events,
                           scrapes=[], meta={}, end_s=10.0)
    (execution,) = log.executions
    assert execution.call_index == 1 and execution.created_s == 6.0 and execution.accepted_s == 6.0
    assert execution.first_token_s == 7.0 and execution.abort_requested_s == 8.0
    assert execution.fate == "cancelled" and log.meta["live"] is True


def test_several_instances_logs_merge_on_one_clock_with_distinct_execution_ids() -> None:
    first = proxy_header(100.0)
    second = proxy_header(100.5)  # started 5 policy seconds later
    header, events = merge_proxy_logs([
        (first, [{"ev": "attempt", "t": 1.0, "execution": 0, "decision": "create"},
                 {"ev": "engine", "t": 9.0, "execution": 0, "kind": "completed", "actions": [["retain", 0]]}]),
        (second, [{"ev": "attempt", "t": 1.0, "execution": 0, "decision": "create"},
                  {"ev": "left", "t": 2.0, "actions": [["cancel", 0]]}]),
    ])
    assert header["instances"] == 2 and header["t0_unix"] == 100.0
    assert [(e["t"], e.get("execution"), e["instance"]) for e in events] == [
        (1.0, 0, 0), (6.0, 1, 1), (7.0, None, 1), (9.0, 0, 0)]
    assert events[2]["actions"] == [["cancel", 1]] and events[3]["actions"] == [["retain", 0]]
