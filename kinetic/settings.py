"""Server settings: the single table of flags, environment variables, defaults and help.

Flag spellings copy llama-server's (`-m`, `-hf`, `-a`, `-c`, `-np`...). Each setting can also come
from `KINETIC_<NAME>` or from the `LLAMA_ARG_*` variable llama-server reads; the command line wins.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from kinetic.classroom.keys import KeyRing


@dataclass(frozen=True)
class Flag:
    dest: str
    names: tuple[str, ...]
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = str
    llama_env: str | None = None
    negation: str | None = None  # "--no-x" spelling for boolean flags that default to on
    metavar: str | None = None

    @property
    def is_bool(self) -> bool:
        return self.type is None

    @property
    def kinetic_env(self) -> str:
        return "KINETIC_" + self.dest.upper()


def _bool_env(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "on", "enabled", "yes"}


FLAGS: tuple[Flag, ...] = (
    Flag("model", ("-m", "--model"), "path of the GGUF model to serve (default: the bundled Gemma 3 270M)",
         llama_env="LLAMA_ARG_MODEL", metavar="FNAME"),
    Flag("hf_repo", ("-hf", "-hfr", "--hf-repo"), "Hugging Face repo to serve, <user>/<model>[:quant] (quant default Q4_K_M)",
         llama_env="LLAMA_ARG_HF_REPO", metavar="REPO"),
    Flag("hf_file", ("-hff", "--hf-file"), "file inside the -hf repo (overrides the quant)",
         llama_env="LLAMA_ARG_HF_FILE", metavar="FILE"),
    Flag("alias", ("-a", "--alias"), "model name used by the API (comma list: the alphabetically first is the id)",
         llama_env="LLAMA_ARG_ALIAS", metavar="NAME"),
    Flag("ctx_size", ("-c", "--ctx-size"), "total context size in tokens, shared by the slots (0 = from the model)",
         default=0, type=int, llama_env="LLAMA_ARG_CTX_SIZE", metavar="N"),
    Flag("parallel", ("-np", "--parallel"), "number of slots (requests served at once; -1 = auto: 4 with a unified KV cache)",
         default=-1, type=int, llama_env="LLAMA_ARG_N_PARALLEL", metavar="N"),
    Flag("batch_size", ("-b", "--batch-size"), "most tokens one decode step evaluates, prompts included",
         default=2048, type=int, llama_env="LLAMA_ARG_BATCH", metavar="N"),
    Flag("ubatch_size", ("-ub", "--ubatch-size"), "physical batch size llama.cpp computes at once",
         default=512, type=int, llama_env="LLAMA_ARG_UBATCH", metavar="N"),
    Flag("host", ("--host",), "address to listen on", default="127.0.0.1", llama_env="LLAMA_ARG_HOST"),
    Flag("port", ("--port",), "port to listen on (0 = any free port)", default=8080, type=int,
         llama_env="LLAMA_ARG_PORT"),
    Flag("threads", ("-t", "--threads"), "generation threads (-1 = all cores)", default=-1, type=int,
         llama_env="LLAMA_ARG_THREADS", metavar="N"),
    Flag("n_predict", ("-n", "--predict", "--n-predict"), "default max tokens to generate (-1 = until the end of the context)",
         default=-1, type=int, llama_env="LLAMA_ARG_N_PREDICT", metavar="N"),
    Flag("temp", ("--temp",), "default sampling temperature", default=0.8, type=float, metavar="T"),
    Flag("seed", ("-s", "--seed"), "default sampling seed (-1 = random)", default=-1, type=int, metavar="N"),
    Flag("api_key", ("--api-key",), "API key(s) clients must send, comma separated", llama_env="LLAMA_API_KEY",
         metavar="KEY"),
    Flag("api_key_file", ("--api-key-file",), "file with one API key a line, `KEY [name]` (# comments allowed)",
         llama_env="LLAMA_ARG_API_KEY_FILE", metavar="FNAME"),
    Flag("chat_template", ("--chat-template",), "chat template: a built-in name (chatml, gemma, llama3...) or Jinja text",
         llama_env="LLAMA_ARG_CHAT_TEMPLATE", metavar="TEMPLATE"),
    Flag("chat_template_file", ("--chat-template-file",), "file with a Jinja chat template",
         llama_env="LLAMA_ARG_CHAT_TEMPLATE_FILE", metavar="FNAME"),
    Flag("chat_template_kwargs", ("--chat-template-kwargs",), "JSON object of default chat template variables",
         llama_env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", metavar="JSON"),
    Flag("jinja", ("--jinja",), "use Jinja chat templates (default: on)", default=True, type=None,
         llama_env="LLAMA_ARG_JINJA", negation="--no-jinja"),
    Flag("reasoning_format", ("--reasoning-format",), "where <think> output goes: none, auto, deepseek, deepseek-legacy",
         default="auto", llama_env="LLAMA_ARG_THINK", metavar="FORMAT"),
    Flag("slots", ("--slots",), "expose GET /slots (default: on)", default=True, type=None,
         llama_env="LLAMA_ARG_ENDPOINT_SLOTS", negation="--no-slots"),
    Flag("metrics", ("--metrics",), "expose GET /metrics (Prometheus)", default=False, type=None,
         llama_env="LLAMA_ARG_ENDPOINT_METRICS"),
    Flag("embeddings", ("--embedding", "--embeddings"), "enable the embedding routes", default=False, type=None,
         llama_env="LLAMA_ARG_EMBEDDINGS"),
    Flag("cors_origins", ("--cors-origins",), "allowed CORS origins: *, localhost, or a comma list", default="*",
         llama_env="LLAMA_ARG_CORS_ORIGINS", metavar="ORIGINS"),
    Flag("body_timeout", ("--body-timeout",), "seconds a client may take to send its request body before it is dropped",
         default=30.0, type=float, metavar="S"),
    Flag("fair_share", ("--fair-share",), "serve waiting requests round-robin by API key (off: first come, first served)",
         default=True, type=None, negation="--no-fair-share"),
    Flag("max_in_flight", ("--max-in-flight",), "requests one API key may have waiting or running at once; "
         "more get 429 (0 = no limit; applies when keys are set)", default=4, type=int, metavar="N"),
    Flag("ledger", ("--ledger",), "append one JSON line per request to this file (who, route, status, usage, timings)",
         metavar="FNAME"),
    Flag("ledger_content", ("--ledger-content",), "also write each request's prompt and answer text in the ledger",
         default=False, type=None),
    Flag("verbose", ("-v", "--verbose"), "log every request", default=False, type=None),
    Flag("offline", ("--offline",), "never touch the network: -hf resolves from the Hugging Face cache only",
         default=False, type=None, llama_env="LLAMA_OFFLINE"),
)

FLAGS_BY_DEST = {flag.dest: flag for flag in FLAGS}

# llama-server flags kinetic accepts without acting on them; these take a value, so the value
# must be consumed too (a bare value would otherwise be taken for the model path).
IGNORED_FLAGS_WITH_VALUE = frozenset({
    "-ngl", "--gpu-layers", "--n-gpu-layers",
    "-tb", "--threads-batch", "-to", "--timeout", "--threads-http", "--sse-ping-interval",
    "--pooling", "--embd-normalize", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v",
    "--top-k", "--top-p", "--min-p", "--typical", "--repeat-penalty", "--repeat-last-n",
    "--presence-penalty", "--frequency-penalty", "--mirostat", "--samplers", "-l", "--logit-bias",
    "--grammar", "-j", "--json-schema", "-rea", "--reasoning", "--reasoning-budget",
    "--reasoning-effort", "--api-prefix", "--cache-reuse", "--slot-save-path", "--path",
    "--media-path", "--sleep-idle-seconds", "--lora", "--lora-scaled", "--models-dir",
    "--models-preset", "--models-max", "-mu", "--model-url", "-hft", "--hf-token", "-fa",
    "--flash-attn", "--cors-methods", "--cors-headers", "--tags", "-mm", "--mmproj",
    "--ssl-key-file", "--ssl-cert-file", "-dev", "--device", "-sm", "--split-mode", "-ts",
    "--tensor-split", "-mg", "--main-gpu", "--numa", "--rope-scaling", "--rope-freq-base",
    "--rope-freq-scale", "-kvu", "--spec-replace", "-md", "--model-draft", "--draft-max",
    "--draft-min", "-cram", "--cache-ram", "--chat-template-kwargs-file", "--alias-file",
})


@dataclass(frozen=True)
class ServerSettings:
    model: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    alias: str | None = None
    ctx_size: int = 0
    parallel: int = -1
    batch_size: int = 2048
    ubatch_size: int = 512
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = -1
    n_predict: int = -1
    temp: float = 0.8
    seed: int = -1
    api_key: str | None = None
    api_key_file: str | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    chat_template_kwargs: str | None = None
    jinja: bool = True
    reasoning_format: str = "auto"
    slots: bool = True
    metrics: bool = False
    embeddings: bool = False
    cors_origins: str = "*"
    body_timeout: float = 30.0
    fair_share: bool = True
    max_in_flight: int = 4
    ledger: str | None = None
    ledger_content: bool = False
    verbose: bool = False
    offline: bool = False
    ignored_flags: tuple[str, ...] = field(default=())

    def key_ring(self) -> KeyRing:
        """The keys clients may send, with their names (empty when the server is open)."""
        return KeyRing(self.api_key, self.api_key_file)

    def api_keys(self) -> tuple[str, ...]:
        """Every key a client may send; empty when the server is open."""
        return self.key_ring().keys

    def replace(self, **changes: Any) -> "ServerSettings":
        return dataclasses.replace(self, **changes)


def env_defaults(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Setting values taken from KINETIC_* (preferred) or llama-server's LLAMA_ARG_* variables."""
    environ = dict(os.environ if environ is None else environ)
    values: dict[str, Any] = {}
    for flag in FLAGS:
        for name in (flag.kinetic_env, flag.llama_env):
            if name and environ.get(name, "") != "":
                raw = environ[name]
                values[flag.dest] = _bool_env(raw) if flag.is_bool else flag.type(raw)  # type: ignore[misc]
                break
    return values
