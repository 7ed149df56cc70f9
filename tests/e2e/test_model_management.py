"""Managing a router's models while it runs, as llama-server's router and Ollama do (issue 35, parts 1, 2, 6).

One keyed router over a --models-dir holding the bundled Gemma, downloading from a local stand-in for the
Hugging Face hub (tests/fake_hub.py) into a Hugging Face cache of its own: llama-server's POST /models with
/models/sse progress, its cancel (/models/unload) and DELETE /models, with httpx; Ollama's pull, create,
copy and delete with the ollama package, the derived model served by every protocol and kept over a
restart; a student's key refused on each of them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from kinetic.backends.bundled import gemma_model_path
from tests.fake_hub import FakeHub
from tests.server import KineticServer, wait_until

REPO = "test-org/tiny-gemma-GGUF"
SLOW = "test-org/slow-GGUF"
STUDENT, ADMIN = "sk-student", "sk-admin"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    gguf = gemma_model_path()
    repos = {REPO: {"tiny-gemma-Q8_0.gguf": gguf, "tiny-gemma-Q4_K_M.gguf": gguf}, SLOW: {"slow-Q4_K_M.gguf": gguf}}
    with FakeHub(repos, slow={SLOW: 0.2}) as fake:
        yield fake


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("management")
    models = root / "models"
    models.mkdir()
    (models / "gemma.gguf").symlink_to(gemma_model_path())
    keys = root / "keys.txt"
    keys.write_text(f"{STUDENT} alice\n", encoding="utf-8")
    return {"models": models, "hf": root / "hf", "keys": keys}


def start(hub: FakeHub, folders: dict[str, Path]) -> KineticServer:
    return KineticServer("--models-dir", str(folders["models"]), "-c", "1024", "-np", "1",
                         "--api-key-file", str(folders["keys"]), "--admin-key", ADMIN,
                         "--drain-timeout", "0",  # the tests' /models/sse listeners would hold a drain
                         env={"HF_HOME": str(folders["hf"]), "HF_ENDPOINT": hub.url}).start()


@pytest.fixture(scope="module")
def server(model_lock: None, hub: FakeHub, folders: dict[str, Path]) -> Iterator[KineticServer]:
    running = start(hub, folders)
    try:
        yield running
    finally:
        running.stop()


def admin(server: KineticServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)


class Listener:
    """/models/sse read in a thread: every event, in order."""

    def __init__(self, server: KineticServer):
        self.events: list[dict[str, Any]] = []
        self.open = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(server.url,), daemon=True)
        self.thread.start()
        assert self.open.wait(30)

    def _read(self, url: str) -> None:
        headers = {"Authorization": f"Bearer {STUDENT}"}
        try:
            with httpx.stream("GET", url + "/models/sse", headers=headers, timeout=None) as response:
                self.open.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line[len("data: "):]))
        except httpx.RemoteProtocolError:
            pass  # the server stopped (the restart of the last test): the stream is over

    def of(self, model: str) -> list[str]:
        return [e["event"] for e in self.events if e["model"] == model]


def rows(server: KineticServer) -> dict[str, dict[str, Any]]:
    body = admin(server).get("/models").json()
    return {row["id"]: row for row in body["data"]}


def cached(folders: dict[str, Path], repo: str) -> list[str]:
    snapshots = folders["hf"] / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
    return sorted(p.name for p in snapshots.glob("*/*.gguf"))


def test_post_models_downloads_with_progress_serves_it_and_delete_removes_it(server: KineticServer,
                                                                             folders: dict[str, Path]) -> None:
    name = f"{REPO}:Q8_0"
    listener = Listener(server)
    client = admin(server)
    assert client.post("/models", json={"model": name}).json() == {"success": True}
    wait_until(lambda: "download_finished" in listener.of(name), "the download's end on /models/sse", 60)
    events = listener.of(name)
    assert events[0] == "model_status" and events[-1] == "download_finished" and "download_progress" in events
    last = [e for e in listener.events if e["model"] == name and e["event"] == "download_progress"][-1]
    [(url, progress)] = last["data"]["progress"].items()
    assert url.endswith("/tiny-gemma-Q8_0.gguf") and progress == {"done": progress["total"],
                                                                    "total": gemma_model_path().stat().st_size}
    row = rows(server)[name]
    assert row["source"] == "cache" and row["can_remove"] is True and row["status"]["value"] == "unloaded"
    assert cached(folders, REPO) == ["tiny-gemma-Q8_0.gguf"]

    answer = client.post("/v1/chat/completions", json={"model": name, "messages": HELLO, "max_tokens": 2}).json()
    assert answer["model"] == name and answer["usage"]["completion_tokens"] <= 2
    again = client.post("/models", json={"model": name})
    assert again.status_code == 400 and "already exists" in again.json()["error"]["message"]
    kept = client.delete("/models", params={"model": "gemma"})  # a --models-dir model is not the cache's
    assert kept.status_code == 400 and "not removable" in kept.json()["error"]["message"]

    assert client.delete("/models", params={"model": name}).json() == {"success": True}
    wait_until(lambda: "model_remove" in listener.of(name), "model_remove on /models/sse", 30)
    assert name not in rows(server) and cached(folders, REPO) == []
    assert client.delete("/models", params={"model": name}).status_code == 404


def test_a_download_under_way_is_listed_with_progress_and_unload_cancels_it(server: KineticServer) -> None:
    name = f"{SLOW}:Q4_K_M"
    listener = Listener(server)
    client = admin(server)
    assert client.post("/models", json={"model": name}).json() == {"success": True}
    wait_until(lambda: any(p["done"] > 0 for p in rows(server).get(name, {}).get("status", {})
                           .get("progress", {}).values()), "progress on GET /models", 30)
    status = rows(server)[name]["status"]
    assert status["value"] == "downloading"
    [progress] = status["progress"].values()
    assert 0 < progress["done"] < progress["total"]
    started = time.monotonic()
    assert client.post("/models/unload", json={"model": name}).json() == {"success": True}
    assert time.monotonic() - started < 5
    wait_until(lambda: "download_failed" in listener.of(name), "download_failed on /models/sse", 10)
    assert name not in rows(server)


def test_a_bad_name_or_a_repo_the_hub_lacks_is_a_one_line_400_at_once(server: KineticServer) -> None:
    client = admin(server)
    for name, words in (("no-slash", "expected <user>/<model>[:quant]"), ("nobody/nothing-GGUF", "was not found"),
                        (f"{REPO}:Q2_K", "no file for quant Q2_K")):
        started = time.monotonic()
        response = client.post("/models", json={"model": name})
        assert response.status_code == 400 and time.monotonic() - started < 6, response.text
        message = response.json()["error"]["message"]
        assert words in message and "\n" not in message, message


def test_a_students_key_may_not_manage_models(server: KineticServer) -> None:
    student = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {STUDENT}"})
    for call in (lambda: student.pull(f"hf.co/{REPO}"), lambda: student.create("x", from_="gemma"),
                 lambda: student.copy("gemma", "x"), lambda: student.delete("gemma"),
                 lambda: student.push("gemma")):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 403 and "needs the admin key" in refused.value.error
    headers = {"Authorization": f"Bearer {STUDENT}"}
    assert httpx.post(server.url + "/models", json={"model": REPO}, headers=headers).status_code == 403
    assert httpx.delete(server.url + "/models", params={"model": "gemma"}, headers=headers).status_code == 403


def test_ollama_pull_streams_progress_and_delete_removes_the_model(server: KineticServer,
                                                                   folders: dict[str, Path]) -> None:
    client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {ADMIN}"})
    lines = list(client.pull(f"hf.co/{REPO}:Q4_K_M", stream=True))
    statuses = [line.status for line in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    files = [line for line in lines if line.status == "pulling tiny-gemma-Q4_K_M.gguf"]
    assert files and files[-1].completed == files[-1].total == gemma_model_path().stat().st_size
    assert all(a.completed <= b.completed for a, b in zip(files, files[1:], strict=False))
    names = [m.model for m in client.list().models]
    assert f"{REPO}:Q4_K_M" in names and cached(folders, REPO) == ["tiny-gemma-Q4_K_M.gguf"]
    with pytest.raises(ollama.ResponseError) as wrong:
        client.pull("llama3")
    assert wrong.value.status_code == 400 and "hf.co/OWNER/REPO" in wrong.value.error
    assert client.delete(f"hf.co/{REPO}:Q4_K_M").status == "success"
    assert cached(folders, REPO) == [] and f"{REPO}:Q4_K_M" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as pushed:
        client.push("gemma")
    assert pushed.value.status_code == 501


def prompt_tokens(server: KineticServer, model: str) -> dict[str, int]:
    """The prompt a model is given for one short question, counted by each protocol's own client."""
    auth = {"Authorization": f"Bearer {ADMIN}"}
    chat = ollama.Client(host=server.url, headers=auth).chat(model=model, messages=HELLO,
                                                             options={"num_predict": 8})
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN, max_retries=0).chat.completions.create(
        model=model, messages=HELLO, max_tokens=8)  # type: ignore[arg-type]
    message = anthropic.Anthropic(base_url=server.url, api_key=ADMIN, max_retries=0).messages.create(
        model=model, max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert oai.usage is not None
    return {"ollama": chat.prompt_eval_count or 0, "openai": oai.usage.prompt_tokens,
            # Anthropic counts the prompt cache's tokens apart
            "anthropic": message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0),
            "ollama_answer": chat.eval_count or 0}


TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}: {{ m.content }}\n{% endfor %}MODEL:"
GO_TEMPLATE = "{{ if .System }}SYSTEM: {{ .System }}\n{{ end }}USER: {{ .Prompt }}\nMODEL:"


def rendered(server: KineticServer, model: str) -> str:
    return admin(server).post("/apply-template", json={"model": model, "messages": HELLO}).json()["prompt"]


def test_ollama_create_with_a_jinja_template_renders_every_protocols_chats_with_it(server: KineticServer) -> None:
    """/api/create `template` (issue 35 part 2): the derived model's prompts are its template's, whichever
    protocol asks; a Go template is a 400 naming `template`."""
    client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {ADMIN}"})
    assert client.create(model="plain-tutor", from_="gemma", system="Be brief.", template=TEMPLATE).status == "success"
    assert rendered(server, "plain-tutor") == "<bos>SYSTEM: Be brief.\nUSER: Say hello.\nMODEL:"
    assert "USER:" not in rendered(server, "gemma")  # the base model keeps its own template
    assert client.show("plain-tutor").template == TEMPLATE
    base, tutor = prompt_tokens(server, "gemma"), prompt_tokens(server, "plain-tutor")
    counted = {tutor[p] for p in ("ollama", "openai", "anthropic")}
    want = len(admin(server).post("/tokenize", json={"model": "plain-tutor", "content": rendered(
        server, "plain-tutor"), "add_special": False, "parse_special": True}).json()["tokens"])
    assert counted == {want} and want != base["openai"], (base, tutor, want)
    with pytest.raises(ollama.ResponseError) as go:
        client.create(model="go-tutor", from_="gemma", template=GO_TEMPLATE)
    assert go.value.status_code == 400 and "template" in go.value.error and "Jinja" in go.value.error


def test_ollama_create_makes_a_model_every_protocol_serves_and_a_restart_keeps(
        server: KineticServer, folders: dict[str, Path]) -> None:
    client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {ADMIN}"})
    system = "You are the tutor of lab 4. Answer in one short sentence and ask a question back."
    made = client.create(model="tutor", from_="gemma", system=system, parameters={"num_predict": 3})
    assert made.status == "success"
    base, tutor = prompt_tokens(server, "gemma"), prompt_tokens(server, "tutor")
    for protocol in ("ollama", "openai", "anthropic"):
        assert tutor[protocol] > base[protocol] + 10, (protocol, base, tutor)  # the system prompt is in it
    # the derived num_predict, where the request sets none (the server's own -n is unlimited)
    assert 1 <= (client.chat(model="tutor", messages=HELLO).eval_count or 0) <= 3
    listed = [m.model for m in client.list().models]
    assert "tutor" in listed and "tutor" in rows(server)
    assert client.copy("tutor", "tutor-copy").status == "success"
    assert prompt_tokens(server, "tutor-copy")["openai"] == tutor["openai"]
    assert client.delete("tutor-copy").status == "success"
    assert "tutor-copy" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as missing:
        client.create(model="x", from_="nothing")
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as bad:
        client.create(model="x", from_="gemma", parameters={"temperature": "hot"})
    assert bad.value.status_code == 400 and "parameters.temperature" in bad.value.error

    server.stop()
    server.start()  # the same folders: the derived model is read back from beside the models
    assert "tutor" in [m["id"] for m in httpx.get(server.url + "/v1/models", headers={
        "Authorization": f"Bearer {STUDENT}"}).json()["data"]]
    assert prompt_tokens(server, "tutor")["openai"] == tutor["openai"]
    assert rendered(server, "plain-tutor") == "<bos>SYSTEM: Be brief.\nUSER: Say hello.\nMODEL:"  # its template kept
    assert sorted(p.name for p in (folders["models"] / "derived-models").iterdir()) == ["plain-tutor.json",
                                                                                       "tutor.json"]
