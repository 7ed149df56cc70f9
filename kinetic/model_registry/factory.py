"""Building the backend of one model from its spec and config: a local GGUF (chat or embedding)
under the shared decode turns, or an upstream pool (kinetic/backends/upstream/). In router mode
every model counts its requests per key in one InFlight, so --max-in-flight holds across models."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from kinetic.backends.base import ModelBackend
from kinetic.backends.config import EngineConfig, finds_projector, model_config
from kinetic.backends.local import LocalBackend
from kinetic.engine.base import Engine
from kinetic.engine.inflight import InFlight
from kinetic.engine.options import ProjectorOptions
from kinetic.engine.turns import DecodeLock
from kinetic.model_registry.registry import BackendFactory
from kinetic.model_registry.sources import ModelSpec
from kinetic.settings import ServerSettings

log = logging.getLogger(__name__)


class Factory:
    """What the registry calls (in a worker thread) to build a model's unloaded backend."""

    def __init__(self, settings: ServerSettings, *, router: bool):
        self.settings = settings
        self.keyed = bool(settings.api_keys())
        self.router = router
        # one for the process, for the dashboard and tests too; a single model counts in its engine
        self.in_flight = InFlight(settings.max_in_flight if self.keyed else 0) if router else None

    def own_limit(self, model_settings: ServerSettings) -> int:
        """A single model's --max-in-flight; in router mode a preset's own value adds a per-model limit
        to the process-wide one."""
        if not self.keyed:
            return 0
        if not self.router:
            return model_settings.max_in_flight
        return model_settings.max_in_flight if model_settings.max_in_flight != self.settings.max_in_flight else 0

    def __call__(self, spec: ModelSpec, decode_lock: DecodeLock) -> ModelBackend:
        model_settings = spec.settings or self.settings
        config = model_config(model_settings)
        own = self.own_limit(model_settings)
        if spec.remote:
            from kinetic.backends.upstream.backend import UpstreamBackend

            return UpstreamBackend(spec, config, own_limit=own, in_flight=self.in_flight)
        engine = local_engine(spec, config.engine, model_settings, decode_lock, max_in_flight=own,
                              in_flight=self.in_flight)
        return LocalBackend(config, engine, spec.name, spec.aliases)


def backend_factory(settings: ServerSettings, *, router: bool = True) -> BackendFactory:
    return Factory(settings, router=router)


def engine_files(spec: ModelSpec, config: EngineConfig, settings: ServerSettings) -> tuple[Path, ProjectorOptions]:
    """The model's GGUF and its projector options with the projector's path: -mmu's download or -mm's file,
    else (with --mmproj-auto) the one found beside the model (-hf's, a --models-dir sub-folder's).
    `settings` only for where the files come from (-hf's file, -mmu, --offline, the token)."""
    from kinetic.models import check_gguf, resolve_hf, resolve_projector

    found = spec.mmproj
    if spec.path is not None:
        path = check_gguf(spec.path)
    else:
        assert spec.hf_repo is not None
        resolved = resolve_hf(spec.hf_repo, settings.hf_file, settings.offline, settings.hf_token,
                              mmproj=finds_projector(settings))
        path, found = resolved.path, resolved.mmproj
    mmproj = resolve_projector(config.projector.path, settings.mmproj_url,
                               found if finds_projector(settings) else None, offline=settings.offline)
    if mmproj is not None:
        log.info("multimodal projector of %s: %s", spec.name, mmproj)
    return path, replace(config.projector, path=str(mmproj) if mmproj else None)


def local_engine(spec: ModelSpec, config: EngineConfig, settings: ServerSettings, decode_lock: DecodeLock, *,
                 max_in_flight: int, in_flight: InFlight | None) -> Engine:
    from kinetic.engine.llama import LlamaEngine

    path, projector = engine_files(spec, config, settings)
    return LlamaEngine(path, n_ctx=config.n_ctx, n_parallel=config.n_parallel, n_threads=config.n_threads,
                       n_batch=config.n_batch, n_ubatch=config.n_ubatch, embeddings=config.embeddings,
                       pooling=config.pooling, options=config.options, fair_share=config.fair_share,
                       max_queue=config.max_queue,
                       max_in_flight_per_client=max_in_flight, cache_ram_mib=config.cache_ram_mib,
                       ctx_checkpoints=config.ctx_checkpoints, verbose=config.verbose, decode_lock=decode_lock,
                       in_flight=in_flight, long_context=config.long_context, spec=config.spec, projector=projector)
