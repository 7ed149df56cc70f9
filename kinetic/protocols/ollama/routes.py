"""Ollama routes: /api/version, /api/tags, /api/show, /api/ps, /api/chat, /api/generate, /api/embed
and the legacy /api/embeddings. (`GET /` lives with the web page.)"""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from kinetic.chat.types import PreparedChat
from kinetic.deps import RegistryDep, service_dependency
from kinetic.engine.types import GenerationRequest
from kinetic.protocols.ollama import translate
from kinetic.protocols.ollama.types import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ShowRequest
from kinetic.router.registry import ModelEntry
from kinetic.service import Service
from kinetic.streaming import respond

router = APIRouter()
NDJSON = "application/x-ndjson"


# In router mode the body's `model` picks the model; Ollama's own words when it is missing or unknown.
OllamaServiceDep = Annotated[Service, Depends(service_dependency(missing="model is required",
                                                                 unknown='model "{name}" not found'))]


def served(service: Service) -> translate.ServedModel:
    template = service.template
    return translate.ServedModel(name=service.model_name, aliases=service.aliases,
                                 thinks=template is not None and template.thinks, n_ctx=service.engine.slot_n_ctx,
                                 embeddings=service.engine.embedding_n_ctx > 0,
                                 generates=service.engine.can_generate)


def loaded(entry: ModelEntry) -> Service | None:
    return entry.service if entry.service is not None and entry.service.ready else None


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> dict[str, str]:
    return {"version": translate.OLLAMA_VERSION}


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(registry: RegistryDep) -> dict[str, Any]:
    """Every model (a router's unloaded ones by name only)."""
    return {"models": [translate.model_entry(served(s), s.info, await s.model_file()) if (s := loaded(e))
                       else translate.unloaded_entry(e.name) for e in registry.entries.values()]}


@router.get("/api/ps")
async def ps(registry: RegistryDep) -> dict[str, Any]:
    """The models loaded now."""
    return {"models": [translate.ps_entry(served(s), s.info, await s.model_file())
                       for e in registry.entries.values() if (s := loaded(e))]}


@router.post("/api/show")
async def show(body: ShowRequest, service: OllamaServiceDep) -> dict[str, Any]:
    model = served(service)
    translate.check_model(body.model or body.name or "", model)
    template = service.template.source if service.template is not None else ""
    return translate.show(model, service.info, await service.model_file(), template=template,
                          stop=(service.info.eos_token,), temperature=service.settings.temp)


@router.post("/api/chat")
async def chat(body: ChatRequest, request: Request, service: OllamaServiceDep) -> Response:
    started, model = time.monotonic_ns(), served(service)
    if translate.is_load_request(body):
        return JSONResponse(translate.load_reply(body, model))
    generation_request, prepared = await service.prepare_chat(translate.to_chat_request(body, model))
    generation_request = translate.limit_context(generation_request, body.options, model)
    ctx = translate.reply_context(body, prepared, started_ns=started)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=body.stream is not False, encoder=translate.LineEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx), media_type=NDJSON)


async def _prepare_generate(body: GenerateRequest, service: Service,
                            model: translate.ServedModel) -> tuple[GenerationRequest, PreparedChat]:
    """`raw` prompts go to the model verbatim; others through the chat template."""
    if body.raw:
        generation_request = await service.prepare_prompt(translate.to_prompt_request(body, model))
        prepared = translate.raw_prepared(generation_request)
    else:
        generation_request, prepared = await service.prepare_chat(translate.to_generate_chat(body, model))
    generation_request = translate.with_context(generation_request, body.context, service.info.bos_id)
    return translate.limit_context(generation_request, body.options, model), prepared


@router.post("/api/generate")
async def generate(body: GenerateRequest, request: Request, service: OllamaServiceDep) -> Response:
    started, model = time.monotonic_ns(), served(service)
    if translate.is_load_request(body):
        return JSONResponse(translate.load_reply(body, model))
    generation_request, prepared = await _prepare_generate(body, service, model)
    ctx = translate.reply_context(body, prepared, started_ns=started, prompt_tokens=generation_request.prompt_tokens)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=body.stream is not False, encoder=translate.LineEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx), media_type=NDJSON)


@router.post("/api/embed")
async def embed(body: EmbedRequest, service: OllamaServiceDep) -> dict[str, Any]:
    service.require_embeddings()
    started, model = time.monotonic_ns(), served(service)
    items, params = translate.embed_inputs(body, model)
    translate.check_dimensions(body.dimensions, service.info.n_embd)
    inputs = await service.embedding_inputs(items, params, truncate=body.truncate is not False) if items else []
    vectors = await service.embed(inputs) if inputs else []
    return translate.to_embed_response(body, inputs, vectors, started)


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, service: OllamaServiceDep) -> dict[str, Any]:
    service.require_embeddings()
    items = translate.embeddings_input(body, served(service))
    inputs = await service.embedding_inputs(items, ["prompt"], truncate=True) if items else []
    return translate.to_embeddings_response(await service.embed(inputs) if inputs else [])
