"""Client row "Embeddings (OpenAI, LlamaIndex, LangChain)": /v1/embeddings with a
string, a list, token ids, lists of token ids, float and base64, through langchain-openai's
OpenAIEmbeddings, LlamaIndex's OpenAILikeEmbedding and plain HTTP, on the bundled decoder model
(mean pooling, normalised vectors)."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest

from tests.conftest import MODEL_ALIAS
from tests.server import KineticServer

N_EMBD = 640  # Gemma 3 270M


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (norm(a) * norm(b))


def test_langchain_openai_embeddings(live_server: KineticServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: send text, not tiktoken ids of an OpenAI tokenizer
    embeddings = OpenAIEmbeddings(base_url=live_server.url + "/v1", api_key="sk-test", model="local",
                                  check_embedding_ctx_length=False, max_retries=0)
    docs = embeddings.embed_documents(["The cat sat on the mat.", "A kitten rested on a rug.", "Stock prices fell."])
    query = embeddings.embed_query("The cat sat on the mat.")
    assert len(docs) == 3 and all(len(v) == N_EMBD for v in docs)
    assert all(math.isclose(norm(v), 1.0, rel_tol=1e-3) for v in docs)
    assert cosine(query, docs[0]) == pytest.approx(1.0, abs=1e-4)  # same text, same vector


def test_llamaindex_openai_like_embedding(live_server: KineticServer) -> None:
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    model = OpenAILikeEmbedding(model_name="local", api_base=live_server.url + "/v1", api_key="sk-test",
                                embed_batch_size=2, max_retries=0)
    vectors = model.get_text_embedding_batch(["one", "two", "three"])
    assert len(vectors) == 3 and all(len(v) == N_EMBD for v in vectors)
    assert model.get_query_embedding("one") == pytest.approx(vectors[0], abs=1e-5)


@pytest.mark.parametrize("path", ["/v1/embeddings"])  # /embeddings is llama-server's native route
def test_input_forms(base_url: str, path: str) -> None:
    tokens = httpx.post(base_url + "/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"]
    forms = {"string": "hello world", "strings": ["hello world", "goodbye"], "ids": tokens,
             "id lists": [tokens, tokens[:2]]}
    results = {}
    for name, value in forms.items():
        r = httpx.post(base_url + path, json={"input": value, "model": "whatever"}, timeout=60)
        assert r.status_code == 200, (name, r.text)
        body = r.json()
        assert body["object"] == "list" and body["model"] == MODEL_ALIAS
        assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
        assert all(d["object"] == "embedding" and math.isclose(norm(d["embedding"]), 1.0, rel_tol=1e-4)
                   for d in body["data"])
        results[name] = body
    assert len(results["strings"]["data"]) == 2 and len(results["id lists"]["data"]) == 2
    assert results["string"]["usage"] == {"prompt_tokens": len(tokens), "total_tokens": len(tokens)}
    assert results["id lists"]["usage"]["prompt_tokens"] == len(tokens) + 2
    # a text and its token ids give the same vector
    assert results["ids"]["data"][0]["embedding"] == pytest.approx(results["string"]["data"][0]["embedding"], abs=1e-5)


def test_base64_is_little_endian_float32(base_url: str) -> None:
    floats = httpx.post(base_url + "/v1/embeddings", json={"input": "hi"}).json()["data"][0]["embedding"]
    item = httpx.post(base_url + "/v1/embeddings", json={"input": "hi", "encoding_format": "base64"}).json()["data"][0]
    assert item["encoding_format"] == "base64"
    raw = base64.b64decode(item["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, abs=1e-6)


@pytest.mark.parametrize("body, words", [
    ({"input": []}, '"input" must not be empty'),
    ({"input": "word " * 3000}, "too large"),
    ({"input": "hi", "encoding_format": "int8"}, "float or base64"),
    ({"input": [[999999999]]}, "invalid tokens"),
    ({"input": "hi", "dimensions": 3}, "dimensions"),
])
def test_bad_inputs_are_400(base_url: str, body: dict, words: str) -> None:
    r = httpx.post(base_url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400 and words in r.json()["error"]["message"]


def test_without_embeddings_flag_is_501(model_lock: None) -> None:
    with KineticServer("-c", "512", "-np", "1") as server:
        r = httpx.post(server.url + "/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "This server does not support embeddings. Start it with `--embeddings`"
