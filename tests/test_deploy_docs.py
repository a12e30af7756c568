"""docs/deploy-proxy.md's examples fit the proxy they deploy.

The Kubernetes manifest (docs/examples/proxy-k8s.yaml): its probes ask routes the proxy serves
(readiness `/ready`, liveness `/health`) on the port the image listens on, its configuration loads,
and the grace period outlasts the preStop hook and the drain timeout together, so SIGKILL cannot cut
a drain short. The `docker run` line: the proxy image, the port published, a stop timeout above the
drain timeout, and arguments the proxy accepts.
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from retrybench.cli.main import main
from retrybench.conditions.config import load_condition
from retrybench.proxy.proxy_server import ProxyServer, ProxySettings
from retrybench.realvllm.images import recipe_for

yaml = pytest.importorskip("yaml", reason="PyYAML reads the Kubernetes manifest")

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "docs" / "examples" / "proxy-k8s.yaml"
GUIDE = REPO / "docs" / "deploy-proxy.md"
EXAMPLE = REPO / "docs" / "examples" / "proxy.toml"


def manifests() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def proxy_routes() -> set[str]:
    """The paths the proxy answers GET on (its app's routes, as it builds them)."""
    server = ProxyServer(ProxySettings(upstream="http://127.0.0.1:9", policy=load_condition("no-control").proxy))
    return {route.resource.canonical for route in server.app().router.routes()
            if route.method == "GET" and route.resource is not None}


def image_port() -> int:
    """The port the proxy image listens on (its entrypoint's --port)."""
    entrypoint = list(recipe_for("proxy", REPO).entrypoint)
    return int(entrypoint[entrypoint.index("--port") + 1])


def drain_timeout_s(config_text: str) -> float:
    return float(tomllib.loads(config_text).get("drain_timeout", 30.0))


def test_the_probes_ask_the_proxys_routes_on_its_port() -> None:
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    routes = proxy_routes()
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (readiness["path"], liveness["path"]) == ("/ready", "/health")
    assert {readiness["path"], liveness["path"]} <= routes, routes
    port = image_port()
    assert readiness["port"] == liveness["port"] == port
    assert [p["containerPort"] for p in container["ports"]] == [port]
    service = manifests()["Service"]["spec"]
    assert [p["targetPort"] for p in service["ports"]] == [port]
    assert service["selector"] == manifests()["Deployment"]["spec"]["selector"]["matchLabels"]


def test_the_grace_period_outlasts_the_prestop_hook_and_the_drain() -> None:
    docs = manifests()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    drain = drain_timeout_s(docs["ConfigMap"]["data"]["proxy.toml"])
    assert pod["terminationGracePeriodSeconds"] > float(command[1]) + drain


def test_the_configuration_the_manifest_mounts_loads(tmp_path: Path) -> None:
    docs = manifests()
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    mount = container["volumeMounts"][0]["mountPath"]
    args = container["args"]
    config = args[args.index("--config") + 1]
    assert config == f"{mount}/proxy.toml"
    path = tmp_path / "proxy.toml"
    path.write_text(docs["ConfigMap"]["data"]["proxy.toml"])
    result = CliRunner().invoke(main, ["proxy", "--config", str(path), "--print-config"])
    assert result.exit_code == 0, result.output


def test_the_docker_run_line_publishes_the_port_and_outwaits_the_drain(tmp_path: Path) -> None:
    (line,) = [ln for ln in GUIDE.read_text().splitlines() if ln.startswith("docker run ")]
    words = shlex.split(line)
    image = next(w for w in words if w.startswith("retrybench/proxy"))
    args = words[words.index(image) + 1:]
    port = image_port()
    assert f"{port}:{port}" in words[words.index("-p") + 1]
    mounts = {}  # container path -> host path
    for i, word in enumerate(words[:words.index(image)]):
        if word == "-v":
            host, container = words[i + 1].split(":")[:2]
            mounts[container] = Path(host.replace("$PWD", str(REPO)))
    config = args[args.index("--config") + 1]
    assert mounts[config] == EXAMPLE
    assert float(words[words.index("--stop-timeout") + 1]) > drain_timeout_s(EXAMPLE.read_text())
    result = CliRunner().invoke(main, ["proxy", *args[:args.index("--config")], "--config", str(EXAMPLE),
                                       *args[args.index("--config") + 2:], "--print-config"])
    assert result.exit_code == 0, result.output
