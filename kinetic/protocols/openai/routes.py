"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models (chat and models also
without /v1; /completions and /embeddings without it are llama-server's native routes)."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kinetic.deps import RegistryDep, ServiceDep
from kinetic.errors import InvalidRequestError
from kinetic.protocols.openai import translate
from kinetic.protocols.openai.types import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from kinetic.router import listing
from kinetic.streaming import respond

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_request, prepared = await service.prepare_chat(translate.to_chat_request(body))
    ctx = translate.chat_context(body, prepared, model=service.model_name, fingerprint=service.system_fingerprint,
                                 generation=generation_request, verbose=service.settings.verbose)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.ChunkEncoder(ctx),
                         to_body=partial(translate.to_chat_completion, ctx=ctx))


@router.post("/v1/chat/completions/input_tokens")
@router.post("/chat/completions/input_tokens")
async def count_chat_completion_tokens(body: ChatCompletionRequest, service: ServiceDep) -> dict[str, int]:
    """llama-server's: the prompt tokens this chat request would take (tools and template included)."""
    return {"input_tokens": await service.count_chat_tokens(translate.to_chat_request(body))}


@router.post("/v1/completions")  # /completions (no v1) is llama-server's native route, as there
async def create_completion(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_request = await service.prepare_prompt(translate.to_prompt_request(body))
    ctx = translate.completion_context(body, model=service.model_name, fingerprint=service.system_fingerprint)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=bool(body.stream),
                         encoder=translate.CompletionChunkEncoder(ctx),
                         to_body=partial(translate.to_completion, ctx=ctx))


@router.post("/v1/embeddings")  # /embeddings (no v1) is llama-server's native route, as there
async def create_embeddings(body: EmbeddingRequest, service: ServiceDep) -> dict[str, Any]:
    service.require_embeddings()
    if service.engine.embedding_pooling == "none":
        raise InvalidRequestError("Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                                  param="input")
    items, params = translate.embedding_inputs(body)
    translate.check_dimensions(body, service.info.n_embd)
    inputs = await service.embedding_inputs(items, params)
    vectors = await service.embed(inputs)
    return translate.to_embeddings(body, inputs, vectors, service.model_name)


@router.get("/v1/models")
@router.get("/models")
async def list_models(registry: RegistryDep) -> dict[str, Any]:
    return listing.models_body(registry)
