"""Ollama routes: /api/version, /api/tags, /api/show, /api/ps, /api/chat, /api/generate, /api/embed
and the legacy /api/embeddings; model management (/api/pull, /api/create...) is manage_routes.py's.
(`GET /` lives with the web page.)"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from kinetic.backends.base import Embedding, Generating, ModelBackend, ModelFiles, embeddings_off
from kinetic.chat.types import AnswerFormat, PreparedRequest
from kinetic.classroom.request_record import RequestRecord
from kinetic.model_registry.deps import CallerDep, RecordDep, RegistryDep, served_dependency
from kinetic.model_registry.derived import DerivedModel
from kinetic.model_registry.listing import derived_models
from kinetic.model_registry.registry import ModelEntry
from kinetic.model_registry.served import Served
from kinetic.protocols.common.streaming import respond
from kinetic.protocols.ollama import manage_routes, translate
from kinetic.protocols.ollama.types import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ShowRequest

router = APIRouter()
router.include_router(manage_routes.router)
NDJSON = "application/x-ndjson"


# In router mode the body's `model` picks the model; Ollama's own words when it is missing or unknown.
OllamaServedDep = Annotated[Served, Depends(served_dependency(missing="model is required",
                                                              unknown='model "{name}" not found'))]


async def shown_name(request: Request, registry: RegistryDep) -> None:
    """/api/show's name held to Ollama's grammar (a 400) before the model is looked up (a 404)."""
    try:
        body = json.loads(await request.body() or b"null")  # Starlette keeps the bytes for the route's own parse
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # the route's validation answers the bad body
    name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
    if isinstance(name, str) and name:
        manage_routes.known_or_valid(registry, name, "model")


def served_model(served: Served) -> translate.ServedModel:
    described, capabilities = served.describe(), served.backend.capabilities
    template = described.template
    return translate.ServedModel(name=described.name, aliases=described.aliases,
                                 thinks=template is not None and template.thinks, n_ctx=described.n_ctx,
                                 embeddings=capabilities.embeddings, generates=capabilities.generate,
                                 vision=described.modalities.vision)


def loaded(entry: ModelEntry) -> ModelBackend | None:
    """A loaded model whose file kinetic reads (a remote one is listed by name only)."""
    backend = entry.backend
    return backend if backend is not None and backend.ready and isinstance(backend, ModelFiles) else None


async def _listed(served: Served, route: str) -> tuple[translate.ServedModel, Any, Any]:
    files = served.role(ModelFiles, route)
    return served_model(served), served.describe().info, await files.model_file()


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> dict[str, str]:
    return {"version": translate.OLLAMA_VERSION}


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(registry: RegistryDep, caller: CallerDep) -> dict[str, Any]:
    """Every model the key may use (a router's unloaded ones, and remote ones, by name only), then the derived
    ones."""
    allows = caller.limits.allows_model
    served: list[tuple[ModelEntry, DerivedModel | None]] = [(e, None) for e in registry.entries.values()
                                                            if allows(e.spec.names) and not e.spec.hidden]
    served += [(base, m) for m, base in derived_models(registry) if allows((m.name,)) and allows(base.spec.names)]
    return {"models": [translate.model_entry(*await _listed(Served(b, m), "/api/tags"))
                       if (b := loaded(e)) else translate.unloaded_entry(e.name if m is None else m.name)
                       for e, m in served]}


@router.get("/api/ps")
async def ps(registry: RegistryDep, caller: CallerDep) -> dict[str, Any]:
    """The models loaded now (those the key may use)."""
    return {"models": [translate.ps_entry(*await _listed(Served(b), "/api/ps")) for e in registry.entries.values()
                       if (b := loaded(e)) and caller.limits.allows_model(e.spec.names)]}


@router.post("/api/show", dependencies=[Depends(shown_name)])  # listed first: it runs before the lookup
async def show(body: ShowRequest, request: Request, served: OllamaServedDep) -> dict[str, Any]:
    model = served_model(served)
    translate.check_model(body.model or body.name or "", model)
    files = served.role(ModelFiles, request.url.path)
    described = served.describe()
    info = described.info
    assert info is not None  # a model whose file is here: kinetic read it
    template = described.template.source if described.template is not None else ""
    return translate.show(model, info, await files.model_file(), template=template, stop=(info.eos_token,),
                          temperature=served.backend.config.temperature)


@router.post("/api/chat")
async def chat(body: ChatRequest, request: Request, served: OllamaServedDep, record: RecordDep) -> Response:
    started, model = time.monotonic_ns(), served_model(served)
    if translate.is_load_request(body):
        return JSONResponse(translate.load_reply(body, model))
    backend = served.role(Generating, request.url.path)
    generation_request, answer_format = await backend.prepare_chat(served.chat(translate.to_chat_request(body, model)),
                                                                   record)
    ctx = translate.reply_context(body, answer_format, started_ns=started)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=body.stream is not False, encoder=translate.LineEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx), media_type=NDJSON)


async def _prepare_generate(body: GenerateRequest, served: Served, backend: Generating[Any],
                            model: translate.ServedModel,
                            record: RequestRecord) -> tuple[PreparedRequest, AnswerFormat]:
    """`raw` prompts go to the model verbatim; others through the chat template."""
    if body.raw:
        # no template: every generated character is the response
        return (await backend.prepare_prompt(served.prompt(translate.to_prompt_request(body, model)), record),
                AnswerFormat())
    return await backend.prepare_chat(served.chat(translate.to_generate_chat(body, model)), record)


@router.post("/api/generate")
async def generate(body: GenerateRequest, request: Request, served: OllamaServedDep, record: RecordDep) -> Response:
    started, model = time.monotonic_ns(), served_model(served)
    if translate.is_load_request(body):
        return JSONResponse(translate.load_reply(body, model))
    backend = served.role(Generating, request.url.path)
    generation_request, answer_format = await _prepare_generate(body, served, backend, model, record)
    # an image's stand-ins are no tokens a client could send back as `context`: left out
    ctx = translate.reply_context(body, answer_format, started_ns=started, prompt_tokens=generation_request.text_tokens)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=body.stream is not False, encoder=translate.LineEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx), media_type=NDJSON)


@router.post("/api/embed")
async def embed(body: EmbedRequest, request: Request, served: OllamaServedDep, record: RecordDep) -> dict[str, Any]:
    backend = served.role(Embedding, request.url.path)
    if not served.backend.capabilities.embeddings:
        raise embeddings_off()
    started, model = time.monotonic_ns(), served_model(served)
    items, params = translate.embed_inputs(body, model)
    described = served.describe()
    if described.info is not None:  # a remote model's width is the server's behind it to check
        translate.check_dimensions(body.dimensions, described.info.n_embd)
    embedded = await backend.embed(items, params, record, truncate=body.truncate is not False)
    record.add_count(model=body.model, prompt_tokens=embedded.n_tokens)
    return translate.to_embed_response(body, embedded.n_tokens, embedded.vectors, started)


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request, served: OllamaServedDep,
                     record: RecordDep) -> dict[str, Any]:
    backend = served.role(Embedding, request.url.path)
    if not served.backend.capabilities.embeddings:
        raise embeddings_off()
    items = translate.embeddings_input(body, served_model(served))
    embedded = await backend.embed(items, ["prompt"], record, truncate=True)
    # the legacy answer shows no count; the ledger keeps what the model read all the same
    record.add_count(model=body.model, prompt_tokens=embedded.n_tokens)
    return translate.to_embeddings_response(embedded.vectors)
