"""ModelRegistry: the models one server answers for, their state, and the backend of each loaded one.

One model named the usual way (`-m`, `-hf`, the bundled default) is a registry of one, loaded at start
(the same way a router loads its models: `load()`), and the request's `model` field is ignored, as
in llama-server. In router mode (several models) the
request's `model` picks the entry by name or alias; an unloaded one is loaded first (unless
--no-models-autoload), and when --models-max local models are already loaded the least recently used
idle one is unloaded to make room. Every local engine decodes under the registry's one DecodeTurns,
so two models never decode at the same time.

A router over the Hugging Face cache (no model named) also has the bundled model, its *default*: a
request that names no model goes to it. `reload()` (GET /models?reload=1) reads the sources again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace

import anyio

from kinetic.backends.base import ModelBackend
from kinetic.backends.sources import ModelSpec
from kinetic.config.settings import ServerSettings
from kinetic.engine.turns import DecodeLock, DecodeTurns
from kinetic.errors import InvalidRequestError, KineticError, ModelLoadError, ServerError, UnavailableError
from kinetic.model_registry.derived import DerivedModel, DerivedStore
from kinetic.model_registry.downloads import Download, Downloads
from kinetic.model_registry.entry import ModelEntry, ModelMissingError, ModelNotFoundError, ModelState
from kinetic.model_registry.events import ModelEvents
from kinetic.model_registry.idle_sleep import IdleSleep
from kinetic.model_registry.served import Served
from kinetic.model_registry.waiting_streams import WaitingStreams

log = logging.getLogger(__name__)

# Builds the (not yet loaded) backend of a model; runs in a worker thread (it may resolve an -hf repo).
BackendFactory = Callable[[ModelSpec, DecodeLock], ModelBackend]
IDLE_POLL_S = 0.05  # how often a load waiting for room looks for an idle model to unload
# llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING (its router tests set it): each load, and each request once its
# model is held, waits this long first, so that a test can line requests up behind a busy model
FAKE_TIMING_S = 2.0
ROOM_TIMEOUT_S = 600.0  # a load gives up when no loaded model became idle in this long


class ModelRegistry:
    def __init__(self, settings: ServerSettings, specs: list[ModelSpec], factory: BackendFactory, *,
                 router: bool, reread: Callable[[], list[ModelSpec]] | None = None):
        self.settings = settings
        self.router = router
        self.factory = factory
        self.reread = reread  # the sources read again (reload); None: a registry of fixed models
        self.entries: dict[str, ModelEntry] = {}
        self._by_name: dict[str, ModelEntry] = {}
        for spec in specs:
            self.add(spec)
        self.fake_timing = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING")) and router
        # Set by the app's start once its readiness line is out: the load's end wakes the start a loop turn or two
        # later, and a /health seen in between answered 200 before "listening on" (the lab waits for that line).
        self.announced = False
        self.decode_lock = DecodeTurns()
        self.derived: dict[str, DerivedModel] = {}  # /api/create's models, served through their base's backend
        self.store = DerivedStore(None)
        self.events = ModelEvents()  # GET /models/sse
        self.waiting_streams = WaitingStreams()  # resumable streams whose request waits for its model
        self.downloads = Downloads(settings, self.events, self._downloaded)  # POST /models, /api/pull
        self._load_lock = asyncio.Lock()  # one load at a time: loading is CPU work too
        self.sleeper: IdleSleep | None = IdleSleep(self.entries, settings.sleep_idle_seconds) \
            if settings.sleep_idle_seconds > 0 else None  # --sleep-idle-seconds: its watch runs in the app

    @classmethod
    def single(cls, settings: ServerSettings, backend: ModelBackend) -> ModelRegistry:
        """One model already built (unloaded), loaded at start; the `model` field ignored."""
        spec = ModelSpec(name=backend.name, aliases=backend.aliases)
        return cls(settings, [spec], lambda _spec, _lock: backend, router=False)

    # ------------------------------------------------------------------ looking models up

    @property
    def ready(self) -> bool:
        """Whether requests may through the gate: the one model is loaded and announced, or (router) always. A
        sleeping model counts: a request wakes it."""
        if self.router:
            return True
        backend = self.only.backend
        return self.announced and backend is not None and (backend.ready or backend.sleeping)

    @property
    def only(self) -> ModelEntry:
        return next(iter(self.entries.values()))

    @property
    def default(self) -> ModelEntry | None:
        """The default bundled model of a router over the cache (the first bundled one listed): what a request that
        names no model gets."""
        return next((e for e in self.entries.values() if e.spec.source == "bundled"), None)

    def spare_slot(self) -> bool:
        """Whether work below every live request (a batch's line) may start now: the server is ready, nothing live
        waits for a slot, and a slot stays free for the next live request (on a one-slot model: it is idle)."""
        if not self.ready:
            return False
        for entry in self.entries.values():
            backend = entry.backend
            if backend is None or not backend.ready:
                continue
            stats, slots = backend.stats(), max(backend.describe().n_slots, 1)
            if stats.requests_deferred or stats.requests_processing + (1 if slots > 1 else 0) >= slots:
                return False
        return True

    def find(self, name: str) -> ModelEntry | None:
        """By id or alias; Ollama clients may add the default tag `:latest`."""
        return self._by_name.get(name) or self._by_name.get(name.removesuffix(":latest"))

    def derived_model(self, name: str | None) -> DerivedModel | None:
        if not name:
            return None
        return self.derived.get(name) or self.derived.get(name.removesuffix(":latest"))

    # ------------------------------------------------------------------ models added while it runs

    def open_store(self, store: DerivedStore) -> None:
        """Serves the derived models `store` holds whose base model this server has (others are warned of)."""
        self.store = store
        for model in store.load():
            if self.find(model.base) is None:
                log.warning("derived model %s skipped: its base model %s is not served here", model.name, model.base)
            elif self.find(model.name) is None:
                self.derived[model.name] = model

    def base_of(self, name: str) -> DerivedModel | ModelEntry:
        """What a new derived model named `from` `name` copies: a derived model, or a served one."""
        found = self.derived_model(name) or self.find(name)
        if found is None:
            raise ModelNotFoundError(name)
        return found

    def put_derived(self, model: DerivedModel) -> None:
        """Adds or replaces (Ollama's create and copy overwrite) a derived model, stored at once."""
        if self.find(model.name) is not None:
            raise InvalidRequestError(f"model '{model.name}' is served from a model file: a derived model "
                                      "needs a name of its own", param="model")
        self.store.save(model)
        self.derived[model.name] = model

    def remove_derived(self, name: str) -> bool:
        model = self.derived_model(name)
        if model is None:
            return False
        self.store.remove(model.name)
        del self.derived[model.name]
        return True

    async def download(self, name: str, aliases: tuple[str, ...] = ()) -> Download:
        """Starts a download (router mode): it joins the models when it is done (downloads.py)."""
        for taken in (name, *aliases):
            if self.find(taken) is not None or self.derived_model(taken) is not None:
                raise InvalidRequestError(f"model '{taken}' already exists", param="model")
        return await self.downloads.start(name, aliases)

    def add_aliases(self, entry: ModelEntry, aliases: tuple[str, ...]) -> None:
        """More names for a served model (/api/pull of a model already here, by its `hf.co/...` name)."""
        for alias in aliases:
            taken = self.find(alias)
            if (taken is not None and taken is not entry) or self.derived_model(alias) is not None:
                raise InvalidRequestError(f"model '{alias}' already exists", param="model")
        entry.spec = replace(entry.spec, aliases=tuple(dict.fromkeys((*entry.spec.aliases, *aliases))))
        for alias in aliases:
            self._by_name[alias] = entry

    def _downloaded(self, download: Download) -> None:
        self.add(ModelSpec(name=download.name, aliases=download.aliases, hf_repo=download.name, source="cache"))

    def add(self, spec: ModelSpec) -> ModelEntry:
        """A model of the sources, or one downloaded while the router runs (POST /models, /api/pull)."""
        entry = ModelEntry(spec)
        self.entries[spec.name] = entry
        for name in spec.names:
            self._by_name[name] = entry
        return entry

    async def remove(self, entry: ModelEntry) -> None:
        """Unloads and forgets a model (DELETE /models); the derived models made from it go with it."""
        await self._forget(entry)
        for model in [m for m in self.derived.values() if m.base in entry.spec.names]:
            self.remove_derived(model.name)

    async def _forget(self, entry: ModelEntry) -> None:
        await self.unload(entry)
        del self.entries[entry.name]
        self._by_name = {k: v for k, v in self._by_name.items() if v is not entry}

    async def reload(self) -> None:
        """Reads the models' sources again (the preset, the cache, --models-dir), as llama-server's
        `GET /models?reload=1`: a model that left them is unloaded and forgotten, one whose spec changed is
        unloaded (its next request loads the new one), a new one is added. Downloads under way go on; the
        derived models of a model that left stay stored, unlisted until it comes back."""
        if self.reread is None:
            return
        try:
            specs = await anyio.to_thread.run_sync(self.reread)
        except ModelLoadError as exc:
            raise ServerError(f"the models were not reloaded: {exc}") from exc
        fresh = {spec.name: spec for spec in specs}
        async with self._load_lock:  # not in the middle of a load
            for entry in list(self.entries.values()):
                spec = fresh.pop(entry.name, None)
                if spec is None:
                    log.info("(reload) model %s left its source", entry.name)
                    await self._forget(entry)
                elif spec != entry.spec:
                    log.info("(reload) model %s changed", entry.name)
                    await self.unload(entry)
                    entry.spec = spec
            for spec in fresh.values():
                self.add(spec)
            self._by_name = {name: e for e in self.entries.values() for name in e.spec.names}

    def resolve(self, name: str | None) -> ModelEntry:
        """The entry a request names (single mode: the one model, whatever it names)."""
        if not self.router:
            return self.only
        if not name:
            if (default := self.default) is not None:
                return default
            raise ModelMissingError()
        entry = self.find(name)
        if entry is None:
            raise ModelNotFoundError(name)
        return entry

    async def acquire(self, name: str | None, *, autoload: bool | None = None,
                      wake: bool = True) -> tuple[ModelEntry, Served]:
        """The backend of the model a request names, loaded first if need be, with a lease taken on it
        (release() it when the request is done) so that it is not unloaded under the request. `wake`
        False: a sleeping model is answered as it is (llama-server's routes that bypass sleep). A derived
        model's request gets its base model's backend, with the derived model to dress it by (served.py)."""
        derived = self.derived_model(name)
        entry, backend = await self._acquire(derived.base if derived else name, autoload, wake)
        if derived is None:
            return entry, Served(backend)
        try:
            return entry, Served.as_derived(backend, derived)
        except BaseException:
            self.release(entry)
            raise

    async def _acquire(self, name: str | None, autoload: bool | None, wake: bool) -> tuple[ModelEntry, ModelBackend]:
        entry = self.resolve(name)
        while entry.draining:  # another model waits for its room: wait for the switch, then load it again
            await entry.accepting.wait()
        entry.leases += 1
        try:
            if self.sleeper is not None and wake:
                await self.sleeper.awake(entry)
            backend = await self._loaded_backend(entry, autoload)
            if wake:  # a look at a sleeping model's state (/props, /metrics) is no use of it: the idle time runs on
                entry.touch()
            if self.fake_timing:  # and so after counting the request on its model
                await asyncio.sleep(FAKE_TIMING_S)
        except BaseException:
            entry.leases -= 1
            raise
        return entry, backend

    def release(self, entry: ModelEntry, *, used: bool = True) -> None:
        entry.leases -= 1
        if used:
            entry.touch()

    async def _loaded_backend(self, entry: ModelEntry, autoload: bool | None) -> ModelBackend:
        if entry.state is ModelState.LOADED and entry.backend is not None:
            return entry.backend
        if not self.router:
            raise UnavailableError("Loading model")
        if entry.state is ModelState.UNLOADED and not (self.settings.models_autoload if autoload is None else autoload):
            raise InvalidRequestError("model is not loaded", param="model")
        return await self.load(entry)

    # ------------------------------------------------------------------ loading and unloading

    async def load(self, entry: ModelEntry) -> ModelBackend:
        """Loads `entry` (or joins the load under way); raises ServerError naming the model if it fails."""
        if self.fake_timing:
            await asyncio.sleep(FAKE_TIMING_S)  # llama-server's router waits so before each load
        if entry.task is None or entry.task.done():
            if entry.state is ModelState.LOADED and entry.backend is not None:
                return entry.backend
            entry.task = asyncio.get_running_loop().create_task(self._load(entry))
        return await asyncio.shield(entry.task)

    async def _load(self, entry: ModelEntry) -> ModelBackend:
        async with self._load_lock:
            if not entry.spec.remote:
                await self._make_room(entry)
            entry.state = ModelState.LOADING
            entry.failure = None
            log.info("loading model %s", entry.name)
            self.events.publish(entry.name, "model_status", {"status": "loading"})  # as llama-server's spawn
            self.events.status(entry.name, "loading")
            try:
                backend = await anyio.to_thread.run_sync(self.factory, entry.spec, self.decode_lock)
                await backend.load()
            except Exception as exc:  # any failure: the model stays unloaded, the router up
                entry.state = ModelState.UNLOADED
                entry.failure = str(exc)
                log.warning("model %s failed to load: %s", entry.name, exc)
                self.events.status(entry.name, "unloaded", exit_code=1)
                raise ServerError(f"model '{entry.name}' failed to load: {exc}") from exc
            entry.backend = backend
            entry.state = ModelState.LOADED
            entry.touch()
            log.info("model %s loaded", entry.name)
            self.events.status(entry.name, "loaded")
            return backend

    def _resident(self, exclude: ModelEntry) -> list[ModelEntry]:
        return [e for e in self.entries.values() if e is not exclude and not e.spec.remote
                and e.state is not ModelState.UNLOADED]

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unloads least recently used idle local models until `entry` fits under --models-max. When
        every loaded one is busy, the least recently used is drained (see ModelEntry.draining): it
        finishes the requests it already has, takes no new ones, and is unloaded."""
        limit = self.settings.models_max
        if limit <= 0:
            return
        deadline = time.monotonic() + ROOM_TIMEOUT_S
        drained: list[ModelEntry] = []
        try:
            while len(resident := self._resident(entry)) >= limit:
                idle = [e for e in resident if e.state is ModelState.LOADED and not e.busy]
                if idle:
                    await self.unload(min(idle, key=lambda e: e.last_used))
                    continue
                loaded = [e for e in resident if e.state is ModelState.LOADED]
                if loaded and not any(e.draining for e in loaded):
                    victim = min(loaded, key=lambda e: e.last_used)
                    victim.accepting.clear()
                    drained.append(victim)
                    log.info("model %s waits for model %s to finish its requests, to take its place",
                             entry.name, victim.name)
                if time.monotonic() > deadline:
                    raise UnavailableError(f"cannot load model '{entry.name}': the {limit} loaded model(s) "
                                           "stayed busy")
                await asyncio.sleep(IDLE_POLL_S)
        finally:
            for victim in drained:
                victim.accepting.set()

    async def unload(self, entry: ModelEntry) -> None:
        """Unloads now, busy or not: its open streams end at once with a 503 error in their protocol's
        way, its waiting requests get that error, and their counts are given back (docs/router.md)."""
        backend, entry.backend = entry.backend, None
        entry.state = ModelState.UNLOADED
        if backend is not None:
            log.info("unloading model %s", entry.name)
            await anyio.to_thread.run_sync(backend.close)
            self.events.status(entry.name, "unloaded", exit_code=0)

    async def load_on_startup(self) -> None:
        """Loads the preset's `load-on-startup` models (a failure is logged; the router stays up)."""
        if not self.settings.models_autoload:
            return  # llama-server: --no-models-autoload wins over load-on-startup
        for entry in list(self.entries.values()):
            if entry.spec.load_on_startup or entry.spec.remote:
                try:
                    await self.load(entry)
                except ServerError:
                    pass

    def refuse_waiting(self, error: KineticError) -> None:
        """A shutdown's start: every model's requests still waiting for a slot fail with `error` (a 503 with
        Retry-After), so that a restart for an upgrade drains only what is running."""
        for entry in self.entries.values():
            if entry.backend is not None:
                entry.backend.refuse_waiting(error)

    async def end_streams(self, error: KineticError) -> None:
        """Shutdown's end: every model's open streams and waiting requests fail with `error` now."""
        self.downloads.stop()
        self.events.close()
        for entry in list(self.entries.values()):
            if entry.backend is not None:
                await anyio.to_thread.run_sync(entry.backend.close, error)

    def close(self) -> None:
        self.downloads.stop()
        for entry in self.entries.values():
            if entry.backend is not None:
                entry.backend.close()
