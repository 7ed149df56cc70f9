"""llama-server native routes: /health, /props, /slots, /metrics, /completion (and /completions),
/infill, /embedding (and /embeddings), /rerank (and its aliases), /tokenize, /detokenize, /apply-template,
/cors-proxy; the router's /models/load, /models/unload, /models/sse (POST and DELETE /models: model_routes.py),
the resumable streams' /v1/stream and /v1/streams/lookup (stream_routes.py), and kinetic's /models/drain and
/models/undrain."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from kinetic import __version__
from kinetic.backends.base import ModelBackend, embeddings_off, lacking, require, rerank_off
from kinetic.chat.types import PreparedRequest
from kinetic.classroom.request_record import caller_of
from kinetic.classroom.roles import Role
from kinetic.engine.types import Offload
from kinetic.errors import (
    InvalidRequestError,
    NotFoundError,
    NotSupportedError,
    RecordUnwritableError,
    UnavailableError,
)
from kinetic.model_registry.deps import BackendDep, RecordDep, RegistryDep, model_backend
from kinetic.model_registry.deps import server_state as app_state
from kinetic.model_registry.registry import ModelRegistry, ModelState
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.streaming import respond, respond_many
from kinetic.protocols.llamacpp import (
    cors_proxy,
    metrics,
    model_routes,
    rerank,
    server_state,
    slot_folder,
    stream_routes,
    tokens,
    translate,
)
from kinetic.protocols.llamacpp.types import (
    ApplyTemplateRequest,
    CompletionRequest,
    DetokenizeRequest,
    DrainRequest,
    EmbeddingRequest,
    InfillRequest,
    ModelActionRequest,
    SlotActionRequest,
    TokenizeRequest,
)

router = APIRouter()
router.include_router(cors_proxy.router)
router.include_router(model_routes.router)
router.include_router(stream_routes.router)
BUILD_INFO = f"b{__version__}-kinetic"


@router.get("/health")
@router.get("/v1/health")
async def health(request: Request) -> dict[str, str]:
    """llama-server's `{"status": "ok"}` (the gate answers 503 while the single model loads), kept
    exactly so while all is well (a lab's students paste it). With --ledger, while the class record
    cannot be written this is a 503 naming it, as requests are; with --ledger-best-effort, which serves
    anyway, a 200 whose `ledger` field says why requests go unrecorded."""
    ledger = app_state(request.app).ledger
    if ledger is None or ledger.writable():  # a probe write: space freed is seen here, before the next request
        return {"status": "ok"}
    problem = ledger.problem or "cannot write the class record"
    if not ledger.best_effort:
        raise RecordUnwritableError(problem)
    return {"status": "ok", "ledger": problem}


@router.get("/props")
async def get_props(request: Request, registry: RegistryDep) -> dict[str, Any]:
    if registry.router and not request.query_params.get("model"):
        return server_state.router_props(max_instances=registry.settings.models_max,
                                      autoload=registry.settings.models_autoload, build_info=BUILD_INFO)
    async with model_backend(request, wake=False) as backend:  # answered asleep (--sleep-idle-seconds)
        return server_state.props(served_state(backend, request.url.path))


def served_state(backend: ModelBackend, route: str) -> server_state.ServedState:
    described, switches = backend.describe(), backend.config.switches
    if described.info is None:
        raise lacking(backend.name, route, "it is served by another server, whose properties are its own")
    template = described.template
    return server_state.ServedState(
        alias=backend.name, info=described.info, n_ctx=described.n_ctx, n_slots=described.n_slots,
        sampling=backend.config.defaults.sampling, n_predict=backend.config.defaults.n_predict,
        n_keep=backend.config.defaults.n_keep,
        template_source=template.source if template else "", template_origin=template.origin if template else "",
        build_info=described.fingerprint, endpoint_slots=switches.slots, endpoint_props=switches.props,
        endpoint_metrics=switches.metrics, ui_settings=switches.ui_settings, llama_params=switches.llama_params,
        is_sleeping=backend.sleeping, speculative_types=described.speculative_types,
        modalities=described.modalities, media_marker=described.media_marker)


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
    """Model state changes as they happen (model_registry/events.py), as llama-server's router streams them."""
    if not registry.router:
        raise NotFoundError("File Not Found")
    return StreamingResponse(registry.events.stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/models/unload")
async def unload_model(body: ModelActionRequest, registry: RegistryDep) -> dict[str, bool]:
    if not registry.router:
        raise NotFoundError("File Not Found")
    if await registry.downloads.cancel(body.model):  # a download under way (POST /models) ends here
        return {"success": True}
    entry = registry.find(body.model)
    if entry is None:
        raise InvalidRequestError("model is not found", param="model")
    if entry.state is not ModelState.LOADED:
        raise InvalidRequestError("model is not running", param="model")
    await registry.unload(entry)
    return {"success": True}


@router.post("/props")
async def set_props(backend: BackendDep) -> dict[str, Any]:
    if not backend.config.switches.props:
        raise NotSupportedError("This server does not support changing global properties. Start it with `--props`")
    return {"success": True}  # as in llama-server, no property is changeable yet


def _viewer(request: Request) -> str | None:
    """None for the admin (who sees every client), else the caller's own name (classroom/roles.py)."""
    caller = caller_of(request)
    return None if caller.role is Role.ADMIN else caller.queue_name


@router.get("/slots")
async def get_slots(request: Request, backend: BackendDep, fail_on_no_slot: str | None = None) -> list[dict[str, Any]]:
    if not backend.config.switches.slots:
        raise NotSupportedError("This server does not support slots endpoint. Start it with `--slots`")
    require(backend.capabilities.slots, backend, request.url.path, "its slots are the server's behind it")
    states = backend.slot_states()
    if fail_on_no_slot and all(slot.is_processing for slot in states):
        raise UnavailableError("no slot available")
    described = backend.describe()
    return server_state.slots(states, described.n_ctx, viewer=_viewer(request),
                              speculative=described.speculative_types)


@router.post("/slots/{id_slot}")
async def slot_action(id_slot: str, request: Request, backend: BackendDep, action: str = "") -> dict[str, Any]:
    folder = backend.config.switches.slot_save_path
    if not folder:
        raise NotSupportedError("This server does not support slots action. Start it with `--slot-save-path`")
    try:
        slot = int(id_slot)
    except ValueError:
        raise InvalidRequestError("Invalid slot ID", param="id_slot") from None
    require(backend.capabilities.slots, backend, request.url.path, "its slots are the server's behind it")
    if action == "erase":
        return server_state.slot_file(action, await backend.slot_file(action, slot, None), None)
    if action not in ("save", "restore"):
        raise InvalidRequestError("Invalid action", param="action")
    try:
        body = SlotActionRequest.model_validate_json(await request.body() or b"{}")
    except ValueError:  # not JSON, or a filename that is not a string
        raise InvalidRequestError("Invalid filename", param="filename") from None
    filename = server_state.slot_filename(body.filename)
    path = slot_folder.slot_path(folder, filename)
    if action == "restore":
        return server_state.slot_file(action, await backend.slot_file(action, slot, path), filename)
    cap = backend.config.switches.slot_save_max
    await anyio.to_thread.run_sync(slot_folder.check_room, folder, cap)  # already full: nothing is written
    result = await backend.slot_file(action, slot, path)
    await anyio.to_thread.run_sync(slot_folder.check_room, folder, cap, path)
    return server_state.slot_file(action, result, filename)


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    async with model_backend(request, wake=False) as backend:  # answered asleep: a scraper keeps no model up
        return _metrics(request, backend)


def _offload(backend: ModelBackend) -> Offload | None:
    """Where the model runs, once it is loaded (a model another server runs has no such lines)."""
    try:
        info = backend.describe().info
    except UnavailableError:  # still loading: the counters show, the devices not yet
        return None
    return info.offload if info is not None else None


def _metrics(request: Request, backend: ModelBackend) -> Response:
    if not backend.config.switches.metrics:
        raise NotSupportedError("This server does not support metrics endpoint. Start it with `--metrics`")
    text = metrics.metrics_text(backend.stats(scrape=True), viewer=_viewer(request),
                                  by_key=app_state(request.app).class_stats.figures_by_key(), offload=_offload(backend))
    response = PlainTextResponse(text, media_type="text/plain; version=0.0.4")
    # spelled as llama-server spells it: its own test suite reads the header with this exact case
    response.raw_headers.append((b"Process-Start-Time-Unix", str(backend.started).encode()))
    return response


@router.post("/completion")
@router.post("/completions")  # no /v1: llama-server answers it natively too (docs/reference/native.md)
async def completion(body: CompletionRequest, request: Request, backend: BackendDep, record: RecordDep) -> Response:
    generation_requests = [await backend.prepare_prompt(r, record)
                           for r in translate.to_prompt_requests(body, n_slots=backend.describe().n_slots)]
    # one result is an object, several an array (llama-server's rule)
    return await _generate(body, generation_requests, request, backend, several=len(generation_requests) > 1)


@router.post("/infill")
async def infill(body: InfillRequest, request: Request, backend: BackendDep, record: RecordDep) -> Response:
    require(backend.capabilities.infill, backend, request.url.path, "the server behind it is reached by its "
            "OpenAI routes, which have no fill-in-the-middle")
    generation_request = await backend.prepare_infill(translate.to_infill_request(body), record)
    return await _generate(body, [generation_request], request, backend, several=False)


async def _generate(body: CompletionRequest | InfillRequest, generation_requests: list[PreparedRequest],
                    request: Request, backend: ModelBackend, *, several: bool) -> Response:
    speculative = backend.describe().speculative_types
    contexts = [translate.native_context(body, g, model=backend.name, index=i, prompt_text=backend.prompt_text(g),
                                         speculative=speculative) for i, g in enumerate(generation_requests)]
    generations = await backend.start_together(generation_requests)
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
async def embedding(body: EmbeddingRequest, backend: BackendDep, record: RecordDep) -> list[dict[str, Any]]:
    if not backend.capabilities.embeddings:
        raise embeddings_off()
    items, params = translate.embedding_inputs(body)
    embedded = await backend.embed(items, params, record, per_token=True)
    # llama-server's native answer shows no count; the ledger keeps what the model read all the same
    record.add_count(model=backend.name, prompt_tokens=embedded.n_tokens)
    return translate.to_native_embeddings(embedded.vectors, pooling=backend.describe().pooling,
                                          embd_normalize=body.embd_normalize if body.embd_normalize is not None
                                          else backend.config.switches.embd_normalize)


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank_documents(request: Request, backend: BackendDep, record: RecordDep) -> Any:
    if not backend.capabilities.rerank:  # checked before the body, as llama-server does
        raise rerank_off()
    try:
        raw = await request.json()
    except ValueError:
        raise InvalidRequestError("Invalid JSON body", param="body") from None
    body = rerank.rerank_request(raw)
    scores = await backend.rerank(body.query, body.documents)
    record.add_count(model=backend.name, prompt_tokens=sum(ranked.n_tokens for ranked in scores))
    return rerank.to_rerank_body(body, scores, model=backend.name)


@router.get("/lora-adapters")
async def lora_adapters(backend: BackendDep) -> list[dict[str, Any]]:
    """llama-server's list (a model with no adapters, or a remote one: empty)."""
    listed = backend.lora_adapters() if backend.capabilities.lora else []
    return [{"id": i, "path": str(path), "scale": scale, "task_name": "", "prompt_prefix": ""}
            for i, (path, scale) in enumerate(listed)]


@router.post("/lora-adapters")
async def set_lora_adapters(request: Request, backend: BackendDep) -> dict[str, bool]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequestError("Invalid JSON body: expected an array of {id, scale}", param="body") from None
    scales = server_state.lora_scales(body)
    if backend.capabilities.lora:
        await backend.set_lora_scales(scales)
    return {"success": True}


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, backend: BackendDep) -> dict[str, Any]:
    if backend.capabilities.forwards_token_routes:
        return await backend.forward_token_route("/tokenize", body.model_dump(exclude_unset=True))
    ids = await backend.tokenize(tokens.tokenize_parts(body), add_special=body.add_special,
                                 parse_special=body.parse_special)
    return tokens.tokenize_answer(ids, await backend.token_pieces(ids) if body.with_pieces else None)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, backend: BackendDep) -> dict[str, Any]:
    if backend.capabilities.forwards_token_routes:
        return await backend.forward_token_route("/detokenize", body.model_dump(exclude_unset=True))
    return {"content": await backend.detokenize(body.tokens)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, backend: BackendDep) -> dict[str, Any]:
    if backend.capabilities.forwards_token_routes:
        return await backend.forward_token_route("/apply-template", body.model_dump(exclude_unset=True))
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    rendered = await backend.render(common.to_messages(body.messages), tools=tools,
                                    template_kwargs=body.chat_template_kwargs,
                                    add_generation_prompt=body.add_generation_prompt,
                                    continue_final_message=common.continuation(body.continue_final_message))
    return {"prompt": rendered.prompt}


# ------------------------------------------------------------------ kinetic's: an upstream pool's maintenance

DRAIN_WAIT_S = 600.0  # as long as one upstream answer may take (the pool's read timeout)


def pool_backend(registry: ModelRegistry, name: str, route: str) -> ModelBackend:
    """The backend of the upstream pool `name` (router mode, loaded), or the 4xx/501 saying why not."""
    if not registry.router:
        raise NotFoundError("File Not Found")
    entry = registry.find(name)
    if entry is None:
        raise InvalidRequestError("model is not found", param="model")
    if entry.state is not ModelState.LOADED or entry.backend is None:
        raise InvalidRequestError("model is not running", param="model")
    require(entry.backend.capabilities.pool, entry.backend, route, "it is not served by a pool of upstream servers")
    return entry.backend


@router.post("/models/drain")
async def drain_upstream(body: DrainRequest, registry: RegistryDep) -> dict[str, Any]:
    """One server of a pool takes no new request, and finishes those it has (`wait`: answered once it has):
    the instructor can then restart it without cutting off a student."""
    backend = pool_backend(registry, body.model, "/models/drain")
    status = await backend.drain(body.upstream, drain=True, wait_s=DRAIN_WAIT_S if body.wait else 0.0)
    return {"success": True, "upstream": status}


@router.post("/models/undrain")
async def undrain_upstream(body: DrainRequest, registry: RegistryDep) -> dict[str, Any]:
    backend = pool_backend(registry, body.model, "/models/undrain")
    return {"success": True, "upstream": await backend.drain(body.upstream, drain=False)}
