"""Containers of the live stack under testcontainers: a spec as plain data, and one context manager.

`ContainerSpec` is everything Docker is told about a container (image, command, environment,
mounts, port, GPU request, IPC mode, CPU set, network alias), so what a container gets is checked
without Docker. `ServiceContainer` is the only part that talks to Docker: it starts the spec,
waits for its health path to answer 200 (giving up at once if the container exits), saves the
container's log before it removes the container, whatever happened, and removes it.
`docker_network` gives containers one network on which they reach each other by alias (the proxy
container reaches the vLLM container as http://vllm:8000).

vLLM's container spec is `realvllm.vllm.container_spec_for`; the proxy's is `proxy.proxy_container`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from docker.types import DeviceRequest

__all__ = ["CONTAINER_PORT", "ContainerSpec", "CreateOptions", "ServiceContainer", "docker_network", "require_image"]

CONTAINER_PORT = 8000  # what both images serve on (vLLM's default; the proxy image's entrypoint)


class CreateOptions(TypedDict, total=False):
    """docker-py `containers.create` arguments beyond image, command, env, ports, volumes and network."""

    ipc_mode: str
    device_requests: list[DeviceRequest]
    cpuset_cpus: str
    entrypoint: list[str]


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """Everything Docker is told about a container, as plain data. `volumes` are (host path,
    container path, "ro" | "rw"); `gpus` asks for every GPU (`--gpus all`); `cpus` pins the
    container to those host CPUs (docker's --cpuset-cpus); `alias` is its name on the network
    it joins."""

    image: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    volumes: tuple[tuple[str, str, str], ...] = ()
    ports: tuple[int, ...] = (CONTAINER_PORT,)
    health_path: str = "/health"
    ipc_mode: str | None = "host"  # vLLM: PyTorch shares tensors between processes through /dev/shm
    gpus: bool = True
    cpus: frozenset[int] | None = None
    alias: str | None = None
    entrypoint: tuple[str, ...] | None = None  # None: the image's own

    def create_kwargs(self) -> CreateOptions:
        kwargs: CreateOptions = {} if self.ipc_mode is None else {"ipc_mode": self.ipc_mode}
        if self.gpus:
            from docker.types import DeviceRequest

            # A LIST of requests: docker-py rejects a bare DeviceRequest (testcontainers' own Ollama
            # module once passed one).
            kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if self.cpus is not None:
            kwargs["cpuset_cpus"] = ",".join(str(cpu) for cpu in sorted(self.cpus))
        if self.entrypoint is not None:
            kwargs["entrypoint"] = list(self.entrypoint)
        return kwargs


def require_image(tag: str, build: str) -> None:
    """Raise, naming the command that builds it, unless the local Docker engine has image `tag`: no
    registry is asked (a missing image would otherwise become a failed pull from Docker Hub)."""
    import docker
    import docker.errors

    client = docker.from_env()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise FileNotFoundError(f"no image {tag} in the local Docker engine: build it with {build}") from None
    finally:
        client.close()


@contextmanager
def docker_network() -> Iterator[Any]:
    """A Docker network (testcontainers' `Network`) for the `with` block, removed after it."""
    from testcontainers.core.network import Network

    with Network() as network:
        yield network


class ServiceContainer:
    """`spec` running under testcontainers inside the `with` block: ready when its /health answers 200,
    stopped with SIGTERM (SIGKILL after `stop_timeout_s`), its log (stdout and stderr, interleaved)
    written to `log_path` when it stops or fails to start, and the container removed after,
    whatever happened.

    `reaper`: whether testcontainers' Ryuk reaper (which removes containers of a crashed session)
    runs; by default only when its image is already local, since starting it would otherwise pull
    from a registry."""

    def __init__(self, spec: ContainerSpec, *, log_path: Path, start_timeout_s: float = 900.0,
                 reaper: bool | None = None, network: Any = None, stop_timeout_s: float = 20.0) -> None:
        self.spec = spec
        self.stop_timeout_s = stop_timeout_s
        self.network = network  # a `docker_network()`, joined under `spec.alias`
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.reaper = reaper
        self._container: Any = None  # testcontainers' DockerContainer, imported lazily
        self.container_id: str | None = None
        self.url = ""

    def __enter__(self) -> ServiceContainer:
        from testcontainers.core.config import testcontainers_config
        from testcontainers.core.container import DockerContainer

        container = DockerContainer(self.spec.image, env=dict(self.spec.env), ports=list(self.spec.ports),
                                    volumes=list(self.spec.volumes), **self.spec.create_kwargs())
        container.with_command(list(self.spec.command))  # a list: no shell splitting of arguments
        if self.network is not None:
            container.with_network(self.network)
            if self.spec.alias is not None:
                container.with_network_aliases(self.spec.alias)
        reaper = self.reaper if self.reaper is not None else _image_present(container, testcontainers_config.ryuk_image)
        testcontainers_config.ryuk_disabled = not reaper  # read by start(); there is no per-container switch
        container.waiting_for(_health_wait(self.spec.ports[0], self.spec.health_path, self.start_timeout_s))
        self._container = container
        try:
            container.start()
            self.container_id = container.get_container_id()
            host = container.get_container_host_ip()
            self.url = f"http://{host}:{container.get_exposed_port(self.spec.ports[0])}"
        except Exception as error:
            status = self._exit_status()
            self._stop()
            if status is not None:
                tail = "\n".join(self.log_text().splitlines()[-40:])
                raise RuntimeError(f"{self.spec.image} exited with status {status} before {self.spec.health_path} "
                                   f"answered; last lines of {self.log_path}:\n{tail}") from error
            raise
        except BaseException:
            self._stop()
            raise
        return self

    def _exit_status(self) -> int | None:
        """The container's exit code if it has exited, else None."""
        wrapped = getattr(self._container, "_container", None)
        if wrapped is None:
            return None
        try:
            wrapped.reload()
        except Exception:  # gone already, or the engine stopped answering: nothing more to say
            return None
        state = wrapped.attrs.get("State", {})
        return int(state.get("ExitCode", 0)) if state.get("Status") in ("exited", "dead") else None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _stop(self) -> None:
        container, self._container = self._container, None
        if container is None:
            return
        wrapped = getattr(container, "_container", None)  # None when create() failed
        try:
            if wrapped is not None:
                self.container_id = wrapped.id
                # SIGTERM first, so that the service ends as it would under `docker stop` (the proxy
                # flushes its decision log); SIGKILL after stop_timeout_s.
                with contextlib.suppress(Exception):
                    wrapped.stop(timeout=max(1, round(self.stop_timeout_s)))
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self.log_path.write_bytes(wrapped.logs(stdout=True, stderr=True))
        finally:
            container.stop()  # removes the container (force) and its anonymous volumes


def _image_present(container: Any, image: str) -> bool:
    return bool(container.get_docker_client().client.images.list(name=image))


def _health_wait(port: int, path: str, timeout_s: float) -> Any:
    """testcontainers' HTTP wait for `path` to answer 200, that also gives up at once when the
    container exits (vLLM failing to load a model would otherwise hold the wait for its whole timeout)."""
    from testcontainers.core.wait_strategies import HttpWaitStrategy

    class HealthWait(HttpWaitStrategy):
        target: Any = None

        def wait_until_ready(self, container: Any) -> None:
            self.target = container
            super().wait_until_ready(container)

        # Hooks a private method of testcontainers 4.x; were it renamed, this would only lose the
        # early exit.
        def _try_http_request(self, url: str, headers: dict[str, str], ssl_context: Any) -> bool:
            if self.target is not None:
                self.target.reload()
                if self.target.status in ("exited", "dead"):
                    raise RuntimeError(f"the container exited before {path} answered (status {self.target.status})")
            return bool(super()._try_http_request(url, headers, ssl_context))

    return HealthWait(port, path).for_status_code(200).with_startup_timeout(int(timeout_s))

