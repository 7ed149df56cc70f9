"""Server settings: one validated model, and the table of the flags and variables that fill it.

Flag spellings copy llama-server's (`-m`, `-hf`, `-a`, `-c`, `-np`...). Each setting can also come from
`KINETIC_<NAME>` or from the variable llama-server reads for it (`LLAMA_ARG_*`); the command line wins,
then KINETIC_*, then llama-server's variable. Whatever the source, the value goes through
`ServerSettings` (pydantic-settings), and a bad one is a `SettingsError` naming the flag or variable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from kinetic.engine.options import KV_CACHE_TYPES, LlamaOptions, parse_kv_override
from kinetic.llama_flags import LlamaFlag, by_spelling

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")  # llama.cpp's common/chat.cpp names
# llama.cpp's is_truthy / is_falsey spellings (common/arg.cpp), plus yes/no that kinetic always took.
TRUE_WORDS = frozenset({"on", "enabled", "true", "1", "yes"})
FALSE_WORDS = frozenset({"off", "disabled", "false", "0", "no"})
SWITCH_TYPES = (bool, bool | None)  # a switch that may also be left unset (None: kinetic decides)

from kinetic.classroom.keys import KeyRing


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
        return ServerSettings.model_fields[self.dest].annotation in SWITCH_TYPES

    @property
    def default(self) -> Any:
        return ServerSettings.model_fields[self.dest].default


FLAGS: tuple[Flag, ...] = (
    Flag("model", ("-m", "--model"), "path of the GGUF model to serve (default: the bundled Gemma 3 270M)",
         metavar="FNAME"),
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
    Flag("models_preset", ("--models-preset",), "router mode: llama-server's INI preset, one [section] a model", metavar="PATH"),
    Flag("models_max", ("--models-max",), "router mode: local models loaded at once, LRU unloaded (0 = no limit)", metavar="N"),
    Flag("models_autoload", ("--models-autoload",), "router mode: a request for an unloaded model loads it",
         negations=("--no-models-autoload",)),
    Flag("upstream", ("--upstream",), "router mode: NAME served by an OpenAI-compatible server (repeat: a pool)", metavar="NAME=URL"),
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
    Flag("backend_sampling", ("-bs", "--backend-sampling"), "llama-server's backend sampling (the CPU build "
         "samples on the CPU either way; shown in /props)"),
    # What llama.cpp is asked when the model loads and the context is made (kinetic.engine.llama.params)
    Flag("gpu_layers", ("-ngl", "--gpu-layers", "--n-gpu-layers"), "layers to store in VRAM: a number, auto or all "
         "(a CPU build has no GPU: passed on, no effect)", metavar="N"),
    Flag("split_mode", ("-sm", "--split-mode"), "how to split the model across GPUs: none, layer, row, tensor",
         metavar="MODE"),
    Flag("tensor_split", ("-ts", "--tensor-split"), "fraction of the model for each GPU, e.g. 3,1", metavar="N0,N1,..."),
    Flag("main_gpu", ("-mg", "--main-gpu"), "the GPU for the model (split mode none) or for intermediate results",
         metavar="INDEX"),
    Flag("load_mode", ("-lm", "--load-mode"), "model loading: auto, none, mmap, mlock, mmap+mlock, dio", metavar="MODE"),
    Flag("mmap", ("--mmap",), "older llama-server spelling: --no-mmap reads the model into memory (--load-mode none)",
         negations=("--no-mmap",)),
    Flag("mlock", ("--mlock",), "older llama-server spelling: keep the model in RAM (--load-mode mmap+mlock)"),
    Flag("lazy_mode", ("-lzm", "--lazy-mode"), "on-demand reading of tensors the architecture marks: on, auto, off",
         metavar="MODE"),
    Flag("numa", ("--numa",), "NUMA strategy: distribute, isolate, numactl", metavar="TYPE"),
    Flag("override_kv", ("--override-kv",), "override model metadata, KEY=TYPE:VALUE,... (types int, float, bool, "
         "str; repeat the flag for more)", metavar="KEY=TYPE:VALUE"),
    Flag("check_tensors", ("--check-tensors",), "check the model's tensor data for invalid values at load"),
    Flag("repack", ("--repack",), "weight repacking for faster CPU kernels (default: off; a cached prompt's answer may then differ from a fresh one)", negations=("-nr", "--no-repack")),
    Flag("no_host", ("--no-host",), "bypass the host buffer so extra buffer types can be used"),
    Flag("op_offload", ("--op-offload",), "offload host tensor operations to the device",
         negations=("--no-op-offload",)),
    Flag("threads_batch", ("-tb", "--threads-batch"), "threads for prompt processing (default: same as -t)",
         metavar="N"),
    Flag("flash_attn", ("-fa", "--flash-attn"), "flash attention: on, off, auto", metavar="on|off|auto"),
    Flag("cache_type_k", ("-ctk", "--cache-type-k"), "KV cache type for K: " + ", ".join(KV_CACHE_TYPES),
         metavar="TYPE"),
    Flag("cache_type_v", ("-ctv", "--cache-type-v"), "KV cache type for V (quantized V needs flash attention)",
         metavar="TYPE"),
    Flag("kv_offload", ("-kvo", "--kv-offload"), "KV cache offloading to the GPU",
         negations=("-nkvo", "--no-kv-offload")),
    Flag("kv_unified", ("-kvu", "--kv-unified"), "one KV buffer shared by all slots, each may use the whole context "
         "(default: on when -np is auto)", negations=("-no-kvu", "--no-kv-unified")),
    Flag("swa_full", ("--swa-full",), "full-size sliding-window cache (always on in kinetic: a slot's cached prefix "
         "stays reusable)"),
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
    Flag("control_vector", ("--control-vector",), "control vector to add at scale 1 (comma list, or repeat the flag)",
         metavar="FNAME"),
    Flag("control_vector_scaled", ("--control-vector-scaled",), "control vector with its scale, FNAME:SCALE (comma "
         "list, or repeat the flag); all the vectors given are summed", metavar="FNAME:SCALE"),
    Flag("control_vector_layer_range", ("--control-vector-layer-range",), "layers the control vectors apply to, "
         "START END, both inclusive (default: 1 to the last)", metavar="START END"),
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
    Flag("api_key_file", ("--api-key-file",), "file with one key a line, `KEY [name]` (# comments allowed)",
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
    Flag("rerank", ("--rerank", "--reranking"), "serve /rerank: a reranker model scores documents against a query "
         "(sets --embeddings and --pooling rank)"),
    Flag("pooling", ("--pooling",), "embedding pooling: none, mean, cls, last, rank (default: the model's)",
         metavar="TYPE"),
    Flag("props", ("--props",), "allow POST /props"),
    Flag("slot_save_path", ("--slot-save-path",), "where POST /slots saves KV caches", metavar="DIR"),
    Flag("slot_save_max", ("--slot-save-max",), "MiB the slot files may take (0 = no cap)", metavar="MIB"),
    Flag("fair_share", ("--fair-share",), "serve waiting requests round-robin by API key (off: first come, "
         "first served)", negations=("--no-fair-share",)),
    Flag("max_in_flight", ("--max-in-flight",), "requests one API key may have waiting or running at once; "
         "more get 429 (0 = no limit; applies when keys are set)", metavar="N"),
    Flag("ledger", ("--ledger",), "append one JSON line per request to this file (who, route, status, usage, "
         "timings)", metavar="FNAME"),
    Flag("ledger_content", ("--ledger-content",), "also write each request's prompt and answer text in the ledger"),
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

FLAGS_BY_DEST = {flag.dest: flag for flag in FLAGS}
FLAGS_BY_SPELLING = {name: flag for flag in FLAGS for name in (*flag.names, *flag.negations)}

Port = Annotated[int, Field(ge=0, le=65535)]

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*", re.IGNORECASE)


def byte_size(value: Any) -> Any:
    """'4M', '512K', '64KiB', '65536' -> bytes (binary units: K = 1024); other values pass through."""
    if not isinstance(value, str):
        return value
    match = _SIZE.fullmatch(value)
    if match is None:
        raise ValueError(f"not a size: {value!r} (write bytes, or e.g. 512K, 4M)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmg".index(unit.lower() or " "))


ByteSize = Annotated[int, BeforeValidator(byte_size), Field(ge=1)]


LOGIT_BIAS_ENTRY = re.compile(r"\s*(-?\d+)\s*([+-])\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+|inf)\s*",
                              re.IGNORECASE)


def _read_text(path: str) -> str:
    """A file a flag names, read now so a typo stops the start naming the flag."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError("no such file" if not file.exists() else "not a file")
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read it ({exc})") from None


def _json_object_text(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return parsed


def schema_grammar_or_error(text: str) -> str:
    """The GBNF of a JSON schema given as text; ValueError saying why not."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(schema, dict):
        raise ValueError('expected a JSON schema object, like \'{"type": "object"}\'')
    from kinetic.engine.grammar import grammar_from_json_schema

    return grammar_from_json_schema(schema)


def scaled_files(plain: tuple[str, ...], scaled: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """FNAME flags (scale 1) then FNAME:SCALE flags, each a comma list: (path, scale) in the order given."""
    return tuple([(part, 1.0) for item in plain for part in item.split(",")]
                 + [(part.rpartition(":")[0], float(part.rpartition(":")[2])) for item in scaled
                    for part in item.split(",")])


class SettingsError(ValueError):
    """A bad flag or variable value; the message is the one line the user sees."""


class ServerSettings(BaseSettings):
    """Every setting of `kinetic serve`. Build it with `load_settings()` to read flags and variables."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", validate_default=True)

    model: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    hf_token: str | None = None
    offline: bool = False
    alias: str | None = None
    tags: str | None = None
    models_dir: str | None = None
    models_preset: str | None = None
    models_max: Annotated[int, Field(ge=0)] = 4  # llama-server's default
    models_autoload: bool = True
    upstream: tuple[str, ...] = ()
    ctx_size: Annotated[int, Field(ge=0)] = 0
    parallel: int = -1
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
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: Annotated[int, Field(ge=0)] = 64
    dry_sequence_breaker: tuple[str, ...] = ()  # empty: the defaults (DEFAULT_DRY_BREAKERS)
    adaptive_target: float = -1.0
    adaptive_decay: Annotated[float, Field(ge=0, le=0.99)] = 0.9
    dynatemp_range: float = 0.0
    dynatemp_exp: float = 1.0
    mirostat: Annotated[int, Field(ge=0, le=2)] = 0
    mirostat_lr: float = 0.1
    mirostat_ent: float = 5.0
    samplers: str | None = None
    sampling_seq: str | None = None
    logit_bias: tuple[str, ...] = ()
    ignore_eos: bool = False
    grammar: str | None = None
    grammar_file: str | None = None
    json_schema: str | None = None
    json_schema_file: str | None = None
    reverse_prompt: tuple[str, ...] = ()
    escape: bool = True
    special: bool = False
    backend_sampling: bool = False
    # model and context parameters (kinetic.engine.options.LlamaOptions): llama.cpp's defaults
    gpu_layers: str = "auto"
    split_mode: Literal["none", "layer", "row", "tensor"] = "layer"
    tensor_split: str | None = None
    main_gpu: int = 0
    load_mode: Literal["auto", "none", "mmap", "mlock", "mmap+mlock", "dio"] = "auto"
    mmap: bool | None = None
    mlock: bool = False
    lazy_mode: Literal["on", "auto", "off"] = "auto"
    numa: Literal["distribute", "isolate", "numactl"] | None = None
    override_kv: tuple[str, ...] = ()
    check_tensors: bool = False
    repack: bool = False  # llama-server's default is on: see the differences table
    no_host: bool = False
    op_offload: bool = True
    threads_batch: int = 0
    flash_attn: Literal["on", "off", "auto"] = "auto"
    cache_type_k: Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] = "f16"
    cache_type_v: Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] = "f16"
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
    lora: tuple[str, ...] = ()
    lora_scaled: tuple[str, ...] = ()
    lora_init_without_apply: bool = False
    control_vector: tuple[str, ...] = ()
    control_vector_scaled: tuple[str, ...] = ()
    control_vector_layer_range: str | None = None  # "START END", as the command line gives the two values
    path: str | None = None
    api_prefix: str | None = None
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    ui_config: str | None = None
    ui_config_file: str | None = None
    cache_prompt: bool = True
    reuse_port: bool = False
    threads_http: int = -1
    spm_infill: bool = False
    timeout: Annotated[float, Field(gt=0)] | None = None
    sleep_idle_seconds: int = -1
    embd_normalize: int = 2
    reasoning_effort: str = "default"
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    port: Port = 8080
    api_key: str | None = None
    api_key_file: str | None = None
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
    fair_share: bool = True
    max_in_flight: Annotated[int, Field(ge=0)] = 4
    ledger: str | None = None
    ledger_content: bool = False
    chat_template: str | None = None
    chat_template_file: str | None = None
    chat_template_kwargs: str | None = None
    jinja: bool = True
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] = "auto"
    reasoning: Literal["on", "off", "auto"] = "auto"
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
    verbose: bool = False
    log_file: str | None = None
    log_timestamps: bool = False
    log_disable: bool = False
    log_verbosity: int = 3  # llama-server's LOG_LEVEL_INFO
    log_colors: Literal["on", "off", "auto"] = "auto"
    log_prefix: bool = True
    log_jsonl: bool = False
    log_prompts_dir: str | None = None
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
        # by the environment; load_settings() adds the variables explicitly.
        return (init_settings,)

    @field_validator("*", mode="before")
    @classmethod
    def _llama_bool(cls, value: Any, info: ValidationInfo) -> Any:
        """Switches read from variables take llama.cpp's words (enabled/disabled too)."""
        if isinstance(value, str) and cls.model_fields[info.field_name].annotation in SWITCH_TYPES:
            word = value.strip().lower()
            if word in TRUE_WORDS:
                return True
            if word in FALSE_WORDS:
                return False
            raise ValueError("expected on/off, true/false, 1/0 or enabled/disabled")
        return value

    @field_validator("log_colors", mode="before")
    @classmethod
    def _colors_word(cls, value: Any) -> Any:
        """llama.cpp's is_truthy / is_falsey / is_autoy spellings."""
        if isinstance(value, str):
            word = value.strip().lower()
            return "on" if word in TRUE_WORDS else "off" if word in FALSE_WORDS else "auto" if word in ("auto", "-1") \
                else value
        return value

    @field_validator("reasoning", mode="before")
    @classmethod
    def _reasoning_word(cls, value: Any) -> Any:
        """llama.cpp's is_truthy / is_falsey / is_autoy spellings (common/arg.cpp)."""
        if isinstance(value, str):
            word = value.strip().lower()
            if word in TRUE_WORDS:
                return "on"
            if word in FALSE_WORDS:
                return "off"
            if word in ("auto", "-1"):
                return "auto"
        return value

    @field_validator("parallel")
    @classmethod
    def _slots_count(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("expected -1 (auto) or a number of slots >= 1")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _json_object(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(parsed, dict):
            raise ValueError("expected a JSON object, like '{\"enable_thinking\": false}'")
        return value

    @field_validator("upstream", mode="before")
    @classmethod
    def _upstream_list(cls, value: Any) -> Any:
        # one flag per upstream on the command line; several in one variable, separated by spaces
        return tuple(value.split()) if isinstance(value, str) else value

    @field_validator("upstream")
    @classmethod
    def _upstream_spec(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for spec in value:
            name, sep, rest = spec.partition("=")
            url = rest.split(",", 1)[0]
            if not sep or not name or not url.startswith(("http://", "https://")):
                raise ValueError(f"{spec!r}: expected NAME=URL[,key=KEY] with an http(s) URL")
        return value

    @field_validator("lora", "lora_scaled", "control_vector", "control_vector_scaled")
    @classmethod
    def _lora_files(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        scaled = info.field_name.endswith("_scaled")
        for item in value:
            for part in item.split(","):
                path = part.rpartition(":")[0] if scaled else part
                if scaled:
                    try:
                        float(part.rpartition(":")[2])
                    except ValueError:
                        raise ValueError(f"{part!r}: expected FNAME:SCALE, e.g. adapter.gguf:0.5") from None
                if not path or not Path(path).expanduser().is_file():
                    raise ValueError(f"{path or part!r}: no such file")
        return value

    @field_validator("control_vector_layer_range")
    @classmethod
    def _layer_range(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                int(value.split()[0]), int(value.split()[1])
            except (ValueError, IndexError):
                raise ValueError("expected two layer numbers, START END") from None
        return value

    @field_validator("logit_bias", "reverse_prompt", "dry_sequence_breaker", "override_kv", "lora", "lora_scaled",
                     "control_vector", "control_vector_scaled", mode="before")
    @classmethod
    def _one_from_a_variable(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value  # a flag repeats; a variable holds one value

    @field_validator("ui_config")
    @classmethod
    def _ui_config(cls, value: str | None) -> str | None:
        if value is not None:
            _json_object_text(value)
        return value

    @field_validator("ui_config_file")
    @classmethod
    def _ui_config_file(cls, value: str | None) -> str | None:
        if value is not None:
            _json_object_text(_read_text(value))
        return value

    @field_validator("log_file")
    @classmethod
    def _log_folder(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().parent.is_dir():
            raise ValueError("its folder does not exist")
        return value

    @field_validator("sleep_idle_seconds")
    @classmethod
    def _sleep_seconds(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("cannot be 0 or less than -1")  # llama-server's rule
        return value

    @field_validator("dry_base")
    @classmethod
    def _dry_base(cls, value: float) -> float:
        return value if value >= 1.0 else 1.75  # llama-server keeps its default for a base below 1

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_entries(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            if LOGIT_BIAS_ENTRY.fullmatch(entry) is None:
                raise ValueError(f"{entry!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-1")
        return value

    @field_validator("json_schema")
    @classmethod
    def _json_schema(cls, value: str | None) -> str | None:
        if value is not None:
            schema_grammar_or_error(value)
        return value

    @field_validator("json_schema_file")
    @classmethod
    def _json_schema_file(cls, value: str | None) -> str | None:
        if value is not None:
            schema_grammar_or_error(_read_text(value))
        return value

    @field_validator("grammar_file")
    @classmethod
    def _grammar_file(cls, value: str | None) -> str | None:
        if value is not None:
            _read_text(value)
        return value

    @field_validator("gpu_layers")
    @classmethod
    def _gpu_layers(cls, value: str) -> str:
        word = value.strip().lower()
        if word not in ("auto", "all"):
            try:
                int(word)
            except ValueError:
                raise ValueError("expected a number of layers, auto or all") from None
        return word

    @field_validator("tensor_split")
    @classmethod
    def _tensor_split(cls, value: str | None) -> str | None:
        if value is not None:
            parts = [p for p in re.split(r"[,/]+", value) if p.strip()]
            try:
                [float(p) for p in parts]
            except ValueError:
                raise ValueError("expected proportions separated by commas, e.g. 3,1") from None
            if len(parts) >= 16:
                raise ValueError(f"got {len(parts)} proportions, but llama.cpp takes at most 15")
        return value

    @field_validator("override_kv")
    @classmethod
    def _override_kv(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            for part in item.split(","):
                parse_kv_override(part)
        return value

    @field_validator("flash_attn", mode="before")
    @classmethod
    def _flash_attn_word(cls, value: Any) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            return "on" if word in TRUE_WORDS else "off" if word in FALSE_WORDS else "auto" if word in ("auto", "-1") \
                else value
        return value

    @field_validator("path")
    @classmethod
    def _static_folder(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().is_dir():
            raise ValueError("no such folder" if not Path(value).expanduser().exists() else "not a folder")
        return value

    @field_validator("models_dir")
    @classmethod
    def _existing_dir(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().is_dir():
            raise ValueError("no such folder" if not Path(value).expanduser().exists() else "not a folder")
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
    def _ssl_pair(self) -> "ServerSettings":
        if (self.ssl_key_file is None) != (self.ssl_cert_file is None):
            raise ValueError("--ssl-key-file and --ssl-cert-file go together: give both to serve HTTPS")
        return self

    @property
    def serves_rerank(self) -> bool:
        """/rerank answers: --rerank, or --embeddings with --pooling rank (llama-server's own condition)."""
        return self.rerank or (self.embeddings and self.pooling == "rank")

    @property
    def router_mode(self) -> bool:
        """Several models at one address: a models folder, a preset file, upstreams, or more than one -m/-hf."""
        return bool(self.models_dir or self.models_preset or self.upstream or len(self.model_args) > 1)

    @field_validator("chat_template_file", "api_key_file", "models_preset", "ssl_key_file", "ssl_cert_file")
    @classmethod
    def _existing_file(cls, value: str | None) -> str | None:
        # Checked now, so a typo stops the start before the model loads, naming the flag.
        if value is not None and not Path(value).expanduser().is_file():
            raise ValueError("no such file" if not Path(value).expanduser().exists() else "not a file")
        return value

    @field_validator("chat_template")
    @classmethod
    def _template_name_or_jinja(cls, value: str | None) -> str | None:
        from kinetic.chat.templates import BUILTIN_NAMES, known_names

        if value is None or value in BUILTIN_NAMES or "{%" in value or "{{" in value:
            return value
        if value not in known_names():
            raise ValueError(f"expected a built-in template name ({', '.join(known_names())}) or Jinja text")
        return value

    @field_validator("hf_repo")
    @classmethod
    def _hf_repo(cls, value: str | None) -> str | None:
        if value is not None:
            repo = value.partition(":")[0]
            if repo.count("/") != 1 or not all(repo.split("/")):
                raise ValueError("expected <user>/<model>[:quant]")
        return value

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
            return _json_object_text(Path(self.ui_config_file).expanduser().read_text(encoding="utf-8"))
        return _json_object_text(self.ui_config) if self.ui_config is not None else {}

    def lora_adapters(self) -> tuple[tuple[str, float], ...]:
        """--lora (scale 1) then --lora-scaled adapters, in the order given: their ids in /lora-adapters."""
        return scaled_files(self.lora, self.lora_scaled)

    def control_vectors(self) -> tuple[tuple[str, float], ...]:
        """--control-vector (scale 1) and --control-vector-scaled files: llama.cpp sums them all."""
        return scaled_files(self.control_vector, self.control_vector_scaled)

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
            check_tensors=self.check_tensors, repack=self.repack, no_host=self.no_host, numa=self.numa,
            special=self.special, lora=self.lora_adapters(), lora_init_without_apply=self.lora_init_without_apply,
            control_vectors=self.control_vectors(),
            control_vector_layers=tuple(int(n) for n in (self.control_vector_layer_range or "-1 -1").split()[:2]),
            threads_batch=max(self.threads_batch, 0), flash_attn=self.flash_attn, perf=self.perf,
            cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v, kv_offload=self.kv_offload,
            op_offload=self.op_offload, kv_unified=self.kv_unified, rope_scaling=self.rope_scaling,
            rope_freq_base=self.rope_freq_base, rope_freq_scale=rope_freq_scale, yarn_orig_ctx=self.yarn_orig_ctx,
            yarn_ext_factor=self.yarn_ext_factor, yarn_attn_factor=self.yarn_attn_factor,
            yarn_beta_slow=self.yarn_beta_slow, yarn_beta_fast=self.yarn_beta_fast)

    def template_kwargs(self) -> dict[str, Any]:
        """--chat-template-kwargs over --reasoning-effort: the variables every chat template gets by default."""
        effort = {} if self.reasoning_effort == "default" else {"reasoning_effort": self.reasoning_effort}
        return {**effort, **(json.loads(self.chat_template_kwargs) if self.chat_template_kwargs else {})}

    def key_ring(self) -> KeyRing:
        """The keys clients may send, with their names (empty when the server is open)."""
        return KeyRing(self.api_key, self.api_key_file, self.admin_key)

    def api_keys(self) -> tuple[str, ...]:
        """Every key a client may send; empty when the server is open."""
        return self.key_ring().keys

    def replace(self, **changes: Any) -> "ServerSettings":
        return self.model_copy(update=changes)


class FlagEnvSource(PydanticBaseSettingsSource):
    """The settings found in an environment: KINETIC_<DEST>, then llama-server's LLAMA_ARG_NO_X / LLAMA_ARG_X."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        super().__init__(settings_cls)
        self.found: dict[str, tuple[str, Any]] = {}  # dest -> (variable, value)
        for flag in FLAGS:
            for name in flag.env_names:
                raw = environ.get(name, "")
                if raw != "":
                    negative = flag.llama is not None and name == flag.llama.negative_env
                    self.found[flag.dest] = (name, False if negative else raw)
                    break

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        name, value = self.found.get(field_name, (field_name, None))
        return value, name, False

    def __call__(self) -> dict[str, Any]:
        return {dest: value for dest, (_, value) in self.found.items()}


# KINETIC_* variables that are not server settings (read where they are used).
OTHER_KINETIC_VARIABLES = frozenset({
    "KINETIC_CACHE_DIR",  # kinetic.models.cache_dir(): where the bundled model is assembled
    "KINETIC_REGENERATE_REFERENCE",  # tests: rewrite the grading reference outputs
    "KINETIC_LLAMA_SDIST",  # tests: the llama-cpp-python sdist the flag table is checked against
    "KINETIC_TEST_MODELS",  # tests: where the router tests' embedding GGUF is cached
})


def ignored_variables(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Variables that look like settings but set nothing: llama-server's for flags kinetic does not
    implement, and KINETIC_* names that are no setting (a typo such as KINETIC_PROT)."""
    implemented = {name for flag in FLAGS for name in flag.env_names}
    names: list[str] = [name for name in environ if name.startswith("KINETIC_") and environ[name] != ""
                        and name not in implemented and name not in OTHER_KINETIC_VARIABLES]
    for spelling, llama in by_spelling().items():
        for env in (llama.env, llama.negative_env):
            if (env and env.startswith("LLAMA_") and env not in implemented and environ.get(env, "") != ""
                    and env not in names):
                names.append(env)
    return tuple(sorted(names))


def load_settings(cli: Mapping[str, tuple[str, Any]], environ: Mapping[str, str],
                  **extra: Any) -> ServerSettings:
    """Validate command-line values (dest -> (spelling, value)) over the environment's.

    Raises SettingsError with one line per bad value, each naming the flag or variable it came from.
    """
    env = FlagEnvSource(ServerSettings, environ)
    init = InitSettingsSource(ServerSettings, init_kwargs={**{d: v for d, (_, v) in cli.items()}, **extra})
    try:
        return ServerSettings(_build_sources=((init, env), {}))
    except ValidationError as exc:
        origins = {dest: spelling for dest, (spelling, _) in env.found.items()}
        origins.update({dest: spelling for dest, (spelling, _) in cli.items()})
        raise SettingsError("\n".join(_describe(error, origins) for error in exc.errors())) from None


def _describe(error: Any, origins: Mapping[str, str]) -> str:
    dest = str(error["loc"][0]) if error["loc"] else "?"
    source = origins.get(dest, dest)
    value = error.get("input")
    return f"invalid value {value!r} for {source}: {_reason(error)}"


def _reason(error: Any) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "int_parsing":
        return "expected an integer"
    if kind == "float_parsing":
        return "expected a number"
    if kind == "bool_parsing":
        return "expected on/off, true/false, 1/0 or enabled/disabled"
    if kind == "literal_error":
        return "expected one of: " + str(ctx.get("expected", "")).replace("'", "")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return f"must be {sign} {bound}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"])
