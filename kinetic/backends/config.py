"""What one model needs to run, read once from the command line (or a preset section): its context,
slots, template choice, defaults and feature switches. Backends are built from this, never from the
~50-field ServerSettings, so a preset's per-model values and the server's own cannot be confused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetic.backends.media_source import MediaPolicy
from kinetic.backends.upstream.affinity import PoolPolicy
from kinetic.chat.prepare import ServerDefaults
from kinetic.engine.options import EngineConfig, ProjectorOptions
from kinetic.models import projector_cache_path
from kinetic.sampling_defaults import default_sampling, default_stops
from kinetic.settings import ServerSettings


@dataclass(frozen=True)
class TemplateChoice:
    """--jinja, --chat-template, --chat-template-file: how the chat template is picked at load."""

    jinja: bool = True
    override: str | None = None
    override_file: str | None = None


@dataclass(frozen=True)
class Switches:
    """Feature switches the routes honour per model (llama-server's --slots, --metrics, --props...)."""

    slots: bool = True
    metrics: bool = False
    props: bool = False
    slot_save_path: str | None = None
    slot_save_max: int = 4096  # MiB
    verbose: bool = False
    embd_normalize: int = 2
    tags: tuple[str, ...] = ()
    ui_settings: dict[str, Any] = field(default_factory=dict)
    llama_params: dict[str, Any] = field(default_factory=dict)  # /props: what -ngl, -fa, -ctk... asked
    rerank: bool = False  # /rerank answers (--rerank, or --embeddings with --pooling rank)
    log_prompts_dir: str | None = None  # --log-prompts-dir: each prompt as the model reads it, one file each


@dataclass(frozen=True)
class ModelConfig:
    defaults: ServerDefaults = field(default_factory=ServerDefaults)
    template: TemplateChoice = field(default_factory=TemplateChoice)
    engine: EngineConfig = field(default_factory=EngineConfig)
    switches: Switches = field(default_factory=Switches)
    temperature: float = 0.8  # --temp as given (Ollama's /api/show prints it)
    media: MediaPolicy = field(default_factory=MediaPolicy)  # where files named by URL may be loaded from
    pool: PoolPolicy = field(default_factory=PoolPolicy)  # how an upstream pool picks a server


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
