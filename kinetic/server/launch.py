"""Starting a real `kinetic serve` process and waiting for it: free port, readiness poll, clean stop.

Used by the tests, the benchmarks (`bench/`) and operator scripts, so it lives in the package and
needs nothing but httpx. Whoever starts a model should hold MODEL_LOCK_PATH (a file lock) for as
long as it runs: llama.cpp's threads spin, and two models decoding at once on a small machine crawl.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

STARTUP_TIMEOUT_S = 120
# Several pytest sessions (developers working side by side) must never decode at the same time:
# llama.cpp's threads spin, and two concurrent decodes on two cores crawl at ~1 token/s.
MODEL_LOCK_PATH = Path(tempfile.gettempdir()) / "kinetic-tests-model.lock"
# How often a starting server is asked whether it is up: a poll is a refused connect or a 503 from /health over one
# client (cheap for both sides), and the suite starts some 150 servers, each noticed 0.1 s late on average at 0.2 s.
HEALTH_POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(proc: subprocess.Popen[Any], url: str, timeout_s: float) -> str | None:
    """Polls `url`/health until it answers 200 (None), or says why it never will: the process exited
    (with its code), or the time ran out. Works for llama-server as well (the benchmarks')."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2) as client:  # one client: a new one loads the CA bundle, ~20 ms of CPU each poll
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"exited with {proc.returncode}"
            try:
                if client.get(url + "/health").status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
    return f"did not become healthy in {timeout_s:.0f}s"


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a graceful shutdown), then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class KineticServer:
    """One `kinetic serve` subprocess on the bundled model (or the model its args name)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="kinetic-serve-", suffix=".log")[1])
        # Read after the server stops (its shutdown lines), so it goes with this object, or at exit: a suite starts
        # some 150 servers, and each run left their logs in the temporary folder.
        weakref.finalize(self, self.log_path.unlink, missing_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KineticServer:
        command = [sys.executable, "-m", "kinetic", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                   *self.args]
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=self.env)
        failure = wait_until_healthy(self.proc, self.url, STARTUP_TIMEOUT_S)
        if failure is not None:
            self.stop()
            raise RuntimeError(f"kinetic serve {failure}:\n{self.log()}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def __enter__(self) -> KineticServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def model_lock(path: Path = MODEL_LOCK_PATH) -> Iterator[None]:
    """Holds the machine-wide model lock (tests, benchmarks, a manual serve) for the block."""
    from filelock import FileLock  # the serve extra's: only whoever starts a model needs it

    with FileLock(str(path)):
        yield
