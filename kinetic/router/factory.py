"""Building the Service of one router model: a local GGUF (chat or embedding) under the shared decode
turns, or an upstream pool (upstream.py)."""

from __future__ import annotations

from kinetic.engine.turns import DecodeLock
from kinetic.router.sources import ModelSpec
from kinetic.service import Service
from kinetic.settings import ServerSettings


def service_factory(settings: ServerSettings):
    """The factory a router's registry calls (in a worker thread) to build a model's unloaded Service."""

    def build(spec: ModelSpec, decode_lock: DecodeLock) -> Service:
        model_settings = spec.settings or settings
        if spec.remote:
            from kinetic.router.upstream import upstream_service

            return upstream_service(spec, model_settings, keyed=bool(settings.api_keys()))
        engine = local_engine(spec, model_settings, decode_lock, keyed=bool(settings.api_keys()))
        return Service.for_model(model_settings, engine, spec.name, spec.aliases)

    return build


def local_engine(spec: ModelSpec, settings: ServerSettings, decode_lock: DecodeLock, *, keyed: bool):
    from kinetic.engine.llama import LlamaEngine
    from kinetic.models import check_gguf, resolve_hf

    if spec.path is not None:
        path = check_gguf(spec.path)
    else:
        assert spec.hf_repo is not None
        path = resolve_hf(spec.hf_repo, settings.hf_file, settings.offline, settings.hf_token).path
    return LlamaEngine(path, n_ctx=settings.ctx_size, n_parallel=settings.parallel, n_threads=settings.threads,
                       n_batch=settings.batch_size, n_ubatch=settings.ubatch_size, embeddings=settings.embeddings,
                       pooling=settings.pooling,
                       fair_share=settings.fair_share, max_in_flight_per_client=settings.max_in_flight if keyed else 0,
                       cache_ram_mib=settings.cache_ram,
                       verbose=settings.verbose, decode_lock=decode_lock)
