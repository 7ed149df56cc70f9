"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/audio/transcriptions, /v1/models
(chat, transcriptions and models also without /v1; /completions and /embeddings without it are llama-server's
native routes)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from kinetic.backends.base import Embedding, Generating, Tokenizing, embeddings_off
from kinetic.classroom.request_record import caller_of
from kinetic.classroom.roles import Role
from kinetic.errors import ForbiddenError, InvalidRequestError
from kinetic.model_registry import listing
from kinetic.model_registry.deps import CallerDep, RecordDep, RegistryDep, ServedDep
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.streaming import respond
from kinetic.protocols.openai import transcription, translate
from kinetic.protocols.openai.control import REASONING_END, RunningCompletion, RunningCompletions, control
from kinetic.protocols.openai.types import (
    ChatCompletionRequest,
    CompletionRequest,
    ControlRequest,
    EmbeddingRequest,
    TranscriptionRequest,
)

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request, served: ServedDep,
                                 record: RecordDep) -> Response:
    backend = served.role(Generating, request.url.path)
    generation_request, answer_format = await backend.prepare_chat(served.chat(translate.to_chat_request(body)),
                                                                   record)
    described = served.describe()
    ctx = translate.chat_context(body, answer_format, model=served.name, fingerprint=described.fingerprint,
                                 generation=generation_request, verbose=served.backend.config.switches.verbose,
                                 speculative=described.speculative_types,
                                 prompt_text=partial(backend.prompt_text, generation_request))
    generation = await backend.start(generation_request)
    running_completions(request).add(ctx.id, RunningCompletion(owner=key_name(request), generation=generation,
                                                               armed=body.reasoning_control is True))
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.ChunkEncoder(ctx),
                         to_body=partial(translate.to_chat_completion, ctx=ctx))


@router.post("/v1/chat/completions/control")
async def control_chat_completion(body: ControlRequest, request: Request) -> dict[str, bool | str]:
    """llama-server's: acts on a running chat completion of the caller's, named by its `id`."""
    if not body.id:
        raise InvalidRequestError("missing completion id", param="id")
    if body.action != REASONING_END:
        raise InvalidRequestError("unknown control action", param="action")
    return control(running_completions(request), body, key_name(request))


def running_completions(request: Request) -> RunningCompletions:
    return installed(request.app, RunningCompletions)


def key_name(request: Request) -> str | None:
    """The caller's key name on a keyed server (the gate's), None on an open one."""
    return caller_of(request).name


@router.post("/v1/chat/completions/input_tokens")
@router.post("/chat/completions/input_tokens")
async def count_chat_completion_tokens(body: ChatCompletionRequest, request: Request, served: ServedDep,
                                      record: RecordDep) -> dict[str, int]:
    """llama-server's: the prompt tokens this chat request would take (tools and template included)."""
    backend = served.role(Tokenizing, request.url.path)
    return {"input_tokens": await backend.count_chat_tokens(served.chat(translate.to_chat_request(body)), record)}


@router.post("/v1/completions")  # /completions (no v1) is llama-server's native route, as there
async def create_completion(body: CompletionRequest, request: Request, served: ServedDep,
                            record: RecordDep) -> Response:
    backend = served.role(Generating, request.url.path)
    generation_request = await backend.prepare_prompt(served.prompt(translate.to_prompt_request(body)), record)
    ctx = translate.completion_context(body, model=served.name, fingerprint=served.describe().fingerprint)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=bool(body.stream),
                         encoder=translate.CompletionChunkEncoder(ctx),
                         to_body=partial(translate.to_completion, ctx=ctx))


@router.post("/v1/embeddings")  # /embeddings (no v1) is llama-server's native route, as there
async def create_embeddings(body: EmbeddingRequest, request: Request, served: ServedDep,
                            record: RecordDep) -> dict[str, Any]:
    backend = served.role(Embedding, request.url.path)
    if not served.backend.capabilities.embeddings:
        raise embeddings_off()
    described = served.describe()
    if described.pooling == "none":
        raise InvalidRequestError("Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                                  param="input")
    items, params = translate.embedding_inputs(body)
    if described.info is not None:  # a remote model's width is the server's behind it to check
        translate.check_dimensions(body, described.info.n_embd)
    embedded = await backend.embed(items, params, record)
    record.add_count(model=served.name, prompt_tokens=embedded.n_tokens)
    return translate.to_embeddings(body, embedded.n_tokens, embedded.vectors, served.name)


@router.post("/v1/audio/transcriptions")
@router.post("/audio/transcriptions")
async def create_transcription(body: Annotated[TranscriptionRequest, Form()], file: Annotated[UploadFile, File()],
                               request: Request, served: ServedDep, record: RecordDep) -> Response:
    """OpenAI's multipart upload, read by the model's audio projector as one chat turn (llama-server's)."""
    backend = served.role(Generating, request.url.path)
    described = served.describe()
    transcription.check_model_hears(described.modalities, served.name)
    clip = await file.read()
    transcription.check_request(body, clip)
    chat = transcription.to_chat_request(body, clip, template_source=described.template.source
                                         if described.template else "")
    generation_request, answer_format = await backend.prepare_chat(served.chat(chat), record)
    ctx = transcription.transcription_context(body, clip, answer_format, model=served.name)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=transcription.TranscriptEncoder(ctx),
                         to_body=partial(transcription.to_transcription, ctx=ctx),
                         render=PlainTextResponse if body.response_format == "text" else JSONResponse)


@router.get("/v1/models")
@router.get("/models")
async def list_models(registry: RegistryDep, caller: CallerDep, reload: str = "") -> dict[str, Any]:
    if reload and registry.router:  # llama-server's ?reload=1: the preset, the cache and the folder read again
        if caller.role is not Role.ADMIN:
            raise ForbiddenError("only the admin key may reload the models")
        await registry.reload()
    # an upstream pool's servers (their addresses, load, hit rate) are the admin's to see
    return listing.models_body(registry, caller.limits.allows_model, admin=caller.role is Role.ADMIN)
