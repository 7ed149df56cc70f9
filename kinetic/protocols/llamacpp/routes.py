"""llama-server native routes: /health, /props, /slots, /metrics, /completion, /tokenize,
/detokenize, /apply-template."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from kinetic import __version__
from kinetic.deps import RegistryDep, ServiceDep, model_service
from kinetic.errors import InvalidRequestError, NotFoundError, NotSupportedError, UnavailableError
from kinetic.protocols.llamacpp import translate
from kinetic.protocols.llamacpp.types import (
    ApplyTemplateRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelActionRequest,
    TokenizeRequest,
)
from kinetic.router.registry import ModelState
from kinetic.protocols.common import translate as common
from kinetic.streaming import respond

router = APIRouter()
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
    async with model_service(request) as service:
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


@router.get("/slots")
async def get_slots(service: ServiceDep, fail_on_no_slot: str | None = None) -> list[dict[str, Any]]:
    if not service.settings.slots:
        raise NotSupportedError("This server does not support slots endpoint. Start it with `--slots`")
    states = service.engine.slot_states()
    if fail_on_no_slot and all(slot.is_processing for slot in states):
        raise UnavailableError("no slot available")
    return translate.slots(states, service.engine.slot_n_ctx)


@router.get("/metrics")
async def get_metrics(service: ServiceDep) -> Response:
    if not service.settings.metrics:
        raise NotSupportedError("This server does not support metrics endpoint. Start it with `--metrics`")
    return PlainTextResponse(translate.metrics_text(service.engine.stats()), media_type="text/plain; version=0.0.4")


@router.post("/completion")  # /completions (no /v1) is the OpenAI route here, as issue 2 asks
async def completion(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_request = await service.prepare_prompt(translate.to_prompt_request(body))
    prompt_text = service.engine.detokenize(generation_request.prompt_tokens, special=True)
    ctx = translate.native_context(body, generation_request, model=service.model_name, prompt_text=prompt_text)
    generation = await service.engine.submit(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.NativeEncoder(ctx),
                         to_body=partial(translate.to_completion, ctx=ctx))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, service: ServiceDep) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(translate.tokenize, body, service.engine)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, service: ServiceDep) -> dict[str, str]:
    return await anyio.to_thread.run_sync(translate.detokenize, body, service.engine)


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, service: ServiceDep) -> dict[str, str]:
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    rendered = await service.render(common.to_messages(body.messages), tools=tools,
                                    template_kwargs=body.chat_template_kwargs,
                                    add_generation_prompt=body.add_generation_prompt)
    return {"prompt": rendered.prompt}
