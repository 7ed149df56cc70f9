"""Model management without a model: derived models (stored, read back, put on requests), Ollama's names and
/api/create's fields, a download that cannot start (offline and not cached, a hub that does not answer): a
one-line 400 at once, and one offline from the cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from kinetic.chat.types import ChatRequest, GenerationOptions, Message, SamplingOptions, TextPart
from kinetic.config.settings import ServerSettings
from kinetic.errors import InvalidRequestError
from kinetic.model_registry.derived import DerivedModel, DerivedStore, with_defaults
from kinetic.model_registry.downloads import plan, remove_cached
from kinetic.model_registry.served import dressed
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
    for fields, param in (({"files": {"a.gguf": "sha256:0"}}, "files"), ({"from": None}, "from")):
        with pytest.raises(InvalidRequestError) as refused:
            manage.check_create(CreateRequest.model_validate({"model": "t", "from": "gemma", **fields}))
        assert refused.value.param == param
    with pytest.raises(InvalidRequestError) as bad:
        create({"parameters": {"top_p": 2}}, made)
    assert bad.value.param == "parameters.top_p"


JINJA = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}<model>"
GO_TEMPLATES = [  # as Ollama's Modelfiles write them: the legacy form, the messages form, a tools check
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}<|im_start|>user\n{{ .Prompt }}",
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n",
    "{{- if $.Tools }}tools{{ end }}{{ .Response }}"]


@pytest.mark.parametrize("template", GO_TEMPLATES)
def test_a_go_template_is_a_400_naming_template_that_says_to_send_jinja(template: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        manage.chat_template(CreateRequest.model_validate({"model": "t", "from": "gemma", "template": template}))
    assert refused.value.param == "template" and "Jinja" in refused.value.message


def test_a_jinja_template_is_taken_kept_by_what_derives_from_it_and_stored() -> None:
    body = CreateRequest.model_validate({"model": "t", "from": "gemma", "template": JINJA})
    assert manage.chat_template(body) == JINJA
    made = DerivedModel(name="gemma", base="gemma").derive("t", system=None, messages=None, options=None,
                                                           created=1.0, template=JINJA)
    assert made.derive("t2", system="S", messages=None, options=None, created=2.0).template == JINJA
    assert DerivedModel.from_json(made.to_json()) == made
    with pytest.raises(InvalidRequestError) as broken:
        manage.chat_template(CreateRequest.model_validate({"model": "t", "from": "gemma",
                                                           "template": "{% for m in messages %}"}))
    assert broken.value.param == "template" and "invalid chat template" in broken.value.message


def test_a_derived_model_with_a_template_renders_its_chats_with_it_and_the_base_keeps_its_own() -> None:
    loaded = threading.Event()
    loaded.set()
    engine = ScriptedEngine(["hi", "hi", "hi"], loaded=loaded)
    with ReadyClient(single_model_app(ServerSettings(), engine, "scripted")) as client:
        made = client.post("/api/create", json={"model": "tagged", "from": "scripted", "template": JINJA,
                                                "system": "Be brief.", "stream": False})
        assert made.json() == {"status": "success"}
        for model in ("tagged", "scripted"):
            reply = client.post("/v1/chat/completions", json={"model": model, "messages": HELLO})
            assert reply.status_code == 200, reply.text
        shown = client.post("/api/show", json={"model": "tagged"}).json()
        refused = client.post("/api/create", json={"model": "x", "from": "scripted", "template": GO_TEMPLATES[0]})
    tagged, plain = (bytes(r.prompt_tokens).decode() for r in engine.requests)
    assert tagged == "<system>Be brief.</system><user>Say hello.</user><model>"
    assert "<user>" not in plain and "Say hello." in plain
    assert shown["template"] == JINJA
    assert refused.status_code == 400 and "template" in refused.json()["error"]


def lay_out_cache(home: Path, repo: str, files: dict[str, bytes]) -> None:
    """A Hugging Face cache laid out by hand (as huggingface_hub writes it) holding `files` of `repo`."""
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    for name, data in files.items():
        (folder / "snapshots" / revision / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "snapshots" / revision / name).write_bytes(data)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lay_out_cache(tmp_path, "org/repo-GGUF", {"repo-Q4_K_M.gguf": b"GGUF1", "repo-Q8_0.gguf": b"GGUF22",
                                              "mmproj-repo-F16.gguf": b"GGUF333"})
    lay_out_cache(tmp_path, "org/split-GGUF", {"split-Q4_K_M-00001-of-00002.gguf": b"GGUF"})  # a shard is missing
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    return tmp_path


def test_a_download_offline_of_a_model_not_in_the_cache_is_a_one_line_400(offline_cache: Path) -> None:
    for name in ("org/other-GGUF:Q4_K_M", "org/repo-GGUF:Q2_K", "org/split-GGUF:Q4_K_M"):
        with pytest.raises(InvalidRequestError) as refused:
            plan(name, ServerSettings(offline=True))
        message = refused.value.message
        assert "not in the Hugging Face cache" in message and "the network is off" in message, message
        assert "\n" not in message and refused.value.param == "model"


@pytest.mark.parametrize("offline", [{"offline": True}, {"env": "1"}])
def test_a_download_offline_of_a_cached_model_reads_its_files_from_the_cache(
        offline_cache: Path, monkeypatch: pytest.MonkeyPatch, offline: dict[str, object]) -> None:
    if "env" in offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    download = plan("org/repo-GGUF:Q8_0", ServerSettings(offline=offline.get("offline") is True))
    assert download.cached_only and download.repo == "org/repo-GGUF"
    assert download.files == ["repo-Q8_0.gguf", "mmproj-repo-F16.gguf"]  # the model, then its projector


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


def test_removing_a_cached_model_never_deletes_a_file_outside_the_cache(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache entry that is a link to a file elsewhere (a hand-made cache, a shared model) loses the link, not the
    file; a blob of the cache's own goes with its link."""
    outside = tmp_path / "shared" / "model.gguf"
    outside.parent.mkdir()
    outside.write_bytes(b"GGUF-shared")
    lay_out_cache(tmp_path, "org/linked-GGUF", {})
    repo = tmp_path / "hub" / "models--org--linked-GGUF"
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text()
    snapshot.mkdir(parents=True)
    (snapshot / "linked-Q4_K_M.gguf").symlink_to(outside)
    blob = repo / "blobs" / "0123abcd"
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF-own")
    (snapshot / "linked-Q8_0.gguf").symlink_to(blob)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert remove_cached("org/linked-GGUF:Q4_K_M") and outside.read_bytes() == b"GGUF-shared"
    assert not (snapshot / "linked-Q4_K_M.gguf").exists()
    assert remove_cached("org/linked-GGUF:Q8_0") and not blob.exists()
