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

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from kinetic.llama_flags import LlamaFlag, by_spelling

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")  # llama.cpp's common/chat.cpp names
# llama.cpp's is_truthy / is_falsey spellings (common/arg.cpp), plus yes/no that kinetic always took.
TRUE_WORDS = frozenset({"on", "enabled", "true", "1", "yes"})
FALSE_WORDS = frozenset({"off", "disabled", "false", "0", "no"})

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
        return ServerSettings.model_fields[self.dest].annotation is bool

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
    Flag("host", ("--host",), "address(es) to listen on, comma list (e.g. 127.0.0.1,::1)"),
    Flag("port", ("--port",), "port to listen on (0 = any free port)"),
    Flag("api_key", ("--api-key",), "API key(s) clients must send, comma separated", metavar="KEY"),
    Flag("api_key_file", ("--api-key-file",), "file with one key a line, `KEY [name]` (# comments allowed)",
         metavar="FNAME"),
    Flag("admin_key", ("--admin-key",), "key(s) for the instructor's /dashboard (so is a key named admin in "
         "the key file)", metavar="KEY"),
    Flag("cors_origins", ("--cors-origins",), "allowed CORS origins: *, localhost, or a comma list "
         "(default: *; localhost with --tools/--agent)", metavar="ORIGINS"),
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
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    port: Port = 8080
    api_key: str | None = None
    api_key_file: str | None = None
    admin_key: str | None = None
    cors_origins: str | None = None  # None: "*", or "localhost" with tools, agent or MCP servers (llama-server's rule)
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
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = None  # None: the model's own, else mean
    props: bool = False
    slot_save_path: str | None = None
    # A slot file is a KV cache (about 18 KiB a token on the bundled model, 128 KiB on an 8B one): 4 GiB
    # holds a few full contexts of a large model, and keeps a loop of saves from filling the disk.
    slot_save_max: Annotated[int, Field(ge=0)] = 4096
    verbose: bool = False
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
        if isinstance(value, str) and cls.model_fields[info.field_name].annotation is bool:
            word = value.strip().lower()
            if word in TRUE_WORDS:
                return True
            if word in FALSE_WORDS:
                return False
            raise ValueError("expected on/off, true/false, 1/0 or enabled/disabled")
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

    @field_validator("models_dir")
    @classmethod
    def _existing_dir(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().is_dir():
            raise ValueError("no such folder" if not Path(value).expanduser().exists() else "not a folder")
        return value

    @property
    def router_mode(self) -> bool:
        """Several models at one address: a models folder, a preset file, upstreams, or more than one -m/-hf."""
        return bool(self.models_dir or self.models_preset or self.upstream or len(self.model_args) > 1)

    @field_validator("chat_template_file", "api_key_file", "models_preset")
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

    def template_kwargs(self) -> dict[str, Any]:
        return json.loads(self.chat_template_kwargs) if self.chat_template_kwargs else {}

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
