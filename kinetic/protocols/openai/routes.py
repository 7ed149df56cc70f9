"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models (each also without /v1)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kinetic.deps import ServiceDep
from kinetic.protocols.openai import translate
from kinetic.protocols.openai.types import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from kinetic.service import Service
from kinetic.streaming import respond

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_request, prepared = await service.prepare_chat(translate.to_chat_request(body))
    ctx = translate.chat_context(body, prepared, model=service.model_name, fingerprint=service.system_fingerprint)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.ChunkEncoder(ctx),
                         to_body=partial(translate.to_chat_completion, ctx=ctx))


@router.post("/v1/completions")
@router.post("/completions")
async def create_completion(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_request = await service.prepare_prompt(translate.to_prompt_request(body))
    ctx = translate.completion_context(body, model=service.model_name, fingerprint=service.system_fingerprint)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=bool(body.stream),
                         encoder=translate.CompletionChunkEncoder(ctx),
                         to_body=partial(translate.to_completion, ctx=ctx))


@router.post("/v1/embeddings")
@router.post("/embeddings")
async def create_embeddings(body: EmbeddingRequest, service: ServiceDep) -> dict[str, Any]:
    service.require_embeddings()
    items, params = translate.embedding_inputs(body)
    translate.check_dimensions(body, service.info.n_embd)
    inputs = await service.embedding_inputs(items, params)
    vectors = await service.embed(inputs)
    return translate.to_embeddings(body, inputs, vectors, service.model_name)


def model_entry(service: Service) -> dict[str, Any]:
    info = service.info
    return {
        "id": service.model_name,
        "aliases": list(service.aliases),
        "tags": [],
        "object": "model",
        "created": int(time.time()),
        "owned_by": "llamacpp",
        "meta": {"vocab_type": info.vocab_type, "n_vocab": info.n_vocab, "n_ctx": service.engine.slot_n_ctx,
                 "n_ctx_train": info.n_ctx_train, "n_embd": info.n_embd, "n_params": info.n_params,
                 "size": info.size, "ftype": info.ftype},
    }


@router.get("/v1/models")
@router.get("/models")
async def list_models(service: ServiceDep) -> dict[str, Any]:
    name = service.model_name
    ollama_shaped = {"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
                     "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                     "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                                 "parameter_size": "", "quantization_level": ""}}
    return {"models": [ollama_shaped], "object": "list", "data": [model_entry(service)]}
