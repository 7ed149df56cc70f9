"""`kinetic serve`'s flags: each setting's spellings (llama-server's where it has the flag), help and
variables. The table is read by the one command-line reader (kinetic.config.args) for the run and for
`--help`, by the router's presets (kinetic.backends.sources) and by the generated docs (kinetic.config.flag_status).
A flag's type and default live on ServerSettings, whose field is named by the flag's `dest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from kinetic.chat.reasoning import REASONING_FORMATS
from kinetic.config.llama_flags import LlamaFlag, by_spelling
from kinetic.config.values import SWITCH_TYPES
from kinetic.engine.options import KV_CACHE_TYPES

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo


@cache
def _setting(dest: str) -> FieldInfo:
    # imported here: kinetic.config.settings re-exports this table, so it cannot be imported at module level
    from kinetic.config.settings import ServerSettings

    return ServerSettings.model_fields[dest]


@dataclass(frozen=True)
class Flag:
    """A flag kinetic implements: its spellings and help; type and default live on ServerSettings."""

    dest: str
    names: tuple[str, ...]
    help: str
    negations: tuple[str, ...] = ()  # "--no-x" spellings of a boolean switch that defaults to on
    metavar: str | None = None

    @property
    def llama(self) -> LlamaFlag | None:
        """The llama-server flag with the same spellings (None for kinetic's own flags)."""
        return next((by_spelling()[n] for n in self.names if n in by_spelling()), None)

    @property
    def kinetic_env(self) -> str:
        return "KINETIC_" + self.dest.upper()

    @property
    def llama_env(self) -> str | None:
        return self.llama.env if self.llama else None

    @property
    def env_names(self) -> tuple[str, ...]:
        """Variables in the order they are looked up (the first one set wins)."""
        negative = self.llama.negative_env if self.llama else None
        return tuple(n for n in (self.kinetic_env, negative, self.llama_env) if n)

    @property
    def is_switch(self) -> bool:
        return _setting(self.dest).annotation in SWITCH_TYPES

    @property
    def repeats(self) -> bool:
        """Every occurrence counts (a list setting); for the other flags the last one wins."""
        return _setting(self.dest).annotation == tuple[str, ...]

    @property
    def default(self) -> Any:
        return _setting(self.dest).default


FLAGS: tuple[Flag, ...] = (
    Flag("model", ("-m", "--model"), "path of the GGUF model to serve, or a bundled model's name: smollm2 (the "
         "default, a small chat model) or gemma (the base Gemma 3 270M)", metavar="FNAME"),
    Flag("bundled", ("--bundled",), "which bundled model serves when no model is named: smollm2 (default) or gemma",
         metavar="NAME"),
    Flag("hf_repo", ("-hf", "-hfr", "--hf-repo"),
         "Hugging Face repo to serve, <user>/<model>[:quant] (quant default Q4_K_M); downloaded once, then "
         "taken from the Hugging Face cache", metavar="REPO"),
    Flag("hf_file", ("-hff", "--hf-file"), "file inside the -hf repo (overrides the quant)", metavar="FILE"),
    Flag("hf_token", ("-hft", "--hf-token"), "Hugging Face access token for gated or private repos",
         metavar="TOKEN"),
    Flag("offline", ("--offline",), "never touch the network: -hf resolves from the Hugging Face cache only"),
    Flag("alias", ("-a", "--alias"), "model name used by the API (comma list: the alphabetically first is the id); "
         "with several -m/-hf, each -a names the one it follows", metavar="NAME"),
    Flag("tags", ("--tags",), "model tags, comma list (shown by /v1/models)", metavar="TAGS"),
    Flag("models_dir", ("--models-dir",), "router mode: serve every GGUF under this folder, named by file stem",
         metavar="PATH"),
    Flag("models_preset", ("--models-preset",), "router mode: llama-server's INI preset, one [section] a model",
         metavar="PATH"),
    Flag("models_max", ("--models-max",), "router mode: local models loaded at once, LRU unloaded (0 = no limit)",
         metavar="N"),
    Flag("models_autoload", ("--models-autoload",), "router mode: a request for an unloaded model loads it",
         negations=("--no-models-autoload",)),
    Flag("upstream", ("--upstream",), "router mode: NAME served by an OpenAI-compatible server (repeat: a pool)",
         metavar="NAME=URL"),
    Flag("upstream_policy", ("--upstream-policy",), "how a pool picks a server: cache-aware (a conversation goes "
         "back to the server holding it) or least-outstanding", metavar="POLICY"),
    Flag("upstream_cache_threshold", ("--upstream-cache-threshold",), "cache-aware: share of the prompt a server "
         "must hold to be chosen for it", metavar="SHARE"),
    Flag("upstream_balance_abs_threshold", ("--upstream-balance-abs-threshold",), "cache-aware: a request leaves "
         "the server holding it when that has more than N requests over the idlest server (and is over the relative "
         "bound)", metavar="N"),
    Flag("upstream_balance_rel_threshold", ("--upstream-balance-rel-threshold",), "cache-aware: ... and more than R "
         "times the idlest server's requests (and is over the absolute bound)", metavar="R"),
    Flag("upstream_probe_interval", ("--upstream-probe-interval",), "seconds between health and load probes of "
         "each upstream server", metavar="S"),
    Flag("ctx_size", ("-c", "--ctx-size"), "total context size in tokens, shared by the slots (0 = from the model)",
         metavar="N"),
    Flag("parallel", ("-np", "--parallel"),
         "number of slots (requests served at once; -1 = auto: 16 over one unified KV cache)", metavar="N"),
    Flag("batch_size", ("-b", "--batch-size"), "logical batch: most prompt tokens decoded in one step", metavar="N"),
    Flag("ubatch_size", ("-ub", "--ubatch-size"), "physical batch: most tokens per llama.cpp compute call",
         metavar="N"),
    Flag("threads", ("-t", "--threads"), "generation threads (-1 = all cores)", metavar="N"),
    Flag("n_predict", ("-n", "--predict", "--n-predict"),
         "default max tokens to generate (-1 = until the end of the context)", metavar="N"),
    Flag("temp", ("--temp", "--temperature"), "default sampling temperature", metavar="T"),
    Flag("seed", ("-s", "--seed"), "default sampling seed (-1 = random)", metavar="N"),
    # Server-wide sampling defaults: what every request on every protocol gets for a field it leaves out
    Flag("top_k", ("--top-k",), "default top-k sampling (0 = off)", metavar="N"),
    Flag("top_p", ("--top-p",), "default top-p sampling (1.0 = off)", metavar="N"),
    Flag("min_p", ("--min-p",), "default min-p sampling (0.0 = off)", metavar="N"),
    Flag("top_n_sigma", ("--top-nsigma", "--top-n-sigma"), "default top-n-sigma sampling (-1 = off)", metavar="N"),
    Flag("typical_p", ("--typical", "--typical-p"), "default locally typical sampling p (1.0 = off)", metavar="N"),
    Flag("xtc_probability", ("--xtc-probability",), "default XTC probability (0.0 = off)", metavar="N"),
    Flag("xtc_threshold", ("--xtc-threshold",), "default XTC threshold (above 0.5 = off)", metavar="N"),
    Flag("repeat_last_n", ("--repeat-last-n",), "default tokens the repetition penalties look back on (0 = off)",
         metavar="N"),
    Flag("repeat_penalty", ("--repeat-penalty",), "default repetition penalty (1.0 = off)", metavar="N"),
    Flag("presence_penalty", ("--presence-penalty",), "default presence penalty (0.0 = off)", metavar="N"),
    Flag("frequency_penalty", ("--frequency-penalty",), "default frequency penalty (0.0 = off)", metavar="N"),
    Flag("dry_multiplier", ("--dry-multiplier",), "default DRY multiplier (0.0 = off)", metavar="N"),
    Flag("dry_base", ("--dry-base",), "default DRY base (below 1.0: kept at the default)", metavar="N"),
    Flag("dry_allowed_length", ("--dry-allowed-length",), "default DRY allowed length", metavar="N"),
    Flag("dry_penalty_last_n", ("--dry-penalty-last-n",), "default tokens DRY scans (0 = off)", metavar="N"),
    Flag("dry_sequence_breaker", ("--dry-sequence-breaker",), "a DRY sequence breaker (repeat the flag; replaces "
         "the defaults \\n : \" *; none = no breaker)", metavar="STRING"),
    Flag("adaptive_target", ("--adaptive-target",), "default adaptive-p target (negative = off)", metavar="N"),
    Flag("adaptive_decay", ("--adaptive-decay",), "default adaptive-p decay (0.0 to 0.99)", metavar="N"),
    Flag("dynatemp_range", ("--dynatemp-range",), "default dynamic temperature range (0.0 = off)", metavar="N"),
    Flag("dynatemp_exp", ("--dynatemp-exp",), "default dynamic temperature exponent", metavar="N"),
    Flag("mirostat", ("--mirostat",), "default Mirostat (0 = off, 1 = Mirostat, 2 = Mirostat 2.0)", metavar="N"),
    Flag("mirostat_lr", ("--mirostat-lr",), "default Mirostat learning rate, eta", metavar="N"),
    Flag("mirostat_ent", ("--mirostat-ent",), "default Mirostat target entropy, tau", metavar="N"),
    Flag("samplers", ("--samplers",), "default sampler chain, names separated by ';' (e.g. top_k;temperature)",
         metavar="SAMPLERS"),
    Flag("sampling_seq", ("--sampler-seq", "--sampling-seq"), "default sampler chain as letters (e.g. kt); "
         "--samplers wins when both are given", metavar="SEQUENCE"),
    Flag("logit_bias", ("-l", "--logit-bias"), "default logit bias TOKEN_ID(+/-)BIAS, e.g. 15043+1 (repeat the "
         "flag; a request's own logit_bias replaces them all)", metavar="TOKEN_ID(+/-)BIAS"),
    Flag("ignore_eos", ("--ignore-eos",), "by default, generate past end-of-generation tokens"),
    Flag("grammar", ("--grammar",), "default GBNF grammar every answer must follow", metavar="GRAMMAR"),
    Flag("grammar_file", ("--grammar-file",), "file with the default GBNF grammar", metavar="FNAME"),
    Flag("json_schema", ("-j", "--json-schema"), "default JSON schema every answer must follow", metavar="SCHEMA"),
    Flag("json_schema_file", ("-jf", "--json-schema-file"), "file with the default JSON schema", metavar="FILE"),
    Flag("reverse_prompt", ("-r", "--reverse-prompt"), "default stop string (repeat the flag for several; a "
         "request's own non-empty stop replaces them)", metavar="PROMPT"),
    Flag("escape", ("-e", "--escape"), "process escapes (\\n, \\t, \\x7d...) in -r and --dry-sequence-breaker",
         negations=("--no-escape",)),
    Flag("special", ("-sp", "--special"), "special tokens appear in the generated text"),
    Flag("backend_sampling", ("-bs", "--backend-sampling"), "the default of a request's backend_sampling, shown in "
         "/props; kinetic samples in its own sampler either way (llama-server samples in llama.cpp's graph: see "
         "the differences table)"),
    # What llama.cpp is asked when the model loads and the context is made (kinetic.engine.llama.params)
    Flag("gpu_layers", ("-ngl", "--gpu-layers", "--n-gpu-layers"), "layers to store in VRAM: a number, auto or all "
         "(a CPU build has no GPU: passed on, no effect)", metavar="N"),
    Flag("split_mode", ("-sm", "--split-mode"), "how to split the model across GPUs: none, layer, row, tensor",
         metavar="MODE"),
    Flag("tensor_split", ("-ts", "--tensor-split"), "fraction of the model for each GPU, e.g. 3,1",
         metavar="N0,N1,..."),
    Flag("main_gpu", ("-mg", "--main-gpu"), "the GPU for the model (split mode none) or for intermediate results",
         metavar="INDEX"),
    Flag("load_mode", ("-lm", "--load-mode"), "model loading: auto, none, mmap, mlock, mmap+mlock, dio",
         metavar="MODE"),
    Flag("mmap", ("--mmap",), "older llama-server spelling: --no-mmap reads the model into memory (--load-mode none)",
         negations=("--no-mmap",)),
    Flag("mlock", ("--mlock",), "older llama-server spelling: keep the model in RAM (--load-mode mmap+mlock)"),
    Flag("lazy_mode", ("-lzm", "--lazy-mode"), "on-demand reading of tensors the architecture marks: on, auto, off",
         metavar="MODE"),
    Flag("numa", ("--numa",), "NUMA strategy: distribute, isolate, numactl", metavar="TYPE"),
    Flag("override_kv", ("--override-kv",), "override model metadata, KEY=TYPE:VALUE,... (types int, float, bool, "
         "str; repeat the flag for more)", metavar="KEY=TYPE:VALUE"),
    Flag("check_tensors", ("--check-tensors",), "check the model's tensor data for invalid values at load"),
    Flag("device", ("-dev", "--device"), "devices to offload to, comma-separated, or none (--list-devices shows "
         "them; a CPU build has none)", metavar="DEV1,DEV2,.."),
    Flag("override_tensor", ("-ot", "--override-tensor"), "buffer type for the tensors whose name matches a "
         "pattern, PATTERN=TYPE,... (repeat the flag for more)", metavar="PATTERN=TYPE"),
    Flag("cpu_moe", ("-cmoe", "--cpu-moe"), "keep every Mixture-of-Experts weight in the CPU"),
    Flag("n_cpu_moe", ("-ncmoe", "--n-cpu-moe"), "keep the MoE weights of the first N layers in the CPU",
         metavar="N"),
    Flag("n_cpu_ffn", ("-ncffn", "--n-cpu-ffn"), "keep the dense FFN weights of the first N layers in the CPU",
         metavar="N"),
    Flag("repack", ("--repack",), "weight repacking for faster CPU kernels (default: off; a cached prompt's "
         "answer may then differ from a fresh one)", negations=("-nr", "--no-repack")),
    Flag("no_host", ("--no-host",), "bypass the host buffer so extra buffer types can be used"),
    Flag("op_offload", ("--op-offload",), "offload host tensor operations to the device",
         negations=("--no-op-offload",)),
    Flag("threads_batch", ("-tb", "--threads-batch"), "threads for prompt processing (default: same as -t)",
         metavar="N"),
    Flag("cpu_mask", ("-C", "--cpu-mask"), "CPUs the generation threads may run on, as a hex mask (with -Cr, "
         "either CPU)", metavar="M"),
    Flag("cpu_range", ("-Cr", "--cpu-range"), "CPUs the generation threads may run on, as lo-hi", metavar="lo-hi"),
    Flag("cpu_strict", ("--cpu-strict",), "pin each generation thread to one CPU of the mask: 0 or 1 (default: 1 "
         "with every CPU as the mask where -t is as many as the CPUs and no -C/-Cr is given, else 0)",
         metavar="<0|1>"),
    Flag("prio", ("--prio",), "process and thread priority: low(-1), normal(0), medium(1), high(2), realtime(3)",
         metavar="N"),
    Flag("poll", ("--poll",), "how much idle threads poll for work before they sleep: 0 (none) to 100 (default: "
         "50)", metavar="<0...100>"),
    Flag("cpu_mask_batch", ("-Cb", "--cpu-mask-batch"), "-C for the prompt-processing threads (default: -C's)",
         metavar="M"),
    Flag("cpu_range_batch", ("-Crb", "--cpu-range-batch"), "-Cr for the prompt-processing threads",
         metavar="lo-hi"),
    Flag("cpu_strict_batch", ("--cpu-strict-batch",), "--cpu-strict for the prompt-processing threads "
         "(default: --cpu-strict's)", metavar="<0|1>"),
    Flag("prio_batch", ("--prio-batch",), "thread priority of the prompt-processing threads, 0 to 3 (default: "
         "--prio's)", metavar="N"),
    Flag("poll_batch", ("--poll-batch",), "--poll for the prompt-processing threads (default: --poll's)",
         metavar="<0|1>"),
    Flag("flash_attn", ("-fa", "--flash-attn"), "flash attention: on, off, auto", metavar="on|off|auto"),
    Flag("cache_type_k", ("-ctk", "--cache-type-k"), "KV cache type for K: " + ", ".join(KV_CACHE_TYPES),
         metavar="TYPE"),
    Flag("cache_type_v", ("-ctv", "--cache-type-v"), "KV cache type for V (quantized V needs flash attention)",
         metavar="TYPE"),
    Flag("kv_offload", ("-kvo", "--kv-offload"), "KV cache offloading to the GPU",
         negations=("-nkvo", "--no-kv-offload")),
    Flag("kv_unified", ("-kvu", "--kv-unified"), "one KV buffer shared by all slots, each may use the whole context "
         "(default: on when -np is auto)", negations=("-no-kvu", "--no-kv-unified")),
    Flag("warmup", ("--warmup",), "warm up the model with an empty run at load, so the first request does not pay "
         "the backends' first-use costs (default: on)", negations=("--no-warmup",)),
    Flag("swa_full", ("--swa-full",), "full-size sliding-window cache (always on in kinetic: a slot's cached prefix "
         "stays reusable); given, a prompt is read without llama-server's early batch ends, as there"),
    Flag("rope_scaling", ("--rope-scaling",), "RoPE frequency scaling: none, linear, yarn (default: the model's)",
         metavar="TYPE"),
    Flag("rope_scale", ("--rope-scale",), "RoPE context scaling factor: expands the context by N", metavar="N"),
    Flag("rope_freq_base", ("--rope-freq-base",), "RoPE base frequency (default: the model's)", metavar="N"),
    Flag("rope_freq_scale", ("--rope-freq-scale",), "RoPE frequency scaling factor: expands the context by 1/N",
         metavar="N"),
    Flag("yarn_orig_ctx", ("--yarn-orig-ctx",), "YaRN: the model's original context (0 = its training context)",
         metavar="N"),
    Flag("yarn_ext_factor", ("--yarn-ext-factor",), "YaRN: extrapolation mix factor (-1 = the model's)", metavar="N"),
    Flag("yarn_attn_factor", ("--yarn-attn-factor",), "YaRN: attention magnitude scale (-1 = the model's)",
         metavar="N"),
    Flag("yarn_beta_slow", ("--yarn-beta-slow",), "YaRN: high correction dim or alpha (-1 = the model's)",
         metavar="N"),
    Flag("yarn_beta_fast", ("--yarn-beta-fast",), "YaRN: low correction dim or beta (-1 = the model's)",
         metavar="N"),
    Flag("list_devices", ("--list-devices",), "print the devices llama.cpp can offload to, and exit"),
    Flag("lora", ("--lora",), "LoRA adapter to apply at scale 1 (comma list, or repeat the flag)", metavar="FNAME"),
    Flag("lora_scaled", ("--lora-scaled",), "LoRA adapter with its scale, FNAME:SCALE (comma list, or repeat the "
         "flag)", metavar="FNAME:SCALE"),
    Flag("lora_init_without_apply", ("--lora-init-without-apply",), "load the adapters at scale 0; POST "
         "/lora-adapters sets their scales"),
    # speculative decoding (kinetic.engine.llama.speculative)
    Flag("draft_model", ("--spec-draft-model", "-md", "--model-draft"), "draft model for speculative decoding "
         "(alone it means --spec-type draft-simple)", metavar="FNAME"),
    Flag("spec_type", ("--spec-type",), "speculative decoding kinds, comma list: draft-simple (needs -md), "
         "ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache (drafts from the tokens already seen), "
         "none", metavar="TYPES"),
    Flag("draft_max", ("--spec-draft-n-max",), "most tokens the draft model proposes a step", metavar="N"),
    Flag("draft_min", ("--spec-draft-n-min",), "fewest tokens a draft-model draft must have to be verified",
         metavar="N"),
    # the spellings model cards still carry; the vendored llama-server refuses them ("removed")
    Flag("draft_max_old", ("--draft", "--draft-n", "--draft-max"), "--spec-draft-n-max's older spelling (kinetic "
         "takes it; the vendored llama-server refuses it)", metavar="N"),
    Flag("draft_min_old", ("--draft-min", "--draft-n-min"), "--spec-draft-n-min's older spelling (kinetic takes "
         "it; the vendored llama-server refuses it)", metavar="N"),
    Flag("draft_p_min", ("--spec-draft-p-min", "--draft-p-min"), "the draft model stops at a token it gives a "
         "lower probability (greedy)", metavar="P"),
    Flag("spec_ngram_simple_size_n", ("--spec-ngram-simple-size-n",), "ngram-simple: length of the n-gram looked up "
         "in the slot's tokens", metavar="N"),
    Flag("spec_ngram_simple_size_m", ("--spec-ngram-simple-size-m",), "ngram-simple: most tokens drafted after a "
         "match", metavar="N"),
    Flag("spec_ngram_map_k_size_n", ("--spec-ngram-map-k-size-n",), "ngram-map-k: length of the n-gram looked up",
         metavar="N"),
    Flag("spec_ngram_map_k_size_m", ("--spec-ngram-map-k-size-m",), "ngram-map-k: length of the m-gram drafted "
         "after it", metavar="N"),
    Flag("spec_ngram_map_k_min_hits", ("--spec-ngram-map-k-min-hits",), "ngram-map-k: times a key must have been "
         "seen before it drafts", metavar="N"),
    Flag("spec_ngram_map_k4v_size_n", ("--spec-ngram-map-k4v-size-n",), "ngram-map-k4v: length of the n-gram "
         "looked up", metavar="N"),
    Flag("spec_ngram_map_k4v_size_m", ("--spec-ngram-map-k4v-size-m",), "ngram-map-k4v: length of the m-gram "
         "drafted after it", metavar="N"),
    Flag("spec_ngram_map_k4v_min_hits", ("--spec-ngram-map-k4v-min-hits",), "ngram-map-k4v: times a key must have "
         "been seen before it drafts", metavar="N"),
    Flag("spec_ngram_mod_n_match", ("--spec-ngram-mod-n-match",), "ngram-mod: length of the n-gram hashed",
         metavar="N"),
    Flag("spec_ngram_mod_n_min", ("--spec-ngram-mod-n-min",), "ngram-mod: a shorter draft is dropped", metavar="N"),
    Flag("spec_ngram_mod_n_max", ("--spec-ngram-mod-n-max",), "ngram-mod: most tokens drafted", metavar="N"),
    Flag("spec_synth_rates", ("--spec-synth-rates",), "benchmarking only: each draft position's unconditional "
         "chance of acceptance, non-increasing, one for each position of the longest draft the kinds asked make "
         "(-md: --spec-draft-n-max); drafts are then accepted at random instead of verified, and the output is "
         "not the model's", metavar="P0,P1,..."),
    Flag("spec_synth_len", ("--spec-synth-len",), "benchmarking only: the mean accepted length (the target's token "
         "included) that sets --spec-synth-rates to p, p^2, ...", metavar="L"),
    Flag("control_vector", ("--control-vector",), "control vector to add at scale 1 (comma list, or repeat the flag)",
         metavar="FNAME"),
    Flag("control_vector_scaled", ("--control-vector-scaled",), "control vector with its scale, FNAME:SCALE (comma "
         "list, or repeat the flag); all the vectors given are summed", metavar="FNAME:SCALE"),
    Flag("control_vector_layer_range", ("--control-vector-layer-range",), "layers the control vectors apply to, "
         "START END, both inclusive (default: 1 to the last)", metavar="START END"),
    # the multimodal projector: image and audio input (kinetic.backends.config.projector_options)
    Flag("mmproj", ("-mm", "--mmproj"), "multimodal projector GGUF (image/audio input); with -mmu, where the "
         "download is written; wins over the one -hf finds", metavar="FILE"),
    Flag("mmproj_url", ("-mmu", "--mmproj-url"), "download the projector from this URL once (into -mm's path, else "
         "kinetic's cache), then reuse the file", metavar="URL"),
    Flag("mmproj_auto", ("--mmproj-auto",), "-hf fetches the repo's mmproj GGUF, and a --models-dir sub-folder's "
         "mmproj file goes with its model", negations=("--no-mmproj", "--no-mmproj-auto")),
    Flag("mmproj_offload", ("--mmproj-offload",), "run the projector on the GPU (a CPU build has none)",
         negations=("--no-mmproj-offload",)),
    Flag("mmproj_device", ("-mmdev", "--mmproj-device"), "the one device the projector runs on, or none (default: "
         "the first of --device)", metavar="DEVICE"),
    Flag("image_min_tokens", ("--image-min-tokens",), "fewest tokens an image may take, for projectors of dynamic "
         "resolution (-1 = the projector's own)", metavar="N"),
    Flag("image_max_tokens", ("--image-max-tokens",), "most tokens an image may take, for projectors of dynamic "
         "resolution (-1 = the projector's own)", metavar="N"),
    Flag("path", ("--path",), "serve static files from this folder at / (its index.html replaces the chat page)",
         metavar="PATH"),
    Flag("api_prefix", ("--api-prefix",), "serve every route under this path prefix (e.g. /llama)", metavar="PREFIX"),
    Flag("ssl_key_file", ("--ssl-key-file",), "PEM private key: serve HTTPS (with --ssl-cert-file)", metavar="FNAME"),
    Flag("ssl_cert_file", ("--ssl-cert-file",), "PEM certificate: serve HTTPS (with --ssl-key-file)", metavar="FNAME"),
    Flag("ui_config", ("--ui-config", "--webui-config"), "JSON object of default web UI settings (GET /props "
         "ui_settings)", metavar="JSON"),
    Flag("ui_config_file", ("--ui-config-file", "--webui-config-file"), "file with the JSON of --ui-config",
         metavar="PATH"),
    Flag("cache_prompt", ("--cache-prompt",), "requests that do not send cache_prompt reuse a cached prefix",
         negations=("--no-cache-prompt",)),
    Flag("spm_infill", ("--spm-infill",), "/infill lays out suffix, prefix, middle (some models were trained so)"),
    Flag("threads_http", ("--threads-http",), "worker threads for requests' blocking work (default: anyio's 40)",
         metavar="N"),
    Flag("reuse_port", ("--reuse-port",), "let other processes listen on the same port (SO_REUSEPORT)"),
    Flag("sleep_idle_seconds", ("--sleep-idle-seconds",), "unload the model after this many idle seconds; the next "
         "request loads it again and waits (-1 = never)", metavar="SECONDS"),
    Flag("timeout", ("-to", "--timeout"), "llama-server's read timeout in seconds: sets --header-timeout and "
         "--body-timeout when they are not given", metavar="N"),
    Flag("embd_normalize", ("--embd-normalize",), "default normalisation of /embedding vectors: -1 none, 0 max "
         "absolute int16, 1 taxicab, 2 euclidean, >2 p-norm", metavar="N"),
    Flag("reasoning_effort", ("--reasoning-effort",), "reasoning effort given to the chat template (default: the "
         "template's own)", metavar="LEVEL"),
    Flag("host", ("--host",), "address(es) to listen on, comma list (e.g. 127.0.0.1,::1)"),
    Flag("port", ("--port",), "port to listen on (0 = any free port)"),
    Flag("api_key", ("--api-key",), "API key(s) clients must send, comma separated", metavar="KEY"),
    Flag("api_key_file", ("--api-key-file",), "file with one key a line, `KEY [name] [field=value ...]`: its name and "
         "limits "
         "(tokens=, hours=, models=, priority=...; # comments allowed)",
         metavar="FNAME"),
    Flag("admin_key", ("--admin-key",), "key(s) for the instructor's /dashboard (so is a key named admin in "
         "the key file)", metavar="KEY"),
    Flag("cors_origins", ("--cors-origins",), "allowed CORS origins: *, localhost, or a comma list "
         "(default: *; localhost with --tools/--agent)", metavar="ORIGINS"),
    Flag("cors_methods", ("--cors-methods",), "methods a CORS preflight allows", metavar="METHODS"),
    Flag("cors_headers", ("--cors-headers",), "headers a CORS preflight allows (default: the ones it asks for)",
         metavar="HEADERS"),
    Flag("cors_credentials", ("--cors-credentials",), "CORS requests may carry credentials (off: and * stays *)",
         negations=("--no-cors-credentials",)),
    Flag("ui_mcp_proxy", ("--ui-mcp-proxy", "--webui-mcp-proxy"), "serve /cors-proxy (untrusted networks: no)",
         negations=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy")),
    Flag("tools", ("--tools",), "llama-server's agent tools: none run; limits CORS to localhost", metavar="LIST"),
    Flag("agent", ("-ag", "--agent"), "--tools all plus --ui-mcp-proxy", negations=("-no-ag", "--no-agent")),
    Flag("body_timeout", ("--body-timeout",),
         "seconds a client may take to send its request body before it is dropped", metavar="S"),
    Flag("drain_timeout", ("--drain-timeout",), "seconds open streams may still run on SIGTERM/Ctrl+C", metavar="S"),
    Flag("header_timeout", ("--header-timeout",),
         "seconds a client may take to send its request headers before it is disconnected", metavar="S"),
    Flag("max_connections", ("--max-connections",), "connections served at once; more get a 503", metavar="N"),
    Flag("max_header_size", ("--max-header-size",),
         "largest request head in bytes (K, M suffixes); more gets a 431", metavar="BYTES"),
    Flag("max_body_size", ("--max-body-size",), "largest request body in bytes (K, M suffixes), chunked ones "
         "included; more gets a 413 (the default holds a 128K-token context of JSON-escaped text)", metavar="BYTES"),
    Flag("chat_template", ("--chat-template",),
         "chat template: a built-in name (chatml, gemma, llama3...) or Jinja text", metavar="TEMPLATE"),
    Flag("chat_template_file", ("--chat-template-file",), "file with a Jinja chat template", metavar="FNAME"),
    Flag("chat_template_kwargs", ("--chat-template-kwargs",), "JSON object of default chat template variables",
         metavar="JSON"),
    Flag("jinja", ("--jinja",), "use Jinja chat templates", negations=("--no-jinja",)),
    Flag("reasoning_format", ("--reasoning-format",), "where <think> output goes: " + ", ".join(REASONING_FORMATS),
         metavar="FORMAT"),
    Flag("reasoning", ("-rea", "--reasoning"), "template thinking: on, off, auto", metavar="MODE"),
    Flag("reasoning_budget", ("--reasoning-budget",), "thinking tokens before the end-of-thinking tag is forced "
         "(-1 = no limit, 0 = end it at once)", metavar="N"),
    Flag("reasoning_budget_message", ("--reasoning-budget-message",), "text put before the forced end-of-thinking "
         "tag", metavar="MESSAGE"),
    Flag("reasoning_preserve", ("--reasoning-preserve",), "templates that can keep the reasoning of every past "
         "turn keep it (preserve_reasoning; off: only the last turn's)", negations=("--no-reasoning-preserve",)),
    Flag("skip_chat_parsing", ("--skip-chat-parsing",), "everything the model writes is content: no reasoning or "
         "tool calls read out of it", negations=("--no-skip-chat-parsing",)),
    Flag("prefill_assistant", ("--prefill-assistant",), "continue a last assistant message",
         negations=("--no-prefill-assistant",)),
    Flag("ui", ("--ui", "--webui"), "the chat page at / (for browsers)", negations=("--no-ui", "--no-webui")),
    Flag("slots", ("--slots",), "expose GET /slots", negations=("--no-slots",)),
    Flag("metrics", ("--metrics",), "expose GET /metrics (Prometheus)"),
    Flag("embeddings", ("--embedding", "--embeddings"), "enable the embedding routes"),
    Flag("cache_ram", ("-cram", "--cache-ram"), "MiB of host memory for prompt prefixes a slot moved on from, "
         "restored when a later prompt starts the same way (0 = off)", metavar="N"),
    Flag("ctx_checkpoints", ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"),
         "hybrid/recurrent models: prompt states kept per slot (in --cache-ram; 0 = off)", metavar="N"),
    Flag("context_shift", ("--context-shift",), "a slot that fills while generating keeps --keep tokens, drops half "
         "of the rest and goes on (off: it stops with `length`; refused where the cells cannot move, as on Qwen3.5)",
         negations=("--no-context-shift",)),
    Flag("keep", ("--keep",), "default n_keep: prompt tokens a context shift keeps (-1 = all)", metavar="N"),
    Flag("cache_reuse", ("--cache-reuse",), "smallest chunk of a slot's cached prompt moved to its new place "
         "after a changed prefix instead of evaluated again (0 = off; not on hybrid or recurrent models)",
         metavar="N"),
    Flag("kv_unified_per_slot", ("--kv-unified-per-slot",), "most tokens one slot may hold; without -c the KV "
         "cache is sized to slots x N", metavar="N"),
    Flag("cache_idle_slots", ("--cache-idle-slots",), "save a slot's cached prompt to the --cache-ram cache "
         "before a new request takes the slot (default: on)", negations=("--no-cache-idle-slots",)),
    Flag("slot_prompt_similarity", ("-sps", "--slot-prompt-similarity"), "share of a prompt an idle slot's cache "
         "must hold for the request to go to it, else to the least recently used idle slot; without -kvu, one beside "
         "busy slots first (default: 0.1; 0 = no cache match sought)", metavar="SIMILARITY"),
    Flag("rerank", ("--rerank", "--reranking"), "serve /rerank: a reranker model scores documents against a query "
         "(sets --embeddings and --pooling rank)"),
    Flag("pooling", ("--pooling",), "embedding pooling: none, mean, cls, last, rank (default: the model's)",
         metavar="TYPE"),
    Flag("props", ("--props",), "allow POST /props"),
    Flag("slot_save_path", ("--slot-save-path",), "where POST /slots saves KV caches", metavar="DIR"),
    Flag("slot_save_max", ("--slot-save-max",), "MiB the slot files may take (0 = no cap)", metavar="MIB"),
    Flag("media_path", ("--media-path",), "folder media may be read from: file:// URLs in requests name files "
         "inside it (default: file:// is refused)", metavar="DIR"),
    Flag("media_allow_private", ("--media-allow-private",), "let image and audio URLs in requests be fetched from "
         "private, loopback and link-local addresses (default: allowed without keys, refused with --api-key or "
         "--api-key-file: the server's network is the students')", negations=("--no-media-allow-private",)),
    Flag("fair_share", ("--fair-share",), "serve waiting requests round-robin by API key (off: first come, "
         "first served)", negations=("--no-fair-share",)),
    Flag("max_in_flight", ("--max-in-flight",), "requests one API key may have waiting or running at once; "
         "more get 429 (0 = no limit; applies when keys are set)", metavar="N"),
    Flag("max_queue", ("--max-queue",), "requests that may wait for a slot, per model; more get 503 with "
         "Retry-After at once (0 = no cap)", metavar="N"),
    Flag("ledger", ("--ledger",), "append one JSON line per request to this file (who, route, status, usage, "
         "timings)", metavar="FNAME"),
    Flag("ledger_content", ("--ledger-content",), "also write each request's prompt and answer text in the ledger"),
    Flag("ledger_best_effort", ("--ledger-best-effort",), "serve requests even while the ledger cannot be written "
         "(a full disk): they go unrecorded (off: they get 503 until it can)"),
    Flag("chat_history", ("--chat-history",), "keep the chat page's conversations on the server, in this folder, "
         "one subfolder per key name (a student finds them again on another PC)", metavar="DIR"),
    Flag("store_dir", ("--store-dir",), "keep the Responses API's stored responses in this folder, so that they "
         "survive a restart (default: the ledger's folder with --ledger, else in memory)", metavar="DIR"),
    Flag("verbose", ("-v", "--verbose", "--log-verbose"), "log every request"),
    Flag("log_file", ("--log-file",), "also write the log to this file", metavar="FNAME"),
    Flag("log_timestamps", ("--log-timestamps",), "start each log line with its time",
         negations=("--no-log-timestamps",)),
    Flag("log_disable", ("--log-disable",), "log nothing (the start line and errors still print)"),
    Flag("log_verbosity", ("-lv", "--verbosity", "--log-verbosity"), "log threshold: 0 start and error lines only, "
         "1 errors, 2 warnings, 3 info, 4 and up debug (-v: everything)", metavar="N"),
    Flag("log_colors", ("--log-colors",), "colour the level of each log line: on, off, auto (when the log goes to "
         "a terminal)", metavar="on|off|auto"),
    Flag("log_prefix", ("--log-prefix",), "start each log line with its level and source",
         negations=("--no-log-prefix",)),
    Flag("log_jsonl", ("--log-jsonl",), "log one JSON object a line to stdout ({type, time, level, msg})",
         negations=("--no-log-jsonl",)),
    Flag("log_prompts_dir", ("--log-prompts-dir",), "write each generation's prompt to a file in this folder "
         "(created if need be; for debugging)", metavar="PATH"),
    Flag("perf", ("--perf",), "llama.cpp's internal performance timings (off: kinetic times requests itself)",
         negations=("--no-perf",)),
    Flag("sse_ping_interval", ("--sse-ping-interval",), "seconds a stream may stay silent (a request waiting for a "
         "slot, a long prompt) before an SSE comment ping keeps it open (-1 = never)", metavar="N"),
)


FLAGS_BY_SPELLING = {name: flag for flag in FLAGS for name in (*flag.names, *flag.negations)}
