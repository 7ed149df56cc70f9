"""What one model needs to run: its context, slots, template choice, defaults and feature switches.
Backends are built from this, never from the ~50-field ServerSettings (model_registry/factory.py reads
those into it once), so a preset's per-model values and the server's own cannot be confused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kinetic.backends.media_source import MediaPolicy
from kinetic.backends.upstream.affinity import PoolPolicy
from kinetic.chat.prepare import ServerDefaults
from kinetic.engine.options import EngineConfig


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
