"""What llama-server's model and context flags (-ngl, -fa, -ctk, --override-kv...) ask of llama.cpp.

Pure data: kinetic.engine.llama.params turns it into llama_model_params and llama_context_params, and
/props reports it. Defaults are llama.cpp's own.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# llama.cpp's KV cache types (common/arg.cpp kv_cache_types) and their ggml_type values
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6,
                  "q5_1": 7}
KV_OVERRIDE_TYPES = ("int", "float", "bool", "str")
MAX_THREADS = 512  # GGML_MAX_N_THREADS: the length of a CPU mask
PRIORITIES = {-1: "low", 0: "normal", 1: "medium", 2: "high", 3: "realtime"}
DEFAULT_POLL = 50


@dataclass(frozen=True)
class KvOverride:
    """--override-kv KEY=TYPE:VALUE: one GGUF metadata value replaced at load."""

    key: str
    type: str  # int, float, bool, str
    value: int | float | bool | str


def parse_kv_override(text: str) -> KvOverride:
    """llama.cpp's string_parse_kv_override; ValueError saying what is wrong."""
    key, sep, rest = text.partition("=")
    if not sep or not key or len(key) >= 128:
        raise ValueError(f"{text!r}: expected KEY=TYPE:VALUE (types: {', '.join(KV_OVERRIDE_TYPES)})")
    kind, sep, raw = rest.partition(":")
    if not sep or kind not in KV_OVERRIDE_TYPES:
        raise ValueError(f"{text!r}: the type must be one of {', '.join(KV_OVERRIDE_TYPES)}")
    value: int | float | bool | str
    try:
        if kind == "int":
            value = int(raw)
        elif kind == "float":
            value = float(raw)
        elif kind == "bool":
            if raw not in ("true", "false"):
                raise ValueError
            value = raw == "true"
        else:
            if len(raw.encode("utf-8")) > 127:
                raise ValueError
            value = raw
    except ValueError:
        raise ValueError(f"{text!r}: {raw!r} is not a {kind} value") from None
    return KvOverride(key=key, type=kind, value=value)


@dataclass(frozen=True)
class CpuParams:
    """One pool's flags: the CPUs its threads may run on (empty: any), placement, priority, polling."""

    cpus: tuple[int, ...] = ()
    strict: bool = False
    priority: int = 0
    poll: int = DEFAULT_POLL

    @property
    def is_default(self) -> bool:
        return self == CpuParams()

    def describe(self) -> dict[str, object]:
        return {"cpus": list(self.cpus), "strict": self.strict, "priority": PRIORITIES[self.priority],
                "poll": self.poll}


def default_threads() -> int:
    """-t's default: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def one_thread_per_cpu(cpu: CpuParams, n_threads: int) -> CpuParams:
    """`cpu` with each thread pinned to a CPU of its own (`-C <all> --cpu-strict 1`) where the threads are as many as
    the CPUs this process may run on (-t's default), on Linux. Left to place them, the kernel sometimes woke
    llama.cpp's second thread on the CPU where the first was computing, another CPU idle: each then spun at the
    step's barriers through the other's time slice, and a tiny model's 3.5 ms prompt step took 15 ms in one
    request of ten on 2 cores (perf sched, 2026-12-07). With as many threads as CPUs, none is left for the kernel
    to move a thread to anyway."""
    if not hasattr(os, "sched_getaffinity"):
        return cpu
    available = tuple(sorted(os.sched_getaffinity(0)))
    threads = n_threads if n_threads > 0 else default_threads()
    if len(available) < 2 or threads != len(available) or len(available) > MAX_THREADS:
        return cpu
    return replace(cpu, cpus=available, strict=True)


def parse_cpu_mask(mask: str) -> tuple[int, ...]:
    """-C: an arbitrarily long hex mask, lowest bit = CPU 0 (a `0x` prefix allowed; 128 digits at most)."""
    digits = mask.removeprefix("0x")[:128]
    if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(f"{mask!r} is not a hex CPU mask (e.g. 0xff)")
    value = int(digits, 16)
    return tuple(cpu for cpu in range(len(digits) * 4) if value >> cpu & 1)


def parse_cpu_range(text: str) -> tuple[int, ...]:
    """-Cr: `lo-hi` (either end may be left out: from CPU 0, up to the last ggml knows)."""
    low, dash, high = text.partition("-")
    try:
        start = int(low) if low else 0
        end = int(high) if high else MAX_THREADS - 1
    except ValueError:
        start = end = -1
    if not dash or not 0 <= start <= end < MAX_THREADS:
        raise ValueError(f"{text!r} is not a CPU range lo-hi within 0-{MAX_THREADS - 1}")
    return tuple(range(start, end + 1))


@dataclass(frozen=True)
class LlamaOptions:
    # model (llama_model_params)
    n_gpu_layers: int = -1  # -ngl: -1 auto, -2 all, else a count
    split_mode: str = "layer"  # none, layer, row, tensor
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    load_mode: str = "auto"  # auto, none, mmap, mlock, mmap+mlock, dio
    lazy_mode: str = "auto"  # off, auto, on
    kv_overrides: tuple[KvOverride, ...] = ()
    check_tensors: bool = False
    devices: tuple[str, ...] | None = None  # -dev: offload devices by name; () none; None llama.cpp's default
    tensor_overrides: tuple[tuple[str, str], ...] = ()  # -ot, --cpu-moe...: (name pattern, buffer type name)
    # llama.cpp's use_extra_bufts; off by default, unlike llama-server (see params.model_params)
    repack: bool = False
    no_host: bool = False
    numa: str | None = None  # distribute, isolate, numactl
    special: bool = False  # generated special tokens show as text
    lora: tuple[tuple[str, float], ...] = ()  # --lora / --lora-scaled: (path, scale), in order (their ids)
    lora_init_without_apply: bool = False  # loaded at scale 0 until POST /lora-adapters sets one
    control_vectors: tuple[tuple[str, float], ...] = ()  # --control-vector[-scaled]: (path, scale), summed
    control_vector_layers: tuple[int, ...] = (-1, -1)  # --control-vector-layer-range; <= 0: 1 and the last layer
    # context (llama_context_params)
    warmup: bool = True  # --warmup: one decode of BOS and EOS at load (LoadedModel.warm_up)
    perf: bool = False  # --perf: llama.cpp keeps its internal timings (no_perf off)
    threads_batch: int = 0  # 0: same as the generation threads
    cpu: CpuParams = CpuParams()  # -C/-Cr, --cpu-strict, --prio, --poll: the generation thread pool
    cpu_batch: CpuParams = CpuParams()  # their -batch twins: the prompt-processing pool
    flash_attn: str = "auto"  # on, off, auto
    # --swa-full: kinetic's sliding-window cache is full-size either way; the flag leaves prompt batches whole, as
    # llama-server's do once its window can roll back (admission.end_breaks)
    swa_full: bool = False
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    kv_offload: bool = True
    op_offload: bool = True
    kv_unified: bool | None = None  # None: unified when the slot count is auto (-np -1)
    rope_scaling: str | None = None  # none, linear, yarn; None: the model's
    rope_freq_base: float = 0.0  # 0: the model's
    rope_freq_scale: float = 0.0  # 0: the model's
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0

    def describe(self) -> dict[str, Any]:
        """JSON for /props: every value as the flags set it."""
        shown = asdict(self)
        shown["kv_overrides"] = [f"{o.key}={o.type}:{str(o.value).lower() if o.type == 'bool' else o.value}"
                                 for o in self.kv_overrides]
        shown["tensor_split"] = list(self.tensor_split)
        shown["tensor_overrides"] = [f"{pattern}={buft}" for pattern, buft in self.tensor_overrides]
        shown["devices"] = None if self.devices is None else list(self.devices)
        shown["cpu"], shown["cpu_batch"] = self.cpu.describe(), self.cpu_batch.describe()
        shown["lora"] = [{"path": path, "scale": scale} for path, scale in self.lora]
        shown["control_vectors"] = [{"path": path, "scale": scale} for path, scale in self.control_vectors]
        shown["control_vector_layers"] = list(self.control_vector_layers)
        return shown


@dataclass(frozen=True)
class LongContext:
    """--context-shift and --cache-reuse (kinetic.engine.llama.context_shift); --keep is a request default
    (GenerationRequest.n_keep)."""

    context_shift: bool = False
    cache_reuse: int = 0  # smallest cached chunk moved instead of evaluated again; 0: off
    slot_limit: int = 0  # --kv-unified-per-slot: most tokens one slot holds (and, without -c, the pool per slot)
    # -sps: the share of a prompt an idle slot's cache must hold for the slot to be picked by it; else the
    # least recently used idle slot (llama-server's get_available_slot); 0: always the least recently used
    slot_similarity: float = 0.1
    # --cache-idle-slots: a slot's cells go to the --cache-ram cache before a new request drops them
    cache_idle_slots: bool = True


# llama.cpp's speculative decoding kinds (common/speculative.cpp), and the ones kinetic runs
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# in llama.cpp's order of preference (common_speculative_init): a slot gets the first kind's draft that has one
SPEC_TYPES_RUN = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple")


@dataclass(frozen=True)
class NgramMapOptions:
    """ngram-map-k's or ngram-map-k4v's sizes (llama-server's common_params_speculative_ngram_map)."""

    size_n: int = 12  # the n-gram looked up
    size_m: int = 48  # the m-gram drafted after it
    min_hits: int = 1  # k4v: times the key must have been seen


def parse_spec_types(text: str) -> tuple[str, ...]:
    """--spec-type's comma list as llama.cpp reads it: `none` anywhere turns speculation off; an unknown
    name is a ValueError."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in SPEC_TYPES:
            raise ValueError(f"unknown speculative type {name!r} (known: {', '.join(SPEC_TYPES)})")
    return () if "none" in names else tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class SpecOptions:
    """What the speculative decoding flags ask (llama-server's common_params_speculative)."""

    types: tuple[str, ...] = ()  # in llama.cpp's order of preference: ngram-simple before draft-simple
    draft_model: str | None = None  # -md: a GGUF with the target's vocabulary
    n_max: int = 3  # draft-simple: most tokens drafted a step
    n_min: int = 0  # draft-simple: a shorter draft is dropped
    p_min: float = 0.0  # draft-simple: drafting stops below this probability of the draft's top token
    ngram_size_n: int = 12  # ngram-simple: the n-gram looked up
    ngram_size_m: int = 48  # ngram-simple: most tokens drafted after a match
    map_k: NgramMapOptions = NgramMapOptions()
    map_k4v: NgramMapOptions = NgramMapOptions()
    mod_n_match: int = 24  # ngram-mod: the n-gram hashed
    mod_n_min: int = 48  # ngram-mod: a shorter draft is dropped
    mod_n_max: int = 64  # ngram-mod: most tokens drafted
    # --spec-synth-rates/--spec-synth-len (benchmarking only): the chance that draft token i is accepted once
    # tokens 0..i-1 were, whatever the target model picks; empty: drafts are verified
    synth_probs: tuple[float, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.runnable)

    @property
    def runnable(self) -> tuple[str, ...]:
        """The asked kinds kinetic runs (draft-simple only with a draft model), in llama.cpp's order."""
        return tuple(t for t in SPEC_TYPES_RUN if t in self.types and (t != "draft-simple" or self.draft_model))

    @property
    def not_run(self) -> tuple[str, ...]:
        return tuple(t for t in self.types if t not in SPEC_TYPES_RUN)


@dataclass(frozen=True)
class ProjectorOptions:
    """A model's multimodal projector (llama-server's -mm, found by -hf unless --no-mmproj) and how mtmd loads it."""

    path: str | None = None  # the mmproj GGUF; None: the model reads text only
    use_gpu: bool = True  # --mmproj-offload / --no-mmproj-offload (-mmdev none turns it off)
    device: str | None = None  # -mmdev: the one device it runs on (None: follows --device)
    image_min_tokens: int = -1  # --image-min-tokens (-1: the projector's own)
    image_max_tokens: int = -1  # --image-max-tokens

    @property
    def enabled(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class EngineConfig:
    """The llama engine's construction, handed to it whole: context, slots, threads, batches, embeddings,
    llama.cpp options (a model's config holds it, kinetic.backends.config)."""

    n_ctx: int = 0
    n_parallel: int = -1
    n_threads: int = -1
    n_batch: int = 2048  # llama-server's -b
    n_ubatch: int = 512  # llama-server's -ub
    embeddings: bool = False
    pooling: str | None = None
    options: LlamaOptions = field(default_factory=LlamaOptions)
    fair_share: bool = True
    max_queue: int = 0  # --max-queue: requests that may wait for a slot (0: no cap)
    cache_ram_mib: int = 0
    ctx_checkpoints: int = 32
    verbose: bool = False
    long_context: LongContext = field(default_factory=LongContext)  # --context-shift, --cache-reuse...
    spec: SpecOptions = field(default_factory=SpecOptions)  # speculative decoding (-md, --spec-type...)
    projector: ProjectorOptions = field(default_factory=ProjectorOptions)  # image/audio input (-mm, -hf's mmproj)
