"""A scripted engine: the Engine interface with canned events, for what a real model cannot be
made to do on demand (stay loading while a test knocks, fail in the middle of a stream).

It never replaces the real model in e2e tests; it drives the real app, served by real uvicorn on
a free port, so clients still talk HTTP to it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kinetic.backends.local import LocalBackend
from kinetic.config.settings import ServerSettings
from kinetic.engine.base import Generation
from kinetic.engine.types import (
    EngineStats,
    Event,
    Finished,
    GenerationRequest,
    MediaSpan,
    Modalities,
    ModelInfo,
    RankScore,
    SlotFileResult,
    SlotState,
    TextDelta,
    Timings,
    Usage,
)
from kinetic.errors import InvalidRequestError, KineticError, UnavailableError
from kinetic.model_registry.factory import model_config
from kinetic.model_registry.registry import ModelRegistry
from kinetic.server.app import create_app
from tests.server import free_port

# Step: a piece of text to emit, or an error to raise there.
Step = str | KineticError


class ScriptedEngine:
    """Bytes are tokens; every generation plays `script` and finishes (unless a step raises, or
    `stall`: then it stays open after the script, as a long answer does, until close() ends it)."""

    n_slots = 1
    slot_n_ctx = 4096
    n_batch = 2048
    modalities = Modalities()  # reads text only
    media_marker = ""

    def __init__(self, script: list[Step], *, loaded: threading.Event | None = None, stall: bool = False):
        self.script = script
        self.stall = stall
        self.requests: list[GenerationRequest] = []  # every request submitted, as the engine got it
        self.open: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event | BaseException]]] = []
        self.loaded = loaded or threading.Event()
        self._ready = False
        self.info = ModelInfo(path=Path("scripted.gguf"), architecture="scripted", description="scripted 0M F32",
                              n_vocab=256, n_ctx_train=4096, n_embd=4, n_params=0, size=0, vocab_type=0,
                              bos_token="", eos_token="", bos_id=-1, add_bos=False, chat_template=None, metadata={})

    @property
    def ready(self) -> bool:
        return self._ready

    def load(self) -> None:
        self.loaded.wait()  # the test decides when loading ends
        self._ready = True

    def close(self, error: KineticError | None = None) -> None:
        """Ends every open generation with `error`, as a real engine's unload does."""
        self.loaded.set()
        failure = error or UnavailableError("the model was unloaded")
        for loop, queue in self.open:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, failure)
        self.open.clear()

    def require_ready(self) -> ModelInfo:
        if not self._ready:
            raise UnavailableError("Loading model")
        return self.info

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return bytes(tokens).decode("utf-8", "replace")

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        return bytes([token])

    def valid_token(self, token: int) -> bool:
        return 0 <= token < 256

    def tokenize_media(self, text: str, files: list[bytes],
                       params: list[str]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        raise InvalidRequestError("the scripted engine reads text only", param=params[0] if params else "prompt")

    @property
    def can_generate(self) -> bool:
        return True

    async def submit(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        text = ""
        for step in self.script:
            if isinstance(step, KineticError):
                queue.put_nowait(step)
                break
            text += step
            queue.put_nowait(TextDelta(text=step, token_id=0))
        else:
            if self.stall:
                self.open.append((asyncio.get_running_loop(), queue))
                return Generation(queue, lambda: None)
            n_prompt = len(request.prompt_tokens)
            queue.put_nowait(Finished(
                finish_reason="stop", stop_type="eos", stopping_word="", text=text, tokens=[0] * len(self.script),
                usage=Usage(prompt_tokens=n_prompt, completion_tokens=len(self.script), cached_tokens=0),
                timings=Timings(cache_n=0, prompt_n=n_prompt, prompt_ms=1.0, predicted_n=len(self.script),
                                predicted_ms=1.0),
                id_slot=0, tokens_cached=n_prompt, truncated=False))
        return Generation(queue, lambda: None)

    async def submit_many(self, requests: list[GenerationRequest]) -> list[Generation]:
        return [await self.submit(request) for request in requests]  # a script never refuses one

    def lora_adapters(self) -> list[tuple[Path, float]]:
        return []

    sleeping = False

    def sleep(self) -> None:
        raise AssertionError("the scripted engine is only put to sleep by tests that say how")

    wake = sleep

    def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        raise AssertionError("the scripted engine has no ranking head")

    def set_lora_scales(self, scales: dict[int, float]) -> None:
        pass

    @property
    def embedding_n_ctx(self) -> int:
        return 0

    embedding_pooling = ""

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        raise AssertionError("the scripted engine has no embeddings")

    def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        raise AssertionError("the scripted engine has no embeddings")

    def slot_save(self, id_slot: int, path: Path) -> SlotFileResult:
        raise AssertionError("the scripted engine keeps no KV cache")

    slot_restore = slot_save

    def slot_erase(self, id_slot: int) -> SlotFileResult:
        raise AssertionError("the scripted engine keeps no KV cache")

    @property
    def speculative_types(self) -> tuple[str, ...]:
        return ()

    def slot_states(self) -> list[SlotState]:
        return [SlotState(id=0, is_processing=False, used=False, n_prompt_tokens=0, n_prompt_tokens_processed=0,
                          n_prompt_tokens_cache=0, n_decoded=0)]

    def stats(self, *, scrape: bool = False) -> EngineStats:
        return EngineStats(counters={}, requests_processing=0, requests_deferred=0)


def single_model_backend(settings: ServerSettings, engine: Any, name: str) -> LocalBackend:
    """The backend `kinetic serve` builds for one model (its -a, else `name`), over `engine`."""
    aliases = tuple(sorted({a.strip() for a in (settings.alias or "").split(",") if a.strip()}))
    return LocalBackend(model_config(settings), engine, aliases[0] if aliases else name, aliases)


class ReadyClient(TestClient):
    """A TestClient that, entered, waits for the model to load (the app loads it in the background
    and answers 503 until then), so that a test's first request is not refused as "loading"."""

    def __enter__(self) -> ReadyClient:
        super().__enter__()
        deadline = time.monotonic() + 10
        while self.get("/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the model never loaded")
            time.sleep(0.01)
        return self


def single_model_app(settings: ServerSettings, engine: Any, name: str = "unused") -> FastAPI:
    """The app `kinetic serve` builds for one model, over `engine` (loaded when the app starts)."""
    return create_app(ModelRegistry.single(settings, single_model_backend(settings, engine, name)))


class ScriptedServer:
    """The real kinetic app over a ScriptedEngine, served by uvicorn in a thread on a free port."""

    def __init__(self, engine: ScriptedEngine, **settings: object):
        self.engine = engine
        self.port = free_port()
        app = single_model_app(ServerSettings(**settings), engine, "scripted")  # type: ignore[arg-type]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedServer:
        """Once the server answers: when the engine's load is let through (`loaded` set), once the model is
        loaded, since the app loads it after it starts answering (a request sent at once got a 503 now and then);
        otherwise a 503 while loading counts as up."""
        self.thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/health", timeout=1)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if self.engine.loaded.is_set():
                wait_until_ready(self.url)
            return self
        raise RuntimeError("scripted server did not start")

    def __exit__(self, *exc: object) -> None:
        self.engine.loaded.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)



def wait_until_ready(url: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if httpx.get(url + "/health").status_code == 200:
            return
        time.sleep(0.05)
    raise RuntimeError("scripted server never became ready")
