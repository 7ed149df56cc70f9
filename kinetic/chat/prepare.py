"""From a protocol-neutral request to a GenerationRequest: render, tokenize, compile constraints,
resolve the server's defaults. The one place below the protocols where that happens.

Every method here is blocking CPU work (Jinja, the tokenizer, schema-to-grammar): the service
runs them in a worker thread, never on the event loop, except a short raw prompt or chat (quick_to_prepare,
quick_to_prepare_chat).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kinetic.chat.callformats import rendered_calls
from kinetic.chat.callformats.base import FoundCall
from kinetic.chat.constraints import chat_constraints, output_grammar
from kinetic.chat.conversation_tokens import ConversationTokens
from kinetic.chat.infill import check_fim, infill_tokens
from kinetic.chat.media import check_readable, content_with_markers, file_bytes, media_extra, media_parts, shifted
from kinetic.chat.reasoning import CLOSE_TAG, OPEN_TAG
from kinetic.chat.reasoning_control import preserve_variables, pure_content, reasoning_budget
from kinetic.chat.templates import ChatTemplate
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    GenerationOptions,
    InfillRequest,
    MediaPart,
    Message,
    PromptInput,
    PromptRequest,
    SamplingOptions,
    TextPart,
)
from kinetic.engine.base import Engine
from kinetic.engine.text import common_prefix
from kinetic.engine.types import GenerationRequest, MediaSpan, Modalities, SamplingParams
from kinetic.errors import ContextOverflowError, InvalidRequestError, field_error

# The longest prompt prepared on the event loop (chars, or token ids). llama.cpp looks for each special token in the
# text (6414 in Gemma's vocabulary): 40 characters take ~50 us, 2000 ~0.7 ms (warm, 2 cores, 2026-12-06). The lab's
# chat (~1100 characters) still does no worse on the loop: 16 students on the tiny LFM2, 6 replays pooled, against
# llama-server in the same run: TTFT p50 0.92 and p95 0.82 on the loop, 0.98-1.00 and 1.00-1.08 with the hop to a
# worker thread (limit 400).
INLINE_PROMPT_SIZE = 2000
# What the last message says while the template renders the conversation to show where that message's turn opens
# (ChatLayer.earlier_text): text no student writes.
LAST_CONTENT_STAND_IN = "\u2063kinetic:last-message\u2063"


def quick_to_prepare(req: PromptRequest) -> bool:
    """Whether a raw prompt is cheap enough to prepare on the event loop (see the module's docstring): no files,
    no schema to compile, a short text. The hop to a worker thread and back cost ~0.3 ms of a one-stream TTFT
    of ~10 ms on a tiny model, and more when several requests arrive at once (2026-12-05, 2 cores)."""
    size = len(req.prompt) if isinstance(req.prompt, str) else sum(
        len(part) if isinstance(part, str) else 1 for part in req.prompt)
    return not req.media and req.output.schema is None and size <= INLINE_PROMPT_SIZE


def quick_to_prepare_chat(req: ChatRequest) -> bool:
    """Whether a chat is cheap enough to prepare on the event loop: no files, tools or constraint (each compiles
    a grammar), and messages whose text adds up to a short prompt. Rendering one with a course template takes
    20-120 us of Python, which holds the GIL on a worker thread just the same; the hop there and back cost more
    (2026-12-06, 2 cores)."""
    if req.tools or req.output.is_set or any(message.tool_calls for message in req.messages):
        return False
    size = 0
    for message in req.messages:
        for part in message.parts or ():
            if not isinstance(part, TextPart):
                return False
            size += len(part.text)
        size += len(message.reasoning_content or "")
    return size <= INLINE_PROMPT_SIZE


@dataclass(frozen=True)
class ServerDefaults:
    """What a request gets for the fields it leaves out (the server's flags)."""

    # --temp, --top-k... (kinetic.config.sampling_defaults): a request that sets no sampler field gets
    # these, /props shows them
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()  # -r: the stop strings of a request that sends none
    n_predict: int = -1
    reasoning_format: str = "auto"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning: str = "auto"  # --reasoning on|off|auto: the `enable_thinking` templates get when nobody set it
    prefill_assistant: bool = True  # a last assistant message is continued, not closed (--no-prefill-assistant)
    cache_prompt: bool = True  # --no-cache-prompt: requests that do not say reuse no cached prefix
    spm_infill: bool = False  # --spm-infill: /infill puts the suffix before the prefix
    n_keep: int = 0  # --keep: what a context shift keeps of a request that does not say
    reasoning_budget: int = -1  # --reasoning-budget (kinetic.chat.reasoning_control)
    reasoning_budget_message: str = ""
    skip_chat_parsing: bool = False  # --skip-chat-parsing: every answer is content


@dataclass(frozen=True)
class RenderedChat:
    prompt: str
    tokens: list[int]
    starts_in_reasoning: bool
    media: tuple[MediaSpan, ...] = ()  # the files' stand-ins in `tokens`
    earlier: str | None = None  # the conversation before the last message, where render was asked to find it

    @property
    def n_tokens(self) -> int:
        """The prompt's tokens as usage counts them (an image's embeddings, not its positions)."""
        return len(self.tokens) + media_extra(self.media)


def template_message(message: Message, calls_in_text: str | None = None, *,
                     modalities: Modalities = Modalities(), marker: str = "") -> dict[str, Any]:  # noqa: B008  frozen
    """A message as chat templates read it: text parts joined, each file as `marker`, tool-call arguments as
    objects. A file the model cannot read (any, without a projector: `modalities`) is a 400.

    `calls_in_text` names the call format to write an assistant's calls in, after its text, for a
    template that does not render `tool_calls` (LFM's): otherwise the model would not see its call."""
    check_readable(message.parts or (), modalities)
    data: dict[str, Any] = {**message.extra, "role": message.role}
    if message.parts is not None:
        has_media = any(isinstance(part, MediaPart) for part in message.parts)
        data["content"] = content_with_markers(message.parts, marker) if has_media else message.text
    elif message.tool_calls:
        # a call turn's text is "", not missing: QwQ's template reads it (llama-server's requires_non_null_content)
        data["content"] = ""
    if calls_in_text is not None and message.tool_calls:
        written = rendered_calls(calls_in_text, [FoundCall(c.name, c.arguments) for c in message.tool_calls])
        data["content"] = "\n".join(text for text in (message.text, written) if text)
        message = replace(message, tool_calls=())
    data.update(message.addressing())
    if message.reasoning_content is not None:
        data["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        data["tool_calls"] = [call.openai(call.arguments, call.id) for call in message.tool_calls]
    return data


def close_reasoning(prompt: str) -> str:
    """The prompt with the think block its generation prompt opened closed empty, as the thinking
    templates write it when thinking is off (`<think>\\n\\n</think>\\n\\n`).

    Constrained output (a schema, json_object, a forced call) is held by the grammar from the first
    token: left open, the block would file the answer as reasoning. llama-server instead lets the
    model think first and holds only what follows `</think>`; kinetic answers at once, so a client
    with a small max_tokens still gets its JSON (docs/clients.md, the differences table)."""
    return prompt.rstrip() + "\n\n" + CLOSE_TAG + "\n\n"


def context_room(n_prompt: int, max_tokens: int, limit: int | None, n_ctx: int) -> int:
    """`max_tokens` within a client's context limit (Ollama's num_ctx) on prompt + answer. A limit at
    or above the slot's context is ignored (Ollama reloads the model for it; kinetic serves the one
    it loaded)."""
    if limit is None or limit >= n_ctx:
        return max_tokens
    if n_prompt >= limit:
        raise ContextOverflowError(n_prompt, limit)
    room = limit - n_prompt
    return room if max_tokens < 0 else min(max_tokens, room)


class ChatLayer:
    """Renders and tokenizes requests for one engine and its chat template."""

    def __init__(self, engine: Engine, template: ChatTemplate, defaults: ServerDefaults):
        self.engine = engine
        self.template = template
        self.defaults = defaults
        self._conversation = ConversationTokens(
            self.tokenize_prompt, lambda text: self.engine.tokenize(text, add_special=False, parse_special=True),
            lambda token, special: self.engine.token_piece(token, special=special))

    # ------------------------------------------------------------------ prompts

    def render(self, messages: tuple[Message, ...], *, tools: list[dict[str, Any]] | None = None,
               template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
               continue_final_message: str | None = None, constrained: bool = False,
               find_earlier: bool = False) -> RenderedChat:
        """`constrained`: a grammar holds the answer, so a think block the generation prompt opens is
        closed first (see close_reasoning). `find_earlier`: find the conversation before the last message
        (earlier_text), whose tokens are then not computed again."""
        kwargs = self.template_variables(template_kwargs)
        mode = self.continuation(messages, continue_final_message, add_generation_prompt)
        earlier = None
        if mode is None:
            listed = [self.template_message(m) for m in messages]
            prompt = self.template.render(listed, add_generation_prompt=add_generation_prompt, tools=tools,
                                          kwargs=kwargs)
            starts_in_reasoning = prompt.rstrip().endswith(OPEN_TAG)
            if starts_in_reasoning and constrained:
                prompt, starts_in_reasoning = close_reasoning(prompt), False
            if find_earlier:
                earlier = self.earlier_text(listed, prompt, tools=tools, kwargs=kwargs)
        else:
            prompt, starts_in_reasoning = self.continue_last(messages, mode, tools=tools, kwargs=kwargs)
        tokens, media = self.tokenize_chat(prompt, messages, earlier)
        return RenderedChat(prompt=prompt, tokens=tokens, starts_in_reasoning=starts_in_reasoning, media=media,
                            earlier=earlier)

    def earlier_text(self, listed: list[dict[str, Any]], prompt: str, *, tools: list[dict[str, Any]] | None,
                     kwargs: dict[str, Any]) -> str | None:
        """The conversation before the last message (`listed`: template messages) as `prompt` renders it: what
        the next turn, and the next student with the same system prompt, send again. Only hybrid and recurrent
        models look for it (a checkpoint is saved where it ends, scheduler.py); None on the others."""
        if len(listed) < 2 or self.engine.require_ready().memory_kind == "attention":
            return None
        try:
            alone = self.template.render(listed[:-1], add_generation_prompt=False, tools=tools, kwargs=kwargs)
        except Exception:  # a template may refuse a conversation that does not end with a user turn
            alone = None
        if alone is not None and prompt.startswith(alone):
            return alone
        # Qwen3.5's refuses a conversation with no user turn, and writes the last answer's (empty) think block only
        # while that answer ends the conversation: the earlier text is found in its rendering of the whole, up to
        # the last message's content (a stand-in), then cut back to the special token that opens that turn where
        # the vocabulary has one (so that the rest's tokens can follow the earlier ones').
        stand_in = {**listed[-1], "content": LAST_CONTENT_STAND_IN}
        try:
            text = self.template.render([*listed[:-1], stand_in], add_generation_prompt=False, tools=tools,
                                        kwargs=kwargs)
        except Exception:
            return alone
        head, found, _ = text.partition(LAST_CONTENT_STAND_IN)
        if not found or not prompt.startswith(head):
            return alone  # no prefix, but where the prompt parts from it still bounds the last message's start
        return self._conversation.before_last_special(head) or head

    def last_message_start(self, messages: tuple[Message, ...], tokens: list[int], earlier: str | None) -> int:
        """Where the last message starts in `tokens`, given the conversation before it (earlier_text)."""
        if earlier is None:
            return 0
        files = media_parts(messages[:-1])
        before = self.tokenize_with_media(earlier, files)[0] if files else self._conversation.earlier(earlier)
        return common_prefix(before, tokens)

    def template_message(self, message: Message) -> dict[str, Any]:
        inline = None if self.template.renders_tool_calls else self.template.call_format
        return template_message(message, inline, modalities=self.engine.modalities, marker=self.engine.media_marker)

    def template_variables(self, template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The server's --chat-template-kwargs under the request's, and `enable_thinking` always set, as
        llama-server sets it: --reasoning on or off, or with auto whether the template can think."""
        kwargs = preserve_variables({**self.defaults.template_kwargs, **(template_kwargs or {})})
        if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
            got = type(kwargs["enable_thinking"]).__name__
            raise InvalidRequestError(f'invalid type for "enable_thinking" (expected boolean, got {got})',
                                      param="chat_template_kwargs")
        if "enable_thinking" not in kwargs:
            chosen = {"on": True, "off": False}.get(self.defaults.reasoning)
            kwargs["enable_thinking"] = self.template.supports_thinking if chosen is None else chosen
        return kwargs

    def continuation(self, messages: tuple[Message, ...], asked: str | None,
                     add_generation_prompt: bool) -> str | None:
        """How to continue the last message ("content" or "reasoning"), or None to answer it; llama-server's
        checks and words (server-common.cpp oaicompat_chat_params_parse)."""
        if not messages:
            return None
        last = messages[-1]
        mode = asked
        if mode is None and self.defaults.prefill_assistant and last.role == "assistant":
            if len(messages) >= 2 and messages[-2].role == "assistant":
                raise InvalidRequestError("Cannot have 2 or more assistant messages at the end of the list.",
                                          param="messages")
            mode, add_generation_prompt = "auto", False
        if mode is None:
            return None
        if add_generation_prompt:
            raise InvalidRequestError("Cannot set both add_generation_prompt and continue_final_message to true.",
                                      param="continue_final_message")
        if last.role == "assistant" and last.tool_calls:
            raise InvalidRequestError("Cannot continue an assistant message that contains tool calls.",
                                      param="messages")
        if mode == "auto":
            return "reasoning" if last.reasoning_content and not last.text else "content"
        return mode

    def continue_last(self, messages: tuple[Message, ...], mode: str, *, tools: list[dict[str, Any]] | None,
                      kwargs: dict[str, Any]) -> tuple[str, bool]:
        """The conversation before the last message, the assistant's generation prompt, then the last
        message's text to continue (llama.cpp's autoparser generate_parser). A template that thinks in
        <think> tags gets the message's reasoning inside them, closed unless the reasoning is continued."""
        head = [self.template_message(m) for m in messages[:-1]]
        last = messages[-1]
        self.template_message(last)  # refuses what the model cannot read, as any message does
        prompt = self.template.render(head, add_generation_prompt=False, tools=tools, kwargs=kwargs)
        assistant_start = self.template.generation_prompt(head, tools=tools, kwargs=kwargs)
        in_reasoning = False
        if self.template.supports_thinking and self.template.thinks:
            cut = assistant_start.find(OPEN_TAG)
            kept = assistant_start if cut < 0 else assistant_start[:cut]
            assistant_start = kept + OPEN_TAG + (last.reasoning_content or "")
            if mode == "content":
                assistant_start += CLOSE_TAG
            else:
                in_reasoning = True
        if mode == "content":
            # text parts joined by a blank line, as common_chat_msg::render_content joins them
            assistant_start += "\n\n".join(part.text for part in last.parts or () if isinstance(part, TextPart))
        return prompt + assistant_start, in_reasoning

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens of a prompt with the model's BOS, never twice (templates often write it too)."""
        info = self.engine.require_ready()
        tokens = self.engine.tokenize(text, add_special=False, parse_special=True)
        if info.add_bos and info.bos_id >= 0 and (not tokens or tokens[0] != info.bos_id):
            tokens.insert(0, info.bos_id)
        return tokens

    def tokenize_chat(self, prompt: str, messages: tuple[Message, ...],
                      earlier: str | None = None) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """A rendered conversation's tokens, with its files' stand-ins when it has any."""
        files = media_parts(messages)
        if not files:
            return self._conversation.of(prompt, earlier), ()
        return self.tokenize_with_media(prompt, files)

    def tokenize_with_media(self, prompt: str, files: list[MediaPart]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """tokenize_prompt for a text holding one media marker per file: the BOS rule, then the files' spans."""
        data, params = file_bytes(files)
        tokens, media = self.engine.tokenize_media(prompt, data, params)
        info = self.engine.require_ready()
        if info.add_bos and info.bos_id >= 0 and (not tokens or tokens[0] != info.bos_id):
            tokens.insert(0, info.bos_id)
            media = shifted(media, 1)
        return tokens, media

    def prompt_tokens(self, prompt: PromptInput, param: str = "prompt") -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize_prompt(prompt)
        tokens = self.mixed_tokens(prompt, lead=self.tokenize_prompt)
        if any(not self.engine.valid_token(t) for t in tokens):
            raise InvalidRequestError("Prompt contains invalid tokens", param=param)
        return tokens

    def mixed_tokens(self, prompt: Sequence[int | str], *, lead: Callable[[str], list[int]]) -> list[int]:
        """Token ids as they are, text tokenized in place; `lead` tokenizes text that comes first
        (with BOS), later text gets none: llama-server's tokenize_mixed."""
        tokens: list[int] = []
        for index, item in enumerate(prompt):
            if isinstance(item, str):
                tokens += lead(item) if index == 0 else self.engine.tokenize(item, add_special=False,
                                                                            parse_special=True)
            else:
                tokens.append(item)
        return tokens

    # ------------------------------------------------------------------ requests

    def prepare_chat(self, req: ChatRequest) -> tuple[GenerationRequest, AnswerFormat]:
        if not req.messages and not req.allow_empty:
            raise field_error("messages", "must contain at least one message, but got an empty list")
        constraints = chat_constraints(req, self.template.call_format)
        if self.defaults.skip_chat_parsing:
            constraints = pure_content(constraints, req)
        rendered = self.render(req.messages, tools=constraints.tools, template_kwargs=req.template_kwargs,
                               add_generation_prompt=req.add_generation_prompt,
                               continue_final_message=req.continue_final_message,
                               constrained=constraints.grammar is not None, find_earlier=True)
        engine_request = self.with_media(self.engine_request(rendered.tokens, req.options, constraints.grammar),
                                         rendered.tokens, rendered.media)
        shared = self.last_message_start(req.messages, rendered.tokens, rendered.earlier)
        if shared:
            engine_request = replace(engine_request, checkpoint_at=shared)
        budget = reasoning_budget(req, server_tokens=self.defaults.reasoning_budget,
                                  server_message=self.defaults.reasoning_budget_message,
                                  thinks=self.template.thinks and not self.defaults.skip_chat_parsing,
                                  starts_inside=rendered.starts_in_reasoning,
                                  constrained=constraints.grammar is not None)
        engine_request = replace(engine_request, reasoning_budget=budget)
        answer_format = AnswerFormat(starts_in_reasoning=rendered.starts_in_reasoning,
                                     reasoning_format="none" if self.defaults.skip_chat_parsing
                                     else req.reasoning_format or self.defaults.reasoning_format,
                                     tool_mode=constraints.tool_mode, tool_names=constraints.tool_names,
                                     call_format=constraints.call_format,
                                     tool_parameters=tuple((tool.name, tool.parameters or {}) for tool in req.tools))
        return engine_request, answer_format

    def prepare_prompt(self, req: PromptRequest) -> GenerationRequest:
        if req.media:
            return self.prepare_media_prompt(req)
        tokens = self.prompt_tokens(req.prompt, req.param)
        return self.engine_request(tokens, req.options, output_grammar(req.output))

    def prepare_media_prompt(self, req: PromptRequest) -> GenerationRequest:
        """A text prompt with files (/completion's multimodal_data, a raw Ollama generate with images): each file
        where its marker stands, or all of them first when the prompt holds no marker (Ollama's clients send
        none)."""
        if not isinstance(req.prompt, str):
            raise InvalidRequestError("a prompt with multimodal data must be text", param=req.param)
        marker = self.engine.media_marker
        if not marker:
            raise InvalidRequestError("Multimodal data provided, but model does not support multimodal requests.",
                                      param=req.media[0].param)
        check_readable(req.media, self.engine.modalities)  # audio to a projector that only sees
        prompt = req.prompt if marker in req.prompt else marker * len(req.media) + req.prompt
        tokens, media = self.tokenize_with_media(prompt, list(req.media))
        return self.with_media(self.engine_request(tokens, req.options, output_grammar(req.output)), tokens, media)

    @staticmethod
    def with_media(request: GenerationRequest, tokens: list[int], media: tuple[MediaSpan, ...]) -> GenerationRequest:
        """`request` made from `tokens`, given their media (moved past what engine_request put before them)."""
        if not media:
            return request
        return replace(request, media=shifted(media, len(request.prompt_tokens) - len(tokens)))

    def prepare_infill(self, req: InfillRequest) -> GenerationRequest:
        info = self.engine.require_ready()
        check_fim(info.fim_tokens)
        max_tokens = req.options.max_tokens if req.options.max_tokens is not None else self.defaults.n_predict
        tokens = infill_tokens(
            lambda text: self.engine.tokenize(text, add_special=False, parse_special=False), info.fim_tokens,
            prefix=req.prefix, suffix=req.suffix, extra=req.extra,
            prompt=self.engine.tokenize(req.prompt, add_special=False, parse_special=True) if req.prompt else [],
            n_batch=self.engine.n_batch, n_predict=max_tokens, n_ctx=self.engine.slot_n_ctx,
            bos=info.bos_id if info.add_bos and info.bos_id >= 0 else None, spm=self.defaults.spm_infill)
        return self.engine_request(tokens, req.options, output_grammar(req.output))

    def engine_request(self, tokens: list[int], options: GenerationOptions, grammar: str | None) -> GenerationRequest:
        max_tokens = options.max_tokens if options.max_tokens is not None else self.defaults.n_predict
        if options.prior_tokens:  # the earlier prompt's own BOS leads: this one's would land in the middle
            bos = self.engine.require_ready().bos_id
            tokens = list(options.prior_tokens) + (tokens[1:] if tokens and tokens[0] == bos else tokens)
        max_tokens = context_room(len(tokens), max_tokens, options.context_limit, self.engine.slot_n_ctx)
        return GenerationRequest(prompt_tokens=tokens, sampling=self.sampling(options.sampling, grammar),
                                 max_tokens=max_tokens, stop=options.stop or self.defaults.stop,
                                 n_probs=options.n_probs,
                                 cache_prompt=self.defaults.cache_prompt if options.cache_prompt is None
                                 else options.cache_prompt, id_slot=options.id_slot,
                                 n_keep=self.defaults.n_keep if options.n_keep is None else options.n_keep,
                                 n_discard=options.n_discard,
                                 post_sampling_probs=options.post_sampling_probs,
                                 return_progress=options.return_progress, lora=options.lora)

    def sampling(self, options: SamplingOptions, grammar: str | None) -> SamplingParams:
        """The server's sampler with what the request set laid over it."""
        chosen = dict(options.chosen)
        if grammar:  # an empty grammar asks for nothing: the server's stays (llama-server's rule)
            chosen["grammar"] = grammar
        if options.logit_bias is not None:
            chosen["logit_bias"] = self.logit_bias(options.logit_bias)
        params = replace(self.defaults.sampling, **chosen)
        if params.ignore_eos:  # llama-server's: a -inf bias per end-of-generation token, shown in the settings
            banned = dict.fromkeys(self.engine.require_ready().eog_ids, float("-inf"))
            params = replace(params, logit_bias={**params.logit_bias, **banned})
        return params

    def logit_bias(self, raw: dict[int | str, float]) -> dict[int, float]:
        """Token-id keys as they are; text keys give every token of the text the bias."""
        bias: dict[int, float] = {}
        for key, amount in raw.items():
            tokens = [key] if isinstance(key, int) else self.engine.tokenize(key, add_special=False,
                                                                              parse_special=False)
            for token in tokens:
                if self.engine.valid_token(token):
                    bias[token] = amount
        return bias

    def embedding_inputs(self, inputs: list[PromptInput], params: list[str], *,
                         truncate: bool = False) -> list[list[int]]:
        """Token lists to embed, each checked against the embedding context (`params` name the fields);
        with `truncate`, a longer input is cut to the context instead (Ollama's default)."""
        limit = self.engine.embedding_n_ctx
        token_lists = []
        for item, param in zip(inputs, params, strict=False):
            if isinstance(item, str):
                tokens = self.engine.tokenize(item, add_special=True, parse_special=True)
            else:
                tokens = self.mixed_tokens(item, lead=lambda text: self.engine.tokenize(text, add_special=True,
                                                                                         parse_special=True))
                if any(not self.engine.valid_token(t) for t in tokens):
                    raise InvalidRequestError("Input contains invalid tokens", param=param)
            if not tokens:
                raise InvalidRequestError("Input content cannot be empty", param=param)
            if len(tokens) > limit and truncate:
                tokens = tokens[:limit]
            elif len(tokens) > limit:
                raise InvalidRequestError(f"input ({len(tokens)} tokens) is too large to process: the embedding "
                                          f"context holds {limit} tokens", param=param)
            token_lists.append(tokens)
        return token_lists
