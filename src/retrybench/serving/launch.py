"""Start live-stack servers as subprocesses and always take them down again.

A server in its own process has its own event loop and GIL, as vLLM and a proxy do in a real
deployment, so an experiment measures the network path rather than one loop's contention.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["ServerProcess", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (another process may take it before it is bound: retry on failure)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM when the parent dies, even by SIGKILL, so a
    crashed test run leaves no server behind. Elsewhere the context manager's cleanup has to do."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_setup(cpus: frozenset[int] | None) -> Callable[[], None]:
    """The child's setup before exec: die with the parent and, given `cpus`, run on those CPUs only
    (every process and thread it starts inherits them)."""
    def setup() -> None:
        _die_with_parent()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return setup


class ServerProcess:
    """A server subprocess that is ready (its health URL answers 200) inside the `with` block and
    gone after it, whatever happened. `env` adds to (and overrides) this process's environment;
    `cpus` pins the server to those CPUs (default: this process's own affinity). `stop_signal` is what
    stops it at the end (SIGINT stops the proxy at once, where SIGTERM would let it drain first)."""

    def __init__(self, argv: list[str], *, health_url: str, log_path: Path, start_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None, cpus: frozenset[int] | None = None,
                 stop_signal: signal.Signals = signal.SIGTERM) -> None:
        self.argv = argv
        self.stop_signal = stop_signal
        self.health_url = health_url
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.env = env
        self.cpus = cpus
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the server is not started")
        return self._process.pid

    def wait(self, timeout_s: float) -> int | None:
        """The exit status once the process has exited, or None if it still runs after `timeout_s`."""
        if self._process is None:
            raise RuntimeError("the server is not started")
        try:
            return self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        env = None if self.env is None else {**os.environ, **self.env}
        self._process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=_child_setup(self.cpus))
        try:
            self._wait_ready()
        except BaseException:
            self._shutdown()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = self._process.poll()
            if code is not None:
                raise RuntimeError(f"{self.argv[:4]} exited with status {code} before it was ready; "
                                   f"last lines of {self.log_path}:\n{self._tail()}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.health_url} did not answer 200 within {self.start_timeout_s} s; "
                                   f"last lines of {self.log_path}:\n{self._tail()}")
            time.sleep(0.05)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        """The stop signal (the server flushes its logs), then SIGKILL after 5 s."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(self.stop_signal)
            try:
                process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
