"""llama-server native routes: /health, /props, /slots, /metrics, /completion (and /completions),
/infill, /embedding (and /embeddings), /rerank (and its aliases), /tokenize, /detokenize, /apply-template,
/cors-proxy."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from kinetic import __version__, slot_folder
from kinetic.classroom.identity import CLIENT
from kinetic.classroom.roles import Role
from kinetic.deps import RegistryDep, ServiceDep, model_service
from kinetic.engine.base import submit_together
from kinetic.engine.types import GenerationRequest
from kinetic.errors import InvalidRequestError, NotFoundError, NotSupportedError, UnavailableError
from kinetic.protocols.common import translate as common
from kinetic.protocols.llamacpp import cors_proxy, rerank, translate
from kinetic.protocols.llamacpp.types import (
    ApplyTemplateRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    InfillRequest,
    ModelActionRequest,
    SlotActionRequest,
    TokenizeRequest,
)
from kinetic.router.registry import ModelState
from kinetic.service import Service
from kinetic.streaming import respond, respond_many

router = APIRouter()
router.include_router(cors_proxy.router)
BUILD_INFO = f"b{__version__}-kinetic"


@router.get("/health")
@router.get("/v1/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}  # the gate answers 503 while the (single) model loads


@router.get("/props")
async def get_props(request: Request, registry: RegistryDep) -> dict[str, Any]:
    if registry.router and not request.query_params.get("model"):
        return translate.router_props(max_instances=registry.settings.models_max,
                                      autoload=registry.settings.models_autoload, build_info=BUILD_INFO)
    async with model_service(request, wake=False) as service:  # answered asleep (--sleep-idle-seconds)
        return translate.props(service)


@router.post("/models/load")
async def load_model(body: ModelActionRequest, registry: RegistryDep) -> dict[str, bool]:
    entry = registry.find(body.model) if registry.router else None
    if entry is None:
        raise NotFoundError("model is not found" if registry.router else "File Not Found", param="model")
    if entry.state is not ModelState.UNLOADED:
        raise InvalidRequestError("model is already running", param="model")
    await registry.load(entry)
    return {"success": True}


@router.get("/models/sse")
async def models_sse(registry: RegistryDep) -> StreamingResponse:
    """Model state changes as they happen (router/events.py), as llama-server's router streams them."""
    if not registry.router:
        raise NotFoundError("File Not Found")
    return StreamingResponse(registry.events.stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/models/unload")
async def unload_model(body: ModelActionRequest, registry: RegistryDep) -> dict[str, bool]:
    if not registry.router:
        raise NotFoundError("File Not Found")
    entry = registry.find(body.model)
    if entry is None:
        raise InvalidRequestError("model is not found", param="model")
    if entry.state is not ModelState.LOADED:
        raise InvalidRequestError("model is not running", param="model")
    await registry.unload(entry)
    return {"success": True}


@router.post("/props")
async def set_props(service: ServiceDep) -> dict[str, Any]:
    if not service.settings.props:
        raise NotSupportedError("This server does not support changing global properties. Start it with `--props`")
    return {"success": True}  # as in llama-server, no property is changeable yet


def _viewer(request: Request) -> str | None:
    """None for the admin (who sees every client), else the caller's own name (classroom/roles.py)."""
    if getattr(request.state, "role", Role.ADMIN) is Role.ADMIN:
        return None
    return CLIENT.get()


@router.get("/slots")
async def get_slots(request: Request, service: ServiceDep, fail_on_no_slot: str | None = None) -> list[dict[str, Any]]:
    if not service.settings.slots:
        raise NotSupportedError("This server does not support slots endpoint. Start it with `--slots`")
    states = service.engine.slot_states()
    if fail_on_no_slot and all(slot.is_processing for slot in states):
        raise UnavailableError("no slot available")
    return translate.slots(states, service.engine.slot_n_ctx, viewer=_viewer(request),
                           speculative=bool(service.engine.speculative_types))


@router.post("/slots/{id_slot}")
async def slot_action(id_slot: str, request: Request, service: ServiceDep, action: str = "") -> dict[str, Any]:
    if not service.settings.slot_save_path:
        raise NotSupportedError("This server does not support slots action. Start it with `--slot-save-path`")
    try:
        slot = int(id_slot)
    except ValueError:
        raise InvalidRequestError("Invalid slot ID", param="id_slot") from None
    engine = service.engine
    if action == "erase":
        return translate.slot_file(action, await anyio.to_thread.run_sync(engine.slot_erase, slot), None)
    if action not in ("save", "restore"):
        raise InvalidRequestError("Invalid action", param="action")
    try:
        body = SlotActionRequest.model_validate_json(await request.body() or b"{}")
    except ValueError:  # not JSON, or a filename that is not a string
        raise InvalidRequestError("Invalid filename", param="filename") from None
    filename = translate.slot_filename(body.filename)
    folder = service.settings.slot_save_path
    path = slot_folder.slot_path(folder, filename)
    if action == "restore":
        return translate.slot_file(action, await anyio.to_thread.run_sync(engine.slot_restore, slot, path), filename)
    cap = service.settings.slot_save_max
    await anyio.to_thread.run_sync(slot_folder.check_room, folder, cap)  # already full: nothing is written
    result = await anyio.to_thread.run_sync(engine.slot_save, slot, path)
    await anyio.to_thread.run_sync(slot_folder.check_room, folder, cap, path)
    return translate.slot_file(action, result, filename)


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    async with model_service(request, wake=False) as service:  # answered asleep: a scraper keeps no model up
        return _metrics(request, service)


def _metrics(request: Request, service: Service) -> Response:
    if not service.settings.metrics:
        raise NotSupportedError("This server does not support metrics endpoint. Start it with `--metrics`")
    response = PlainTextResponse(translate.metrics_text(service.engine.stats(scrape=True), viewer=_viewer(request)),
                                 media_type="text/plain; version=0.0.4")
    # spelled as llama-server spells it: its own test suite reads the header with this exact case
    response.raw_headers.append((b"Process-Start-Time-Unix", str(service.started).encode()))
    return response


@router.post("/completion")
@router.post("/completions")  # no /v1: llama-server answers it natively too (docs/reference/native.md)
async def completion(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_requests = [await service.prepare_prompt(r)
                           for r in translate.to_prompt_requests(body, n_slots=service.engine.n_slots)]
    # one result is an object, several an array (llama-server's rule)
    return await _generate(body, generation_requests, request, service, several=len(generation_requests) > 1)


@router.post("/infill")
async def infill(body: InfillRequest, request: Request, service: ServiceDep) -> Response:
    service.require_infill()
    generation_request = await service.prepare_infill(translate.to_infill_request(body))
    return await _generate(body, [generation_request], request, service, several=False)


async def _generate(body: CompletionRequest | InfillRequest, generation_requests: list[GenerationRequest],
                    request: Request, service: Service, *, several: bool) -> Response:
    contexts = [translate.native_context(body, g, model=service.model_name, index=i,
                                         prompt_text=service.engine.detokenize(g.prompt_tokens, special=True))
                for i, g in enumerate(generation_requests)]
    generations = await submit_together(service.engine, generation_requests)
    if not several:
        ctx = contexts[0]
        return await respond(request, generations[0], stream=bool(body.stream), encoder=translate.NativeEncoder(ctx),
                             to_body=partial(translate.to_completion, ctx=ctx))
    return await respond_many(request, generations, stream=bool(body.stream),
                              encoders=[translate.NativeEncoder(ctx) for ctx in contexts],
                              to_body=lambda i, deltas, finished: translate.to_completion(deltas, finished,
                                                                                          contexts[i]))


@router.post("/embedding")
@router.post("/embeddings")  # no /v1: llama-server's native shape, as /embedding
async def embedding(body: EmbeddingRequest, service: ServiceDep) -> list[dict[str, Any]]:
    service.require_embeddings()
    items, params = translate.embedding_inputs(body)
    inputs = await service.embedding_inputs(items, params)
    vectors = await service.embed_all(inputs)
    return translate.to_native_embeddings(vectors, pooling=service.engine.embedding_pooling,
                                          embd_normalize=body.embd_normalize if body.embd_normalize is not None
                                          else service.settings.embd_normalize)


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank_documents(request: Request, service: ServiceDep) -> Any:
    if not service.settings.serves_rerank:  # checked before the body, as llama-server does
        raise NotSupportedError("This server does not support reranking. Start it with `--reranking`")
    try:
        raw = await request.json()
    except ValueError:
        raise InvalidRequestError("Invalid JSON body", param="body") from None
    body = rerank.rerank_request(raw)
    scores = await service.rerank(body.query, body.documents)
    return rerank.to_rerank_body(body, scores, model=service.model_name)


@router.get("/lora-adapters")
async def lora_adapters(service: ServiceDep) -> list[dict[str, Any]]:
    return service.lora_adapters()


@router.post("/lora-adapters")
async def set_lora_adapters(request: Request, service: ServiceDep) -> dict[str, bool]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequestError("Invalid JSON body: expected an array of {id, scale}", param="body") from None
    await service.set_lora_scales(translate.lora_scales(body))
    return {"success": True}


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, service: ServiceDep) -> dict[str, Any]:
    if (answer := await service.forward_native("/tokenize", body.model_dump(exclude_unset=True))) is not None:
        return answer
    return await anyio.to_thread.run_sync(translate.tokenize, body, service.engine)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, service: ServiceDep) -> dict[str, str]:
    if (answer := await service.forward_native("/detokenize", body.model_dump(exclude_unset=True))) is not None:
        return answer
    return await anyio.to_thread.run_sync(translate.detokenize, body, service.engine)


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, service: ServiceDep) -> dict[str, str]:
    if (answer := await service.forward_native("/apply-template", body.model_dump(exclude_unset=True))) is not None:
        return answer
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    rendered = await service.render(common.to_messages(body.messages), tools=tools,
                                    template_kwargs=body.chat_template_kwargs,
                                    add_generation_prompt=body.add_generation_prompt,
                                    continue_final_message=common.continuation(body.continue_final_message))
    return {"prompt": rendered.prompt}
