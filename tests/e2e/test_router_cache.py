"""`kinetic serve` with no model over a Hugging Face cache that holds models: a router over them, as
llama-server with no model is (issue 44, part 5), with the bundled model among them as `local`.

The cache is laid out on disk (tests/fake_hub.py lay_out_cache): every repo's model is the bundled Gemma,
one repo ships the tiny gemma3 projector. Real servers, httpx and the openai SDK.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kinetic.backends.bundled import gemma_model_path
from tests.fake_hub import lay_out_cache
from tests.projector_model import tiny_projector
from tests.server import KineticServer, wait_until

VISION = "test-org/vision-GGUF:Q8_0"
STORY = "test-org/story-GGUF:F32"
INFILL = "test-org/infill-GGUF:F32"
DOOMED = "test-org/doomed-GGUF:F16"
BUNDLED = "gemma-3-270m-q4_k_m"  # the suite's servers that name no model serve Gemma (tests/conftest.py)
OTHER_BUNDLED = "smollm2-135m-instruct-q4_1"  # the other bundled model: listed too, by its id
HELLO = [{"role": "user", "content": "hello"}]


def cache_repos() -> dict[str, dict[str, Path]]:
    gemma = gemma_model_path()
    return {"test-org/vision-GGUF": {"vision-Q8_0.gguf": gemma, "mmproj-vision-f16.gguf": tiny_projector("gemma3")},
            "test-org/story-GGUF": {"story-F32.gguf": gemma},
            "test-org/infill-GGUF": {"infill-F32.gguf": gemma},
            "test-org/doomed-GGUF": {"doomed-F16.gguf": gemma},
            # no quant tag in its name: llama-server's router does not list it, nor does kinetic
            "test-org/models": {"tinyllamas/untagged.gguf": gemma}}


def new_cache(root: Path) -> Path:
    lay_out_cache(root / "hub", cache_repos())
    return root


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_cache(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def router(model_lock: None, hf_home: Path) -> Iterator[KineticServer]:
    with KineticServer("-c", "1024", "-np", "1", "--models-max", "2", env={"HF_HOME": str(hf_home)}) as server:
        yield server


def models(server: KineticServer, query: str = "") -> dict[str, Any]:
    response = httpx.get(server.url + "/models" + query, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def status(server: KineticServer, model: str) -> str:
    return next(row["status"]["value"] for row in models(server)["data"] if row["id"] == model)


def load(server: KineticServer, model: str) -> None:
    response = httpx.post(server.url + "/models/load", json={"model": model}, timeout=120)
    assert response.status_code == 200 and response.json() == {"success": True}, response.text
    wait_until(lambda: status(server, model) == "loaded", f"{model} loaded")


def tokenize(server: KineticServer, model: str, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + "/tokenize", json={"model": model, "content": "hello world"}, timeout=timeout)


def test_the_cache_models_are_listed_once_with_the_bundled_model(router: KineticServer) -> None:
    body = models(router)
    ids = [row["id"] for row in body["data"]]
    assert sorted(ids) == sorted([BUNDLED, OTHER_BUNDLED, VISION, STORY, INFILL, DOOMED])  # each once; the
    # untagged file is not
    rows = {row["id"]: row for row in body["data"]}
    assert rows[BUNDLED]["aliases"] == ["local"] and rows[BUNDLED]["source"] == "bundled"
    assert rows[OTHER_BUNDLED]["aliases"] == [] and rows[OTHER_BUNDLED]["source"] == "bundled"
    assert rows[STORY]["source"] == "cache" and rows[STORY]["can_remove"] is True
    assert all(row["status"]["value"] == "unloaded" for row in body["data"])
    # the projector beside the model is read before any load, as llama-server's router lists it
    assert rows[VISION]["architecture"]["input_modalities"] == ["text", "image"]
    assert rows[STORY]["architecture"]["input_modalities"] == ["text"]
    capabilities = {row["name"]: row["capabilities"] for row in body["models"]}
    assert capabilities[VISION] == ["completion", "multimodal"] and capabilities[STORY] == ["completion"]
    v1 = httpx.get(router.url + "/v1/models", timeout=60).json()
    assert sorted(row["id"] for row in v1["data"]) == sorted(ids)
    props = httpx.get(router.url + "/props", timeout=60).json()
    assert props["role"] == "router" and props["max_instances"] == 2 and props["models_autoload"] is True


def test_local_and_a_request_without_model_reach_the_bundled_model(router: KineticServer) -> None:
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="local", messages=HELLO, max_tokens=4)  # the labs' chat.py
    assert reply.model == BUNDLED and reply.usage is not None and reply.usage.completion_tokens <= 4
    unnamed = httpx.post(router.url + "/completion", json={"prompt": "Hello", "n_predict": 3}, timeout=120)
    assert unnamed.status_code == 200 and unnamed.json()["tokens_predicted"] <= 3
    assert status(router, BUNDLED) == "loaded"


def test_a_cache_model_streams_and_an_unknown_one_is_refused(router: KineticServer) -> None:
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(model=STORY, messages=HELLO, max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="non-existent/model", messages=HELLO, max_tokens=4, stream=True)
    assert httpx.post(router.url + "/models/load", json={"model": "non-existent/model"}).status_code == 404


def test_load_and_unload_a_cache_model_with_its_projector(router: KineticServer) -> None:
    load(router, VISION)
    row = next(row for row in models(router)["data"] if row["id"] == VISION)
    assert row["capabilities"] == ["completion", "multimodal"]
    assert httpx.post(router.url + "/models/load", json={"model": VISION}).status_code == 400  # already running
    response = httpx.post(router.url + "/models/unload", json={"model": VISION}, timeout=60)
    assert response.status_code == 200 and response.json() == {"success": True}
    assert status(router, VISION) == "unloaded"
    assert httpx.post(router.url + "/models/unload", json={"model": VISION}).status_code == 400  # not running


def test_models_max_unloads_the_least_recently_used(router: KineticServer) -> None:
    for row in models(router)["data"]:
        if row["status"]["value"] == "loaded":
            assert httpx.post(router.url + "/models/unload", json={"model": row["id"]}).status_code == 200
    load(router, STORY)
    load(router, INFILL)
    assert [status(router, m) for m in (STORY, INFILL, BUNDLED)] == ["loaded", "loaded", "unloaded"]
    load(router, VISION)
    assert [status(router, m) for m in (STORY, INFILL, VISION)] == ["unloaded", "loaded", "loaded"]


def test_delete_removes_a_cache_model_from_the_list_and_the_disk(router: KineticServer, hf_home: Path) -> None:
    doomed = hf_home / "hub" / "models--test-org--doomed-GGUF"
    assert any(doomed.rglob("*.gguf"))
    assert tokenize(router, DOOMED).status_code == 200  # loaded, then deleted under the router's feet
    response = httpx.delete(router.url + "/models", params={"model": DOOMED}, timeout=60)
    assert response.status_code == 200 and response.json() == {"success": True}
    assert DOOMED not in [row["id"] for row in models(router)["data"]]
    assert not any(doomed.rglob("*.gguf"))
    assert tokenize(router, DOOMED).status_code == 404
    assert httpx.delete(router.url + "/models", params={"model": BUNDLED}).status_code == 400  # not the cache's
    assert httpx.delete(router.url + "/models", params={"model": "nobody/nothing:Q4_0"}).status_code == 404


def test_reload_reads_the_cache_again(router: KineticServer, hf_home: Path) -> None:
    lay_out_cache(hf_home / "hub", {"test-org/later-GGUF": {"later-Q4_0.gguf": gemma_model_path()}})
    assert "test-org/later-GGUF:Q4_0" not in [row["id"] for row in models(router)["data"]]
    ids = [row["id"] for row in models(router, "?reload=1")["data"]]
    assert "test-org/later-GGUF:Q4_0" in ids and len(ids) == len(set(ids))
    load(router, INFILL)
    # a model that left the cache is unloaded and dropped; the others keep their state
    for link in (hf_home / "hub" / "models--test-org--infill-GGUF" / "snapshots").rglob("*.gguf"):
        link.unlink()
    rows = {row["id"]: row for row in models(router, "?reload=1")["data"]}
    assert INFILL not in rows and rows[VISION]["status"]["value"] == "loaded"
    assert tokenize(router, INFILL).status_code == 404


def test_no_models_autoload_answers_400_until_the_model_is_loaded(model_lock: None, tmp_path: Path) -> None:
    env = {"HF_HOME": str(new_cache(tmp_path))}
    with KineticServer("-c", "1024", "-np", "1", "--no-models-autoload", env=env) as server:
        assert httpx.get(server.url + "/props").json()["models_autoload"] is False
        body = {"model": STORY, "messages": HELLO, "max_tokens": 4}
        refused = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["message"] == "model is not loaded"
        load(server, STORY)
        assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).status_code == 200


def test_a_preset_beside_the_cache_dedup_and_reload(model_lock: None, tmp_path: Path) -> None:
    hf_home = new_cache(tmp_path / "hf")
    preset = tmp_path / "preset.ini"
    section = "[story]\nhf-repo = test-org/story-GGUF\nspec-draft-hf = test-org/infill-GGUF\n"
    preset.write_text(section + "dedup-cache-models = 1\n")
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    with KineticServer("-c", "1024", "-np", "1", "--models-preset", str(preset), env=env) as server:
        ids = [row["id"] for row in models(server)["data"]]
        # the preset's model stands for the two cache entries its files are; the other cache models stay
        assert "story" in ids and STORY not in ids and INFILL not in ids and VISION in ids
        assert BUNDLED not in ids and OTHER_BUNDLED not in ids  # bundled models join only a router with no model
        assert tokenize(server, STORY).status_code == 200  # hidden from the list, still served by name
        preset.write_text(section)
        ids = [row["id"] for row in models(server, "?reload=1")["data"]]
        assert STORY in ids and INFILL in ids and "story" in ids
        preset.write_text("[*]\ndedup-cache-models = 1\n\n[tale]\nhf-repo = test-org/story-GGUF\n")
        ids = [row["id"] for row in models(server, "?reload=1")["data"]]
        assert "tale" in ids and "story" not in ids and STORY not in ids and INFILL in ids
        assert tokenize(server, "story").status_code == 404


def test_a_client_that_leaves_while_queued_costs_no_model_its_room(model_lock: None, tmp_path: Path) -> None:
    """llama-server's debug timing (each load and each request held 2 s) lines requests up behind a busy
    model: a request that gives up in the line does not evict it, and the line is served in arrival order."""
    env = {"HF_HOME": str(new_cache(tmp_path)), "LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}
    with KineticServer("-c", "1024", "-np", "1", "--models-max", "1", env=env) as server:
        load(server, VISION)
        busy = threading.Thread(target=tokenize, args=(server, VISION))
        busy.start()
        time.sleep(0.5)
        with pytest.raises(httpx.TimeoutException):
            tokenize(server, STORY, timeout=1)
        busy.join()
        time.sleep(3)
        assert status(server, VISION) == "loaded" and status(server, STORY) == "unloaded"

        done: dict[str, float] = {}

        def timed(model: str) -> None:
            assert tokenize(server, model).status_code == 200
            done[model] = time.monotonic()

        threads = [threading.Thread(target=timed, args=(model,)) for model in (VISION, STORY, BUNDLED)]
        for thread in threads:
            thread.start()
            time.sleep(0.7)
        for thread in threads:
            thread.join(120)
        assert done[VISION] < done[STORY] < done[BUNDLED]
        assert status(server, BUNDLED) == "loaded" and status(server, VISION) == "unloaded"
        # a resumable stream's request (X-Conversation-Id) is not the client's to give up: its model loads
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url + "/tokenize", json={"model": INFILL, "content": "hi"}, timeout=1,
                       headers={"X-Conversation-Id": "lab-7"})
        wait_until(lambda: status(server, INFILL) == "loaded", f"{INFILL} loaded for a client that left", 30)

        # while its model is on its way, a resumable stream is a 503 to resume and a stop cancels its request
        answer: dict[str, httpx.Response] = {}
        body = {"model": STORY, "messages": HELLO, "max_tokens": 4, "stream": True}
        parked = threading.Thread(target=lambda: answer.setdefault("r", httpx.post(
            server.url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": "lab-8"}, timeout=60)))
        parked.start()
        time.sleep(0.5)
        stream = server.url + "/v1/stream"
        assert httpx.get(stream, params={"conv_id": "lab-8", "from": 0}).status_code == 503
        assert httpx.delete(stream, params={"conv_id": "lab-8"}).status_code == 204
        parked.join(60)
        assert answer["r"].status_code == 400 and "cancelled" in answer["r"].json()["error"]["message"]
        assert httpx.get(stream, params={"conv_id": "lab-8", "from": 0}).status_code == 404
