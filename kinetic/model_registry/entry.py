"""One model of the registry, as the routes, the listing and the idle watch see it: its spec, its state,
its backend once loaded, and the requests that hold it."""

from __future__ import annotations

import asyncio
import time
from enum import Enum

from kinetic.backends.base import ModelBackend
from kinetic.backends.sources import ModelSpec
from kinetic.errors import InvalidRequestError, NotFoundError


class ModelState(str, Enum):  # noqa: UP042  StrEnum would change str() and format() of members
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"


class ModelNotFoundError(NotFoundError):
    """A `model` no entry has (router mode)."""

    def __init__(self, name: str):
        super().__init__(f"model '{name}' not found", param="model")
        self.name = name


class ModelMissingError(InvalidRequestError):
    """A request without `model` (router mode)."""

    def __init__(self) -> None:
        super().__init__("model name is missing from the request", param="model")


class ModelEntry:
    """One model of the registry: its spec, its state and, once loaded, its backend."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.backend: ModelBackend | None = None
        self.state = ModelState.UNLOADED
        self.task: asyncio.Task[ModelBackend] | None = None
        self.last_used = 0.0
        self.leases = 0  # requests that resolved this model and have not finished
        self.failure: str | None = None  # why the last load failed
        # --models-max: a load waiting for this model's room "drains" it: new requests for it wait at
        # `accepting` (outside the engine) until it has been unloaded, so its key's flood cannot hold the
        # room forever; they then load it again in their turn. Cleared while it drains.
        self.accepting = asyncio.Event()
        self.accepting.set()

    @property
    def draining(self) -> bool:
        return not self.accepting.is_set()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def busy(self) -> bool:
        """A request holds it, or its engine still has work (a stream outlives its route function)."""
        if self.leases > 0:
            return True
        return self.backend is not None and self.backend.busy

    @property
    def sleeping(self) -> bool:
        """Unloaded by --sleep-idle-seconds (idle_sleep.py) until a request wakes it."""
        return self.backend is not None and self.backend.sleeping

    def touch(self) -> None:
        self.last_used = time.monotonic()
