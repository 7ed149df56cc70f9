"""Pure helpers more than one protocol's translator uses: sampler-field validation, chat messages
and tools into the neutral types, raw prompts, token log-probabilities, ids.

Nothing here touches an engine: values the server must resolve (defaults, text logit-bias keys,
tokenization) travel on in the neutral request.
"""

from __future__ import annotations

import json
import math
import secrets
import string
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel

from kinetic.chat.types import (
    SAMPLER_FIELDS,
    GenerationOptions,
    MediaPart,
    Message,
    PromptInput,
    SamplingOptions,
    TextPart,
    ToolCall,
    ToolSpec,
)
from kinetic.engine.types import TokenLogprob, sampler_order
from kinetic.errors import InvalidRequestError, field_error, range_error
from kinetic.protocols.common import media
from kinetic.protocols.common.types import (
    ChatMessage,
    ContentPart,
    ImageUrlPart,
    InputAudio,
    InputAudioPart,
    MediaUrl,
    SamplingFields,
    Tool,
)
from kinetic.protocols.common.types import TextPart as WireText

MAX_TOP_LOGPROBS = 20
# OpenAI's structured-output types, the same in Chat Completions' response_format and Responses' text.format
FORMAT_TYPES = ("text", "json_object", "json_schema")
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # json_object, and a json_schema sent without its schema
ALPHANUMERIC = string.ascii_letters + string.digits


def random_id(prefix: str, length: int) -> str:
    """`prefix` and `length` characters drawn uniformly from ALPHANUMERIC, from one read of the system's random
    bytes (a read per character, as secrets.choice does, took ~0.1 ms of every request): bytes at or above the
    largest multiple of the alphabet's size are dropped, so that each character is equally likely."""
    cut = 256 - 256 % len(ALPHANUMERIC)
    chars: list[str] = []
    while len(chars) < length:
        chars += [ALPHANUMERIC[b % len(ALPHANUMERIC)] for b in secrets.token_bytes(length) if b < cut]
    return prefix + "".join(chars[:length])


# ----------------------------------------------------------------------------- sampler fields


def check_range(field: str, value: float | int | None, low: float, high: float) -> None:
    if value is None:
        return
    if not (low <= value <= high) or (isinstance(value, float) and math.isnan(value)):
        raise range_error(field, low, high, value)


def stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    return tuple(s for s in stop if s)


def max_tokens_from(candidates: Iterable[tuple[str, int | None]], *, minimum: int = 1) -> int | None:
    """The first limit the client set (named so an error can name it); None: the server's -n."""
    for name, value in candidates:
        if value is None:
            continue
        if value < minimum and not (minimum == -1 and value == -1):
            raise field_error(name, f"Value must be >= {minimum}, but got {value}")
        return value
    return None


def logit_bias_from(raw: dict[str, Any] | list[Any] | None) -> dict[int | str, float] | None:
    """OpenAI object form ({"15043": -100}) or llama.cpp array form ([[15043, -100], ["Hello", 2]]).
    Keys that are not integers are text, tokenized by the server. `false` bans the token. None (not
    sent): the server's --logit-bias; anything sent, even empty, replaces it, as in llama-server."""
    if raw is None:
        return None
    if not raw:
        return {}
    items = raw.items() if isinstance(raw, dict) else [tuple(pair) for pair in raw
                                                       if isinstance(pair, list) and len(pair) == 2]
    bias: dict[int | str, float] = {}
    for key, value in items:
        if value is False:
            amount = float("-inf")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            amount = float(value)
        else:
            raise field_error("logit_bias", f"bias for {key!r} must be a number or false")
        if isinstance(key, int) or (isinstance(key, str) and key.lstrip("-").isdigit()):
            bias[int(key)] = amount
        else:
            bias[str(key)] = amount
    return bias


INT_MAX = 2147483647
def clamp(value: float | int, low: float, high: float) -> Any:
    return min(max(value, low), high)


def wire_breakers(name: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(b, str) for b in raw):
        raise field_error(name, "Error: dry_sequence_breakers must be a non-empty array of strings")
    return tuple(raw)


def within(low: float, high: float) -> Callable[[str, Any], Any]:
    """A range a value must be in: outside it, a 400 naming the field."""
    def check(name: str, value: Any) -> Any:
        check_range(name, value, low, high)
        return value
    return check


def clamped(low: float, high: float) -> Callable[[str, Any], Any]:
    """A range a value is moved into, as llama-server does for these fields."""
    return lambda name, value: clamp(value, low, high)


def penalty(name: str, value: Any) -> Any:
    if not (math.isfinite(value) and value > 0):
        raise InvalidRequestError("Failed to initialize samplers: penalty_repeat must be finite and greater than 0",
                                  param=name)
    return value


# What a sent sampler value must satisfy, or becomes, by field (llama-server's params_from_json_cmpl);
# a field not named here passes as sent. None out of a rule: the server's default stays.
SAMPLER_RULES: dict[str, Callable[[str, Any], Any]] = {
    "top_p": within(0.0, 1.0), "min_p": within(0.0, 1.0),
    "presence_penalty": within(-2.0, 2.0), "frequency_penalty": within(-2.0, 2.0),
    "repeat_penalty": penalty, "repeat_last_n": within(0, INT_MAX),
    "dry_allowed_length": within(0, INT_MAX), "dry_penalty_last_n": within(0, INT_MAX), "min_keep": within(0, INT_MAX),
    "adaptive_decay": within(0.0, 0.99), "top_k": lambda name, value: max(0, value),
    "xtc_probability": clamped(0.0, 1.0), "xtc_threshold": clamped(0.0, 1.0), "mirostat": clamped(0, 2),
    "adaptive_target": clamped(float("-inf"), 1.0),
    "dry_base": lambda name, value: value if value >= 1.0 else None,  # below 1: the default
    "dry_sequence_breakers": wire_breakers, "samplers": lambda name, value: sampler_order(value),
}
# Other spellings of a sampler field on the wire, and the field they set when its own name is not sent
SAMPLER_SPELLINGS = {"repetition_penalty": "repeat_penalty"}  # SillyTavern's


def sampling_options(body: BaseModel, *, temperature_max: float = 2.0) -> SamplingOptions:
    """The sampler fields a request model sent (chat.types.SAMPLER_FIELDS, by their own names, or a
    SAMPLER_SPELLINGS alias), validated and normalised by SAMPLER_RULES; a protocol's model holds those of
    them it accepts."""
    wanted = {*SAMPLER_FIELDS, *SAMPLER_SPELLINGS, "logit_bias"}
    sent = {name: value for name, value in body.model_dump(include=wanted).items() if value is not None}
    for spelling, name in SAMPLER_SPELLINGS.items():
        if spelling in sent:
            sent.setdefault(name, sent.pop(spelling))
    rules = {**SAMPLER_RULES, "temperature": within(0.0, temperature_max)}
    chosen = {}
    for name, value in sent.items():
        if name in SAMPLER_FIELDS and (kept := rules.get(name, lambda _, v: v)(name, value)) is not None:
            chosen[name] = kept
    return SamplingOptions(chosen=chosen, logit_bias=logit_bias_from(sent.get("logit_bias")))


def generation_options(body: SamplingFields, *, max_tokens: int | None, n_probs: int = 0) -> GenerationOptions:
    return GenerationOptions(
        sampling=sampling_options(body),
        max_tokens=max_tokens,
        stop=stop_list(body.stop),
        n_probs=n_probs,
        cache_prompt=body.cache_prompt,
        id_slot=body.id_slot if body.id_slot is not None else -1,
        n_keep=n_keep(body.n_keep),
        n_discard=n_discard(body.n_discard),
        post_sampling_probs=bool(body.post_sampling_probs),
        lora=lora_request(body.lora),
    )


def lora_entries(value: Any, *, param: str) -> dict[int, float]:
    """`[{"id": 0, "scale": 0.5}, ...]` as llama-server's parse_lora_request reads it: a missing `id` is -1 (no
    adapter), a missing `scale` 0."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise InvalidRequestError(f"'{param}' must be an array of objects with 'id' and 'scale' fields", param=param)
    scales: dict[int, float] = {}
    for entry in value:
        index, scale = entry.get("id", -1), entry.get("scale", 0.0)
        if isinstance(index, bool) or not isinstance(index, int) or isinstance(scale, bool) \
                or not isinstance(scale, (int, float)):
            raise InvalidRequestError("`id` must be an integer and `scale` a number", param=param)
        scales[index] = float(scale)
    return scales


def lora_request(value: Any) -> tuple[tuple[int, float], ...] | None:
    """A request's own `lora`: its (id, scale) pairs, or None for the server's scales (none given, or an empty
    list, as llama-server takes it)."""
    if value is None:
        return None
    scales = lora_entries(value, param="lora")
    return tuple(sorted(scales.items())) or None


def n_keep(value: int | None) -> int | None:
    check_range("n_keep", value, -1, INT_MAX)
    return value


def n_discard(value: int | None) -> int:
    check_range("n_discard", value, 0, INT_MAX)
    return value or 0


# ------------------------------------------------------------------------- messages and tools


def _arguments(arguments: str | dict[str, Any]) -> Any:
    """Tool-call arguments as an object, as templates read them (JSON text that does not parse stays text)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return arguments


def _url_of(value: MediaUrl | str | None) -> tuple[str | None, str]:
    """A media field's URL (or llama-server's `data`) and the key it sat under, for the 400's field path."""
    if value is None or isinstance(value, str):
        return value, ""
    return (value.data, ".data") if value.url is None and value.data is not None else (value.url, ".url")


def content_part(part: ContentPart, param: str) -> TextPart | MediaPart:
    """One content part; `param` is its place (`messages[1].content[0]`)."""
    if isinstance(part, WireText):
        return TextPart(part.text)
    if isinstance(part, ImageUrlPart):
        url, key = _url_of(part.image_url)
        return media.media_part(url, kind=part.type, modality="image", param=f"{param}.image_url{key}")
    if isinstance(part, InputAudioPart):
        audio = part.input_audio or InputAudio()
        url, key = (audio.url, ".url") if audio.data is None and audio.url is not None else (audio.data, ".data")
        return media.media_part(url, kind=part.type, modality="audio", param=f"{param}.input_audio{key}")
    # the field named by the type, as llama-server reads it
    url, key = _url_of(part.input_video if part.type == "input_video" else part.video_url)
    return media.media_part(url, kind=part.type, modality="video", param=f"{param}.{part.type}{key}")


def to_message(message: ChatMessage, param: str = "messages[0]") -> Message:
    """An OpenAI-style chat message as a neutral one (`developer` is a system turn); `param` is its place."""
    known = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
    extra = {k: v for k, v in message.model_dump(exclude_none=True).items() if k not in known}
    parts: tuple[TextPart | MediaPart, ...] | None
    if message.content is None:
        parts = None
    elif isinstance(message.content, str):
        parts = (TextPart(message.content),)
    else:
        parts = tuple(content_part(p, f"{param}.content[{i}]") for i, p in enumerate(message.content))
    calls = tuple(ToolCall(name=c.function.name, arguments=_arguments(c.function.arguments), id=c.id)
                  for c in message.tool_calls or ())
    return Message(role="system" if message.role == "developer" else message.role, parts=parts,
                   tool_calls=calls, tool_call_id=message.tool_call_id, name=message.name,
                   reasoning_content=message.reasoning_content, extra=extra)


def to_messages(messages: list[ChatMessage]) -> tuple[Message, ...]:
    """Validated neutral messages, llama-server's wording for what is missing."""
    if not messages:
        raise field_error("messages", "must contain at least one message, but got an empty list")
    for index, message in enumerate(messages):
        if message.role == "assistant":
            if message.content is None and not message.tool_calls:
                raise InvalidRequestError("Assistant message must contain either 'content' or 'tool_calls'!",
                                          param=f"messages[{index}]")
        elif message.content is None:
            raise InvalidRequestError("All non-assistant messages must contain 'content'",
                                      param=f"messages[{index}].content")
    return tuple(to_message(m, f"messages[{i}]") for i, m in enumerate(messages))


def to_tools(tools: list[Tool] | None) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec(name=t.function.name, description=t.function.description,
                          parameters=t.function.parameters,
                          extra={"strict": t.function.strict} if t.function.strict is not None else {})
                 for t in tools or ())


# ------------------------------------------------------------------------------------ prompts


def prompt_input(prompt: Any, field_name: str = "prompt") -> PromptInput:
    """A prompt given as text, token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and not prompt:
        raise field_error(field_name, "must not be empty")
    raise field_error(field_name, "must be a string or a list of token ids (one prompt per request)")


def logprob_entry(logprob: TokenLogprob, n_top: int) -> dict[str, Any]:
    """A token's log-probability and its top alternatives, the shape OpenAI's `logprobs.content`
    and llama-server's `completion_probabilities` share."""
    return {
        "id": logprob.id,
        "token": logprob.token,
        "bytes": logprob.bytes,
        "logprob": logprob.logprob,
        "top_logprobs": [
            {"id": alt.id, "token": alt.token, "bytes": alt.bytes, "logprob": alt.logprob}
            for alt in logprob.top_logprobs[:n_top]
        ],
    }


def continuation(raw: Any) -> Any:
    """`continue_final_message` (vLLM's and transformers' name, which llama-server takes): true, "content"
    or "reasoning_content"; anything else asks for nothing (common_chat_continuation_parse)."""
    if raw is True:
        return "auto"
    if raw == "content":
        return "content"
    if raw == "reasoning_content":
        return "reasoning"
    return None
