"""A derived model's backend: its base model's, with the derived model's name, system prompt, earlier turns
and sampler defaults put on each request before the base model's chat layer sees it; a derived model with a
template of its own renders its chats through a view of the base backend with that template (with_template).

As Ollama's: the derived system prompt stands where the request has none (a request's own system message
replaces it), the derived turns go before the request's, and a sampler field the request leaves unset takes
the derived value, then the server's. A raw prompt (/completion, /v1/completions, /api/generate `raw`) gets
the sampler defaults only: it has no turns to add to.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Generic

from kinetic.backends.base import Capabilities, Description, Embeddings, ModelBackend, RequestT
from kinetic.backends.model_file import ModelFile
from kinetic.chat.prepare import RenderedChat
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    InfillRequest,
    Message,
    PromptInput,
    PromptRequest,
    TextPart,
)
from kinetic.classroom.request_record import RequestRecord
from kinetic.engine.base import Generation
from kinetic.engine.types import EngineStats, RankScore, SlotFileResult, SlotState
from kinetic.errors import KineticError
from kinetic.model_registry.derived import DerivedModel, with_defaults


def dressed(req: ChatRequest, model: DerivedModel) -> ChatRequest:
    """A chat request as the derived model answers it: its system prompt where the request has none, its
    turns after the request's system messages and before the rest, its options under the request's."""
    system_roles = ("system", "developer")
    leading = tuple(m for m in req.messages if m.role in system_roles)
    rest = tuple(m for m in req.messages if m.role not in system_roles)
    system = (Message(role="system", parts=(TextPart(model.system),)),) if model.system and not leading else ()
    turns = tuple(Message(role=role, parts=(TextPart(text),)) for role, text in model.messages)
    return replace(req, messages=system + leading + turns + rest, options=with_defaults(req.options, model.options))


class DerivedBackend(Generic[RequestT]):
    """Satisfies ModelBackend by handing every call to the base model's backend: it prepares and starts
    what its base does."""

    def __init__(self, base: ModelBackend[RequestT], model: DerivedModel):
        self.base = base
        self.model = model
        self.chatting = base if model.template is None else base.with_template(model.template)  # renders chats
        self.name = model.name
        self.aliases: tuple[str, ...] = (model.name,)
        self.config = base.config
        self.started = base.started

    # ------------------------------------------------------------------ what changes

    def _chat(self, req: ChatRequest) -> ChatRequest:
        return dressed(req, self.model)

    def describe(self) -> Description:
        return replace(self.chatting.describe(), name=self.name, aliases=self.aliases)

    async def prepare_chat(self, req: ChatRequest, record: RequestRecord) -> tuple[RequestT, AnswerFormat]:
        return await self.chatting.prepare_chat(self._chat(req), record)

    async def prepare_prompt(self, req: PromptRequest, record: RequestRecord) -> RequestT:
        return await self.base.prepare_prompt(replace(req, options=with_defaults(req.options, self.model.options)),
                                              record)

    async def count_chat_tokens(self, req: ChatRequest, record: RequestRecord) -> int:
        return await self.chatting.count_chat_tokens(self._chat(req), record)

    async def render(self, messages: tuple[Message, ...], *, tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
                     continue_final_message: str | None = None) -> RenderedChat:
        return await self.chatting.render(self._chat(ChatRequest(messages=messages)).messages, tools=tools,
                                      template_kwargs=template_kwargs, add_generation_prompt=add_generation_prompt,
                                      continue_final_message=continue_final_message)

    # ------------------------------------------------------------------ the base model's, as they are

    def with_template(self, template: str) -> DerivedBackend[RequestT]:
        return DerivedBackend(self.base, replace(self.model, template=template))

    @property
    def ready(self) -> bool:
        return self.base.ready

    async def load(self) -> None:
        await self.base.load()

    def close(self, error: Exception | None = None) -> None:
        self.base.close(error)

    def refuse_waiting(self, error: KineticError) -> None:
        self.base.refuse_waiting(error)

    @property
    def busy(self) -> bool:
        return self.base.busy

    @property
    def sleeping(self) -> bool:
        return self.base.sleeping

    async def sleep(self) -> None:
        await self.base.sleep()

    async def wake(self) -> None:
        await self.base.wake()

    @property
    def capabilities(self) -> Capabilities:
        return self.base.capabilities

    async def model_file(self) -> ModelFile:
        return await self.base.model_file()

    async def prepare_infill(self, req: InfillRequest, record: RequestRecord) -> RequestT:
        return await self.base.prepare_infill(replace(req, options=with_defaults(req.options, self.model.options)),
                                              record)

    async def start(self, request: RequestT) -> Generation:
        return await self.base.start(request)

    async def start_together(self, requests: list[RequestT]) -> list[Generation]:
        return await self.base.start_together(requests)

    async def tokenize(self, parts: list[str | int], *, add_special: bool, parse_special: bool) -> list[int]:
        return await self.base.tokenize(parts, add_special=add_special, parse_special=parse_special)

    async def token_pieces(self, tokens: list[int]) -> list[bytes]:
        return await self.base.token_pieces(tokens)

    async def detokenize(self, tokens: list[int]) -> str:
        return await self.base.detokenize(tokens)

    def prompt_text(self, request: RequestT) -> str:
        return self.base.prompt_text(request)

    async def forward_token_route(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.base.forward_token_route(route, body)

    async def embed(self, inputs: list[PromptInput], params: list[str], record: RequestRecord, *,
                    truncate: bool = False, per_token: bool = False) -> Embeddings:
        return await self.base.embed(inputs, params, record, truncate=truncate, per_token=per_token)

    async def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        return await self.base.rerank(query, documents)

    def slot_states(self) -> list[SlotState]:
        return self.base.slot_states()

    async def slot_file(self, action: str, id_slot: int, path: Path | None) -> SlotFileResult:
        return await self.base.slot_file(action, id_slot, path)

    def lora_adapters(self) -> list[tuple[Path, float]]:
        return self.base.lora_adapters()

    async def set_lora_scales(self, scales: dict[int, float]) -> None:
        await self.base.set_lora_scales(scales)

    def stats(self, *, scrape: bool = False) -> EngineStats:
        return self.base.stats(scrape=scrape)

    async def drain(self, server: str, *, drain: bool, wait_s: float = 0.0) -> dict[str, Any]:
        return await self.base.drain(server, drain=drain, wait_s=wait_s)
