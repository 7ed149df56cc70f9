"""llama-server native routes: /health, /props, /slots, /metrics, /completion, /tokenize,
/detokenize, /apply-template."""

from __future__ import annotations

from functools import partial
from typing import Any

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
from kinetic.protocols.openai.translate import template_message, validate_messages
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
    if fail_on_no_slot and all(slot.is_processing for slot in service.engine.slots):
        raise UnavailableError("no slot available")
    return translate.slots(service)


@router.get("/metrics")
async def get_metrics(service: ServiceDep) -> Response:
    if not service.settings.metrics:
        raise NotSupportedError("This server does not support metrics endpoint. Start it with `--metrics`")
    return PlainTextResponse(translate.metrics_text(service), media_type="text/plain; version=0.0.4")


@router.post("/completion")  # /completions (no /v1) is the OpenAI route here, as issue 2 asks
async def completion(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    generation_request, ctx = translate.to_generation(body, service)
    generation = service.engine.submit(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.NativeEncoder(ctx),
                         to_body=partial(translate.to_completion, ctx=ctx))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, service: ServiceDep) -> dict[str, Any]:
    if body.content is None:
        return {"tokens": []}
    parts = [body.content] if isinstance(body.content, str) else body.content
    tokens: list[int] = []
    for index, part in enumerate(parts):
        if isinstance(part, int):
            tokens.append(part)
        else:
            tokens += service.engine.tokenize(part, add_special=body.add_special and index == 0,
                                              parse_special=body.parse_special)
    if not body.with_pieces:
        return {"tokens": tokens}
    pieces = []
    for token in tokens:
        raw = service.engine.token_piece(token, special=True)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        pieces.append({"id": token, "piece": piece})
    return {"tokens": pieces}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, service: ServiceDep) -> dict[str, str]:
    return {"content": service.engine.detokenize([t for t in body.tokens if service.engine.valid_token(t)],
                                                 special=True)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, service: ServiceDep) -> dict[str, str]:
    validate_messages(body.messages)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    rendered = service.render_chat([template_message(m) for m in body.messages], tools=tools,
                                   template_kwargs=body.chat_template_kwargs,
                                   add_generation_prompt=body.add_generation_prompt)
    return {"prompt": rendered.prompt}
