"""Recorded workload files (traffic.workload_file): each format read, the format detected from the header,
and every kind of bad row refused with its file, line and field; then the trace they become
(traffic.recorded): --rate-x rescaling, --pulse parsing and the bursts laid over the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrybench.traffic.recorded import Pulse, parse_pulse, recorded_trace, rescaled
from retrybench.traffic.workload_file import (
    REQUIRED,
    RecordedWorkload,
    Row,
    WorkloadFileError,
    detect_format,
    file_digest,
    parse_workload,
    read_workload,
)

OWN_CSV = """arrival_s,prompt_tokens,output_tokens,prefix_tokens,call_id
0.0,4000,200,1000,a
0.5,3000,100,1000,b
2.0,5000,50,1000,c
"""
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,4808,10
2023-11-16 18:15:50.9951690,3180,8
2023-11-16 18:15:47.0000000,110,27
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,GPT-4,1087,136,1223,Conversation log
118,ChatGPT,417,217,634,API log
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_own_csv_is_read_as_written(tmp_path: Path) -> None:
    workload, digest = read_workload(write(tmp_path, "own.csv", OWN_CSV))
    assert workload.format == "own" and workload.name == str(tmp_path / "own.csv")
    assert workload.rows == (Row(line=2, arrival_s=0.0, prompt_tokens=4000, output_tokens=200, prefix_tokens=1000,
                                 call_id="a"),
                             Row(line=3, arrival_s=0.5, prompt_tokens=3000, output_tokens=100, prefix_tokens=1000,
                                 call_id="b"),
                             Row(line=4, arrival_s=2.0, prompt_tokens=5000, output_tokens=50, prefix_tokens=1000,
                                 call_id="c"))
    assert workload.prefix_tokens == 1000 and workload.rate_calls_per_s() == pytest.approx(1.5)
    assert digest == file_digest(OWN_CSV.encode()) != file_digest(OWN_CSV.replace("50,", "51,").encode())


def test_the_own_jsonl_is_read_with_its_line_numbers_and_without_a_prefix(tmp_path: Path) -> None:
    lines = [json.dumps({"arrival_s": 1.5, "prompt_tokens": 10, "output_tokens": 3, "call_id": "x"}), "",
             json.dumps({"arrival_s": 4, "prompt_tokens": 12, "output_tokens": 4})]
    workload, _ = read_workload(write(tmp_path, "own.jsonl", "\n".join(lines) + "\n"))
    assert workload.format == "own"
    # The own format's arrivals are kept from its own zero, not shifted to the first row.
    assert [(r.line, r.arrival_s, r.prompt_tokens, r.output_tokens, r.call_id) for r in workload.rows] == [
        (1, 1.5, 10, 3, "x"), (3, 4.0, 12, 4, None)]
    assert workload.prefix_tokens == 0


def test_azure_times_are_seconds_since_the_first_call_in_arrival_order() -> None:
    workload = parse_workload(AZURE, "azure.csv")
    assert workload.format == "azure"
    assert [r.line for r in workload.rows] == [2, 4, 3]  # sorted by time, each row keeps its line
    assert [r.arrival_s for r in workload.rows] == pytest.approx([0.0, 0.31941, 4.314579], abs=1e-5)
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.rows] == [(4808, 10), (110, 27), (3180, 8)]


def test_burstgpt_keeps_its_token_columns_and_ignores_the_others() -> None:
    workload = parse_workload(BURSTGPT, "burst.csv")
    assert workload.format == "burstgpt"
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in workload.rows] == [
        (0.0, 472, 18), (40.0, 1087, 136), (113.0, 417, 217)]


@pytest.mark.parametrize(("header", "expected"), [
    ("arrival_s,prompt_tokens,output_tokens", "own"),
    (" output_tokens , arrival_s,prompt_tokens,call_id", "own"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens", "azure"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "burstgpt"),
])
def test_the_format_is_detected_from_the_header(header: str, expected: str) -> None:
    assert detect_format(header.split(",")) == expected


def test_a_partial_header_names_the_missing_column_and_an_unknown_one_lists_the_formats() -> None:
    with pytest.raises(ValueError, match=r"missing required column 'output_tokens' \(own format\)"):
        detect_format(["arrival_s", "prompt_tokens"])
    with pytest.raises(ValueError, match="no known format") as raised:
        detect_format(["time", "tokens"])
    assert all(column in str(raised.value) for columns in REQUIRED.values() for column in columns)


def test_a_forced_format_reads_the_file_as_that_format_or_refuses_its_header() -> None:
    both = "arrival_s,prompt_tokens,output_tokens,Timestamp,Request tokens,Response tokens\n1,10,2,50,20,5\n"
    assert parse_workload(both, "f").format == "own"
    forced = parse_workload(both, "f", "burstgpt")
    assert forced.format == "burstgpt" and forced.rows[0].prompt_tokens == 20
    with pytest.raises(WorkloadFileError, match=r"^f: line 1: missing required column 'TIMESTAMP' \(azure format\)$"):
        parse_workload(both, "f", "azure")


@pytest.mark.parametrize(("text", "message"), [
    ("", "f: empty file"),
    ("\n\n", "f: empty file"),
    ("arrival_s,prompt_tokens,output_tokens\n", "f: no calls"),
    ("arrival_s,prompt_tokens\n0,10\n", "f: line 1: missing required column 'output_tokens'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,ten,2\n", "f: line 3: prompt_tokens: not a whole number: 'ten'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10.5,2\n", "f: line 2: prompt_tokens: not a whole number: '10.5'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,-10,2\n", "f: line 2: prompt_tokens: negative: '-10'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,2\n", "f: line 2: prompt_tokens: 0 tokens: a call needs at least 1"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,0\n", "f: line 2: output_tokens: 0 tokens: a call needs at least 1"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,2\n", "f: line 2: arrival_s: negative: '-1'"),
    ("arrival_s,prompt_tokens,output_tokens\nnan,10,2\n", "f: line 2: arrival_s: not a finite number: 'nan'"),
    ("arrival_s,prompt_tokens,output_tokens\nsoon,10,2\n", "f: line 2: arrival_s: could not convert"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n0,,2\n", "f: line 3: prompt_tokens: missing"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n0,10\n", "f: line 3: 2 fields, the header has 3"),
    ("arrival_s,prompt_tokens,output_tokens\n5,10,2\n4.5,10,2\n",
     "f: line 3: arrival_s: goes backwards (4.5 s, after 5 s on line 2)"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_tokens\n0,10,2,4\n1,10,2,5\n",
     "f: line 3: prefix_tokens: 5 differs from line 2's 4"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_tokens\n0,10,2,4\n1,10,2,\n",
     "f: line 3: prefix_tokens: missing, where line 2 gives one"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_tokens\n0,10,2,4\n1,4,2,4\n",
     "f: line 3: prompt_tokens: 4 tokens, not longer than the 4-token shared prefix"),
    ("arrival_s,prompt_tokens,output_tokens,call_id\n0,10,2,a\n1,10,2,a\n", "f: line 3: call_id: 'a' repeats line 2's"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n{"arrival_s": 1, "prompt_tokens": 10}\n',
     "f: line 2: output_tokens: missing"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n{"arrival_s": 1, "prompt_tokens": true, '
     '"output_tokens": 2}\n', "f: line 2: prompt_tokens: not a whole number: True"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n[1, 2]\n', "f: line 2: not a JSON object"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n{"arrival_s": \n', "f: line 2: not a JSON object"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\nyesterday,10,2\n",
     "f: line 3: TIMESTAMP: not a date and time"),
    ("Timestamp,Request tokens,Response tokens\n5,10,2\n6,10,0\n", "f: line 3: Response tokens: 0 tokens"),
    ("Timestamp,Request tokens,Response tokens\n5,10,2\n-6,10,1\n", "f: line 3: Timestamp: negative"),
])
def test_a_bad_file_is_refused_naming_its_line_and_field(text: str, message: str) -> None:
    with pytest.raises(WorkloadFileError) as raised:
        parse_workload(text, "f")
    assert str(raised.value).startswith(message), str(raised.value)


def test_an_unreadable_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match=r"missing\.csv: cannot read"):
        read_workload(tmp_path / "missing.csv")
    (tmp_path / "bin.csv").write_bytes(b"arrival_s,prompt_tokens,output_tokens\n\xff\xfe,1,1\n")
    with pytest.raises(WorkloadFileError, match=r"bin\.csv: not UTF-8 text"):
        read_workload(tmp_path / "bin.csv")


# -- the trace a recorded workload becomes ------------------------------------------------------------


def rows(times: list[float]) -> RecordedWorkload:
    found = tuple(Row(line=i + 2, arrival_s=t, prompt_tokens=100 + i, output_tokens=10 + i)
                  for i, t in enumerate(times))
    return RecordedWorkload(name="w.csv", format="own", rows=found)


def test_rate_x_rescales_the_mean_rate_and_keeps_the_gaps_proportions() -> None:
    workload = rows([0.0, 1.0, 3.0, 10.0])  # 4 calls over 10 s: 0.4 calls/s
    trace = recorded_trace(workload, chat=2.0, seed=1, rate_x=0.5)  # 1 call/s
    times = [c.arrival_s for c in trace.calls]
    assert times == pytest.approx([0.0, 0.4, 1.2, 4.0])
    assert len(times) / times[-1] == pytest.approx(0.5 * 2.0)
    assert [c.prompt_tokens for c in trace.calls] == [100, 101, 102, 103]
    assert recorded_trace(workload, chat=2.0, seed=1).calls[-1].arrival_s == 10.0  # no --rate-x: as recorded
    with pytest.raises(ValueError, match="no rate to rescale"):
        rescaled(rows([0.0, 0.0]).rows, 1.0)


@pytest.mark.parametrize(("text", "expected"), [("300:107:2.7", Pulse(300.0, 107.0, 2.7)),
                                                ("0:1.5:100", Pulse(0.0, 1.5, 100.0))])
def test_a_pulse_is_at_duration_and_multiple_of_chat(text: str, expected: Pulse) -> None:
    assert parse_pulse(text) == expected


@pytest.mark.parametrize(("text", "message"), [("300:107", "give AT:DURATION:X"), ("a:1:2", "are numbers"),
                                               ("-1:10:2", "starts at a finite time >= 0"),
                                               ("1:0:2", "lasts a finite time > 0"), ("1:10:0", "rate is in"),
                                               ("1:10:101", "rate is in")])
def test_a_bad_pulse_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_pulse(text)


def test_pulses_add_poisson_calls_at_x_chat_with_the_file_s_lengths() -> None:
    workload = rows([float(t) for t in range(0, 2000, 10)])  # 200 calls, one every 10 s
    pulses = [Pulse(100.0, 400.0, 3.0), Pulse(1000.0, 200.0, 1.5)]
    trace = recorded_trace(workload, chat=2.0, seed=7, pulses=pulses)
    base = [c for c in trace.calls if c.phase == "base"]
    burst = [c for c in trace.calls if c.phase == "pulse"]
    assert [c.arrival_s for c in base] == [r.arrival_s for r in workload.rows]  # the file's calls untouched
    first = [c for c in burst if 100 <= c.arrival_s < 500]
    second = [c for c in burst if 1000 <= c.arrival_s < 1200]
    assert len(first) + len(second) == len(burst)  # nothing outside the bursts
    assert len(first) == pytest.approx(400 * 3.0 * 2.0, rel=0.1) and len(second) == pytest.approx(600, rel=0.15)
    lengths = {(r.prompt_tokens, r.output_tokens) for r in workload.rows}
    assert {(c.prompt_tokens, c.response_tokens) for c in burst} <= lengths
    assert len({c.prompt_tokens for c in burst}) > 100  # drawn across the file's rows, not one row repeated
    times = [c.arrival_s for c in trace.calls]
    assert times == sorted(times) and [c.index for c in trace.calls] == list(range(len(times)))
    assert len({c.call_id for c in trace.calls}) == len(times)
    phases = trace.phase_bounds()
    assert phases["pulse"] == (100.0, 1200.0) and trace.end_s == pytest.approx(1990.0)
    again = recorded_trace(workload, chat=2.0, seed=7, pulses=pulses)
    assert again == trace != recorded_trace(workload, chat=2.0, seed=8, pulses=pulses)


def test_without_pulses_the_pulse_phase_is_empty_and_the_hold_is_the_whole_file() -> None:
    trace = recorded_trace(rows([0.0, 5.0, 30.0]), chat=1.0, seed=1)
    assert trace.phase_bounds() == {"base": (0.0, 0.0), "pulse": (0.0, 0.0), "hold": (0.0, 30.0)}
    assert {c.phase for c in trace.calls} == {"base"}


def test_call_ids_and_prompt_token_ids_follow_the_file_and_its_shared_prefix() -> None:
    workload = parse_workload(OWN_CSV, "own.csv")
    trace = recorded_trace(workload, chat=1.0, seed=3, pulses=[Pulse(0.5, 20.0, 1.0)])
    named = [c for c in trace.calls if c.phase == "base"]
    assert [c.call_id for c in named] == ["a", "b", "c"]
    assert all(c.call_id.startswith("call-3-") for c in trace.calls if c.phase == "pulse")
    assert trace.spec.shared_prefix_tokens == 1000
    ids = [trace.prompt_token_ids(c.index) for c in trace.calls[:3]]
    assert [len(i) for i in ids] == [c.prompt_tokens for c in trace.calls[:3]]
    assert ids[0][:1000] == ids[1][:1000] == ids[2][:1000] and ids[0][1000:1100] != ids[1][1000:1100]
    assert np.all((np.array(ids[0]) >= 100) & (np.array(ids[0]) < 30_000))


def test_a_given_call_id_that_a_generated_one_would_repeat_is_refused() -> None:
    text = "arrival_s,prompt_tokens,output_tokens,call_id\n0,10,2,\n1,10,2,call-1-000000\n"
    with pytest.raises(ValueError, match="line 3: call_id 'call-1-000000' is the id generated for call 0"):
        recorded_trace(parse_workload(text, "f"), chat=1.0, seed=1)
