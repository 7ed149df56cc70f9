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
from kinetic.backends.base import (
    Adapters,
    Embedding,
    ForwardsTokenRoutes,
    Generating,
    Infilling,
    ModelBackend,
    Pool,
    Reranking,
    Slots,
    Templating,
    Tokenizing,
    embeddings_off,
    lacking,
    rerank_off,
    role,
)
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
from kinetic.model_registry.deps import RecordDep, RegistryDep, ServedDep, model_backend
from kinetic.model_registry.deps import server_state as app_state
from kinetic.model_registry.registry import ModelRegistry, ModelState
from kinetic.model_registry.served import Served
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
    async with model_backend(request, wake=False) as served:  # answered asleep (--sleep-idle-seconds)
        return server_state.props(served_state(served, request.url.path))


def served_state(served: Served, route: str) -> server_state.ServedState:
    backend = served.backend
    described, switches = served.describe(), backend.config.switches
    if described.info is None:
        raise lacking(served.name, route, "it is served by another server, whose properties are its own")
    template = described.template
    return server_state.ServedState(
        alias=served.name, info=described.info, n_ctx=described.n_ctx, n_slots=described.n_slots,
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
async def set_props(served: ServedDep) -> dict[str, Any]:
    if not served.backend.config.switches.props:
        raise NotSupportedError("This server does not support changing global properties. Start it with `--props`")
    return {"success": True}  # as in llama-server, no property is changeable yet


def _viewer(request: Request) -> str | None:
    """None for the admin (who sees every client), else the caller's own name (classroom/roles.py)."""
    caller = caller_of(request)
    return None if caller.role is Role.ADMIN else caller.queue_name


@router.get("/slots")
async def get_slots(request: Request, served: ServedDep, fail_on_no_slot: str | None = None) -> list[dict[str, Any]]:
    if not served.backend.config.switches.slots:
        raise NotSupportedError("This server does not support slots endpoint. Start it with `--slots`")
    states = served.role(Slots, request.url.path).slot_states()
    if fail_on_no_slot and all(slot.is_processing for slot in states):
        raise UnavailableError("no slot available")
    described = served.describe()
    return server_state.slots(states, described.n_ctx, viewer=_viewer(request),
                              speculative=described.speculative_types)


@router.post("/slots/{id_slot}")
async def slot_action(id_slot: str, request: Request, served: ServedDep, action: str = "") -> dict[str, Any]:
    folder = served.backend.config.switches.slot_save_path
    if not folder:
        raise NotSupportedError("This server does not support slots action. Start it with `--slot-save-path`")
    try:
        slot = int(id_slot)
    except ValueError:
        raise InvalidRequestError("Invalid slot ID", param="id_slot") from None
    backend = served.role(Slots, request.url.path)
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
    cap = served.backend.config.switches.slot_save_max
    await anyio.to_thread.run_sync(slot_folder.check_room, folder, cap)  # already full: nothing is written
    result = await backend.slot_file(action, slot, path)
    await anyio.to_thread.run_sync(slot_folder.check_room, folder, cap, path)
    return server_state.slot_file(action, result, filename)


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    async with model_backend(request, wake=False) as served:  # answered asleep: a scraper keeps no model up
        return _metrics(request, served.backend)


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
async def completion(body: CompletionRequest, request: Request, served: ServedDep, record: RecordDep) -> Response:
    backend = served.role(Generating, request.url.path)
    generation_requests = [await backend.prepare_prompt(served.prompt(r), record)
                           for r in translate.to_prompt_requests(body, n_slots=served.describe().n_slots)]
    # one result is an object, several an array (llama-server's rule)
    return await _generate(body, generation_requests, request, served, backend, several=len(generation_requests) > 1)


@router.post("/infill")
async def infill(body: InfillRequest, request: Request, served: ServedDep, record: RecordDep) -> Response:
    backend = served.role(Infilling, request.url.path)
    generation_request = await backend.prepare_infill(served.infill(translate.to_infill_request(body)), record)
    return await _generate(body, [generation_request], request, served, backend, several=False)


async def _generate(body: CompletionRequest | InfillRequest, generation_requests: list[PreparedRequest],
                    request: Request, served: Served, backend: Generating[Any], *, several: bool) -> Response:
    speculative = served.describe().speculative_types
    contexts = [translate.native_context(body, g, model=served.name, index=i, prompt_text=backend.prompt_text(g),
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
async def embedding(body: EmbeddingRequest, request: Request, served: ServedDep,
                    record: RecordDep) -> list[dict[str, Any]]:
    backend = served.role(Embedding, request.url.path)
    if not served.backend.capabilities.embeddings:
        raise embeddings_off()
    items, params = translate.embedding_inputs(body)
    embedded = await backend.embed(items, params, record, per_token=True)
    # llama-server's native answer shows no count; the ledger keeps what the model read all the same
    record.add_count(model=served.name, prompt_tokens=embedded.n_tokens)
    return translate.to_native_embeddings(embedded.vectors, pooling=served.describe().pooling,
                                          embd_normalize=body.embd_normalize if body.embd_normalize is not None
                                          else served.backend.config.switches.embd_normalize)


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank_documents(request: Request, served: ServedDep, record: RecordDep) -> Any:
    backend = served.role(Reranking, request.url.path)  # both checked before the body, as llama-server does
    if not served.backend.capabilities.rerank:
        raise rerank_off()
    try:
        raw = await request.json()
    except ValueError:
        raise InvalidRequestError("Invalid JSON body", param="body") from None
    body = rerank.rerank_request(raw)
    scores = await backend.rerank(body.query, body.documents)
    record.add_count(model=served.name, prompt_tokens=sum(ranked.n_tokens for ranked in scores))
    return rerank.to_rerank_body(body, scores, model=served.name)


@router.get("/lora-adapters")
async def lora_adapters(served: ServedDep) -> list[dict[str, Any]]:
    """llama-server's list (a model with no adapters, or a remote one: empty)."""
    backend = served.backend
    listed = backend.lora_adapters() if isinstance(backend, Adapters) else []
    return [{"id": i, "path": str(path), "scale": scale, "task_name": "", "prompt_prefix": ""}
            for i, (path, scale) in enumerate(listed)]


@router.post("/lora-adapters")
async def set_lora_adapters(request: Request, served: ServedDep) -> dict[str, bool]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequestError("Invalid JSON body: expected an array of {id, scale}", param="body") from None
    scales = server_state.lora_scales(body)
    if isinstance(backend := served.backend, Adapters):  # a remote model's are its server's: nothing to set
        await backend.set_lora_scales(scales)
    return {"success": True}


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request, served: ServedDep) -> dict[str, Any]:
    if isinstance(served.backend, ForwardsTokenRoutes):
        return await served.backend.forward_token_route("/tokenize", body.model_dump(exclude_unset=True))
    backend = served.role(Tokenizing, request.url.path)
    ids = await backend.tokenize(tokens.tokenize_parts(body), add_special=body.add_special,
                                 parse_special=body.parse_special)
    return tokens.tokenize_answer(ids, await backend.token_pieces(ids) if body.with_pieces else None)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request, served: ServedDep) -> dict[str, Any]:
    if isinstance(served.backend, ForwardsTokenRoutes):
        return await served.backend.forward_token_route("/detokenize", body.model_dump(exclude_unset=True))
    return {"content": await served.role(Tokenizing, request.url.path).detokenize(body.tokens)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, request: Request, served: ServedDep) -> dict[str, Any]:
    if isinstance(served.backend, ForwardsTokenRoutes):
        return await served.backend.forward_token_route("/apply-template", body.model_dump(exclude_unset=True))
    backend = served.role(Templating, request.url.path)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    rendered = await backend.render(served.messages(common.to_messages(body.messages)), tools=tools,
                                    template_kwargs=body.chat_template_kwargs,
                                    add_generation_prompt=body.add_generation_prompt,
                                    continue_final_message=common.continuation(body.continue_final_message),
                                    template=served.template)
    return {"prompt": rendered.prompt}


# ------------------------------------------------------------------ kinetic's: an upstream pool's maintenance

DRAIN_WAIT_S = 600.0  # as long as one upstream answer may take (the pool's read timeout)


def pool_backend(registry: ModelRegistry, name: str, route: str) -> Pool:
    """The backend of the upstream pool `name` (router mode, loaded), or the 4xx/501 saying why not."""
    if not registry.router:
        raise NotFoundError("File Not Found")
    entry = registry.find(name)
    if entry is None:
        raise InvalidRequestError("model is not found", param="model")
    if entry.state is not ModelState.LOADED or entry.backend is None:
        raise InvalidRequestError("model is not running", param="model")
    return role(entry.backend, Pool, name=entry.name, route=route)


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
