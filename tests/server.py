"""The tests' server helper is the package's (kinetic.server.launch), shared with bench/ and scripts/, and
the one way tests wait for a server's state."""

from __future__ import annotations

import time
from collections.abc import Callable

from kinetic.server.launch import MODEL_LOCK_PATH, STARTUP_TIMEOUT_S, KineticServer, free_port

__all__ = ["DEFAULT_MODEL_ENV", "KEYED_SERVER_ARGS", "KEYED_SERVER_KEY", "MODEL_LOCK_PATH", "STARTUP_TIMEOUT_S",
           "KineticServer", "free_port", "wait_until"]

# What a server started with this environment serves when it names no model: kinetic's default, the bundled chat
# model (the suite's conftest makes the others serve the bundled Gemma).
DEFAULT_MODEL_ENV = {"KINETIC_BUNDLED": ""}

# The suite's one server with a single --api-key (the conftest's session fixture `keyed_server`), shared by the
# modules that test a keyed server as a student starts it (lab 04-02's key): auth, the clients, the labs.
KEYED_SERVER_KEY = "segreta123"
KEYED_SERVER_ARGS = ("-c", "1024", "-np", "1", "--api-key", KEYED_SERVER_KEY)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Polls the server's state; the deadline only stops a broken server from hanging the suite."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")
