"""OpenAI Responses routes: /v1/responses and /v1/responses/input_tokens (each also without /v1)."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kinetic.backends.base import require
from kinetic.model_registry.deps import BackendDep
from kinetic.protocols.common.streaming import respond
from kinetic.protocols.responses import translate
from kinetic.protocols.responses.types import InputTokensRequest, ResponsesRequest

router = APIRouter()


@router.post("/v1/responses")
@router.post("/responses")
async def create_response(body: ResponsesRequest, request: Request, backend: BackendDep) -> Response:
    generation_request, answer_format = await backend.prepare_chat(translate.to_chat_request(body))
    ctx = translate.response_context(body, answer_format, model=backend.name)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.EventEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx))


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens")
async def count_input_tokens(body: InputTokensRequest, request: Request, backend: BackendDep) -> dict[str, Any]:
    require(backend.capabilities.tokenizer, backend, request.url.path, "its tokenizer and template are the "
            "server's behind it")
    return translate.input_tokens_body(await backend.count_chat_tokens(translate.to_chat_request(body)))
