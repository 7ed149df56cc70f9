"""llama-server native routes: /health, /props, /slots, /metrics, /completion, /tokenize,
/detokenize, /apply-template."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from kinetic.deps import ServiceDep
from kinetic.errors import NotSupportedError, UnavailableError
from kinetic.protocols.llamacpp import translate
from kinetic.protocols.llamacpp.types import (
    ApplyTemplateRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from kinetic.protocols.common import translate as common
from kinetic.streaming import respond

router = APIRouter()


@router.get("/health")
@router.get("/v1/health")
async def health(service: ServiceDep) -> dict[str, str]:
    return {"status": "ok"}


@router.get("/props")
async def get_props(service: ServiceDep) -> dict[str, Any]:
    return translate.props(service)


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
