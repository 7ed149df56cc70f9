"""OpenAI transcriptions <-> kinetic: an uploaded clip becomes one chat turn that the model's audio projector
reads, and the answer becomes OpenAI's transcription (json, text or verbose_json) or its stream of
`transcript.text.delta` events.

The chat is llama-server's (server-chat.cpp `convert_transcriptions_to_chatcmpl`): the user asks
"Transcribe audio to text" (the request's `prompt` replaces that), adds " (language: LANG)" when `language`
is set, and the clip follows the text; an LFM2 template gets its own preset instead (a system turn
"Perform ASR." and the clip alone). Pure: nothing here touches an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kinetic.chat.answer import AnswerStream, parse_answer
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    ContentPart,
    GenerationOptions,
    MediaPart,
    Message,
    TextPart,
)
from kinetic.classroom.outcome import Outcome
from kinetic.engine.types import Event, Finished, Modalities, PromptProgress
from kinetic.errors import InvalidRequestError, KineticError
from kinetic.protocols.common import audio_file
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.streaming import sse_data, sse_done
from kinetic.protocols.openai.translate import error_body
from kinetic.protocols.openai.types import TranscriptionRequest

ASR_REQUEST = "Transcribe audio to text"
LFM2_SYSTEM = "Perform ASR."
LFM2_MARKERS = ("<|tool_list_start|>", "<|tool_list_end|>")  # llama.cpp's is_lfm2_template
# srt and vtt need each segment's times, which a chat model's answer does not carry
RESPONSE_FORMATS = ("json", "text", "verbose_json")


def check_model_hears(modalities: Modalities, model: str) -> None:
    """A 400 naming `model` for a model without an audio projector (llama-server answers 501 there)."""
    if not modalities.audio:
        reads = "images, not audio" if modalities.vision else "text only"
        raise InvalidRequestError(f"the model '{model}' reads {reads}: transcription needs an audio projector "
                                  "(start the server with -mm MMPROJ.gguf of an audio model)", param="model")


def check_request(req: TranscriptionRequest, clip: bytes) -> None:
    if req.response_format not in RESPONSE_FORMATS:
        raise InvalidRequestError(f"response_format '{req.response_format}' is not supported: use "
                                  f"{', '.join(RESPONSE_FORMATS)} (srt and vtt need timestamps the model does "
                                  "not give)", param="response_format")
    if not audio_file.is_audio(clip):
        raise InvalidRequestError("the file is not audio: send a WAV, MP3 or FLAC file", param="file")
    if req.response_format == "verbose_json" and audio_file.seconds(clip) is None:
        raise InvalidRequestError("verbose_json states the clip's duration, which kinetic reads from a WAV or "
                                  "FLAC header: send one of those, or ask for json or text",
                                  param="response_format")


def to_chat_request(req: TranscriptionRequest, clip: bytes, *, template_source: str) -> ChatRequest:
    """The chat that asks the model for the clip's words (the request checked by check_request)."""
    lfm2 = all(marker in template_source for marker in LFM2_MARKERS)
    instruction = req.prompt or ("" if lfm2 else ASR_REQUEST)
    if req.language:
        instruction += f" (language: {req.language})"
    parts: list[ContentPart] = [TextPart(instruction)] if instruction else []
    parts.append(MediaPart(kind="file", modality="audio", data=clip, param="file"))
    system = (Message(role="system", parts=(TextPart(LFM2_SYSTEM),)),) if lfm2 else ()
    max_tokens = common.max_tokens_from([("max_tokens", req.max_tokens)])
    return ChatRequest(messages=(*system, Message(role="user", parts=tuple(parts))),
                       options=GenerationOptions(sampling=common.sampling_options(req), max_tokens=max_tokens))


@dataclass
class TranscriptionContext:
    model: str
    answer_format: AnswerFormat
    response_format: str
    language: str | None
    duration: float | None  # the clip's seconds (verbose_json states them)
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.outcome.model = self.model


def transcription_context(req: TranscriptionRequest, clip: bytes, answer_format: AnswerFormat, *,
                          model: str) -> TranscriptionContext:
    return TranscriptionContext(model=model, answer_format=answer_format, response_format=req.response_format,
                                language=req.language, duration=audio_file.seconds(clip))


def usage(finished: Finished) -> dict[str, Any]:
    """OpenAI's token usage of a transcription (llama-server's numbers: the prompt includes the clip)."""
    counts = finished.usage
    return {"type": "tokens", "input_tokens": counts.prompt_tokens, "output_tokens": counts.completion_tokens,
            "total_tokens": counts.total_tokens, "input_tokens_details": {"cached_tokens": counts.cached_tokens}}


def done_event(text: str, finished: Finished) -> dict[str, Any]:
    return {"type": "transcript.text.done", "text": text, "usage": usage(finished)}


def to_transcription(_deltas: object, finished: Finished, ctx: TranscriptionContext) -> dict[str, Any] | str:
    """The whole answer in the format asked: `text` is the words alone; json is llama-server's body (the
    stream's closing event); verbose_json adds the task, the language asked for and the clip's length."""
    text = parse_answer(finished.text, ctx.answer_format).content or ""
    ctx.outcome.finished(finished, finished.finish_reason, answer=text)
    if ctx.response_format == "text":
        return text
    if ctx.response_format == "verbose_json":
        language = {"language": ctx.language} if ctx.language else {}
        return {"task": "transcribe", **language, "duration": ctx.duration, "text": text, "usage": usage(finished)}
    return done_event(text, finished)


class TranscriptEncoder:
    """Engine events -> `data: {"type": "transcript.text.delta"}` frames, then the `transcript.text.done`
    event and `data: [DONE]`, as llama-server streams a transcription."""

    def __init__(self, ctx: TranscriptionContext):
        self.ctx = ctx
        self.answer = AnswerStream(ctx.answer_format)
        self.text = ""

    @property
    def outcome(self) -> Outcome:
        return self.ctx.outcome

    def _delta(self, content: str) -> list[bytes]:
        if not content:
            return []
        self.text += content
        self.outcome.chunk(content)
        return [sse_data({"type": "transcript.text.delta", "delta": content})]

    def encode(self, event: Event) -> list[bytes]:
        if isinstance(event, PromptProgress):
            return []
        if isinstance(event, Finished):
            frames = [frame for piece in self.answer.finish() for frame in self._delta(piece.content)]
            self.outcome.finished(event, event.finish_reason)
            return [*frames, sse_data(done_event(self.text, event)), sse_done()]
        return self._delta(self.answer.push(event.text).content)

    def error(self, err: KineticError) -> list[bytes]:
        return [sse_data(error_body(err)), sse_done()]
