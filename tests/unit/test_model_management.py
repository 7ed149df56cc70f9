"""Model management without a model: derived models (stored, read back, put on requests), Ollama's names and
/api/create's fields, and a download that cannot start (offline, a hub that does not answer): a one-line
400 at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from kinetic.chat.types import ChatRequest, GenerationOptions, Message, SamplingOptions, TextPart
from kinetic.config.settings import ServerSettings
from kinetic.errors import InvalidRequestError
from kinetic.model_registry.derived import DerivedModel, DerivedStore
from kinetic.model_registry.derived_backend import dressed, with_defaults
from kinetic.model_registry.downloads import plan
from kinetic.protocols.ollama import manage
from kinetic.protocols.ollama.types import CreateRequest
from tests.scripted import ReadyClient, ScriptedEngine, single_model_app
from tests.server import free_port

HELLO = [{"role": "user", "content": "Say hello."}]
SAMPLING = SamplingOptions(chosen={"temperature": 0.2, "dry_sequence_breakers": ("\n",)})
TUTOR = DerivedModel(name="lab/tutor:v1", base="gemma", system="Be brief.",
                     messages=(("user", "hi"), ("assistant", "Hello.")),
                     options=GenerationOptions(sampling=SAMPLING, max_tokens=5, stop=("END",), context_limit=512),
                     created=1.5)


def text(message: Message) -> str:
    return message.text or ""


def test_a_derived_model_is_stored_under_any_name_and_read_back_the_same(tmp_path: Path) -> None:
    store = DerivedStore(tmp_path / "derived-models")
    store.save(TUTOR)
    assert DerivedStore(tmp_path / "derived-models").load() == [TUTOR]
    (tmp_path / "derived-models" / "broken.json").write_text("{", encoding="utf-8")
    assert store.load() == [TUTOR]  # a broken file is skipped, not fatal
    store.remove(TUTOR.name)
    assert store.load() == []


def test_the_derived_system_turns_and_options_go_on_the_request_the_requests_own_win() -> None:
    plain = dressed(ChatRequest(messages=(Message(role="user", parts=(TextPart("q"),)),)), TUTOR)
    assert [(m.role, text(m)) for m in plain.messages] == [("system", "Be brief."), ("user", "hi"),
                                                           ("assistant", "Hello."), ("user", "q")]
    assert plain.options.sampling.get("temperature") == 0.2 and plain.options.max_tokens == 5
    assert plain.options.stop == ("END",) and plain.options.context_limit == 512
    own = dressed(ChatRequest(
        messages=(Message(role="system", parts=(TextPart("mine"),)), Message(role="user", parts=(TextPart("q"),))),
        options=GenerationOptions(sampling=SamplingOptions(chosen={"temperature": 0.9}), max_tokens=7)), TUTOR)
    assert [text(m) for m in own.messages] == ["mine", "hi", "Hello.", "q"]
    assert own.options.sampling.get("temperature") == 0.9 and own.options.max_tokens == 7
    assert with_defaults(GenerationOptions(), GenerationOptions()) == GenerationOptions()


@pytest.mark.parametrize(("name", "repo"), [
    ("hf.co/org/repo-GGUF:Q8_0", "org/repo-GGUF:Q8_0"), ("huggingface.co/org/repo", "org/repo"),
    ("https://hf.co/org/repo:latest", "org/repo")])
def test_ollama_names_of_hugging_face_models(name: str, repo: str) -> None:
    assert manage.hf_repo(name) == repo


@pytest.mark.parametrize("name", ["llama3", "hf.co/just-a-name", "hf.co/a/b/c"])
def test_other_ollama_names_are_a_400_naming_the_model(name: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        manage.hf_repo(name)
    assert refused.value.param == "model"


def create(fields: dict[str, object], parent: DerivedModel) -> DerivedModel:
    body = CreateRequest.model_validate({"model": "t", "from": parent.name, **fields})
    name, _ = manage.check_create(body)
    system, messages, options = manage.create_fields(body)
    return parent.derive(name, system=system, messages=messages, options=options, created=2.0)


def test_create_takes_from_system_messages_and_parameters_and_names_what_it_cannot_take() -> None:
    made = create({"model": "tutor:latest", "system": "S", "messages": [{"role": "user", "content": "u"}],
                   "parameters": {"temperature": 0.1, "num_predict": 9, "stop": ["x"]}},
                  DerivedModel(name="gemma", base="gemma"))
    assert (made.name, made.base, made.system, made.messages) == ("tutor", "gemma", "S", (("user", "u"),))
    assert made.options.sampling.get("temperature") == 0.1
    assert made.options.max_tokens == 9 and made.options.stop == ("x",)
    copied = create({"system": "T", "parameters": {"top_k": 3}}, made)
    assert (copied.base, copied.system, copied.messages) == ("gemma", "T", made.messages)
    # over the base's
    assert copied.options.sampling.get("top_k") == 3 and copied.options.sampling.get("temperature") == 0.1
    for fields, param in (({"files": {"a.gguf": "sha256:0"}}, "files"), ({"template": "{{ .Prompt }}"}, "template"),
                          ({"from": None}, "from")):
        with pytest.raises(InvalidRequestError) as refused:
            manage.check_create(CreateRequest.model_validate({"model": "t", "from": "gemma", **fields}))
        assert refused.value.param == param
    with pytest.raises(InvalidRequestError) as bad:
        create({"parameters": {"top_p": 2}}, made)
    assert bad.value.param == "parameters.top_p"


def test_a_download_offline_is_a_one_line_400() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        plan("org/repo-GGUF:Q4_K_M", ServerSettings(offline=True))
    assert "the network is off" in refused.value.message and "\n" not in refused.value.message


def test_a_download_from_a_hub_that_does_not_answer_is_a_one_line_400_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as refused:
        plan("org/repo-GGUF", ServerSettings())
    assert time.monotonic() - started < 6
    assert "cannot be reached" in refused.value.message and "\n" not in refused.value.message


def test_a_single_model_server_serves_a_derived_model_by_name_and_its_own_name_as_before() -> None:
    loaded = threading.Event()
    loaded.set()
    engine = ScriptedEngine(["hi"], loaded=loaded)
    with ReadyClient(single_model_app(ServerSettings(), engine, "scripted")) as client:
        made = client.post("/api/create", json={"model": "tutor", "from": "scripted", "system": "Be a tutor.",
                                                "parameters": {"num_predict": 2}, "stream": False})
        assert made.json() == {"status": "success"}
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["scripted", "tutor"]
        assert [m["name"] for m in client.get("/api/tags").json()["models"]] == ["scripted", "tutor"]
        answer = client.post("/v1/chat/completions", json={"model": "tutor", "messages": HELLO}).json()
        assert answer["model"] == "tutor"
        plain = client.post("/v1/chat/completions", json={"model": "anything", "messages": HELLO}).json()
        assert plain["model"] == "scripted"  # one model: any other name is still the model itself
        derived_request, plain_request = engine.requests
        assert derived_request.max_tokens == 2 and plain_request.max_tokens != 2
        assert len(derived_request.prompt_tokens) > len(plain_request.prompt_tokens)  # the system prompt
        assert client.post("/api/copy", json={"source": "tutor", "destination": "tutor2"}).status_code == 200
        assert client.request("DELETE", "/api/delete", json={"model": "tutor2:latest"}).status_code == 200
        assert client.request("DELETE", "/api/delete", json={"model": "tutor2"}).status_code == 404
        assert client.request("DELETE", "/api/delete", json={"model": "scripted"}).status_code == 400
        taken = client.post("/api/create", json={"model": "scripted", "from": "scripted", "stream": False})
        assert taken.status_code == 400 and "a name of its own" in taken.json()["error"]
        assert client.post("/api/pull", json={"model": "hf.co/a/b"}).status_code == 501  # router mode only
        assert client.post("/models", json={"model": "a/b"}).status_code == 404  # llama-server's, router only
