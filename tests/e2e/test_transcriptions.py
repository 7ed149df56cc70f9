"""POST /v1/audio/transcriptions (and /audio/transcriptions), llama-server's: an uploaded clip read by the model's
audio projector, through the openai SDK's `client.audio.transcriptions.create`.

The server is the bundled Gemma with the tiny random audio projector (tests/projector_model.py), so the words are
nonsense; what is checked is that the clip reaches the model (its embeddings are in the prompt's count, the
ledger says one audio clip), that `language`, `prompt`, `max_tokens` and `response_format` act, and that a text
model, a file that is not audio and a format the answer cannot fill are 400s naming their field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from kinetic.classroom.ledger import LedgerRecord, read_ledger
from tests.projector_model import png_image, tiny_projector, wav_tone
from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

MODEL = "listener"
AUDIO_EMBEDDINGS = 15  # the tiny audio projector reads any clip up to 30 s as one window of 15 embeddings
CLIP = wav_tone(1.0, 440.0)


@pytest.fixture(scope="module")
def served(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KineticServer, Path]]:
    ledger = tmp_path_factory.mktemp("transcriptions") / "ledger.jsonl"
    with KineticServer("-mm", str(tiny_projector("audio")), "-c", "2048", "-np", "1", "-n", "6", "-a", MODEL,
                       "--ledger", str(ledger)) as server:
        yield server, ledger


@pytest.fixture(scope="module")
def client(served: tuple[KineticServer, Path]) -> OpenAI:
    return OpenAI(base_url=served[0].url + "/v1", api_key="sk-test", max_retries=0, timeout=120)


def transcribe(served: tuple[KineticServer, Path], files: dict[str, tuple[str, bytes, str]] | None = None,
               path: str = "/v1/audio/transcriptions", **fields: str) -> httpx.Response:
    upload = files if files is not None else {"file": ("clip.wav", CLIP, "audio/wav")}
    return httpx.post(served[0].url + path, data={"model": MODEL, **fields}, files=upload, timeout=120)


def test_sdk_transcription_reads_the_clip_and_counts_its_tokens(client: OpenAI) -> None:
    result = client.audio.transcriptions.create(model=MODEL, file=("clip.wav", CLIP, "audio/wav"))
    assert isinstance(result.text, str)
    usage = result.usage
    assert usage is not None and usage.type == "tokens"
    assert usage.input_tokens >= AUDIO_EMBEDDINGS + 5  # the clip's embeddings and the request around them
    assert 1 <= usage.output_tokens <= 6 and usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_language_and_prompt_change_the_request_the_model_reads(served: tuple[KineticServer, Path]) -> None:
    def input_tokens(**fields: str) -> int:
        response = transcribe(served, **fields)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["type"] == "transcript.text.done"
        return int(body["usage"]["input_tokens"])

    plain = input_tokens()
    assert input_tokens(language="fr") > plain  # " (language: fr)" follows the request
    assert input_tokens(prompt="Write down every word of this recording, please") > plain


def test_max_tokens_limits_the_transcript(served: tuple[KineticServer, Path]) -> None:
    response = transcribe(served, max_tokens="1")
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["output_tokens"] == 1


def test_text_and_verbose_json_formats(client: OpenAI, served: tuple[KineticServer, Path]) -> None:
    text = client.audio.transcriptions.create(model=MODEL, file=("clip.wav", CLIP, "audio/wav"),
                                              response_format="text")
    assert isinstance(text, str)
    plain = transcribe(served, response_format="text")
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain")
    verbose = client.audio.transcriptions.create(model=MODEL, file=("clip.wav", wav_tone(2.5, 330.0), "audio/wav"),
                                                 response_format="verbose_json", language="en")
    assert verbose.duration == pytest.approx(2.5) and verbose.language == "en" and isinstance(verbose.text, str)
    assert verbose.model_dump()["task"] == "transcribe"


def test_streamed_transcript_ends_with_the_done_event(client: OpenAI) -> None:
    events = list(client.audio.transcriptions.create(model=MODEL, file=("clip.wav", CLIP, "audio/wav"), stream=True))
    deltas = [event for event in events if event.type == "transcript.text.delta"]
    done = events[-1]
    assert done.type == "transcript.text.done" and [e.type for e in events[:-1]] == [d.type for d in deltas]
    assert done.text == "".join(delta.delta for delta in deltas)
    assert done.usage is not None and done.usage.input_tokens >= AUDIO_EMBEDDINGS + 5


def test_the_route_without_v1_is_the_same_route(served: tuple[KineticServer, Path]) -> None:
    response = transcribe(served, path="/audio/transcriptions", response_format="json")
    assert response.status_code == 200 and response.json()["usage"]["input_tokens"] >= AUDIO_EMBEDDINGS + 5
    wait_until(lambda: any(r.route == "/audio/transcriptions" and r.media is not None and r.media.audio == 1
                           and r.prompt_tokens == response.json()["usage"]["input_tokens"]
                           for r in read_ledger(served[1])), "the ledger line of /audio/transcriptions", timeout=10)


def test_a_file_that_is_not_audio_is_a_400_naming_file(client: OpenAI, served: tuple[KineticServer, Path]) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model=MODEL, file=("picture.png", png_image(32, 32, 7), "image/png"))
    assert refused.value.status_code == 400
    error = refused.value.response.json()["error"]
    assert error["param"] == "file" and "not audio" in error["message"]
    text = transcribe(served, files={"file": ("notes.txt", b"hello, this is no recording at all", "text/plain")})
    assert text.status_code == 400 and text.json()["error"]["param"] == "file"


def test_missing_file_and_unfillable_formats_are_400s(served: tuple[KineticServer, Path]) -> None:
    missing = httpx.post(served[0].url + "/v1/audio/transcriptions", data={"model": MODEL}, timeout=30)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "file"
    for response_format in ("srt", "vtt"):
        refused = transcribe(served, response_format=response_format)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_format"
    mp3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(64)  # an MP3 states no duration in a header
    refused = transcribe(served, files={"file": ("clip.mp3", mp3, "audio/mpeg")}, response_format="verbose_json")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_format"
    after = transcribe(served)  # and the server keeps serving, its slot free
    assert after.status_code == 200
    slots = httpx.get(served[0].url + "/slots", timeout=10).json()
    assert not any(slot["is_processing"] for slot in slots)


def test_the_ledger_records_the_audio_clip_and_its_tokens(served: tuple[KineticServer, Path]) -> None:
    response = transcribe(served, language="de")
    assert response.status_code == 200
    usage = response.json()["usage"]

    def line() -> LedgerRecord | None:
        lines = [r for r in read_ledger(served[1]) if r.route == "/v1/audio/transcriptions"
                 and r.prompt_tokens == usage["input_tokens"] and r.status == 200]
        return lines[-1] if lines else None

    wait_until(lambda: line() is not None, "the transcription's ledger line", timeout=10)
    record = line()
    assert record is not None and record.model == MODEL and record.completion_tokens == usage["output_tokens"]
    assert record.media is not None and record.media.audio == 1 and record.media.images == 0
    assert record.media.tokens >= AUDIO_EMBEDDINGS


def test_a_text_only_model_is_a_400_naming_model(live_server: KineticServer) -> None:
    sdk = OpenAI(base_url=live_server.url + "/v1", api_key="sk-test", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.audio.transcriptions.create(model="local", file=("clip.wav", CLIP, "audio/wav"))
    error = json.loads(refused.value.response.text)["error"]
    assert error["param"] == "model" and "audio" in error["message"]
