"""The transcription translator and the audio-file facts it reads, without a model: the chat llama-server builds
(server-chat.cpp `convert_transcriptions_to_chatcmpl`), the 400s naming their field, and the output shapes."""

from __future__ import annotations

import io
import struct
import wave

import pytest

from kinetic.chat.types import AnswerFormat, MediaPart, TextPart
from kinetic.engine.types import Finished, Modalities, TextDelta, Timings, Usage
from kinetic.errors import InvalidRequestError
from kinetic.protocols.common import audio_file
from kinetic.protocols.openai import transcription
from kinetic.protocols.openai.types import TranscriptionRequest


def wav(seconds: float, rate: int = 16000, width: int = 2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(width)
        file.setframerate(rate)
        file.writeframes(bytes(int(seconds * rate) * width))
    return out.getvalue()


def flac_header(rate: int, samples: int) -> bytes:
    """fLaC and a STREAMINFO block (the last metadata block), with no frames after it."""
    packed = (rate << 44) | (0 << 41) | (15 << 36) | samples
    info = struct.pack(">HH", 4096, 4096) + bytes(6) + packed.to_bytes(8, "big") + bytes(16)
    return b"fLaC" + bytes([0x80 | 0]) + len(info).to_bytes(3, "big") + info


def test_audio_files_are_known_by_their_first_bytes() -> None:
    assert audio_file.is_audio(wav(0.1))
    assert audio_file.is_audio(flac_header(44100, 44100))
    assert audio_file.is_audio(b"ID3\x04" + bytes(20)) and audio_file.is_audio(b"\xff\xfb\x90\x00" + bytes(20))
    assert not audio_file.is_audio(b"\x89PNG\r\n\x1a\n" + bytes(20))
    assert not audio_file.is_audio(b"RIFF\x00\x00\x00\x00AVI LIST")
    assert not audio_file.is_audio(b"fLaC")  # too short to be anything


def test_the_duration_comes_from_the_wav_and_flac_headers() -> None:
    assert audio_file.seconds(wav(2.5)) == pytest.approx(2.5)
    assert audio_file.seconds(wav(1.0, rate=8000, width=1)) == pytest.approx(1.0)
    assert audio_file.seconds(flac_header(48000, 120000)) == pytest.approx(2.5)
    assert audio_file.seconds(b"ID3\x04" + bytes(20)) is None  # an MP3 states none
    assert audio_file.seconds(wav(1.0)[:30]) is None  # cut before its data chunk


def test_the_chat_is_llama_servers() -> None:
    clip = wav(0.5)
    plain = transcription.to_chat_request(TranscriptionRequest(), clip, template_source="{{ messages }}")
    turn, = plain.messages
    assert turn.role == "user" and turn.parts is not None
    text, audio = turn.parts
    assert text == TextPart("Transcribe audio to text")
    assert isinstance(audio, MediaPart) and audio.modality == "audio" and audio.data == clip and audio.param == "file"
    asked = transcription.to_chat_request(TranscriptionRequest(prompt="Words, please", language="fr", max_tokens=5,
                                                               temperature=0.2), clip, template_source="")
    parts = asked.messages[0].parts
    assert parts is not None and parts[0] == TextPart("Words, please (language: fr)")
    assert asked.options.max_tokens == 5 and asked.options.sampling.get("temperature") == pytest.approx(0.2)


def test_an_lfm2_template_gets_its_own_preset() -> None:
    lfm2 = transcription.to_chat_request(TranscriptionRequest(), wav(0.5),
                                         template_source="<|tool_list_start|>{{ tools }}<|tool_list_end|>")
    system, user = lfm2.messages
    assert system.role == "system" and system.text == "Perform ASR."
    assert user.parts is not None and len(user.parts) == 1 and isinstance(user.parts[0], MediaPart)


@pytest.mark.parametrize(("request_fields", "clip", "param"), [
    ({"response_format": "srt"}, wav(0.5), "response_format"),
    ({"response_format": "vtt"}, wav(0.5), "response_format"),
    ({}, b"\x89PNG\r\n\x1a\n" + bytes(40), "file"),
    ({"response_format": "verbose_json"}, b"ID3\x04" + bytes(40), "response_format"),
])
def test_requests_that_cannot_be_answered_name_their_field(request_fields: dict[str, str], clip: bytes,
                                                           param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        transcription.check_request(TranscriptionRequest(**request_fields), clip)
    assert refused.value.param == param


def test_a_model_that_does_not_hear_is_a_400_naming_model() -> None:
    transcription.check_model_hears(Modalities(audio=True), "m")
    for modalities in (Modalities(), Modalities(vision=True)):
        with pytest.raises(InvalidRequestError) as refused:
            transcription.check_model_hears(modalities, "m")
        assert refused.value.param == "model" and "audio projector" in refused.value.message


def finished(text: str) -> Finished:
    return Finished(finish_reason="stop", stop_type="eos", stopping_word="", text=text, tokens=[],
                    usage=Usage(prompt_tokens=30, completion_tokens=3, cached_tokens=4),
                    timings=Timings(cache_n=4, prompt_n=26, prompt_ms=1.0, predicted_n=3, predicted_ms=1.0),
                    id_slot=0, tokens_cached=0, truncated=False)


def context(response_format: str, clip: bytes, language: str | None = None) -> transcription.TranscriptionContext:
    return transcription.transcription_context(TranscriptionRequest(response_format=response_format,
                                                                    language=language),
                                               clip, AnswerFormat(), model="m")


def test_the_three_formats() -> None:
    clip = wav(1.5)
    body = transcription.to_transcription([], finished("hello there"), context("json", clip))
    assert body == {"type": "transcript.text.done", "text": "hello there",
                    "usage": {"type": "tokens", "input_tokens": 30, "output_tokens": 3, "total_tokens": 33,
                              "input_tokens_details": {"cached_tokens": 4}}}
    assert transcription.to_transcription([], finished("hello there"), context("text", clip)) == "hello there"
    verbose = transcription.to_transcription([], finished("hi"), context("verbose_json", clip, language="en"))
    assert isinstance(verbose, dict)
    assert (verbose["task"], verbose["language"], verbose["duration"], verbose["text"]) == ("transcribe", "en",
                                                                                          pytest.approx(1.5), "hi")


def test_the_stream_sends_deltas_then_the_done_event() -> None:
    ctx = context("json", wav(0.5))
    encoder = transcription.TranscriptEncoder(ctx)
    frames = [frame for text in ("hel", "lo") for frame in encoder.encode(TextDelta(text=text, token_id=1))]
    frames += encoder.encode(finished("hello"))
    assert frames[0] == b'data: {"type":"transcript.text.delta","delta":"hel"}\n\n'
    assert b'"type":"transcript.text.done","text":"hello"' in frames[-2] and frames[-1] == b"data: [DONE]\n\n"
    assert ctx.outcome.chunks == 2 and ctx.outcome.prompt_tokens == 30
