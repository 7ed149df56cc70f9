"""Building the Service of one router model: a local GGUF (chat or embedding) under the shared decode
turns, or an upstream pool (upstream.py). Every model the factory builds counts its requests per key in
one InFlight, so --max-in-flight holds across models."""

from __future__ import annotations

from kinetic.engine.inflight import InFlight
from kinetic.engine.turns import DecodeLock
from kinetic.router.sources import ModelSpec
from kinetic.service import Service
from kinetic.settings import ServerSettings


def service_factory(settings: ServerSettings):
    """The factory a router's registry calls (in a worker thread) to build a model's unloaded Service."""
    keyed = bool(settings.api_keys())
    in_flight = InFlight(settings.max_in_flight if keyed else 0)  # one for the process

    def build(spec: ModelSpec, decode_lock: DecodeLock) -> Service:
        model_settings = spec.settings or settings
        # The server's limit is counted process-wide; a preset's own max-in-flight adds a per-model one.
        own_limit = model_settings.max_in_flight if keyed and model_settings.max_in_flight != settings.max_in_flight \
            else 0
        if spec.remote:
            from kinetic.router.upstream import upstream_service

            return upstream_service(spec, model_settings, max_in_flight=own_limit, in_flight=in_flight)
        engine = local_engine(spec, model_settings, decode_lock, max_in_flight=own_limit, in_flight=in_flight)
        return Service.for_model(model_settings, engine, spec.name, spec.aliases)

    build.in_flight = in_flight  # type: ignore[attr-defined]  # for the dashboard and tests
    return build


def local_engine(spec: ModelSpec, settings: ServerSettings, decode_lock: DecodeLock, *, max_in_flight: int,
                 in_flight: InFlight | None):
    from kinetic.engine.llama import LlamaEngine
    from kinetic.models import check_gguf, resolve_hf

    if spec.path is not None:
        path = check_gguf(spec.path)
    else:
        assert spec.hf_repo is not None
        path = resolve_hf(spec.hf_repo, settings.hf_file, settings.offline, settings.hf_token).path
    return LlamaEngine(path, n_ctx=settings.ctx_size, n_parallel=settings.parallel, n_threads=settings.threads,
                       n_batch=settings.batch_size, n_ubatch=settings.ubatch_size, embeddings=settings.embeddings,
                       pooling=settings.pooling, options=settings.llama_options(),
                       fair_share=settings.fair_share, max_in_flight_per_client=max_in_flight,
                       cache_ram_mib=settings.cache_ram, ctx_checkpoints=settings.ctx_checkpoints,
                       verbose=settings.verbose, decode_lock=decode_lock, in_flight=in_flight,
                       long_context=settings.long_context())
