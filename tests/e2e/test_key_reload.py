"""The instructor adds a student to the key file and sends SIGHUP: the new key works at once, and a
stream that was open meanwhile finishes (POSIX only: Windows has no SIGHUP)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.server import KineticServer

pytestmark = pytest.mark.e2e


def chat(url: str, key: str) -> int:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no SIGHUP; a restart rereads the key file")
def test_sighup_rereads_the_key_file_without_dropping_streams(model_lock: None, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-anna anna\n", encoding="utf-8")
    with KineticServer("-c", "2048", "-np", "2", "--api-key-file", str(keys)) as server:
        assert chat(server.url, "sk-bruno") == 401
        chunks: list[str] = []

        def stream() -> None:
            body = {"prompt": "Once", "n_predict": 120, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", server.url + "/completion", json=body, timeout=120,
                              headers={"Authorization": "Bearer sk-anna"}) as response:
                chunks.extend(line for line in response.iter_lines() if line.startswith("data: "))

        reader = threading.Thread(target=stream)
        reader.start()
        keys.write_text("sk-anna anna\nsk-bruno bruno\n", encoding="utf-8")
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        deadline = 50
        while chat(server.url, "sk-bruno") != 200 and deadline:
            deadline -= 1
            threading.Event().wait(0.1)
        assert chat(server.url, "sk-bruno") == 200 and chat(server.url, "sk-anna") == 200
        reader.join(timeout=120)
        assert len(chunks) == 121 and json.loads(chunks[-1][6:])["stop"] is True  # the stream was not dropped
        keys.write_text("sk-bruno bruno\n", encoding="utf-8")  # anna's key revoked
        server.proc.send_signal(signal.SIGHUP)
        deadline = 50
        while chat(server.url, "sk-anna") != 401 and deadline:
            deadline -= 1
            threading.Event().wait(0.1)
        assert chat(server.url, "sk-anna") == 401 and "reloaded the keys" in server.log()
