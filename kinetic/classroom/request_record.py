"""One request's record: what the request did, as its ledger line will say it, filled in typed steps.

The ledger middleware (classroom/ledger.py) opens the record at the door, before the gate runs, and keeps it
in the request's ASGI scope under one key that only this module reads or writes. Then each layer that learns
something about the request says so through a method, never through a key of a shared dict:

- the gate names the caller (`identify`), or notes the error it refused the request with (`note_error`);
- a protocol's route hands over what its client was told (`add_outcomes`, `add_count`), the error funnel
  the error a route raised (`note_error`);
- a backend is handed the record with each request it prepares: it reads the Caller there (the fair queue's
  name and priority), notes the images and audio the prompt read (`note_media`), and that the request is
  prepared (`note_prepared`: the ledger middleware counts it out of the door then, scheduling/arrivals.py).

Once the answer is out the ledger builds the line from the record. So a ledger line's every number can be
traced back by grepping for the method that wrote it, and nothing reaches the record through a context
variable.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kinetic.classroom.caller import NOBODY, BatchOrigin, Caller
from kinetic.classroom.outcome import ErrorTold, Outcome, error_told
from kinetic.errors import KineticError

if TYPE_CHECKING:  # the grader's install has no starlette, and `kinetic grade` imports the ledger
    from starlette.requests import HTTPConnection

RECORD_SCOPE = "kinetic.record"  # the scope key of the request's RequestRecord: this module's alone
# A batch's line reaches the routes as an in-process request whose ASGI scope holds its BatchOrigin under this key
# (kinetic/server/in_process.py builds it): uvicorn never puts it there, so no client can claim one. The record
# takes it at the door; the gate makes the line's Caller from the owner's key entry.
BATCH_SCOPE = "kinetic.batch"


@dataclass
class MediaCounts:
    """The images and audio a request's prompts read, and the prompt tokens they took (added up over the prompts
    of one request)."""

    images: int = 0
    audio: int = 0
    tokens: int = 0


class RequestRecord:
    """What one HTTP request did: who asked, what its client was told, the error it was answered with, the media
    its prompts read, and the batch it ran for."""

    def __init__(self, batch: BatchOrigin | None = None):
        self.caller: Caller = NOBODY  # until the gate names it (a CORS preflight, a test's app without a gate)
        self.batch = batch
        self.outcomes: list[Outcome] = []
        self.error: ErrorTold | None = None  # the error the request was refused or answered with
        self.media: MediaCounts | None = None  # None: the prompts read no file
        self._on_prepared: list[Callable[[], object]] = []
        self._at_end: list[Callable[[], object]] = []

    def when_prepared(self, action: Callable[[], object]) -> None:
        """The ledger middleware's: `action` runs once a backend has prepared the request (scheduling/arrivals.py)."""
        self._on_prepared.append(action)

    def note_prepared(self) -> None:
        """A backend's: the request's generation is prepared and about to be queued."""
        for action in self._on_prepared:
            action()

    def at_end(self, action: Callable[[], object]) -> None:
        """`action` runs once the request is over, its answer sent or given up (the ledger middleware's `end`)."""
        self._at_end.append(action)

    def end(self) -> None:
        """The ledger middleware's, when the app is done with the request: every `at_end` action, once."""
        actions, self._at_end = self._at_end, []
        for action in actions:
            action()

    def identify(self, caller: Caller) -> None:
        """The gate's: who is asking, resolved once from the request's key."""
        self.caller = caller

    def add_outcomes(self, *outcomes: Outcome) -> None:
        """What the request's answers told the client (a list of prompts has several); an encoder goes on filling
        each one as it writes its frames."""
        self.outcomes.extend(outcomes)

    def add_count(self, *, model: str, prompt_tokens: int) -> None:
        """What an embedding or ranking told its client: the prompt tokens it read, nothing generated."""
        self.add_outcomes(Outcome(model=model, prompt_tokens=prompt_tokens, completion_tokens=0))

    def note_error(self, err: KineticError) -> None:
        """The error the request was refused or answered with."""
        self.error = error_told(err)

    def note_media(self, *, images: int, audio: int, tokens: int) -> None:
        """The files one prompt read and the prompt tokens they took; several prompts add up."""
        if self.media is None:
            self.media = MediaCounts()
        self.media.images += images
        self.media.audio += audio
        self.media.tokens += tokens

    @property
    def error_told(self) -> ErrorTold | None:
        """The error its line names: the request's own, else one told in-band after a stream's headers went out."""
        return self.error or next((o.error for o in self.outcomes if o.error is not None), None)


def open_record(scope: MutableMapping[str, Any]) -> RequestRecord:
    """The ledger middleware's, at the door: a new record for the request of `scope`."""
    origin = scope.get(BATCH_SCOPE)
    record = scope[RECORD_SCOPE] = RequestRecord(batch=origin if isinstance(origin, BatchOrigin) else None)
    return record


def request_record(where: MutableMapping[str, Any] | HTTPConnection) -> RequestRecord:
    """The record of the request of `where` (its ASGI scope, or the request). An app without the ledger
    middleware (a test's) gets one opened on first use."""
    scope = where if isinstance(where, MutableMapping) else where.scope  # a request is a Mapping, not a mutable one
    record = scope.get(RECORD_SCOPE)
    return record if isinstance(record, RequestRecord) else open_record(scope)


def caller_of(request: HTTPConnection) -> Caller:
    """Who sent `request`, as the gate named them (NOBODY before the gate)."""
    return request_record(request).caller
