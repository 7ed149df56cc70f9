"""Server settings: every setting of `kinetic serve`, its type, default and checks, in one validated model.

The flags and variables that fill it are in kinetic.config.flags, read by kinetic.config.args; the kinds
of value (files, sizes, JSON...) and their checks are in kinetic.config.values. Whatever the source,
the value goes through `ServerSettings` (pydantic-settings), and a bad one is a `SettingsError`
naming the flag or variable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from kinetic.classroom.keys import KeyRing
from kinetic.config.speculation import SpeculationSettings
from kinetic.config.values import (
    SWITCH_TYPES,
    ByteSize,
    CpuMask,
    CpuRange,
    DeviceList,
    DownloadUrl,
    DryBase,
    ExistingFile,
    ExistingFolder,
    FileInExistingFolder,
    GpuLayers,
    HfRepo,
    IdleSeconds,
    JsonObjectFile,
    JsonObjectText,
    JsonSchemaFile,
    JsonSchemaText,
    KvOverrides,
    LayerRange,
    LogitBiases,
    LoraFiles,
    OnOffAuto,
    Port,
    ProjectorDevice,
    ReadableFile,
    Repeated,
    ScaledLoraFiles,
    SlotCount,
    TemplateName,
    TemplateVariables,
    TensorOverrides,
    TensorSplit,
    Upstreams,
    json_object_text,
    switch_word,
)
from kinetic.config.values import TRUE_WORDS as TRUE_WORDS
from kinetic.engine.options import (
    CpuParams,
    LlamaOptions,
    LongContext,
    one_thread_per_cpu,
    parse_cpu_mask,
    parse_cpu_range,
    parse_kv_override,
)

KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


def chosen_cpus(mask: str | None, cpu_range: str | None) -> set[int]:
    """The CPUs a -C mask and a -Cr range name together (empty: any)."""
    return set(parse_cpu_mask(mask) if mask else ()) | set(parse_cpu_range(cpu_range) if cpu_range else ())


def scaled_files(plain: tuple[str, ...], scaled: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """FNAME flags (scale 1) then FNAME:SCALE flags, each a comma list: (path, scale) in the order given."""
    return tuple([(part, 1.0) for item in plain for part in item.split(",")]
                 + [(part.rpartition(":")[0], float(part.rpartition(":")[2])) for item in scaled
                    for part in item.split(",")])


class SettingsError(ValueError):
    """A bad flag or variable value; the message is the one line the user sees."""


class ServerSettings(SpeculationSettings):
    """Every setting of `kinetic serve`. kinetic.config.args.parse_serve_args builds it from flags and variables."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", validate_default=True)

    model: str | None = None
    bundled: str | None = None  # which bundled model a server with no model named serves (backends/bundled.py)
    hf_repo: HfRepo | None = None
    hf_file: str | None = None
    hf_token: str | None = None
    offline: bool = False
    alias: str | None = None
    tags: str | None = None
    models_dir: ExistingFolder | None = None
    models_preset: ExistingFile | None = None
    models_max: Annotated[int, Field(ge=0)] = 4  # llama-server's default
    models_autoload: bool = True
    upstream: Upstreams = ()
    upstream_policy: Literal["cache-aware", "least-outstanding"] = "cache-aware"  # kinetic.backends.upstream.affinity
    upstream_cache_threshold: Annotated[float, Field(ge=0, le=1)] = 0.3  # vllm-router's defaults, these three
    upstream_balance_abs_threshold: Annotated[int, Field(ge=0)] = 64
    upstream_balance_rel_threshold: Annotated[float, Field(ge=0)] = 1.5
    upstream_probe_interval: Annotated[float, Field(gt=0)] = 10.0
    ctx_size: Annotated[int, Field(ge=0)] = 0
    parallel: SlotCount = -1
    batch_size: Annotated[int, Field(ge=1)] = 2048  # llama-server's defaults
    ubatch_size: Annotated[int, Field(ge=1)] = 512
    threads: int = -1
    n_predict: Annotated[int, Field(ge=-2)] = -1
    temp: float = 0.8
    seed: int = -1
    # sampling defaults: llama-server's own (common_params_sampling)
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    top_n_sigma: float = -1.0
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_last_n: Annotated[int, Field(ge=0)] = 64
    repeat_penalty: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    presence_penalty: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    frequency_penalty: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    dry_multiplier: float = 0.0
    dry_base: DryBase = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: Annotated[int, Field(ge=0)] = 64
    dry_sequence_breaker: Repeated = ()  # empty: the defaults (DEFAULT_DRY_BREAKERS)
    adaptive_target: float = -1.0
    adaptive_decay: Annotated[float, Field(ge=0, le=0.99)] = 0.9
    dynatemp_range: float = 0.0
    dynatemp_exp: float = 1.0
    mirostat: Annotated[int, Field(ge=0, le=2)] = 0
    mirostat_lr: float = 0.1
    mirostat_ent: float = 5.0
    samplers: str | None = None
    sampling_seq: str | None = None
    logit_bias: LogitBiases = ()
    ignore_eos: bool = False
    grammar: str | None = None
    grammar_file: ReadableFile | None = None
    json_schema: JsonSchemaText | None = None
    json_schema_file: JsonSchemaFile | None = None
    reverse_prompt: Repeated = ()
    escape: bool = True
    special: bool = False
    backend_sampling: bool = False
    # model and context parameters (kinetic.engine.options.LlamaOptions): llama.cpp's defaults
    gpu_layers: GpuLayers = "auto"
    split_mode: Literal["none", "layer", "row", "tensor"] = "layer"
    tensor_split: TensorSplit | None = None
    main_gpu: int = 0
    load_mode: Literal["auto", "none", "mmap", "mlock", "mmap+mlock", "dio"] = "auto"
    mmap: bool | None = None
    mlock: bool = False
    lazy_mode: Literal["on", "auto", "off"] = "auto"
    numa: Literal["distribute", "isolate", "numactl"] | None = None
    override_kv: KvOverrides = ()
    check_tensors: bool = False
    device: DeviceList | None = None
    override_tensor: TensorOverrides = ()
    cpu_moe: bool = False
    n_cpu_moe: Annotated[int, Field(ge=0)] = 0
    n_cpu_ffn: Annotated[int, Field(ge=0)] = 0
    repack: bool = False  # llama-server's default is on: see the differences table
    no_host: bool = False
    op_offload: bool = True
    threads_batch: int = 0
    cpu_mask: CpuMask | None = None
    cpu_range: CpuRange | None = None
    cpu_strict: Annotated[int, Field(ge=0, le=1)] | None = None  # None: one thread per CPU where they fill them
    prio: Annotated[int, Field(ge=-1, le=3)] = 0
    poll: Annotated[int, Field(ge=0, le=100)] = 50
    cpu_mask_batch: CpuMask | None = None
    cpu_range_batch: CpuRange | None = None
    cpu_strict_batch: Annotated[int, Field(ge=0, le=1)] | None = None  # None: --cpu-strict's
    prio_batch: Annotated[int, Field(ge=0, le=3)] | None = None
    poll_batch: Annotated[int, Field(ge=0, le=100)] | None = None
    flash_attn: OnOffAuto = "auto"
    cache_type_k: KvCacheType = "f16"
    cache_type_v: KvCacheType = "f16"
    kv_offload: bool = True
    kv_unified: bool | None = None
    swa_full: bool = False
    rope_scaling: Literal["none", "linear", "yarn"] | None = None
    rope_scale: Annotated[float, Field(gt=0)] | None = None
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_orig_ctx: Annotated[int, Field(ge=0)] = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0
    list_devices: bool = False
    lora: LoraFiles = ()
    lora_scaled: ScaledLoraFiles = ()
    lora_init_without_apply: bool = False
    control_vector: LoraFiles = ()  # FNAME and FNAME:SCALE lists, checked as --lora's are
    control_vector_scaled: ScaledLoraFiles = ()
    control_vector_layer_range: LayerRange | None = None  # "START END", as the command line gives the two values
    # the multimodal projector (kinetic.backends.config.projector_options): llama-server's defaults
    mmproj_url: DownloadUrl | None = None  # before mmproj: _mmproj_file reads it
    mmproj: str | None = None
    mmproj_auto: bool = True
    mmproj_offload: bool = True
    mmproj_device: ProjectorDevice | None = None
    image_min_tokens: Annotated[int, Field(ge=-1)] = -1  # -1: the projector's own
    image_max_tokens: Annotated[int, Field(ge=-1)] = -1
    path: ExistingFolder | None = None
    api_prefix: str | None = None
    ssl_key_file: ExistingFile | None = None
    ssl_cert_file: ExistingFile | None = None
    ui_config: JsonObjectText | None = None
    ui_config_file: JsonObjectFile | None = None
    cache_prompt: bool = True
    reuse_port: bool = False
    threads_http: int = -1
    spm_infill: bool = False
    timeout: Annotated[float, Field(gt=0)] | None = None
    sleep_idle_seconds: IdleSeconds = -1
    embd_normalize: int = 2
    reasoning_effort: str = "default"
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    port: Port = 8080
    api_key: str | None = None
    api_key_file: ExistingFile | None = None
    admin_key: str | None = None
    cors_origins: str | None = None  # None: "*", or "localhost" with tools, agent or MCP servers (llama-server's rule)
    cors_methods: Annotated[str, Field(min_length=1)] = "GET, POST, DELETE, OPTIONS"  # llama-server's
    cors_headers: str | None = None  # llama-server's is *, which a browser never lets cover Authorization
    cors_credentials: bool = True
    ui_mcp_proxy: bool = False
    tools: str | None = None
    agent: bool = False
    body_timeout: Annotated[float, Field(gt=0)] = 30.0
    header_timeout: Annotated[float, Field(gt=0)] = 30.0
    drain_timeout: Annotated[float, Field(ge=0)] = 5.0
    max_connections: Annotated[int, Field(ge=1)] = 64
    max_header_size: ByteSize = 64 * 1024
    max_body_size: ByteSize = 4 * 1024 * 1024
    # llama-server's default is 8192; a course laptop also runs the students' tools: 1 GiB holds the
    # lab's shared prefix many times over (about 18 KiB a token on the bundled model).
    cache_ram: Annotated[int, Field(ge=0)] = 1024
    ctx_checkpoints: Annotated[int, Field(ge=0)] = 32  # llama-server's default
    context_shift: bool = False
    keep: Annotated[int, Field(ge=-1)] = 0
    cache_reuse: Annotated[int, Field(ge=0)] = 0
    kv_unified_per_slot: Annotated[int, Field(ge=0)] = 0
    slot_prompt_similarity: Annotated[float, Field(ge=0, le=1)] = 0.1
    cache_idle_slots: bool = True
    fair_share: bool = True
    max_in_flight: Annotated[int, Field(ge=0)] = 4
    max_queue: Annotated[int, Field(ge=0)] = 0
    ledger: str | None = None
    ledger_content: bool = False
    ledger_best_effort: bool = False
    chat_history: str | None = None
    store_dir: str | None = None
    chat_template: TemplateName | None = None
    chat_template_file: ExistingFile | None = None
    chat_template_kwargs: TemplateVariables | None = None
    jinja: bool = True
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] = "auto"
    reasoning: OnOffAuto = "auto"
    reasoning_budget: Annotated[int, Field(ge=-1)] = -1
    reasoning_budget_message: str = ""
    reasoning_preserve: bool = True  # llama-server's default
    skip_chat_parsing: bool = False
    prefill_assistant: bool = True
    ui: bool = True
    slots: bool = True
    metrics: bool = False
    embeddings: bool = False
    rerank: bool = False  # sets embeddings and pooling rank (_rerank_sets_pooling)
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = None  # None: the model's own, else mean
    props: bool = False
    slot_save_path: str | None = None
    # A slot file is a KV cache (about 18 KiB a token on the bundled model, 128 KiB on an 8B one): 4 GiB
    # holds a few full contexts of a large model, and keeps a loop of saves from filling the disk.
    slot_save_max: Annotated[int, Field(ge=0)] = 4096
    media_path: ExistingFolder | None = None
    media_allow_private: bool | None = None  # None: allowed on an open server, refused on one with keys
    verbose: bool = False
    log_file: FileInExistingFolder | None = None
    log_timestamps: bool = False
    log_disable: bool = False
    log_verbosity: int = 3  # llama-server's LOG_LEVEL_INFO
    log_colors: OnOffAuto = "auto"
    log_prefix: bool = True
    log_jsonl: bool = False
    log_prompts_dir: str | None = None
    warmup: bool = True
    perf: bool = False  # llama-server's default is on; the timings are only read through llama.cpp's own calls
    sse_ping_interval: int = 30  # llama-server's
    # Not settings but what the command line held besides them: every -m with the -a that follows it
    # (when there are several: router mode), and flags to warn about at start.
    model_args: tuple[tuple[str, str | None], ...] = ()
    ignored_flags: tuple[str, ...] = ()
    ignored_env: tuple[str, ...] = ()

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # ServerSettings(...) takes only its arguments, so tests and apps built in code are not steered
        # by the environment; kinetic.config.args.load_settings() adds the variables explicitly.
        return (init_settings,)

    @field_validator("*", mode="before")
    @classmethod
    def _llama_bool(cls, value: Any, info: ValidationInfo) -> Any:
        """Switches read from variables take llama.cpp's words (enabled/disabled too)."""
        if isinstance(value, str) and info.field_name and cls.model_fields[info.field_name].annotation in SWITCH_TYPES:
            return switch_word(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _timeout_sets_the_read_timeouts(cls, data: Any) -> Any:
        """-to N is llama-server's socket read timeout: kinetic's two read timeouts, unless given themselves."""
        if isinstance(data, dict) and data.get("timeout") is not None:
            data = {"header_timeout": data["timeout"], "body_timeout": data["timeout"], **data}
        return data

    @model_validator(mode="before")
    @classmethod
    def _rerank_sets_pooling(cls, data: Any) -> Any:
        """--rerank is llama-server's --embeddings --pooling rank."""
        if isinstance(data, dict) and str(data.get("rerank", "")).strip().lower() in TRUE_WORDS:
            data = {**data, "embeddings": True, "pooling": "rank"}
        return data

    @model_validator(mode="after")
    def _ssl_pair(self) -> ServerSettings:
        if (self.ssl_key_file is None) != (self.ssl_cert_file is None):
            raise ValueError("--ssl-key-file and --ssl-cert-file go together: give both to serve HTTPS")
        return self

    @field_validator("mmproj")
    @classmethod
    def _mmproj_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        """-mm names a file, or with -mmu where the download goes."""
        if value and not info.data.get("mmproj_url") and not Path(value).expanduser().is_file():
            raise ValueError("no such file (with -mmu URL, -mm names where the download goes)")
        return value

    @property
    def serves_rerank(self) -> bool:
        """/rerank answers: --rerank, or --embeddings with --pooling rank (llama-server's own condition)."""
        return self.rerank or (self.embeddings and self.pooling == "rank")

    @property
    def router_mode(self) -> bool:
        """Several models at one address: a models folder, a preset file, upstreams, or more than one -m/-hf."""
        return bool(self.models_dir or self.models_preset or self.upstream or len(self.model_args) > 1)

    @property
    def hosts(self) -> tuple[str, ...]:
        """The addresses to listen on: llama-server's --host takes a comma list."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip()) or ("127.0.0.1",)

    @property
    def agent_features(self) -> bool:
        """llama-server's tools, agent mode or MCP servers asked for (kinetic runs none of them, but
        keeps llama-server's safety rule that comes with them: CORS limited to localhost)."""
        mcp_flags = {"--mcp-servers-config", "--mcp-servers-json"} & set(self.ignored_flags)
        mcp_env = {"LLAMA_ARG_MCP_SERVERS_CONFIG", "LLAMA_ARG_MCP_SERVERS_JSON"} & set(self.ignored_env)
        return bool((self.tools or "").strip(" ,")) or self.agent or bool(mcp_flags or mcp_env)

    @property
    def cors_policy(self) -> str:
        """--cors-origins when given; else llama-server's default: * , or localhost with agent features."""
        if self.cors_origins is not None:
            return self.cors_origins
        return "localhost" if self.agent_features else "*"

    @property
    def cors_proxy(self) -> bool:
        """GET/POST /cors-proxy forwards requests (--ui-mcp-proxy, or --agent)."""
        return self.ui_mcp_proxy or self.agent

    def ui_settings(self) -> dict[str, Any]:
        """GET /props `ui_settings`: --ui-config-file's JSON, else --ui-config's, else {}."""
        if self.ui_config_file is not None:
            return json_object_text(Path(self.ui_config_file).expanduser().read_text(encoding="utf-8"))
        return json_object_text(self.ui_config) if self.ui_config is not None else {}

    def lora_adapters(self) -> tuple[tuple[str, float], ...]:
        """--lora (scale 1) then --lora-scaled adapters, in the order given: their ids in /lora-adapters."""
        return scaled_files(self.lora, self.lora_scaled)

    def control_vectors(self) -> tuple[tuple[str, float], ...]:
        """--control-vector (scale 1) and --control-vector-scaled files: llama.cpp sums them all."""
        return scaled_files(self.control_vector, self.control_vector_scaled)

    def device_names(self) -> tuple[str, ...] | None:
        """-dev: the devices to offload to, () for none, None for llama.cpp's default (all)."""
        if self.device is None:
            return None
        from kinetic.engine.llama import devices

        return tuple(devices.parse_device_list(self.device))

    def cpu_params(self, *, batch: bool = False) -> CpuParams:
        """The generation pool's CPU flags, or the prompt pool's: each -batch flag not given takes the other's."""
        cpus = chosen_cpus(self.cpu_mask, self.cpu_range)
        strict, prio, poll, n_threads = self.cpu_strict, self.prio, self.poll, self.threads
        if batch:
            if self.cpu_mask_batch or self.cpu_range_batch:
                cpus = chosen_cpus(self.cpu_mask_batch, self.cpu_range_batch)
            strict = strict if self.cpu_strict_batch is None else self.cpu_strict_batch
            prio = prio if self.prio_batch is None else self.prio_batch
            poll = poll if self.poll_batch is None else self.poll_batch
            n_threads = self.threads_batch if self.threads_batch > 0 else n_threads
        given = CpuParams(cpus=tuple(sorted(cpus)), strict=bool(strict), priority=prio, poll=poll)
        # neither a mask nor --cpu-strict given: pinned where the threads fill the CPUs (llama-server leaves them)
        return given if strict is not None or cpus else one_thread_per_cpu(given, n_threads)

    def tensor_overrides(self) -> tuple[tuple[str, str], ...]:
        """-ot, then --cpu-moe/--n-cpu-moe, then --n-cpu-ffn: (pattern, buffer type), in llama-server's order."""
        if not (self.override_tensor or self.cpu_moe or self.n_cpu_moe or self.n_cpu_ffn):
            return ()
        from kinetic.engine.llama import devices

        given = [pair for item in self.override_tensor for pair in devices.parse_tensor_overrides(item)]
        return tuple(given + devices.cpu_layer_overrides(self.cpu_moe, self.n_cpu_moe, self.n_cpu_ffn))

    def llama_options(self) -> LlamaOptions:
        """What the model and context flags ask of llama.cpp."""
        load_mode = self.load_mode
        if self.mmap is False or self.mlock:  # the older switches, when given, say it
            load_mode = ("mlock" if self.mmap is False else "mmap+mlock") if self.mlock else "none"
        rope_freq_scale = 1.0 / self.rope_scale if self.rope_scale else self.rope_freq_scale
        return LlamaOptions(
            n_gpu_layers={"auto": -1, "all": -2}.get(self.gpu_layers) or int(self.gpu_layers),
            split_mode=self.split_mode, main_gpu=self.main_gpu, load_mode=load_mode, lazy_mode=self.lazy_mode,
            tensor_split=tuple(float(p) for p in re.split(r"[,/]+", self.tensor_split or "") if p.strip()),
            kv_overrides=tuple(parse_kv_override(part) for item in self.override_kv for part in item.split(",")),
            check_tensors=self.check_tensors, devices=self.device_names(), tensor_overrides=self.tensor_overrides(),
            repack=self.repack, no_host=self.no_host, numa=self.numa,
            special=self.special, lora=self.lora_adapters(), lora_init_without_apply=self.lora_init_without_apply,
            control_vectors=self.control_vectors(),
            control_vector_layers=tuple(int(n) for n in (self.control_vector_layer_range or "-1 -1").split()[:2]),
            threads_batch=max(self.threads_batch, 0), cpu=self.cpu_params(), cpu_batch=self.cpu_params(batch=True),
            flash_attn=self.flash_attn, swa_full=self.swa_full, perf=self.perf, warmup=self.warmup,
            cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v, kv_offload=self.kv_offload,
            op_offload=self.op_offload, kv_unified=self.kv_unified, rope_scaling=self.rope_scaling,
            rope_freq_base=self.rope_freq_base, rope_freq_scale=rope_freq_scale, yarn_orig_ctx=self.yarn_orig_ctx,
            yarn_ext_factor=self.yarn_ext_factor, yarn_attn_factor=self.yarn_attn_factor,
            yarn_beta_slow=self.yarn_beta_slow, yarn_beta_fast=self.yarn_beta_fast)

    def template_kwargs(self) -> dict[str, Any]:
        """--chat-template-kwargs over --reasoning-effort and --reasoning-preserve: the variables every chat
        template gets by default."""
        effort = {} if self.reasoning_effort == "default" else {"reasoning_effort": self.reasoning_effort}
        preserve = {"preserve_reasoning": self.reasoning_preserve}
        return {**preserve, **effort, **(json.loads(self.chat_template_kwargs) if self.chat_template_kwargs else {})}

    def long_context(self) -> LongContext:
        return LongContext(context_shift=self.context_shift, cache_reuse=self.cache_reuse,
                           slot_limit=self.kv_unified_per_slot, slot_similarity=self.slot_prompt_similarity,
                           cache_idle_slots=self.cache_idle_slots)

    def key_ring(self) -> KeyRing:
        """The keys clients may send, with their names (empty when the server is open)."""
        return KeyRing(self.api_key, self.api_key_file, self.admin_key)

    def api_keys(self) -> tuple[str, ...]:
        """Every key a client may send; empty when the server is open."""
        return self.key_ring().keys

    def replace(self, **changes: Any) -> ServerSettings:
        return self.model_copy(update=changes)


