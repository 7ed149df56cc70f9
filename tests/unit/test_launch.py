"""The package's server launcher (kinetic.server.launch) leaves nothing behind in the temporary folder."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from kinetic.server.launch import KineticServer


def test_a_servers_log_is_kept_while_its_object_lives_and_removed_with_it() -> None:
    server = KineticServer("-m", "/nonexistent.gguf")
    server.log_path.write_text("shutdown lines a test reads after stop()")
    server.stop()  # never started: nothing to stop, and the log stays readable
    assert server.log() == "shutdown lines a test reads after stop()"
    path = server.log_path
    del server
    gc.collect()
    assert not path.exists()


def test_a_log_still_referenced_at_exit_is_removed_then() -> None:
    script = ("from kinetic.server.launch import KineticServer\n"
              "server = KineticServer()\n"
              "print(server.log_path)\n")
    path = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert path.endswith(".log") and "kinetic-serve-" in path
    assert not Path(path).exists()
