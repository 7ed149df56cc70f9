"""Every route of the protocol catalogue writes its ledger line whole: a route that generates, embeds or
ranks hands the ledger the counts its client was told, whole and streamed; every other route still
gets its line (method, status). A new route fails here until it is put in one table or the other, so a
new protocol cannot be recorded half (issue 30). Runs the real app over a scripted engine that also
embeds, ranks and fills in the middle."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from kinetic.classroom.ledger import LedgerRecord, read_ledger
from kinetic.config.settings import ServerSettings
from kinetic.engine.types import RankScore
from kinetic.protocols.catalog import PROTOCOLS
from tests.scripted import ReadyClient, ScriptedEngine, single_model_app

ASK = [{"role": "user", "content": "hi"}]
CHAT = {"model": "m", "messages": ASK, "max_tokens": 4}
# every generation route: the body of one request to it, and whether it streams too
GENERATION: dict[str, tuple[dict[str, Any], bool]] = {
    "/v1/chat/completions": (CHAT, True),
    "/chat/completions": (CHAT, True),
    "/v1/completions": ({"model": "m", "prompt": "Once", "max_tokens": 4}, True),
    "/completions": ({"prompt": "Once", "n_predict": 4}, True),
    "/completion": ({"prompt": "Once", "n_predict": 4}, True),
    "/infill": ({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4}, True),
    "/v1/responses": ({"model": "m", "input": "hi", "max_output_tokens": 4}, True),
    "/responses": ({"model": "m", "input": "hi", "max_output_tokens": 4}, True),
    "/v1/messages": (CHAT, True),
    "/api/chat": ({"model": "m", "messages": ASK, "options": {"num_predict": 4}, "stream": False}, True),
    "/api/generate": ({"model": "m", "prompt": "Once", "options": {"num_predict": 4}, "stream": False}, True),
    "/v1/embeddings": ({"model": "m", "input": ["one", "two"]}, False),
    "/embeddings": ({"content": "one"}, False),
    "/embedding": ({"content": "one"}, False),
    "/api/embed": ({"model": "m", "input": ["one", "two"]}, False),
    "/api/embeddings": ({"model": "m", "prompt": "one"}, False),
    "/rerank": ({"query": "q", "documents": ["a", "bb"]}, False),
    "/reranking": ({"query": "q", "documents": ["a", "bb"]}, False),
    "/v1/rerank": ({"query": "q", "documents": ["a", "bb"]}, False),
    "/v1/reranking": ({"query": "q", "documents": ["a", "bb"]}, False),
}
# routes that generate nothing: their lines carry no usage
OTHER = frozenset({
    "/", "/dashboard", "/dashboard/stats", "/ui/{name}", "/ui/config.json", "/health", "/v1/health", "/metrics",
    "/props", "/slots", "/slots/{id_slot}", "/models", "/v1/models", "/models/sse", "/models/load", "/models/unload",
    "/lora-adapters", "/tokenize", "/detokenize", "/apply-template", "/cors-proxy", "/v1/chat/completions/input_tokens",
    "/chat/completions/input_tokens", "/v1/responses/input_tokens", "/responses/input_tokens",
    "/v1/responses/{response_id}", "/responses/{response_id}", "/v1/responses/{response_id}/input_items",
    "/responses/{response_id}/input_items", "/v1/responses/{response_id}/cancel", "/responses/{response_id}/cancel",
    *(prefix + path for prefix in ("/v1", "") for path in (
        "/conversations", "/conversations/{conversation_id}", "/conversations/{conversation_id}/items",
        "/conversations/{conversation_id}/items/{item_id}")),
    *(prefix + path for prefix in ("/v1", "") for path in (  # a batch's lines are recorded as their own requests
        "/files", "/files/{file_id}", "/files/{file_id}/content", "/batches", "/batches/{batch_id}",
        "/batches/{batch_id}/cancel")),
    "/v1/messages/count_tokens", "/api/tags", "/api/version", "/api/ps", "/api/show",
    "/v1/chat/completions/control", "/models/drain", "/models/undrain",
    "/api/pull", "/api/create", "/api/copy", "/api/delete", "/api/push",
})
# generation routes that read an upload the scripted engine cannot hear: their ledger lines are checked on a live
# server, with a real projector (the test named)
TRANSCRIPTIONS = "tests/e2e/test_transcriptions.py::"
LIVE_ONLY = {
    "/v1/audio/transcriptions": TRANSCRIPTIONS + "test_the_ledger_records_the_audio_clip_and_its_tokens",
    "/audio/transcriptions": TRANSCRIPTIONS + "test_the_route_without_v1_is_the_same_route",
}
GENERATES = {path for path in GENERATION if "embed" not in path and "rerank" not in path}


class CountingEngine(ScriptedEngine):
    """The scripted engine with embeddings, a ranking head and fill-in-the-middle tokens."""

    embedding_pooling = "mean"

    def __init__(self) -> None:
        super().__init__(["Hel", "lo", "!"])
        self.loaded.set()
        self.info = replace(self.info, fim_tokens={"pre": 1, "suf": 2, "mid": 3})

    @property
    def embedding_n_ctx(self) -> int:
        return 4096

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        return [[1.0, 0.0, 0.0, 0.0] for _ in inputs]

    def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        return [[[1.0, 0.0, 0.0, 0.0]] for _ in inputs]

    def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        return [RankScore(score=0.5, n_tokens=len(query) + len(document)) for document in documents]


def catalogue_routes() -> set[str]:
    return {route.path for protocol in PROTOCOLS for route in protocol.router.routes if isinstance(route, APIRoute)}


def test_every_route_of_the_catalogue_is_in_one_table() -> None:
    routes = catalogue_routes()
    unknown = routes - set(GENERATION) - OTHER - set(LIVE_ONLY)
    for test in LIVE_ONLY.values():
        module, _, name = test.partition("::")
        assert f"def {name}(" in (Path(__file__).resolve().parents[2] / module).read_text(encoding="utf-8"), test
    assert not unknown, f"say in {__file__} whether these routes generate (and how to call them): {sorted(unknown)}"
    assert not set(GENERATION) & OTHER and set(GENERATION) <= routes


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], LedgerRecord]:
    """Each generation route called once whole and once streamed (where it streams): its ledger line."""
    ledger = tmp_path_factory.mktemp("catalog") / "ledger.jsonl"
    settings = ServerSettings(embeddings=True, rerank=True, ledger=str(ledger))
    lines: dict[tuple[str, bool], LedgerRecord] = {}
    with ReadyClient(single_model_app(settings, CountingEngine(), "m")) as client:
        for path, (body, streams) in GENERATION.items():
            for stream in (False, True) if streams else (False,):
                response = client.post(path, json={**body, "stream": stream})
                assert response.status_code == 200, (path, response.text)
                line = read_ledger(ledger)[-1]
                assert line.route == path and line.stream == stream
                lines[(path, stream)] = line
    return lines


@pytest.mark.parametrize("path", sorted(GENERATION))
def test_a_generation_route_writes_its_usage(recorded: dict[tuple[str, bool], LedgerRecord], path: str) -> None:
    for (route, stream), line in recorded.items():
        if route != path:
            continue
        assert line.status == 200 and line.error is None and line.model, (route, stream)
        assert line.prompt_tokens is not None and line.prompt_tokens > 0, (route, stream)
        assert line.completion_tokens is not None and line.total_tokens == line.prompt_tokens + line.completion_tokens
        if route in GENERATES:
            assert line.completion_tokens == 3 and line.finish_reason and line.timings is not None, (route, stream)
            assert line.chunks == (3 if stream else None), (route, stream)


def test_other_routes_still_get_their_line(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    settings = ServerSettings(ledger=str(ledger), metrics=True)
    with ReadyClient(single_model_app(settings, CountingEngine(), "m")) as client:
        assert client.get("/v1/models").status_code == 200
        assert client.post("/tokenize", json={"content": "ab"}).status_code == 200
        assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    models, tokenize, bad = read_ledger(ledger)[-3:]
    assert (models.method, models.route, models.status, models.prompt_tokens) == ("GET", "/v1/models", 200, None)
    assert (tokenize.route, tokenize.prompt_tokens, tokenize.error) == ("/tokenize", None, None)
    assert bad.status == 400 and bad.error is not None and "messages" in (bad.error.message or "")
