"""The proxy as a container, as it would be deployed: its spec as data, and a launcher for live runs.

The image is the one `scripts/build_image.py proxy` builds (realvllm.images): `retrybench proxy` on
0.0.0.0:8000. `proxy_container_spec` adds the upstream, the condition (a name, or a policy TOML
mounted read-only), the clocks' time scale and the decision log, written to a mounted folder.
`ContainerProxies` starts one such container per live run (`run_live(..., proxy=...)`) on the
network the vLLM container is on, reaching the engine by its alias rather than by the URL the
host uses for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from retrybench.proxy.eventlog import PROXY_LOG
from retrybench.serving.containers import ContainerSpec, ServiceContainer

__all__ = ["CONTAINER_LOGS", "CONTAINER_POLICY", "ContainerProxies", "proxy_container_spec"]

CONTAINER_LOGS = "/logs"
CONTAINER_POLICY = "/etc/retrybench"


def proxy_container_spec(*, image: str, upstream: str, policy: str, log_dir: Path, time_scale: float = 1.0,
                         extra: tuple[str, ...] = (), cpus: frozenset[int] | None = None,
                         alias: str = "proxy") -> ContainerSpec:
    """The proxy container in front of `upstream` (a URL the container can reach) under `policy`: a
    Table 1 condition's name, or the path of a policy TOML on the host (mounted read-only). Its
    decision log goes to `log_dir / PROXY_LOG`; `extra` are more `retrybench proxy` options."""
    volumes = [(str(log_dir), CONTAINER_LOGS, "rw")]
    policy_arg = policy
    if policy.endswith(".toml"):
        path = Path(policy).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no policy file {path}")
        policy_arg = str(PurePosixPath(CONTAINER_POLICY) / path.name)
        volumes.append((str(path), policy_arg, "ro"))
    command = ("--engine", upstream, "--condition", policy_arg, "--log", str(PurePosixPath(CONTAINER_LOGS) / PROXY_LOG),
               "--time-scale", repr(time_scale), *extra)
    return ContainerSpec(image=image, command=command, volumes=tuple(volumes), ipc_mode=None, gpus=False, cpus=cpus,
                         alias=alias)


@dataclass(frozen=True, kw_only=True)
class ContainerProxies:
    """A `ProxyLauncher` (loadgen.run) that starts the proxy image for each run, on `network`, in
    front of `upstream` (the engine's address on that network, e.g. http://vllm:8000)."""

    image: str
    network: Any  # a serving.containers.docker_network()
    upstream: str
    cpus: frozenset[int] | None = None
    start_timeout_s: float = 120.0

    @contextmanager
    def __call__(self, *, engine_url: str, policy: str, time_scale: float, workdir: Path) -> Iterator[str]:
        """`engine_url` is the host's address of the engine; the container uses `upstream` instead."""
        spec = proxy_container_spec(image=self.image, upstream=self.upstream, policy=policy, log_dir=workdir,
                                    time_scale=time_scale, cpus=self.cpus)
        with ServiceContainer(spec, log_path=workdir / "proxy.log", network=self.network,
                              start_timeout_s=self.start_timeout_s) as container:
            yield container.url
