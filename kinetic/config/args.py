"""The one reader of a `kinetic serve` command line: the run, `--help` and the tests all go through
`parse_serve_args`, which reads kinetic's flag table (kinetic.config.flags) beside llama-server's whole
table (kinetic.config.llama_flags).

As llama-server does, a flag reads exactly the values its table row says (a switch none, so `-kvu`
never swallows the next argument; a value flag the next argument whatever it looks like) and `_` in a
long flag reads as `-`. kinetic also takes `--flag=value` and one positional model path. A llama-server
flag kinetic does not implement is consumed with its values and warned about at start; a flag neither
knows is an error. Each setting can also come from `KINETIC_<NAME>` or from the variable llama-server
reads for it (`LLAMA_ARG_*`); the command line wins, then KINETIC_*, then llama-server's variable.
"""

from __future__ import annotations

import difflib
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource

from kinetic import __version__
from kinetic.config.flag_status import DIFFERENCES_PAGE, IGNORED, acting_flags
from kinetic.config.flags import FLAGS, FLAGS_BY_SPELLING, Flag
from kinetic.config.llama_flags import LlamaFlag, by_spelling, llama_server_flags
from kinetic.config.settings import ServerSettings, SettingsError

HELP_FLAGS = ("-h", "--help", "--usage")
VERSION_FLAG = "--version"
HF_PREFIX = "hf:"  # how a -hf model is told from a -m path in ServerSettings.model_args
DESCRIPTION = ("Serve a GGUF model over HTTP: llama-server's routes plus the OpenAI, Ollama and\n"
               "Anthropic APIs. Without a model, serves the bundled SmolLM2 135M Instruct (a small\n"
               "chat model); -m gemma serves the bundled base Gemma 3 270M.")


class InfoRequested(Exception):
    """The command line asks for a text (--help, --version) instead of a server: print `text`, exit 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


@dataclass
class CommandLine:
    """What a `kinetic serve` command line holds, before validation."""

    values: dict[str, tuple[str, Any]] = field(default_factory=dict)  # dest -> (spelling, value)
    ignored: list[str] = field(default_factory=list)  # llama-server flags kinetic does not implement
    asked: Literal["help", "version"] | None = None
    positional: list[str] = field(default_factory=list)
    # every -m (a path) and -hf ("hf:" REPO) with the -a that follows it, and an -a given before any
    models: list[list[str | None]] = field(default_factory=list)
    alias_first: str | None = None

    def take(self, flag: Flag, spelling: str, value: str | None) -> None:
        """One occurrence of one of kinetic's flags (a switch has no value)."""
        if value is None:
            self.values[flag.dest] = (spelling, spelling not in flag.negations)
        elif flag.repeats:
            self.values[flag.dest] = (spelling, [*self.values.get(flag.dest, (spelling, []))[1], value])
        else:
            self.values[flag.dest] = (spelling, value)
            if flag.dest in ("model", "hf_repo"):
                self.models.append([value if flag.dest == "model" else HF_PREFIX + value, None])
            elif flag.dest == "alias" and self.models:
                self.models[-1][1] = value
            elif flag.dest == "alias":
                self.alias_first = value

    def finish(self) -> CommandLine:
        """The positional model, and router mode's list when several models are named."""
        if len(self.positional) > 1:
            raise SettingsError(f"unexpected argument(s): {' '.join(self.positional[1:])} "
                                "(only one model path is taken)")
        if self.positional:
            self.values["model"] = ("MODEL", self.positional[0])
            self.models.insert(0, [self.positional[0], None])
        if len(self.models) > 1:  # router mode: each -m/-hf is its own model, named by its -a (else file stem, repo)
            if self.models[0][1] is None:
                self.models[0][1] = self.alias_first
            self.values["model_args"] = ("-m", tuple((path, alias) for path, alias in self.models))
        return self


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1:2].isdigit()


def _value_count(name: str) -> tuple[Flag | None, LlamaFlag | None, int]:
    """kinetic's flag and llama-server's for a spelling, and how many values it reads."""
    flag, llama = FLAGS_BY_SPELLING.get(name), by_spelling().get(name)
    if flag is not None:  # a value flag reads llama-server's count: two for --control-vector-layer-range
        return flag, llama, 0 if flag.is_switch else 2 if llama is not None and llama.kind == "value2" else 1
    if llama is not None:
        return None, llama, llama.values
    raise SettingsError(_unknown_flag(name))


def read_command_line(argv: Sequence[str]) -> CommandLine:
    """Every flag of a command line with its values, in llama-server's way (see the module's docstring)."""
    line = CommandLine()
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":
            line.positional += argv[index:]
            break
        if not _looks_like_flag(token):
            line.positional.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        if name.startswith("--"):
            name = name.replace("_", "-")
        if name in (*HELP_FLAGS, VERSION_FLAG):
            line.asked = "help" if name in HELP_FLAGS else "version"
            continue
        flag, llama, count = _value_count(name)
        if has_inline and count != 1:
            raise SettingsError(f"{name} takes {'no value' if count == 0 else 'two values'}, not {token!r}")
        values = [inline] if has_inline else list(argv[index:index + count])
        if len(values) < count:
            hint = f" ({llama.value_hint})" if llama and llama.value_hint else ""
            raise SettingsError(f"{name} expects a value{hint}")
        index += 0 if has_inline else count
        if flag is not None:
            line.take(flag, name, " ".join(values) if values else None)
        elif name not in line.ignored:
            line.ignored.append(name)
    return line.finish()


def _unknown_flag(name: str) -> str:
    spellings = [*FLAGS_BY_SPELLING, *by_spelling(), *HELP_FLAGS, VERSION_FLAG]
    # kinetic's own flags first: `--ctx` more likely meant --ctx-size than --ctx-checkpoints
    close = ([s for s in FLAGS_BY_SPELLING if s.startswith(name)] or [s for s in spellings if s.startswith(name)]
             or difflib.get_close_matches(name, spellings, n=1))
    hint = f"; did you mean {close[0]}?" if close else "; see kinetic serve --help"
    return f"unknown flag {name} (neither kinetic nor llama-server has it){hint}"


def parse_serve_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServerSettings:
    """The validated settings of a `kinetic serve` command line over the environment (os.environ unless given).

    Raises InfoRequested for --help and --version, and SettingsError naming a bad flag or variable."""
    environ = os.environ if environ is None else environ
    line = read_command_line(argv)
    if line.asked == "help":
        raise InfoRequested(help_text())
    if line.asked == "version":
        raise InfoRequested(f"kinetic {__version__}")
    return load_settings(line.values, environ, ignored_flags=tuple(line.ignored),
                         ignored_env=ignored_variables(environ))


# ------------------------------------------------------------------------------------------- --help

HELP_WIDTH = 100
HELP_COLUMN = 24  # where a flag's help starts, as argparse lays it out


def _entry(left: str, help_text: str) -> list[str]:
    """One option of the help: its spellings, then its help wrapped beside them or under them."""
    indent = " " * HELP_COLUMN
    lines = textwrap.wrap(help_text, width=HELP_WIDTH, initial_indent=indent, subsequent_indent=indent,
                          break_on_hyphens=False)
    head = f"  {left}"
    if len(head) <= HELP_COLUMN - 2 and lines:
        return [head.ljust(HELP_COLUMN) + lines[0].lstrip(), *lines[1:]]
    return [head, *lines]


def _flag_entries(flag: Flag) -> list[str]:
    default = "" if flag.default is None or flag.default is False else f" (default: {flag.default})"
    if flag.default is True:
        default = " (default: on)"
    metavar = "" if flag.is_switch else " " + (flag.metavar or flag.dest.upper())
    entries = _entry(", ".join(flag.names) + metavar, f"{flag.help}{default} [env: {' / '.join(flag.env_names)}]")
    if flag.negations:
        entries += _entry(", ".join(flag.negations), f"turn {flag.names[-1]} off")
    return entries


def epilog() -> str:
    """Which llama-server flags act (the options above) and which are ignored, by reason."""
    acting, flags = len(acting_flags()), len(llama_server_flags())
    lines = [f"The options above act: {acting} of llama-server's {flags} flags (-h and --version counted) and",
             f"kinetic's own. The other {flags - acting} are accepted with their values and ignored, each with a",
             f"warning naming its reason's row in {DIFFERENCES_PAGE} (Differences from llama-server):", ""]
    for reason in IGNORED:
        lines.append(f"{reason.row.removeprefix('ignored flags: ')}:")
        lines += textwrap.wrap(" ".join(reason.flags), width=HELP_WIDTH, initial_indent="  ",
                               subsequent_indent="  ", break_on_hyphens=False)
    lines += ["", "A flag llama-server does not know either is an error. A bad value stops the start with one",
              "line naming the flag or variable (exit code 2)."]
    return "\n".join(lines)


def help_text() -> str:
    """`kinetic serve --help`: every flag of the table read_command_line reads, then the ignored ones."""
    lines = ["usage: kinetic serve [MODEL] [OPTIONS]", "", DESCRIPTION, "", "positional arguments:",
             *_entry("MODEL", "GGUF model path (same as -m)"), "", "options:",
             *_entry(", ".join(HELP_FLAGS), "show this help and exit"),
             *_entry(VERSION_FLAG, "print kinetic's version and exit")]
    for flag in FLAGS:
        lines += _flag_entries(flag)
    return "\n".join([*lines, "", epilog()])


# ------------------------------------------------------------------------------------ the environment

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
    "KINETIC_CACHE_DIR",  # kinetic.backends.kinetic_cache.cache_dir(): where the bundled models are assembled
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
    for llama in by_spelling().values():
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
        # pydantic-settings' own keyword for sources built by hand: not in the generated signature
        return ServerSettings(_build_sources=((init, env), {}))  # type: ignore[call-arg]
    except ValidationError as exc:
        origins = {dest: spelling for dest, (spelling, _) in env.found.items()}
        origins.update({dest: spelling for dest, (spelling, _) in cli.items()})
        raise SettingsError("\n".join(_describe(error, origins) for error in exc.errors())) from None


def _describe(error: Any, origins: Mapping[str, str]) -> str:
    if not error["loc"]:  # a rule over several flags: its message names them
        return _reason(error)
    dest = str(error["loc"][0])
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
