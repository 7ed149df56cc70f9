"""A class record that cannot be written is never served silently (issue 46): the ledger, the saved chats
and the derived models on a small tmpfs that the test fills with a filler file. While it cannot be written,
a request that would generate gets a 503 in its protocol's own error body, naming the class record,
before any token is generated; no slot is left busy; /health (503) and the dashboard say why. Once
the filler is gone, the next request is served and its line is in the ledger. With
--ledger-best-effort the server serves anyway and /health says what goes unrecorded; and a restart
on a ledger whose last line a crash tore sets that line aside. A chat or a model saved on the full disk is a
507 naming it, and the copy saved before is kept whole.

EIO comes from a real disk that fails: a FUSE file system (tests/failing_disk.py, over libfuse 3: Debian's fuse3)
that passes every call through to a folder until it is told to fail, then answers every change with EIO, as a
dead disk does. The ledger and the saved chats on it: the same refusals as a full disk, and the same recovery.
Where FUSE cannot be mounted (no /dev/fuse, no fuse3) that test is skipped, saying which."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from kinetic.backends.bundled import gemma_model_path
from kinetic.classroom.ledger import LedgerRecord, read_ledger
from tests.failing_disk import FailingDisk, fuse_unavailable
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

ADMIN = "sk-teacher-disk"
STUDENT = "sk-ann-disk"


class Disk:
    """A 64 KiB tmpfs that holds the ledger, and a filler file that takes whatever room is left."""

    def __init__(self, root: Path):
        self.mount = root / "disk"
        self.mount.mkdir()
        self.ledger = self.mount / "ledger.jsonl"
        self.filler = self.mount / "filler"

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while os.write(fd, b"\0" * 1024):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC  # the disk is full
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()


def mount_tmpfs(disk: Disk) -> None:
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk.mount)],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root and mount): {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root and mount): {done.stderr.strip()}")


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Disk]:
    held = Disk(tmp_path_factory.mktemp("fulldisk"))
    mount_tmpfs(held)
    try:
        yield held
    finally:
        subprocess.run(["umount", "-l", str(held.mount)], check=False, timeout=30)


@pytest.fixture(scope="module")
def server(model_lock: None, disk: Disk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    keys = tmp_path_factory.mktemp("fulldisk-keys") / "keys.txt"  # off the small disk: it must stay readable
    keys.write_text(f"{STUDENT} ann\n", encoding="utf-8")
    with KineticServer("-c", "512", "-np", "1", "--api-key-file", str(keys), "--admin-key", ADMIN,
                       "--ledger", str(disk.ledger), "--metrics") as started:
        yield started


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=STUDENT, max_retries=0, timeout=60)


def chat(url: str) -> openai.types.chat.ChatCompletion:
    return oa(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)


def predicted(url: str) -> float:
    text = httpx.get(url + "/metrics", headers=auth(ADMIN), timeout=10).text
    counter = "llamacpp:tokens_predicted_total"
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(counter))


def slots_idle(url: str) -> bool:
    return not any(slot["is_processing"] for slot in httpx.get(url + "/slots", headers=auth(ADMIN), timeout=10).json())


def refused_everywhere(url: str) -> None:
    """Each protocol's 503, naming the class record, with no token generated and no slot left busy."""
    before = predicted(url)
    with pytest.raises(openai.APIStatusError) as oa_err:
        chat(url)
    assert oa_err.value.status_code == 503
    body: Any = oa_err.value.body
    assert "class record" in body["message"] and body["type"] == "unavailable_error"  # the SDK unwraps "error"
    assert int(oa_err.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.APIStatusError) as an_err:
        anthropic.Anthropic(base_url=url, api_key=STUDENT, max_retries=0, timeout=60).messages.create(
            model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert an_err.value.status_code == 503
    an_body: Any = an_err.value.body
    assert an_body["type"] == "error" and "class record" in an_body["error"]["message"]
    ollama = httpx.post(url + "/api/chat", headers=auth(STUDENT), timeout=60,
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert ollama.status_code == 503 and "class record" in ollama.json()["error"]
    native = httpx.post(url + "/completion", headers=auth(STUDENT), timeout=60, json={"prompt": "hi", "n_predict": 3})
    assert native.status_code == 503 and "class record" in native.json()["error"]["message"]
    assert predicted(url) == before  # refused before generating: not one token
    assert slots_idle(url)
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 503 and "ledger" in health.json()["error"]["message"]
    board = httpx.get(url + "/dashboard/stats", headers=auth(ADMIN), timeout=10).json()
    assert board["ledger"] not in (None, "ok") and str(board["ledger"]).startswith("cannot write the class record")


def served_and_recorded(url: str, ledger: Path) -> None:
    answer = chat(url)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.id in [r.id for r in read_ledger(ledger)]
    assert httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}  # llama-server's, exactly
    assert httpx.get(url + "/dashboard/stats", headers=auth(ADMIN), timeout=10).json()["ledger"] == "ok"


def test_a_full_disk_refuses_requests_until_space_returns(server: KineticServer, disk: Disk) -> None:
    served_and_recorded(server.url, disk.ledger)
    disk.fill()
    refused_everywhere(server.url)
    disk.free()
    served_and_recorded(server.url, disk.ledger)  # the very next request
    assert server.alive()
    assert all(line.endswith("}") for line in disk.ledger.read_text(encoding="utf-8").splitlines())


def test_a_torn_tail_is_set_aside_and_best_effort_serves_anyway(server: KineticServer, disk: Disk) -> None:
    server.stop()  # one model at a time: the same files, with the instructor's choice to serve anyway
    torn = '{"time":"2026-12-04T10:00:00.000Z","client":"ann","rou'  # as a crash mid-append leaves it
    with disk.ledger.open("a", encoding="utf-8") as handle:
        handle.write(torn)
    with KineticServer("-c", "512", "-np", "1", "--ledger", str(disk.ledger), "--ledger-best-effort") as relaxed:
        assert (disk.mount / "ledger.jsonl.torn").read_text(encoding="utf-8") == torn
        assert "torn line" in relaxed.log()
        lines = disk.ledger.read_text(encoding="utf-8").splitlines()
        assert lines and all(LedgerRecord.from_line(line) is not None for line in lines)
        disk.fill()
        try:
            assert chat(relaxed.url).choices  # served (its line only if the ledger's last page had room)
            health = httpx.get(relaxed.url + "/health", timeout=10)
            assert health.status_code == 200 and health.json()["status"] == "ok"
            assert health.json()["ledger"].startswith("cannot write the class record")
        finally:
            disk.free()
        answer = chat(relaxed.url)
        assert answer.id in [r.id for r in read_ledger(disk.ledger)]
        assert httpx.get(relaxed.url + "/health", timeout=10).json() == {"status": "ok"}
        assert "cannot write the class record" in relaxed.log()


def test_a_full_disk_refuses_a_save_with_a_507_and_keeps_the_saved_copy(server: KineticServer, disk: Disk,
                                                                         tmp_path: Path) -> None:
    """The saved chats and the derived models on the full disk (the ledger elsewhere): a save is a 507 naming
    what was not saved, the copy saved before reads back whole, generation goes on, and a save works once
    there is room."""
    server.stop()  # one model at a time
    models = disk.mount / "models"
    models.mkdir(exist_ok=True)
    (models / "m.gguf").unlink(missing_ok=True)
    (models / "m.gguf").symlink_to(gemma_model_path())
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{STUDENT} ann\n", encoding="utf-8")
    with KineticServer("-c", "512", "-np", "1", "--models-dir", str(models), "--chat-history",
                       str(disk.mount / "chats"), "--api-key-file", str(keys), "--admin-key", ADMIN,
                       "--ledger", str(tmp_path / "ledger.jsonl")) as stores:
        first = [{"role": "user", "content": "hi"}]
        saved = httpx.put(stores.url + "/chats/c1", headers=auth(STUDENT), json={"title": "t", "messages": first})
        assert saved.status_code == 200, saved.text
        create = {"model": "tutor", "from": "m", "system": "Be brief.", "stream": False}
        assert httpx.post(stores.url + "/api/create", headers=auth(ADMIN), json=create, timeout=30).status_code == 200
        disk.fill()
        try:
            longer = [*first, {"role": "assistant", "content": "hello " * 2000}]
            refused = httpx.put(stores.url + "/chats/c1", headers=auth(STUDENT),
                                json={"title": "t", "messages": longer})
            assert refused.status_code == 507 and "cannot save the chat 'c1'" in refused.json()["error"]["message"]
            assert httpx.get(stores.url + "/chats/c1", headers=auth(STUDENT)).json()["messages"] == first
            other = httpx.post(stores.url + "/api/create", headers=auth(ADMIN), timeout=30,
                               json={**create, "model": "tutor2", "system": "x" * 8000})
            assert other.status_code == 507 and "cannot save the model 'tutor2'" in other.json()["error"]
            tags = httpx.get(stores.url + "/api/tags", headers=auth(ADMIN)).json()["models"]
            assert "tutor2" not in [m["name"].removesuffix(":latest") for m in tags]
            answer = openai.OpenAI(base_url=stores.url + "/v1", api_key=STUDENT, max_retries=0, timeout=60) \
                .chat.completions.create(model="tutor", messages=first, max_tokens=3)
            assert answer.choices[0].finish_reason in ("stop", "length")
        finally:
            disk.free()
        again = httpx.put(stores.url + "/chats/c1", headers=auth(STUDENT), json={"title": "t", "messages": longer})
        assert again.status_code == 200
        assert httpx.get(stores.url + "/chats/c1", headers=auth(STUDENT)).json()["messages"] == longer
        assert not [p for p in (disk.mount / "chats").rglob(".*.tmp")]  # no temporary file left behind


@pytest.fixture(scope="module")
def failing_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FailingDisk]:
    if (why := fuse_unavailable()) is not None:
        pytest.skip(f"no disk that fails on demand here: {why}")
    held = FailingDisk(tmp_path_factory.mktemp("eio"))
    try:
        held.start()
    except RuntimeError as exc:  # /dev/fuse is there but this container may not mount (no CAP_SYS_ADMIN)
        pytest.skip(f"no disk that fails on demand here: {exc}")
    try:
        yield held
    finally:
        held.stop()


def test_an_io_error_refuses_requests_and_saves_until_the_disk_answers(server: KineticServer,
                                                                       failing_disk: FailingDisk,
                                                                       tmp_path: Path) -> None:
    """EIO on every write: each protocol's 503 naming the class record before a token is generated, /health and
    the dashboard say why, a chat save is a 507 naming it and the copy saved before reads back whole; once the
    disk answers, the very next request is served and recorded, and the save works."""
    server.stop()  # one model at a time
    keys = tmp_path / "keys.txt"  # off the failing disk: it must stay readable
    keys.write_text(f"{STUDENT} ann\n", encoding="utf-8")
    ledger = failing_disk.mount / "ledger.jsonl"
    with KineticServer("-c", "512", "-np", "1", "--api-key-file", str(keys), "--admin-key", ADMIN, "--ledger",
                       str(ledger), "--chat-history", str(failing_disk.mount / "chats"), "--metrics") as dying:
        served_and_recorded(dying.url, ledger)
        first = [{"role": "user", "content": "hi"}]
        saved = httpx.put(dying.url + "/chats/c1", headers=auth(STUDENT), json={"title": "t", "messages": first})
        assert saved.status_code == 200, saved.text
        failing_disk.failing = True
        try:
            refused_everywhere(dying.url)
            assert "Input/output error" in httpx.get(dying.url + "/health", timeout=10).json()["error"]["message"]
            longer = [*first, {"role": "assistant", "content": "hello"}]
            refused = httpx.put(dying.url + "/chats/c1", headers=auth(STUDENT), json={"title": "t", "messages": longer})
            assert refused.status_code == 507 and "cannot save the chat 'c1'" in refused.json()["error"]["message"]
            assert httpx.get(dying.url + "/chats/c1", headers=auth(STUDENT)).json()["messages"] == first
        finally:
            failing_disk.failing = False
        served_and_recorded(dying.url, ledger)  # the very next request
        again = httpx.put(dying.url + "/chats/c1", headers=auth(STUDENT), json={"title": "t", "messages": longer})
        assert again.status_code == 200
        assert dying.alive()
    assert all(LedgerRecord.from_line(line) for line in ledger.read_text(encoding="utf-8").splitlines())
