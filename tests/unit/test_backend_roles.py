"""The backends' roles (kinetic/backends/base.py): each backend has the roles its class names and no other, a
route that asks for a role its model's backend lacks gets the one shared 501 (`lacking`, naming the model and the
route) in its protocol's envelope, and a derived model over any backend is its base's backend with each request
dressed (model_registry/served.py), not a second backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from kinetic.backends.base import (
    LACKS,
    Adapters,
    Embedding,
    ForwardsTokenRoutes,
    Generating,
    Infilling,
    ModelBackend,
    ModelFiles,
    Pool,
    Reranking,
    Sleeping,
    Slots,
    Templating,
    Tokenizing,
    lacking,
    role,
)
from kinetic.backends.config import ModelConfig
from kinetic.backends.sources import ModelSpec, UpstreamSpec
from kinetic.backends.upstream.backend import UpstreamBackend
from kinetic.chat.types import ChatRequest, Message, PromptRequest, TextPart
from kinetic.config.settings import ServerSettings
from kinetic.errors import NotSupportedError
from kinetic.model_registry.derived import DerivedModel
from kinetic.model_registry.registry import ModelRegistry
from kinetic.model_registry.served import Served
from kinetic.server.app import create_app
from tests.scripted import ScriptedEngine, single_model_backend

UPSTREAM = ModelSpec(name="remote", upstreams=(UpstreamSpec(url="http://upstream:8000/v1", model="up"),))
UPSTREAM_ROLES = {Generating, Embedding, ForwardsTokenRoutes, Pool}
ALL_ROLES = set(LACKS)


def roles_of(backend: ModelBackend) -> set[type]:
    return {wanted for wanted in ALL_ROLES if isinstance(backend, wanted)}


def test_the_upstream_backend_has_only_the_roles_a_remote_server_gives_it() -> None:
    backend = UpstreamBackend(UPSTREAM, ModelConfig())
    assert roles_of(backend) == UPSTREAM_ROLES
    for lacked in (Infilling, Tokenizing, Templating, Reranking, Slots, Adapters, Sleeping, ModelFiles):
        assert not isinstance(backend, lacked), lacked
    # no stub answers for a role it lacks: the methods are simply not there
    for method in ("prepare_infill", "tokenize", "detokenize", "token_pieces", "count_chat_tokens", "render",
                   "with_template", "rerank", "slot_states", "slot_file", "lora_adapters", "set_lora_scales",
                   "sleep", "wake", "model_file"):
        assert method not in vars(UpstreamBackend), method


def test_the_local_backend_has_every_role_but_the_remote_ones() -> None:
    backend = single_model_backend(ServerSettings(), ScriptedEngine(["x"]), "local")
    assert roles_of(backend) == ALL_ROLES - {ForwardsTokenRoutes, Pool}


def test_a_missing_role_is_the_one_501_naming_the_model_and_the_route() -> None:
    backend = UpstreamBackend(UPSTREAM, ModelConfig())
    assert role(backend, Embedding, name="remote", route="/v1/embeddings") is backend
    with pytest.raises(NotSupportedError) as refused:
        role(backend, Tokenizing, name="alias", route="/tokenize")
    assert refused.value.status == 501
    assert refused.value.message == f"model 'alias' cannot serve /tokenize: {LACKS[Tokenizing]}"
    assert all(LACKS.values())  # every role has its words


@pytest.fixture()
def forwarded() -> list[dict[str, Any]]:
    return []


@pytest.fixture()
def client(forwarded: list[dict[str, Any]]) -> Iterator[TestClient]:
    """A router serving `remote` from one upstream that answers every chat "ok", and two derived models of it:
    `tutor` (a system prompt and options) and `templated` (a template of its own, which only a backend with the
    Templating role can render)."""

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the health probe
            return httpx.Response(200, json={"object": "list", "data": []})
        forwarded.append({"path": request.url.path, **json.loads(request.content)})
        chunks = [{"choices": [{"index": 0, "delta": {"content": "ok"}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]
        body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    def factory(spec: ModelSpec, lock: object) -> UpstreamBackend:
        backend = UpstreamBackend(spec, ModelConfig())
        backend.pool._client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
        return backend

    registry = ModelRegistry(ServerSettings(), [UPSTREAM], factory, router=True)
    registry.put_derived(DerivedModel(name="tutor", base="remote", system="Be brief."))
    registry.put_derived(DerivedModel(name="templated", base="remote", template="{{ messages[0].content }}"))
    with TestClient(create_app(registry)) as test_client:
        yield test_client


@pytest.mark.parametrize(("path", "body", "wanted", "envelope"), [
    ("/infill", {"input_prefix": "def f(", "input_suffix": ")"}, Infilling, "openai"),
    ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}, Tokenizing, "openai"),
    ("/v1/responses/input_tokens", {"input": "hi"}, Tokenizing, "openai"),
    ("/rerank", {"query": "q", "documents": ["a"]}, Reranking, "openai"),
    ("/api/show", {}, ModelFiles, "ollama"),
])
def test_a_route_whose_role_the_backend_lacks_answers_the_shared_501(client: TestClient, path: str,
                                                                     body: dict[str, Any], wanted: type,
                                                                     envelope: str) -> None:
    response = client.post(path, params={"model": "remote"}, json={**body, "model": "remote"})
    message = lacking("remote", path, LACKS[wanted]).message
    assert response.status_code == 501, response.text
    if envelope == "ollama":
        assert response.json() == {"error": message}
    else:
        error = response.json()["error"]
        assert (error["code"], error["type"], error["message"]) == (501, "not_supported_error", message)


def test_get_slots_of_a_remote_model_is_the_shared_501(client: TestClient) -> None:
    response = client.get("/slots", params={"model": "remote"})
    assert response.status_code == 501
    assert response.json()["error"]["message"] == lacking("remote", "/slots", LACKS[Slots]).message


def test_a_derived_model_over_an_upstream_is_its_base_with_each_request_dressed(
        client: TestClient, forwarded: list[dict[str, Any]]) -> None:
    reply = client.post("/v1/chat/completions", json={"model": "tutor", "messages": [
        {"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tutor"  # the name the request used
    assert [m["role"] for m in forwarded[-1]["messages"]] == ["system", "user"]
    assert forwarded[-1]["messages"][0]["content"] == "Be brief." and forwarded[-1]["model"] == "up"
    # its own template needs a backend that renders templates: the shared 501, naming the base model
    refused = client.post("/v1/chat/completions", json={"model": "templated", "messages": [
        {"role": "user", "content": "hi"}]})
    assert refused.status_code == 501
    assert refused.json()["error"]["message"] == lacking("remote", "a derived model's own chat template",
                                                         LACKS[Templating]).message


def test_served_dresses_only_a_derived_models_requests() -> None:
    backend = UpstreamBackend(UPSTREAM, ModelConfig())
    chat = ChatRequest(messages=(Message(role="user", parts=(TextPart("q"),)),))
    plain = Served(backend)
    assert plain.name == "remote" and plain.chat(chat) is chat and plain.template is None
    tutor = Served(backend, DerivedModel(name="tutor", base="remote", system="Be brief.", template="T"))
    assert tutor.name == "tutor" and tutor.aliases == ("tutor",) and tutor.template == "T"
    dressed = tutor.chat(chat)
    assert [m.role for m in dressed.messages] == ["system", "user"] and dressed.template == "T"
    assert tutor.prompt(PromptRequest(prompt="p")).prompt == "p"  # a raw prompt: the options only
    with pytest.raises(NotSupportedError, match="model 'tutor' cannot serve /tokenize"):
        tutor.role(Tokenizing, "/tokenize")
