"""The protocol-neutral requests every protocol's translator produces.

A translator turns its wire request into one of these without touching an engine; the chat
layer (kinetic.chat.prepare) then renders, tokenizes and compiles them into a GenerationRequest.
Fields left None take the server's defaults there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol

from kinetic.engine.types import SamplingParams


@dataclass(frozen=True)
class TextPart:
    text: str


MediaKind = Literal["image", "audio", "video", "document"]


@dataclass(frozen=True)
class MediaPart:
    """An image, audio, video or document part.

    `kind` is the wire name ("image_url", "input_audio", "input_image", "image", "images"...), for
    messages; `modality` is what the model must read. The file is either in the request (`data`: the
    decoded bytes of a data: URL or base64 field) or named by it (`url`: http(s):// or file://), which
    the backend loads (kinetic/backends/media_source.py) before the chat layer sees the request.
    `param` is the request field it came from, for a 400 naming it."""

    kind: str
    modality: MediaKind = "image"
    data: bytes | None = None
    url: str | None = None
    param: str = "messages"


ContentPart = TextPart | MediaPart


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any  # an object, or the JSON text the caller sent when it does not parse
    id: str | None = None

    def openai(self, arguments: Any, id: str | None) -> dict[str, Any]:  # noqa: A002  OpenAI's own field name
        """The call as an OpenAI message's `tool_calls` entry, with `arguments` as the reader wants them (a
        template: the object; a server: JSON text) and `id` (none: the entry has no id)."""
        call = {"type": "function", "function": {"name": self.name, "arguments": arguments}}
        return call if id is None else {"id": id, **call}


@dataclass(frozen=True)
class Message:
    """One chat turn. `parts` is None when the wire message had no content (an assistant's call)."""

    role: str  # "system", "user", "assistant", "tool" (others pass through to the template)
    parts: tuple[ContentPart, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields a template may read, passed through

    @property
    def text(self) -> str | None:
        if self.parts is None:
            return None
        return "\n".join(part.text for part in self.parts if isinstance(part, TextPart))

    def addressing(self) -> dict[str, str]:
        """The OpenAI message fields that say who speaks and which call a tool's turn answers, where set."""
        return {key: value for key, value in (("name", self.name), ("tool_call_id", self.tool_call_id))
                if value is not None}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolChoice:
    """`auto`: the model may call; `none`: it may not (and is not told about tools); `required`:
    it must call one (`name` set: that one)."""

    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None


@dataclass(frozen=True)
class OutputConstraint:
    """What the answer must look like: a GBNF grammar, a JSON schema, or any JSON value.
    `param` names the request field that asked, for error messages."""

    grammar: str | None = None
    schema: dict[str, Any] | None = None
    any_json: bool = False
    param: str = ""

    @property
    def is_set(self) -> bool:
        return self.grammar is not None or self.schema is not None or self.any_json


# The sampler fields a request may set: SamplingParams' (the one declaration of each sampler, its type and
# llama-server's default) but the grammar, which comes from the output constraint, and the logit bias, whose
# text keys need the tokenizer.
SAMPLER_FIELDS = frozenset(f.name for f in fields(SamplingParams)) - {"grammar", "logit_bias"}


@dataclass(frozen=True)
class SamplingOptions:
    """The sampler fields the client set (validated: kinetic.protocols.common.translate.sampling_options), by
    their SamplingParams names; the chat layer lays them over the server's defaults, the upstream body builder
    sends OpenAI's of them. `logit_bias` keys are token ids or text (every token of the text gets the bias);
    None: the server's, and a request's own (even {}) replaces it."""

    chosen: Mapping[str, Any] = field(default_factory=dict)
    logit_bias: dict[int | str, float] | None = None

    def __post_init__(self) -> None:
        if unknown := set(self.chosen) - SAMPLER_FIELDS:
            raise ValueError(f"not sampler fields: {sorted(unknown)}")

    def get(self, name: str) -> Any:
        """The client's value of one field, None where it set none."""
        return self.chosen.get(name)

    def with_values(self, **values: Any) -> SamplingOptions:
        return replace(self, chosen={**self.chosen, **values})


@dataclass(frozen=True)
class GenerationOptions:
    """What every generation route asks besides its input."""

    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    max_tokens: int | None = None  # None: the server's -n
    stop: tuple[str, ...] = ()
    n_probs: int = 0
    cache_prompt: bool | None = None  # None: the server's (--cache-prompt, on by default)
    id_slot: int = -1
    n_keep: int | None = None  # prompt tokens a context shift keeps (-1: all); None: the server's --keep
    n_discard: int = 0  # tokens a context shift drops (0: half of those after n_keep)
    post_sampling_probs: bool = False  # n_probs after the sampler chain, as probabilities
    return_progress: bool = False  # prompt-progress events while the prompt is evaluated
    # Ollama's: `num_ctx` below the slot's context limits prompt + answer; `context` (the tokens an
    # earlier /api/generate returned) goes before this prompt
    context_limit: int | None = None
    prior_tokens: tuple[int, ...] = ()
    lora: tuple[tuple[int, float], ...] | None = None  # adapter (id, scale) pairs; None: the server's scales


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    options: GenerationOptions = field(default_factory=GenerationOptions)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    reasoning_format: str | None = None  # None: the server's --reasoning-format
    reasoning_budget: int | None = None  # thinking tokens (-1, None: the server's --reasoning-budget)
    reasoning_budget_message: str | None = None  # None: the server's --reasoning-budget-message
    reasoning_control: bool = False  # its thinking may be ended while it runs (/v1/chat/completions/control)
    output: OutputConstraint = field(default_factory=OutputConstraint)
    # Continue the last message instead of answering it: "auto" (its reasoning when it has only that,
    # else its content), "content" or "reasoning"; None: not asked (a last assistant message is still
    # continued unless the server runs with --no-prefill-assistant)
    continue_final_message: Literal["auto", "content", "reasoning"] | None = None
    # An empty `messages` is a 400 (OpenAI's and Ollama's rule); llama-server's Anthropic route renders
    # it as just the generation prompt, and kinetic's follows it there.
    allow_empty: bool = False
    template: str | None = None  # a derived model's own Jinja chat template, rendered instead of the model's


# Text, token ids, or both mixed ([12, "text", 34]: the text is tokenized in place, BOS only when it leads)
PromptInput = str | list[int] | list[int | str]


@dataclass(frozen=True)
class PromptRequest:
    """A raw prompt (text, or token ids) to continue: /completion, /v1/completions, /api/generate raw."""

    prompt: PromptInput
    options: GenerationOptions = field(default_factory=GenerationOptions)
    output: OutputConstraint = field(default_factory=OutputConstraint)
    param: str = "prompt"  # the field the prompt came from, for error messages
    # llama-server's `multimodal_data`: one file per media marker in a text prompt, in order
    media: tuple[MediaPart, ...] = ()


@dataclass(frozen=True)
class InfillRequest:
    """Fill in the middle (llama-server's /infill): code before and after the gap, other files as
    context (`extra`: (filename, text) pairs), and an optional start of the answer (`prompt`)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    options: GenerationOptions = field(default_factory=GenerationOptions)
    output: OutputConstraint = field(default_factory=OutputConstraint)


ToolMode = Literal["forced", "auto", "none"]


@dataclass(frozen=True)
class AnswerFormat:
    """How the outward translation reads a chat answer's text: where its reasoning starts and ends, and
    which tool calls it may hold in which format. An answer that arrives already split (an upstream
    server's) has nothing to read out of its text: the defaults."""

    reasoning_format: str = "none"
    starts_in_reasoning: bool = False
    tool_mode: ToolMode = "none"
    tool_names: tuple[str, ...] = ()
    call_format: str = "json"  # the template's tool-call format (kinetic.chat.callformats)
    tool_parameters: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, parameters schema): types values


class PreparedRequest(Protocol):
    """What the protocols read of any backend's prepared request (a local GenerationRequest, an upstream
    ForwardRequest), to echo it: llama-server's generation_settings and `__verbose`, Ollama's `context`."""

    @property
    def sampling(self) -> SamplingParams: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def stop(self) -> tuple[str, ...]: ...
    @property
    def n_probs(self) -> int: ...
    @property
    def n_keep(self) -> int: ...
    @property
    def n_discard(self) -> int: ...
    @property
    def post_sampling_probs(self) -> bool: ...
    @property
    def lora(self) -> tuple[tuple[int, float], ...] | None: ...
    @property
    def n_prompt_tokens(self) -> int:
        """The prompt's tokens as kinetic counted them (media stand-ins included; 0 where it never saw them)."""
    @property
    def text_tokens(self) -> list[int]:
        """The prompt's text tokens, as a client may be given them (none where kinetic never saw them)."""

