"""POST /rerank (and /reranking, /v1/rerank, /v1/reranking): llama-server's JSON both ways. Pure.

Two request shapes, as llama-server reads them: Jina's (`documents`, answered with `results` of `index` and
`relevance_score`, plus `model`, `object` and `usage`) and TEI's (`texts`, answered with a bare array of `index`
and `score`, with the `text` when `return_text` is true). Both are sorted by score, best first, and cut to
`top_n`. Jina's `return_documents: true` adds each result's `document: {"text": ...}` (llama-server ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kinetic.engine.types import RankScore
from kinetic.errors import InvalidRequestError


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    top_n: int
    tei: bool  # the body named its documents `texts`: TEI's answer shape
    return_text: bool
    model: str | None


def rerank_request(body: Any) -> RerankRequest:
    """The body llama-server's post_rerank takes; a 400 naming the field otherwise."""
    if not isinstance(body, dict):
        raise InvalidRequestError("Invalid request body: expected a JSON object", param="body")
    if "query" not in body:
        raise InvalidRequestError('"query" must be provided', param="query")
    if not isinstance(body["query"], str):
        raise InvalidRequestError('"query" must be a string', param="query")
    tei = "texts" in body
    documents = body.get("documents", body.get("texts"))
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise InvalidRequestError('"documents" must be a non-empty string array', param="documents")
    top_n = body.get("top_n", len(documents))
    if not isinstance(top_n, int) or isinstance(top_n, bool):
        raise InvalidRequestError('"top_n" must be an integer', param="top_n")
    wants_text = body.get("return_text" if tei else "return_documents", False) is True
    model = body.get("model")
    return RerankRequest(query=body["query"], documents=documents, top_n=top_n, tei=tei, return_text=wants_text,
                         model=model if isinstance(model, str) else None)


def to_rerank_body(request: RerankRequest, scores: list[RankScore], *, model: str) -> Any:
    """llama-server's format_response_rerank: ranked results, best first, at most top_n."""
    label = "score" if request.tei else "relevance_score"
    results: list[dict[str, Any]] = []
    for index, ranked in enumerate(scores):
        result: dict[str, Any] = {"index": index, label: ranked.score}
        if request.return_text:
            text = request.documents[index]
            result.update({"text": text} if request.tei else {"document": {"text": text}})
        results.append(result)
    results.sort(key=lambda result: result[label], reverse=True)  # stable: ties keep the documents' order
    results = results[:max(request.top_n, 0)]
    if request.tei:
        return results
    n_tokens = sum(ranked.n_tokens for ranked in scores)
    return {"model": request.model or model, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}
