"""A recorded workload replayed live: the load generator sends the file's calls (and a burst's) through the
proxy to a running engine, at their recorded times and with their lengths."""

from __future__ import annotations

from pathlib import Path

from fixtures.live import EngineFactory

from retrybench.loadgen.run import run_live
from retrybench.plan.recorded import workload_fields
from retrybench.plan.spec import RunSpec
from retrybench.traffic.recorded import Pulse

CHAT = 2.7116906833687042  # tests/sim/test_digests.py's C-hat of qwen2.5-7b-instruct
TRACE = """arrival_s,prompt_tokens,output_tokens,prefix_tokens,call_id
0.0,4000,20,2000,first
0.5,3000,10,2000,second
2.0,5000,5,2000,third
"""


def test_a_live_run_replays_the_file(engine_server_factory: EngineFactory, tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    fields = workload_fields(path, None, gpus=("h100",), pulses=[Pulse(1.0, 1.0, 2.0)])
    spec = RunSpec(model="qwen2.5-7b-instruct", condition="no-control", seed=1, **fields)
    engine = engine_server_factory(time_scale=0.05)
    live = run_live(spec, time_scale=0.05, workdir=tmp_path / "run", chat=CHAT, engine_url=engine.url)
    calls = live.load.calls
    times = (0.0, 0.5, 2.0)
    assert [(c.arrival_s, c.prompt_tokens, c.response_tokens) for c in calls if c.arrival_s in times] == [
        (0.0, 4000, 20), (0.5, 3000, 10), (2.0, 5000, 5)]
    assert len(calls) > 3 and all(1.0 <= c.arrival_s < 2.0 for c in calls if c.arrival_s not in times)
    assert all(c.delivered_s is not None for c in calls)
    assert (live.log.meta["pulse_start_s"], live.log.meta["pulse_end_s"], live.log.meta["hold_end_s"]) == (1.0, 2.0,
                                                                                                           2.0)
