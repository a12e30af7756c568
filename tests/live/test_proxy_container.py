"""The proxy as a container: its spec as data, and the proxy image in front of an engine on a Docker network.

The docker case starts two containers of the proxy image on one network: the simulated engine server
(the image holds all of retrybench, so its entrypoint is replaced) and the proxy in front of it,
reached by the engine's alias. The load generator on the host replays a short trace through the
proxy's published port; once the proxy is stopped (SIGTERM, as `docker stop` sends), its decision
log, written to a mounted folder, accounts for every call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.containers import image_skip_reason, suite_image

from retrybench.conditions.config import ClientPolicy, WorkloadSpec
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, run_load
from retrybench.proxy.eventlog import PROXY_LOG, read_event_log
from retrybench.proxy.proxy_container import proxy_container_spec
from retrybench.serving.aio import run_event_loop
from retrybench.serving.containers import ContainerSpec, ServiceContainer, docker_network
from retrybench.traffic.workload import Call, Trace


def test_the_proxy_command_names_upstream_policy_clock_and_log(tmp_path: Path) -> None:
    spec = proxy_container_spec(image="retrybench/proxy:x", upstream="http://vllm:8000", policy="coalescing",
                                log_dir=tmp_path, time_scale=0.1, cpus=frozenset({1}))
    assert spec.command == ("--engine", "http://vllm:8000", "--condition", "coalescing", "--log",
                            f"/logs/{PROXY_LOG}", "--time-scale", "0.1")
    assert spec.volumes == ((str(tmp_path), "/logs", "rw"),) and spec.alias == "proxy"
    assert spec.create_kwargs() == {"cpuset_cpus": "1"}  # no GPU request, no host IPC


def test_a_policy_file_is_mounted_read_only(tmp_path: Path) -> None:
    policy = tmp_path / "mine.toml"
    policy.write_text("[proxy]\n")
    spec = proxy_container_spec(image="i", upstream="http://e:8000", policy=str(policy), log_dir=tmp_path)
    assert (str(policy), "/etc/retrybench/mine.toml", "ro") in spec.volumes
    assert spec.command[spec.command.index("--condition") + 1] == "/etc/retrybench/mine.toml"
    with pytest.raises(FileNotFoundError, match=r"absent\.toml"):
        proxy_container_spec(image="i", upstream="u", policy=str(tmp_path / "absent.toml"), log_dir=tmp_path)


def test_a_spec_can_replace_the_entrypoint_and_pin_cpus() -> None:
    spec = ContainerSpec(image="i", command=("--port", "8000"), gpus=False, ipc_mode=None, cpus=frozenset({3, 1}),
                         entrypoint=("/opt/venv/bin/retrybench", "engine-server"))
    assert spec.create_kwargs() == {"cpuset_cpus": "1,3", "entrypoint": ["/opt/venv/bin/retrybench", "engine-server"]}


@pytest.fixture
def proxy_image() -> Iterator[str]:
    if (reason := image_skip_reason("proxy")) is not None:
        pytest.skip(f"proxy container: {reason}")
    yield suite_image("proxy")


def _trace(n: int) -> Trace:
    calls = tuple(Call(index=i, call_id=f"container-{i}", arrival_s=0.5 * i, prompt_tokens=120, response_tokens=8,
                       phase="base") for i in range(n))
    return Trace(spec=WorkloadSpec(chat_calls_per_s=1.0), seed=0, calls=calls)


@pytest.mark.docker
@pytest.mark.live
def test_the_proxy_image_serves_a_trace_in_front_of_an_engine_and_logs_every_call(proxy_image: str,
                                                                                 tmp_path: Path) -> None:
    engine = ContainerSpec(image=proxy_image, entrypoint=("/opt/venv/bin/retrybench", "engine-server"),
                           command=("--model", "tiny-llama", "--gpu", "cpu", "--host", "0.0.0.0", "--port", "8000"),
                           gpus=False, ipc_mode=None, alias="engine")
    proxy = proxy_container_spec(image=proxy_image, upstream="http://engine:8000", policy="coalescing",
                                 log_dir=tmp_path)
    client = ClientPolicy(max_retries=0, attempt_timeout_s=60.0)
    results: list[LoadResult] = []
    with docker_network() as network, \
            ServiceContainer(engine, log_path=tmp_path / "engine.log", network=network, start_timeout_s=120), \
            ServiceContainer(proxy, log_path=tmp_path / "proxy.log", network=network, start_timeout_s=120) as front:

        async def main() -> None:
            results.append(await run_load(_trace(6), LoadgenSettings(target=front.url, client=client)))

        run_event_loop(main)
    (result,) = results
    assert [c.delivered_s is not None for c in result.calls] == [True] * 6, [a.outcome for a in result.attempts]
    header, events = read_event_log(tmp_path / PROXY_LOG)  # flushed on SIGTERM, before the container went
    attempts = [e for e in events if e["ev"] == "attempt"]
    ends = [e.get("fate") for e in events if e["ev"] == "end"]
    assert len(attempts) == 6 and ends == ["completed"] * 6, f"{len(attempts)} attempts logged, ends {ends}"
    assert header["policy"]["coalescing"] is True and header["upstream"] == "http://engine:8000"
