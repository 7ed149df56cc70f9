"""The request's one typed record (kinetic/classroom/request_record.py, issue 49): what its methods are told, the
ledger fields built from it, and its path from the door (the ledger middleware, the gate) through a route and a
backend to the ledger file, over a scripted engine that reads images."""

from __future__ import annotations

import base64
import time
from pathlib import Path

from starlette.requests import Request

from kinetic.classroom.caller import NOBODY, BatchOrigin, Caller
from kinetic.classroom.ledger import BatchRecord, ErrorRecord, MediaRecord, read_ledger, request_fields
from kinetic.classroom.outcome import ErrorTold, Outcome
from kinetic.classroom.request_record import (
    MediaCounts,
    RequestRecord,
    caller_of,
    open_record,
    request_record,
)
from kinetic.classroom.roles import Role
from kinetic.config.settings import ServerSettings
from kinetic.engine.types import Finished, MediaSpan, Modalities, Timings, Usage
from kinetic.errors import RateLimitError, ServerError
from tests.scripted import ReadyClient, ScriptedEngine, single_model_app

ALICE = Caller("alice", Role.STUDENT)


def ending(prompt: int, completion: int, cached: int = 0) -> Finished:
    return Finished(finish_reason="length", stop_type="limit", stopping_word="", text="", tokens=[0] * completion,
                    usage=Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached),
                    timings=Timings(cache_n=cached, prompt_n=prompt, prompt_ms=1.0, predicted_n=completion,
                                    predicted_ms=1.0),
                    id_slot=0, tokens_cached=prompt, truncated=False)


def test_the_record_keeps_what_its_methods_are_told() -> None:
    record = RequestRecord()
    assert record.caller is NOBODY and record.outcomes == [] and record.media is None and record.error_told is None
    record.identify(ALICE)
    first, second = Outcome(id="cmpl-1", model="m"), Outcome(id="cmpl-1", model="m")
    record.add_outcomes(first)
    record.add_outcomes(second)
    record.add_count(model="e", prompt_tokens=7)
    assert record.caller == ALICE and record.outcomes[:2] == [first, second]
    assert (record.outcomes[2].prompt_tokens, record.outcomes[2].completion_tokens) == (7, 0)
    record.note_media(images=1, audio=0, tokens=256)  # one prompt's files, then another's: they add up
    record.note_media(images=2, audio=1, tokens=300)
    assert record.media == MediaCounts(images=3, audio=1, tokens=556)
    second.failed(ServerError("the decode failed"))  # told in-band, after the stream's headers
    assert record.error_told == ErrorTold("server_error", "the decode failed")
    record.note_error(RateLimitError("over budget"))  # the request's own error comes first
    assert record.error_told == ErrorTold("rate_limit_error", "over budget")


def test_the_scope_holds_one_record_opened_at_the_door() -> None:
    origin = BatchOrigin("batch_1", "line-1", "alice", admin=False)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "kinetic.batch": origin}
    opened = open_record(scope)
    assert opened.batch == origin and request_record(scope) is opened
    opened.identify(ALICE)
    assert request_record(Request(scope)) is opened and caller_of(Request(scope)) == ALICE
    assert set(scope) == {"type", "method", "path", "headers", "kinetic.batch", "kinetic.record"}  # no "state"
    bare: dict[str, object] = {"type": "http"}  # a test's app without the ledger: one is opened on first use
    assert request_record(bare) is request_record(bare) and request_record(bare).batch is None


def test_the_line_says_what_the_client_was_told() -> None:
    """A list of two prompts, streamed: the line adds up the counts each answer told, names the batch it ran
    for and the images both prompts read."""
    started = time.monotonic()
    record = RequestRecord(batch=BatchOrigin("batch_1", "line-1", "alice", admin=False))
    record.identify(ALICE)
    for prompt, completion in ((5, 3), (7, 4)):
        outcome = Outcome(id="cmpl-1", model="m")
        for _ in range(completion):
            outcome.chunk("a")
        outcome.finished(ending(prompt, completion, cached=2), "length")
        record.add_outcomes(outcome)
    record.note_media(images=1, audio=0, tokens=16)
    record.note_media(images=2, audio=0, tokens=32)
    fields = request_fields(record, started, content=False)
    assert (fields["prompt_tokens"], fields["completion_tokens"], fields["total_tokens"]) == (12, 7, 19)
    assert (fields["cached_tokens"], fields["chunks"], fields["finish_reason"]) == (4, 7, "length")
    assert fields["ttft_s"] is not None and fields["ttft_s"] >= 0 and fields["error"] is None
    assert fields["batch"] == BatchRecord(id="batch_1", custom_id="line-1")
    assert fields["media"] == MediaRecord(images=3, audio=0, tokens=48)
    record.note_error(ServerError("the engine stopped"))
    assert request_fields(record, started, content=False)["error"] == ErrorRecord(type="server_error",
                                                                                  message="the engine stopped")
    assert "media" not in request_fields(RequestRecord(), started, content=False)  # no file read: no media field


IMAGE_TOKENS = 16  # the embeddings the seeing engine encodes each image to


class SeeingEngine(ScriptedEngine):
    """The scripted engine with a projector: each media marker becomes one stand-in token for an image of
    IMAGE_TOKENS embeddings."""

    modalities = Modalities(vision=True)
    media_marker = "<__media__>"

    def __init__(self) -> None:
        super().__init__(["o", "k"])
        self.loaded.set()

    def tokenize_media(self, text: str, files: list[bytes],
                       params: list[str]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        for index, piece in enumerate(text.split(self.media_marker)):
            tokens += list(piece.encode("utf-8"))
            if index < len(files):
                spans.append(MediaSpan(start=len(tokens), n_pos=1, n_tokens=IMAGE_TOKENS, key=f"file-{index}",
                                       modality="image", chunk=None))
                tokens.append(-1 - index)
        return tokens, tuple(spans)

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return super().detokenize([token for token in tokens if token >= 0])  # an image's stand-ins have no text


def test_a_request_is_recorded_from_the_door_to_the_file(tmp_path: Path) -> None:
    """/completion with two prompts (one image, then two): the gate names the caller on the record, the route
    hands the record to the backend, which puts the caller's name on each prompt for the fair queue and notes
    each prompt's images; the line holds the counts the client was told and the images of both prompts."""
    ledger, keys = tmp_path / "ledger.jsonl", tmp_path / "keys.txt"
    keys.write_text("sk-a alice\n")
    engine = SeeingEngine()
    image = base64.b64encode(b"\x89PNG not really").decode()
    prompts = [{"prompt_string": "one <__media__>", "multimodal_data": [image]},
               {"prompt_string": "<__media__> and <__media__>", "multimodal_data": [image, image]}]
    settings = ServerSettings(ledger=str(ledger), api_key_file=str(keys))
    with ReadyClient(single_model_app(settings, engine, "m"), headers={"Authorization": "Bearer sk-a"}) as client:
        answer = client.post("/completion", json={"prompt": prompts, "n_predict": 2})
        assert answer.status_code == 200, answer.text
        refused = client.post("/completion", json={"prompt": "hi"}, headers={"Authorization": "Bearer sk-wrong"})
        assert refused.status_code == 401
    told = answer.json()
    assert [request.client for request in engine.requests] == ["alice", "alice"]  # handed down, not looked up
    line, refusal = read_ledger(ledger)[-2:]
    assert (line.client, line.route, line.status, line.error) == ("alice", "/completion", 200, None)
    assert line.prompt_tokens == sum(t["tokens_evaluated"] for t in told)
    assert line.completion_tokens == sum(t["tokens_predicted"] for t in told) == 4
    assert line.media == MediaRecord(images=3, audio=0, tokens=3 * IMAGE_TOKENS)
    assert (refusal.client, refusal.auth, refusal.status, refusal.media) == (None, "wrong", 401, None)
    assert refusal.error == ErrorRecord(type="authentication_error", message="Invalid API Key")
