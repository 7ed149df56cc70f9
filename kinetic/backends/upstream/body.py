"""The neutral request as an OpenAI body: what an upstream is sent instead of a token prompt, and the
ForwardRequest that carries it to the upstream backend's start."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from kinetic.chat.constraints import template_tools, tool_plan
from kinetic.chat.types import ChatRequest, MediaPart, Message, OutputConstraint, PromptInput, PromptRequest, TextPart
from kinetic.engine.types import SamplingParams
from kinetic.errors import InvalidRequestError

# the first bytes of the files a projector reads, for the data: URL's type the upstream is sent
SIGNATURES = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
              (b"BM", "image/bmp"), (b"RIFF", "audio/wav"), (b"ID3", "audio/mpeg"), (b"\xff\xfb", "audio/mpeg"),
              (b"fLaC", "audio/flac"))


# The sampler fields an OpenAI-compatible server takes, which kinetic's SamplingParams names the same way
OPENAI_SAMPLERS = frozenset(("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed"))


@dataclass(frozen=True)
class ForwardRequest:
    """What an upstream model starts: the OpenAI route and body to send, and who asked (the waiting line
    serves by client and priority). The rest is what the protocols echo of any prepared request: the
    limits the body asks for, the server's sampler defaults (the upstream applies its own), and no prompt
    tokens, which only the upstream sees."""

    route: str
    payload: dict[str, Any]
    client: str = ""
    priority: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = -1
    stop: tuple[str, ...] = ()
    n_probs: int = 0
    n_keep: int = 0
    n_discard: int = 0
    post_sampling_probs: bool = False
    lora: tuple[tuple[int, float], ...] | None = None
    n_prompt_tokens: int = 0

    @property
    def text_tokens(self) -> list[int]:
        return []

    @classmethod
    def of(cls, route: str, payload: dict[str, Any], *, client: str, priority: int) -> ForwardRequest:
        return cls(route=route, payload=payload, client=client, priority=priority,
                   max_tokens=payload.get("max_tokens", -1), stop=tuple(payload.get("stop", ())))


def file_type(part: MediaPart) -> str:
    data = part.data or b""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in SIGNATURES if data.startswith(magic)), f"{part.modality}/octet-stream")


def media_content(part: MediaPart) -> dict[str, Any]:
    """A file as an OpenAI content part, inline: the backend loaded every URL under kinetic's own rules first, so
    an upstream never fetches what a student named."""
    if part.data is None or part.modality not in ("image", "audio"):
        raise InvalidRequestError(f"{part.kind} input cannot be sent to the upstream server", param=part.param)
    encoded = base64.b64encode(part.data).decode("ascii")
    mime = file_type(part)
    if part.modality == "audio":
        return {"type": "input_audio", "input_audio": {"data": encoded, "format": mime.split("/")[1].replace(
            "mpeg", "mp3")}}
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{encoded}"}}


def openai_message(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role}
    if message.parts is not None and any(isinstance(part, MediaPart) for part in message.parts):
        data["content"] = [{"type": "text", "text": part.text} if isinstance(part, TextPart) else media_content(part)
                           for part in message.parts]
    elif message.parts is not None:
        data["content"] = message.text
    data.update(message.addressing())
    if message.tool_calls:  # an OpenAI server reads arguments as JSON text, and every call with an id
        data["tool_calls"] = [call.openai(call.arguments if isinstance(call.arguments, str)
                                          else json.dumps(call.arguments), call.id or f"call_{i}")
                              for i, call in enumerate(message.tool_calls)]
    return data


def output_fields(output: OutputConstraint) -> dict[str, Any]:
    if output.schema is not None:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": output.schema}}}
    if output.any_json:
        return {"response_format": {"type": "json_object"}}
    if output.grammar:
        return {"grammar": output.grammar}  # llama-server's (and kinetic's) extension
    return {}


def option_fields(req: ChatRequest | PromptRequest, n_predict: int) -> dict[str, Any]:
    options, sampling = req.options, req.options.sampling
    body: dict[str, Any] = {}
    max_tokens = options.max_tokens if options.max_tokens is not None else n_predict
    if max_tokens is not None and max_tokens > 0:
        body["max_tokens"] = max_tokens
    if options.stop:
        body["stop"] = list(options.stop)
    body.update({name: value for name, value in sampling.chosen.items() if name in OPENAI_SAMPLERS})
    return body


def tool_fields(req: ChatRequest) -> dict[str, Any]:
    """`tools`, `tool_choice` and `parallel_tool_calls` as OpenAI writes them (validated here first,
    so a bad choice is kinetic's 400 naming the field, whatever the upstream would say)."""
    mode, only = tool_plan(req)
    if not req.tools:
        return {}
    choice: Any = {"auto": "auto", "none": "none", "forced": "required"}[mode]
    if only is not None:
        choice = {"type": "function", "function": {"name": only}}
    body: dict[str, Any] = {"tools": template_tools(req), "tool_choice": choice}
    if req.parallel_tool_calls:
        body["parallel_tool_calls"] = True
    return body


def chat_body(req: ChatRequest, model: str, n_predict: int) -> dict[str, Any]:
    body = {"model": model, "messages": [openai_message(m) for m in req.messages], "stream": True,
            "stream_options": {"include_usage": True}, **option_fields(req, n_predict), **output_fields(req.output),
            **tool_fields(req)}
    if req.template_kwargs:
        body["chat_template_kwargs"] = req.template_kwargs
    if req.continue_final_message is not None:  # vLLM's and llama-server's spelling
        body["continue_final_message"] = {"auto": True, "content": "content",
                                          "reasoning": "reasoning_content"}[req.continue_final_message]
        body["add_generation_prompt"] = False
    return body


def prompt_body(req: PromptRequest, model: str, n_predict: int) -> dict[str, Any]:
    if req.media:
        raise InvalidRequestError("an upstream model takes images and audio in chat messages only (its "
                                  "/v1/completions has no media field)", param=req.media[0].param)
    prompt: PromptInput = req.prompt
    return {"model": model, "prompt": prompt, "stream": True, "stream_options": {"include_usage": True},
            **option_fields(req, n_predict), **output_fields(req.output)}
