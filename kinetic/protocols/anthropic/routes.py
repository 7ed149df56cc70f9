"""Anthropic routes: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kinetic.backends.base import ForwardsTokenRoutes, Generating, Tokenizing
from kinetic.model_registry.deps import RecordDep, ServedDep
from kinetic.protocols.anthropic import translate
from kinetic.protocols.anthropic.types import CountTokensRequest, MessagesRequest
from kinetic.protocols.common.streaming import respond

router = APIRouter()


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, request: Request, served: ServedDep, record: RecordDep) -> Response:
    backend = served.role(Generating, request.url.path)
    generation_request, answer_format = await backend.prepare_chat(served.chat(translate.to_chat_request(body)),
                                                                   record)
    ctx = translate.message_context(body, answer_format, generation_request.n_prompt_tokens)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.EventEncoder(ctx),
                         to_body=partial(translate.to_message, ctx=ctx))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request, served: ServedDep,
                       record: RecordDep) -> dict[str, int]:
    if isinstance(served.backend, ForwardsTokenRoutes):  # the server behind it has the tokenizer: it counts
        return await served.backend.forward_token_route("/v1/messages/count_tokens",
                                                        body.model_dump(exclude_unset=True))
    backend = served.role(Tokenizing, request.url.path)
    return {"input_tokens": await backend.count_chat_tokens(served.chat(translate.count_tokens_request(body)),
                                                            record)}
