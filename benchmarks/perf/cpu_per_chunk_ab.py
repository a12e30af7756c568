"""CPU per streamed chunk of nginx and of the proxy from one or more source trees, interleaved.

A change to the proxy's per-chunk path is judged against the code before it on a machine whose load
moves from minute to minute: every tree's proxy and nginx run side by side in front of one stub upstream,
and each repeat takes them in turn (in reverse order every other repeat), on the overhead benchmark's
long streams (50 streams of 1,000 chunks, 10 ms apart). Each line splits the CPU into user and system
time (from /proc, in 10 ms ticks), which tells the proxy's own work from the kernel's.

    PYTHONPATH=src:. python3 benchmarks/perf/cpu_per_chunk_ab.py 4 before=/tmp/old/src after=src

(`before`'s tree from `git archive <commit> src | tar -x -C /tmp/old`; a tree's compiled per-chunk path is
used where it was built in that tree, `python setup.py build_ext --inplace`.) A tree given as `PATH#python`
runs the per-chunk path in Python (RETRYBENCH_PYTHON_RELAY=1), so one tree's two paths compare side by side:

    PYTHONPATH=src:. python3 benchmarks/perf/cpu_per_chunk_ab.py 4 python=src#python compiled=src

Not collected by pytest: run it by hand.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from fixtures.nginx_front import nginx_binary, nginx_command, nginx_conf
from overhead import Route, _tree, measure

from retrybench.serving.launch import ServerProcess, free_port

LONG_STREAMS = {"streams": 50, "duration_s": 10.0, "tokens": 1000, "interval_ms": 10.0, "requests": 50}
REPO = Path(__file__).resolve().parents[2]


def user_sys_s(pid: int) -> tuple[float, float]:
    """utime and stime of `pid` and its children, in seconds."""
    user = system = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    return user / 100, system / 100


def _proxy_env(tree: str) -> dict[str, str]:
    """The proxy's environment for a tree given as PATH or PATH#python."""
    path, _, variant = tree.partition("#")
    if variant not in ("", "python"):
        raise SystemExit(f"{tree}: after '#' only 'python' is known")
    env = {"PYTHONPATH": str(Path(path).resolve())}
    return env | {"RETRYBENCH_PYTHON_RELAY": "1"} if variant else env


def main(repeats: int, trees: dict[str, str]) -> None:
    nginx = nginx_binary()
    if nginx is None:
        raise SystemExit("nginx is not installed (apt-get install nginx-light): it is the reference")
    work = Path(tempfile.mkdtemp(prefix="cpu-ab-"))
    with ExitStack() as stack:
        up = free_port()
        stack.enter_context(ServerProcess(
            [sys.executable, "-m", "fixtures.stub_upstream", "--port", str(up)],
            health_url=f"http://127.0.0.1:{up}/health", log_path=work / "stub.log",
            env={"PYTHONPATH": f"{REPO / 'src'}:{REPO}"}))
        port = free_port()
        process = stack.enter_context(ServerProcess(
            nginx_command(nginx, nginx_conf(work, port, [up])), health_url=f"http://127.0.0.1:{port}/health",
            log_path=work / "nginx.log"))
        found = [Route("nginx", f"http://127.0.0.1:{port}", process.pid)]
        for name, src in trees.items():
            port = free_port()
            process = stack.enter_context(ServerProcess(
                [sys.executable, "-m", "retrybench", "proxy", "--engine", f"http://127.0.0.1:{up}", "--port",
                 str(port), "--condition", "retries-on-cancel-on"], env=_proxy_env(src),
                health_url=f"http://127.0.0.1:{port}/health", log_path=work / f"{name}.log"))
            found.append(Route(name, f"http://127.0.0.1:{port}", process.pid))
        figures: dict[str, list[float]] = {route.name: [] for route in found}
        for repeat in range(repeats):
            for route in found if repeat % 2 == 0 else found[::-1]:
                assert route.pid is not None
                user0, sys0 = user_sys_s(route.pid)
                stats = measure(route, **LONG_STREAMS)  # type: ignore[arg-type]
                user1, sys1 = user_sys_s(route.pid)
                per_chunk = 1e6 * stats.cpu_s / stats.chunks
                figures[route.name].append(per_chunk)
                print(f"repeat {repeat + 1} {route.name:<10} {per_chunk:7.2f} us/chunk (user "
                      f"{1e6 * (user1 - user0) / stats.chunks:5.1f}, system {1e6 * (sys1 - sys0) / stats.chunks:5.1f})",
                      flush=True)
    reference = statistics.median(figures["nginx"])
    for name, values in figures.items():
        ratios = [round(v / n, 2) for v, n in zip(values, figures["nginx"], strict=True)]
        print(f"{name:<10} median {statistics.median(values):6.2f} us/chunk, "
              f"{statistics.median(values) / reference:.3f}x nginx's (per repeat {ratios})")


if __name__ == "__main__":
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        raise SystemExit(__doc__)
    main(int(sys.argv[1]), dict(arg.split("=", 1) for arg in sys.argv[2:]))
