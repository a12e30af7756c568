"""The vLLM container: its spec as data (no Docker), a real vLLM in the CPU image, and two failures.

The real case starts the image `scripts/build_image.py vllm` builds, serving the tiny model with the
tracing plugin from the mounted source: its log holds vLLM's own start-up lines and the served
model, and the container is gone afterwards. Where a test needs an image that misbehaves (exits
before serving, never answers), the stand-in (scripts/build-test-image.sh, retrybench/fake-vllm:test)
stands in: `vllm serve` as its entrypoint, its arguments printed, /health served by busybox.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.containers import docker_skip_reason, image_present, image_skip_reason, suite_image

from retrybench.plan.spec import RunSpec
from retrybench.realvllm.tinymodel import make_tiny_model
from retrybench.realvllm.vllm import (
    CONTAINER_HF_CACHE,
    TRACING_SCHEDULER,
    VllmArgs,
    container_spec_for,
    cpu_env,
    for_cpu,
    vllm_args_for,
)
from retrybench.realvllm.vllm_locate import DEFAULT_IMAGE, vllm_image
from retrybench.serving.containers import ContainerSpec, ServiceContainer

TEST_IMAGE = "retrybench/fake-vllm:test"


def args(condition: str = "engine-cap-100", trace: bool = False, model: str | None = None) -> Any:
    return vllm_args_for(RunSpec(model="qwen2.5-7b-instruct", condition=condition, seed=0, trace=trace), model=model)


def spec_for(tmp_path: Path, **kwargs: Any) -> ContainerSpec:
    options: dict[str, Any] = {"results_dir": tmp_path / "results", "hf_cache": tmp_path / "hf",
                               "src": tmp_path / "src", **kwargs}
    return container_spec_for(options.pop("vllm_args", args()), **options)


def test_command_is_the_engine_arguments_on_port_8000(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    assert spec.image == DEFAULT_IMAGE and spec.ports == (8000,) and spec.health_path == "/health"
    assert spec.command[0] == "Qwen/Qwen2.5-7B-Instruct"  # the entrypoint is `vllm serve`
    assert list(spec.command) == [*args().argv()[:-4], "--host", "0.0.0.0", "--port", "8000"]
    assert "--max-num-queued-reqs" in spec.command


def test_gpu_device_requests_are_a_list_and_ipc_is_host(tmp_path: Path) -> None:
    from docker.types import DeviceRequest

    kwargs = spec_for(tmp_path).create_kwargs()
    assert kwargs["ipc_mode"] == "host"
    requests = kwargs["device_requests"]
    assert isinstance(requests, list) and len(requests) == 1 and isinstance(requests[0], DeviceRequest)
    assert requests[0]["Count"] == -1 and requests[0]["Capabilities"] == [["gpu"]]
    assert spec_for(tmp_path, gpus=False).create_kwargs() == {"ipc_mode": "host"}


def test_hugging_face_cache_and_results_are_mounted(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    assert spec.volumes == ((str(tmp_path / "hf"), CONTAINER_HF_CACHE, "rw"),
                            (str(tmp_path / "results"), "/results", "rw"))
    assert spec.env == {}


def test_tracing_mounts_the_source_on_pythonpath(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, vllm_args=args(trace=True))
    assert (str(tmp_path / "src"), "/opt/retrybench/src", "ro") in spec.volumes
    assert spec.env == {"PYTHONPATH": "/opt/retrybench/src", "RETRYBENCH_VLLM_TRACE": "/results/vllm-trace.jsonl"}
    i = spec.command.index("--scheduler-cls")
    assert spec.command[i + 1] == "retrybench.realvllm.vllm_trace.TracingAsyncScheduler"


def test_a_local_model_directory_is_mounted_read_only(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    spec = spec_for(tmp_path, vllm_args=args(model=str(model)), env={"X": "1"})
    assert (str(model), "/models/tiny", "ro") in spec.volumes and spec.command[0] == "/models/tiny"
    assert spec.env == {"X": "1"}
    with pytest.raises(FileNotFoundError):
        spec_for(tmp_path, vllm_args=args(model=str(tmp_path / "absent")))


def test_image_is_configurable() -> None:
    assert vllm_image({}) == DEFAULT_IMAGE
    assert vllm_image({"RETRYBENCH_VLLM_IMAGE": "vllm/vllm-openai:v0.34.0"}) == "vllm/vllm-openai:v0.34.0"


@pytest.fixture(scope="module")
def docker_client() -> Iterator[Any]:
    if (reason := docker_skip_reason()) is not None:
        pytest.skip(reason)
    if not image_present(TEST_IMAGE):
        pytest.skip(f"the stand-in image {TEST_IMAGE} is not in the local engine: run scripts/build-test-image.sh")
    import docker

    client = docker.from_env(timeout=5)
    try:
        yield client
    finally:
        client.close()


def removed(client: Any, container_id: str | None) -> bool:
    import docker.errors

    assert container_id is not None
    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


@pytest.mark.docker
def test_a_real_vllm_container_serves_the_tiny_model_traced_and_is_removed_with_its_log(tmp_path: Path) -> None:
    if (reason := image_skip_reason("vllm")) is not None:
        pytest.skip(f"vLLM container: {reason}")
    model = make_tiny_model(tmp_path / "tiny-llama")
    spec = container_spec_for(for_cpu(VllmArgs(model=str(model), scheduler_cls=TRACING_SCHEDULER)),
                              results_dir=tmp_path / "results", image=suite_image("vllm"), gpus=False, env=cpu_env())
    log = tmp_path / "container.log"
    with ServiceContainer(spec, log_path=log, start_timeout_s=300) as container:
        with urllib.request.urlopen(container.url + "/v1/models", timeout=30) as response:
            served = [m["id"] for m in json.load(response)["data"]]
        ipc = subprocess.run(["docker", "inspect", "--format", "{{.HostConfig.IpcMode}}",
                              str(container.container_id)], capture_output=True, text=True, check=True).stdout.strip()
    assert served == ["retrybench"] and ipc == "host"
    gone = subprocess.run(["docker", "inspect", str(container.container_id)], capture_output=True, check=False)
    assert gone.returncode != 0, f"container {container.container_id} is still there"
    text = log.read_text()
    assert "non-default args" in text and "'served_model_name': ['retrybench']" in text, text[-2000:]
    assert "scheduler_cls': 'retrybench.realvllm.vllm_trace.TracingScheduler'" in text
    assert "Application startup complete" in text
    header = json.loads((tmp_path / "results" / "vllm-trace.jsonl").read_text().splitlines()[0])
    assert header["engine"] == "vllm" and header["scheduler"] == "TracingScheduler"


@pytest.mark.docker
def test_a_container_that_exits_fails_at_once_and_keeps_its_log(docker_client: Any, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, image=TEST_IMAGE, gpus=False, env={"FAKE_VLLM_EXIT": "3"})
    container = ServiceContainer(spec, log_path=tmp_path / "container.log", start_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"), container:
        pass
    assert time.monotonic() - started < 20  # not the whole start timeout
    assert "exiting with status 3" in (tmp_path / "container.log").read_text()
    assert removed(docker_client, container.container_id)


@pytest.mark.docker
def test_a_container_that_never_answers_times_out_and_is_removed(docker_client: Any, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, image=TEST_IMAGE, gpus=False, env={"FAKE_VLLM_DELAY_S": "600"})
    container = ServiceContainer(spec, log_path=tmp_path / "container.log", start_timeout_s=2)
    with pytest.raises(TimeoutError, match="/health"), container:
        pass
    assert "fake-vllm argv: serve" in (tmp_path / "container.log").read_text()
    assert removed(docker_client, container.container_id)
