"""Building the backend of one model from its spec and config: a local GGUF (chat or embedding)
under the shared decode turns, or an upstream pool (kinetic/backends/upstream/). In router mode
every model counts its requests per key in one InFlight, so --max-in-flight holds across models."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from kinetic.backends.base import ModelBackend
from kinetic.backends.config import ModelConfig, Switches, TemplateChoice
from kinetic.backends.gguf_files import projector_cache_path
from kinetic.backends.local import LocalBackend
from kinetic.backends.media_source import MediaPolicy
from kinetic.backends.sources import ModelSpec
from kinetic.backends.upstream.affinity import PoolPolicy
from kinetic.chat.prepare import ServerDefaults
from kinetic.config.sampling_defaults import default_sampling, default_stops
from kinetic.config.settings import ServerSettings
from kinetic.engine.base import Engine
from kinetic.engine.options import EngineConfig, ProjectorOptions
from kinetic.engine.turns import DecodeLock
from kinetic.model_registry.registry import BackendFactory
from kinetic.scheduling.inflight import InFlight

log = logging.getLogger(__name__)


def media_policy(settings: ServerSettings) -> MediaPolicy:
    """--media-path, and whether URLs may reach private addresses: as llama-server on an open server, but
    not on one with keys unless --media-allow-private says so, since a fetch from the server is a door into
    the classroom's network for anyone holding a key."""
    allow_private = settings.media_allow_private
    if allow_private is None:
        allow_private = not settings.api_keys()
    return MediaPolicy(media_path=Path(settings.media_path).expanduser() if settings.media_path else None,
                       allow_private=allow_private)


def tags(value: str | None) -> tuple[str, ...]:
    """--tags a,b: sorted and without duplicates, as llama-server keeps them (a std::set)."""
    return tuple(sorted({t.strip() for t in (value or "").split(",") if t.strip()}))


def projector_options(settings: ServerSettings, devices: tuple[str, ...] | None) -> ProjectorOptions:
    """-mm (or -mmu's download target), --mmproj-offload, -mmdev, --image-min/max-tokens. The path is None
    when only -hf or a --models-dir sub-folder can give one: the factory fills it in (finds_projector).
    Without -mmdev the projector follows -dev's first device, and -dev none keeps it off the GPU (llama.cpp's
    common_params_parse)."""
    path = settings.mmproj and str(Path(settings.mmproj).expanduser())
    if settings.mmproj_url and not path:
        path = str(projector_cache_path(settings.mmproj_url))
    use_gpu, device = settings.mmproj_offload, settings.mmproj_device
    if device == "none":
        use_gpu, device = False, None
    elif device is None and use_gpu and devices is not None:
        use_gpu, device = bool(devices), devices[0] if devices else None
    return ProjectorOptions(path=path or None, use_gpu=use_gpu, device=device,
                            image_min_tokens=settings.image_min_tokens, image_max_tokens=settings.image_max_tokens)


def finds_projector(settings: ServerSettings) -> bool:
    """Whether a projector found beside the model is used: --mmproj-auto, and neither -mm nor -mmu given."""
    return settings.mmproj_auto and not settings.mmproj and not settings.mmproj_url


def model_config(settings: ServerSettings) -> ModelConfig:
    """One model's config from the server's settings (a preset's section already applied to them).
    Blocking: a --json-schema is compiled to a grammar here."""
    defaults = ServerDefaults(
        sampling=default_sampling(settings), stop=default_stops(settings), n_predict=settings.n_predict,
        reasoning_format=settings.reasoning_format, template_kwargs=settings.template_kwargs(),
        reasoning=settings.reasoning, prefill_assistant=settings.prefill_assistant,
        cache_prompt=settings.cache_prompt, spm_infill=settings.spm_infill, n_keep=settings.keep,
        reasoning_budget=settings.reasoning_budget, reasoning_budget_message=settings.reasoning_budget_message,
        skip_chat_parsing=settings.skip_chat_parsing)
    options = settings.llama_options()
    engine = EngineConfig(
        n_ctx=settings.ctx_size, n_parallel=settings.parallel, n_threads=settings.threads,
        n_batch=settings.batch_size, n_ubatch=settings.ubatch_size, embeddings=settings.embeddings,
        pooling=settings.pooling, options=options, fair_share=settings.fair_share, max_queue=settings.max_queue,
        cache_ram_mib=settings.cache_ram,
        ctx_checkpoints=settings.ctx_checkpoints, verbose=settings.verbose, long_context=settings.long_context(),
        spec=settings.spec_options(), projector=projector_options(settings, options.devices))
    switches = Switches(
        slots=settings.slots, metrics=settings.metrics, props=settings.props,
        slot_save_path=settings.slot_save_path, slot_save_max=settings.slot_save_max, verbose=settings.verbose,
        embd_normalize=settings.embd_normalize, tags=tags(settings.tags), ui_settings=settings.ui_settings(),
        llama_params=options.describe(), rerank=settings.serves_rerank, log_prompts_dir=settings.log_prompts_dir)
    template = TemplateChoice(jinja=settings.jinja, override=settings.chat_template,
                              override_file=settings.chat_template_file)
    pool = PoolPolicy(policy=settings.upstream_policy, cache_threshold=settings.upstream_cache_threshold,
                      balance_abs=settings.upstream_balance_abs_threshold,
                      balance_rel=settings.upstream_balance_rel_threshold,
                      probe_interval_s=settings.upstream_probe_interval)
    return ModelConfig(defaults=defaults, template=template, engine=engine, switches=switches,
                       temperature=settings.temp, media=media_policy(settings), pool=pool)


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

            # each backend's class names its roles, each for its own prepared request: mypy checks them there
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
    from kinetic.backends.gguf_files import check_gguf, resolve_hf, resolve_projector

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
    return LlamaEngine(path, replace(config, projector=projector), max_in_flight_per_client=max_in_flight,
                       decode_lock=decode_lock, in_flight=in_flight)
