"""A router started offline over a Hugging Face cache laid out on disk (issue 44 part 4): llama-server's
POST /models of a model that reached the cache after the start succeeds with the same progress as a real
download, each file complete at once, and the model is served; Ollama's /api/pull of a model the router lists
from the cache answers as Ollama does for a model it has; one the cache lacks is a one-line 400. Ollama's
name grammar on create, copy, delete, pull and show: its 400s, through the ollama client and httpx.

The hub's address points at a port nothing listens on, so any request to the network would fail the test.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from kinetic.backends.bundled import gemma_model_path
from tests.server import KineticServer, free_port, wait_until

REPO = "test-org/tiny-gemma-GGUF"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SIZE = gemma_model_path().stat().st_size
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """--models-dir with the bundled Gemma (router mode), and a hub cache holding REPO in two quants."""
    root = tmp_path_factory.mktemp("offline")
    models = root / "models"
    models.mkdir()
    (models / "gemma.gguf").symlink_to(gemma_model_path())
    repo = root / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for quant in ("Q4_K_M", "Q8_0"):
        cached_copy(gemma_model_path(), snapshot / f"tiny-gemma-{quant}.gguf")
    return {"models": models, "hf": root / "hf"}


def cached_copy(source: Path, target: Path) -> None:
    """A hard link (a copy across file systems), never a symlink: deleting a cached model deletes the file its
    link resolves to, which must not be the bundled model itself."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


@pytest.fixture(scope="module")
def server(model_lock: None, folders: dict[str, Path]) -> Iterator[KineticServer]:
    env = {"HF_HOME": str(folders["hf"]), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    with KineticServer("--models-dir", str(folders["models"]), "--offline", "-c", "1024", "-np", "1",
                       "--drain-timeout", "0", env=env) as running:
        yield running


def cache_listing(folders: dict[str, Path]) -> list[str]:
    return sorted(str(p.relative_to(folders["hf"])) for p in folders["hf"].rglob("*"))


class Listener:
    """/models/sse read in a thread: every event, in order."""

    def __init__(self, server: KineticServer):
        self.events: list[dict[str, Any]] = []
        self.open = threading.Event()
        threading.Thread(target=self._read, args=(server.url,), daemon=True).start()
        assert self.open.wait(30)

    def _read(self, url: str) -> None:
        try:
            with httpx.stream("GET", url + "/models/sse", timeout=None) as response:
                self.open.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line[len("data: "):]))
        except httpx.HTTPError:
            pass  # the server stopped: the stream is over

    def of(self, model: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["model"] == model]


def test_post_models_offline_takes_a_model_cached_since_the_start_with_the_events_of_a_download(
        server: KineticServer, folders: dict[str, Path]) -> None:
    """The cache's models at the start are listed already (llama-server's router answers "already exists" for
    them); one that reached the cache while the server ran (another program's download) is taken offline."""
    listed = httpx.post(server.url + "/models", json={"model": f"{REPO}:Q4_K_M"}, timeout=30)
    assert listed.status_code == 400 and "already exists" in listed.json()["error"]["message"]
    name = f"{REPO}:Q5_K_M"
    snapshot = folders["hf"] / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / REVISION
    cached_copy(gemma_model_path(), snapshot / "tiny-gemma-Q5_K_M.gguf")
    before = cache_listing(folders)
    listener = Listener(server)
    assert httpx.post(server.url + "/models", json={"model": name}, timeout=30).json() == {"success": True}
    wait_until(lambda: any(e["event"] == "download_finished" for e in listener.of(name)), "download_finished", 30)
    events = listener.of(name)
    assert [e["event"] for e in events][0] == "model_status" and events[0]["data"] == {"status": "downloading"}
    assert events[-1]["event"] == "download_finished"
    progress = [e["data"]["progress"] for e in events if e["event"] == "download_progress"]
    [(url, row)] = progress[-1].items()
    assert url.endswith(f"/{REPO}/resolve/main/tiny-gemma-Q5_K_M.gguf") and row == {"done": SIZE, "total": SIZE}

    models = {m["id"]: m for m in httpx.get(server.url + "/models", timeout=30).json()["data"]}
    assert models[name]["source"] == "cache" and models[name]["can_remove"] is True
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                        json={"model": name, "messages": HELLO, "max_tokens": 2}).json()
    assert answer["model"] == name and answer["usage"]["completion_tokens"] <= 2
    assert cache_listing(folders) == before  # read where it was: nothing written, nothing fetched


def test_post_models_offline_of_a_model_the_cache_lacks_is_a_one_line_400(server: KineticServer) -> None:
    for name in ("nobody/nothing-GGUF", f"{REPO}:Q2_K"):
        response = httpx.post(server.url + "/models", json={"model": name}, timeout=30)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "not in the Hugging Face cache" in message and "network is off" in message and "\n" not in message
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_ollama_pull_offline_streams_a_cached_models_progress_then_serves_it(server: KineticServer) -> None:
    client = ollama.Client(host=server.url)
    lines = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))
    statuses = [line.status for line in lines]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                   "success"], statuses
    files = [line for line in lines if line.status == "pulling tiny-gemma-Q8_0.gguf"]
    assert files and files[-1].completed == files[-1].total == SIZE
    assert f"{REPO}:Q8_0" in [m.model for m in client.list().models]
    reply = client.chat(model=f"hf.co/{REPO}:Q8_0", messages=HELLO, options={"num_predict": 2})
    assert 1 <= (reply.eval_count or 0) <= 2
    with pytest.raises(ollama.ResponseError) as missing:
        client.pull("hf.co/nobody/nothing-GGUF")
    assert missing.value.status_code == 400 and "not in the Hugging Face cache" in missing.value.error
    assert client.delete(f"hf.co/{REPO}:Q8_0").status == "success"  # deleting works offline too


@pytest.mark.parametrize("bad", ["../escaped", "a b", "-x", "ns.x/model", "model:"])
def test_ollama_names_outside_its_grammar_are_a_400_on_every_route(server: KineticServer, bad: str) -> None:
    client = ollama.Client(host=server.url)
    calls = {"destination": lambda: client.copy("gemma", bad), "source": lambda: client.copy(bad, "fine"),
             "model": lambda: client.create(model=bad, from_="gemma"), "from": lambda: client.create(
                 model="fine", from_=bad), "delete": lambda: client.delete(bad), "pull": lambda: client.pull(bad),
             "show": lambda: client.show(bad)}
    for field, call in calls.items():
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 400, (field, refused.value)
        named = {"delete": "model", "pull": "model", "show": "model"}.get(field, field)
        assert refused.value.error.startswith(f'{named} "{bad}" is invalid'), (field, refused.value.error)
    listed = [m.model for m in client.list().models]
    assert not any("escaped" in name or name == "fine" for name in listed)


def test_ollama_copy_refuses_a_path_escape_as_ollama_does_and_takes_a_good_name(
        server: KineticServer, folders: dict[str, Path]) -> None:
    response = httpx.post(server.url + "/api/copy", json={"source": "gemma", "destination": "../escaped"}, timeout=30)
    assert response.status_code == 400 and response.json()["error"].startswith('destination "../escaped" is invalid')
    assert not list(folders["models"].parent.rglob("*escaped*"))
    for request in (("/api/show", {"model": "../escaped"}), ("/api/delete", {"model": "../escaped"}),
                    ("/api/create", {"model": "../escaped", "from": "gemma"}), ("/api/pull", {"model": "../x"})):
        answer = httpx.request("DELETE" if request[0] == "/api/delete" else "POST", server.url + request[0],
                               json=request[1], timeout=30)
        assert answer.status_code == 400 and "is invalid" in answer.json()["error"], (request, answer.text)
    client = ollama.Client(host=server.url)
    assert client.copy("gemma", "lab/tutor:v1").status == "success"
    assert client.show("lab/tutor:v1").modelfile is not None
    assert client.delete("lab/tutor:v1").status == "success"
    unknown = httpx.post(server.url + "/api/show", json={"model": "nothing-here"}, timeout=30)
    assert unknown.status_code == 404  # a good name of no model is Ollama's 404, not a 400
