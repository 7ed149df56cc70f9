"""`kinetic serve` (llama-server's flags) and `kinetic grade` (lab deliverables)."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import logging
import os
import signal
import socket
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from kinetic import __version__
from kinetic.classroom.keys import KeyFileError, KeyRing
from kinetic.errors import ModelLoadError
from kinetic.flag_status import DIFFERENCES_PAGE, IGNORED, acting_flags, variable_warning, warning
from kinetic.llama_flags import by_spelling, llama_server_flags
from kinetic.settings import (FLAGS, FLAGS_BY_SPELLING, ServerSettings, SettingsError, ignored_variables,
                              load_settings)

log = logging.getLogger("kinetic")

HELP_FLAGS = ("-h", "--help", "--usage")
# flags whose every occurrence counts (the others: the last wins)
REPEATABLE = frozenset({"upstream", "logit_bias", "reverse_prompt", "dry_sequence_breaker", "override_kv", "lora",
                        "lora_scaled"})
HF_PREFIX = "hf:"  # how a -hf model is told from a -m path in ServerSettings.model_args


def build_serve_parser(parser: argparse.ArgumentParser) -> None:
    """The implemented flags, for `kinetic serve --help` (the command line itself is read by scan_serve_args)."""
    parser.add_argument("model_path", nargs="?", metavar="MODEL", help="GGUF model path (same as -m)")
    for flag in FLAGS:
        env = " / ".join(flag.env_names)
        default = "" if flag.default is None or flag.default is False else f" (default: {flag.default})"
        if flag.default is True:
            default = " (default: on)"
        help_text = f"{flag.help}{default} [env: {env}]"
        if flag.is_switch:
            parser.add_argument(*flag.names, dest=flag.dest, action="store_true", help=help_text)
            if flag.negations:
                parser.add_argument(*flag.negations, dest=flag.dest, action="store_false",
                                    help=f"turn {flag.names[-1]} off")
        else:
            parser.add_argument(*flag.names, dest=flag.dest, metavar=flag.metavar or flag.dest.upper(),
                                help=help_text)


def serve_epilog() -> str:
    """Which llama-server flags act (the options above) and which are ignored, by reason."""
    acting, flags = len(acting_flags()), len(llama_server_flags())
    lines = [f"The options above act: {acting} of llama-server's {flags} flags (-h and --version counted) and",
             f"kinetic's own. The other {flags - acting} are accepted with their values and ignored, each with a",
             f"warning naming its reason's row in {DIFFERENCES_PAGE} (Differences from llama-server):", ""]
    for reason in IGNORED:
        lines.append(f"{reason.row.removeprefix('ignored flags: ')}:")
        lines += textwrap.wrap(" ".join(reason.flags), width=100, initial_indent="  ", subsequent_indent="  ",
                               break_on_hyphens=False)
    lines += ["", "A flag llama-server does not know either is an error. A bad value stops the start with one",
              "line naming the flag or variable (exit code 2)."]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kinetic", description="Serve a GGUF model the way llama-server does.")
    parser.add_argument("--version", action="version", version=f"kinetic {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve a model over HTTP (llama-server compatible)",
        description="Serve a GGUF model over HTTP: llama-server's routes plus the OpenAI, Ollama and\n"
                    "Anthropic APIs. Without a model, serves the bundled Gemma 3 270M Q4_K_M.",
        epilog=serve_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    build_serve_parser(serve)
    try:
        from kinetic.grading.cli import add_grade_command
    except ImportError:
        pass
    else:
        add_grade_command(commands)
    return parser


@dataclass
class ServeArgs:
    """What a `kinetic serve` command line holds, before validation."""

    values: dict[str, tuple[str, Any]] = field(default_factory=dict)  # dest -> (spelling, value)
    ignored: list[str] = field(default_factory=list)  # llama-server flags kinetic does not implement
    action: Literal["serve", "help", "version"] = "serve"


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1:2].isdigit()


def scan_serve_args(argv: Sequence[str]) -> ServeArgs:
    """Read a llama-server command line with llama-server's whole flag table.

    As llama-server does, a flag reads exactly the values its table row says (a switch none, so `-kvu`
    never swallows the next argument; a value flag the next argument whatever it looks like) and `_`
    in a long flag reads as `-`. kinetic also takes `--flag=value` and one positional model path.
    """
    scanned = ServeArgs()
    positional: list[str] = []
    models: list[list[str | None]] = []  # every -m (a path) and -hf ("hf:" REPO) with the -a that follows it
    alias_first: str | None = None  # an -a given before any -m
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":
            positional += argv[index:]
            break
        if not _looks_like_flag(token):
            positional.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        if name.startswith("--"):
            name = name.replace("_", "-")
        if name in HELP_FLAGS or name == "--version":
            scanned.action = "help" if name in HELP_FLAGS else "version"
            continue
        flag = FLAGS_BY_SPELLING.get(name)
        llama = by_spelling().get(name)
        if flag is not None:
            count = 0 if flag.is_switch else 1
        elif llama is not None:
            count = llama.values
        else:
            raise SettingsError(_unknown_flag(name))
        if has_inline and count != 1:
            raise SettingsError(f"{name} takes {'no value' if count == 0 else 'two values'}, not {token!r}")
        values = [inline] if has_inline else list(argv[index:index + count])
        if len(values) < count:
            raise SettingsError(f"{name} expects a value" + (f" ({llama.value_hint})" if llama and llama.value_hint
                                                             else ""))
        index += 0 if has_inline else count
        if flag is None:
            if name not in scanned.ignored:
                scanned.ignored.append(name)
        elif flag.is_switch:
            scanned.values[flag.dest] = (name, name not in flag.negations)
        elif flag.dest in REPEATABLE:
            scanned.values[flag.dest] = (name, [*scanned.values.get(flag.dest, (name, []))[1], values[0]])
        else:
            scanned.values[flag.dest] = (name, values[0])
            if flag.dest == "model":
                models.append([values[0], None])
            elif flag.dest == "hf_repo":
                models.append([HF_PREFIX + values[0], None])
            elif flag.dest == "alias" and models:
                models[-1][1] = values[0]
            elif flag.dest == "alias":
                alias_first = values[0]
    if len(positional) > 1:
        raise SettingsError(f"unexpected argument(s): {' '.join(positional[1:])} (only one model path is taken)")
    if positional:
        scanned.values["model"] = ("MODEL", positional[0])
        models.insert(0, [positional[0], None])
    if len(models) > 1:  # router mode: each -m/-hf is its own model, named by its -a (else file stem, repo)
        if models[0][1] is None:
            models[0][1] = alias_first
        scanned.values["model_args"] = ("-m", tuple((path, alias) for path, alias in models))
    return scanned


def _unknown_flag(name: str) -> str:
    spellings = [*FLAGS_BY_SPELLING, *by_spelling(), *HELP_FLAGS, "--version"]
    # kinetic's own flags first: `--ctx` more likely meant --ctx-size than --ctx-checkpoints
    close = ([s for s in FLAGS_BY_SPELLING if s.startswith(name)] or [s for s in spellings if s.startswith(name)]
             or difflib.get_close_matches(name, spellings, n=1))
    hint = f"; did you mean {close[0]}?" if close else "; see kinetic serve --help"
    return f"unknown flag {name} (neither kinetic nor llama-server has it){hint}"


def parse_serve_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServerSettings:
    """The validated settings of a `kinetic serve` command line; SettingsError names a bad flag or variable."""
    environ = os.environ if environ is None else environ
    scanned = scan_serve_args(argv)
    return load_settings(scanned.values, environ, ignored_flags=tuple(scanned.ignored),
                         ignored_env=ignored_variables(environ))


def bind_socket(host: str, port: int, *, v6only: bool = False, reuse_port: bool = False) -> socket.socket:
    host = host.removeprefix("[").removesuffix("]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port and hasattr(socket, "SO_REUSEPORT"):  # --reuse-port; Windows has no such option
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6 and v6only:  # with several addresses, [::] must not also claim 0.0.0.0
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def bind_sockets(hosts: Sequence[str], port: int, *, reuse_port: bool = False) -> list[socket.socket]:
    """One listening socket per --host address (llama-server takes a comma list). Raises OSError
    naming the address that failed; the ones bound before it are closed."""
    if port == 0 and len(hosts) > 1:
        raise OSError(0, "--port 0 is not supported with several addresses", ",".join(hosts))
    sockets: list[socket.socket] = []
    for host in hosts:
        try:
            sockets.append(bind_socket(host, port, v6only=len(hosts) > 1, reuse_port=reuse_port))
        except OSError as exc:
            for sock in sockets:
                sock.close()
            raise OSError(exc.errno, exc.strerror, host) from exc
    return sockets


def limit_worker_threads(n: int) -> None:
    """--threads-http N: the worker threads requests' blocking work (templates, tokenizing, grammars) runs
    in, anyio's default pool (40) otherwise. Call it on the server's event loop."""
    if n > 0:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = n


def missing_server_dependency() -> str | None:
    """The first of the serve extra's modules that is not installed (`pip install kinetic` alone is
    the grader), or None."""
    for module in ("llama_cpp", "uvicorn", "fastapi", "jinja2"):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def reload_keys_on_sighup(keys: KeyRing) -> None:
    """`kill -HUP PID` rereads --api-key-file (a student added, a key revoked) without a restart;
    requests in flight keep going. A file that no longer reads keeps the keys in force. POSIX only:
    Windows has no SIGHUP, and there a restart rereads the file."""
    if not hasattr(signal, "SIGHUP"):
        return

    def reload(signum: int, frame: object) -> None:
        try:
            keys.reload()
        except (OSError, KeyFileError) as exc:
            print(f"warning: the key file was not reloaded ({exc}); the keys in force stay", file=sys.stderr,
                  flush=True)
            return
        print(f"reloaded the keys: {len(keys.keys)} key(s)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGHUP, reload)


def serve(settings: ServerSettings) -> int:

    from kinetic.api_prefix import ApiPrefix
    from kinetic.static_path import StaticPath
    from kinetic.app import create_app, error_response
    from kinetic.shutdown import DrainingServer
    from kinetic.transport import TransportConfig, TransportLimits

    for flag in settings.ignored_flags:
        print(warning(flag), file=sys.stderr)
    if settings.agent_features:
        print("warning: llama-server's built-in tools and MCP servers do not exist in kinetic; as llama-server "
              f"does, CORS origins are limited to {settings.cors_policy}"
              + ("" if settings.cors_origins is not None else " (change with --cors-origins)"), file=sys.stderr)
    for name in settings.ignored_env:
        print(variable_warning(name), file=sys.stderr)
    try:
        if settings.router_mode:
            models, loading = router_registry(settings)
        else:
            models, loading = single_model(settings)
        settings.api_keys()  # an unreadable --api-key-file should stop us now, not on the first request
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if settings.ledger:
        try:
            Path(settings.ledger).open("a", encoding="utf-8").close()
        except OSError as exc:
            print(f"error: cannot write the ledger {settings.ledger}: {exc.strerror}", file=sys.stderr)
            return 1
    config_holder: dict[str, DrainingServer] = {}

    def stop_on_load_failure(exc: BaseException) -> None:
        config_holder["server"].should_exit = True

    try:
        sockets = bind_sockets(settings.hosts, settings.port, reuse_port=settings.reuse_port)
    except OSError as exc:
        print(f"error: cannot listen on {exc.filename}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return 1
    addresses = []
    scheme = "https" if settings.ssl_cert_file else "http"
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        addresses.append(f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")

    def announce() -> None:
        # called on the event loop, before the first request is let through
        limit_worker_threads(settings.threads_http)
        # llama-server's readiness line: printed once the model answers, as the lab tells students to wait for.
        print(f"listening on {', '.join(addresses)}", flush=True)

    app = create_app(models, on_ready=announce, on_load_failure=stop_on_load_failure)
    limits = TransportLimits(max_connections=settings.max_connections, header_timeout=settings.header_timeout,
                             max_header_bytes=settings.max_header_size, max_body_bytes=settings.max_body_size)
    served = StaticPath(app, settings.path) if settings.path else app
    served = ApiPrefix(served, settings.api_prefix, error_response) if settings.api_prefix else served
    config = TransportConfig(served, limits=limits, error_response=error_response,
                             ssl_keyfile=settings.ssl_key_file, ssl_certfile=settings.ssl_cert_file,
                             log_level="info" if settings.verbose else "warning", access_log=settings.verbose,
                             timeout_keep_alive=30, server_header=False)
    server = DrainingServer(config, drain_s=settings.drain_timeout, end_streams=app.state.end_streams)
    config_holder["server"] = server
    reload_keys_on_sighup(app.state.keys)
    print(f"kinetic {__version__}: {loading}", file=sys.stderr, flush=True)
    server.run(sockets=sockets)
    if app.state.load_error is not None:
        print(f"error: {app.state.load_error}", file=sys.stderr)
        return 1
    return 0


def single_model(settings: ServerSettings) -> tuple[Any, str]:
    """Today's server: one model (-m, -hf or the bundled one), loaded at start; `model` fields ignored."""
    from kinetic.engine.turns import DecodeTurns
    from kinetic.models import resolve_model
    from kinetic.router.factory import backend_factory
    from kinetic.router.registry import ModelRegistry
    from kinetic.router.sources import ModelSpec

    resolved = resolve_model(settings.model, settings.hf_repo, settings.hf_file, settings.offline,
                             token=settings.hf_token)
    if resolved.note:
        print(f"warning: {resolved.note}", file=sys.stderr)
    aliases = tuple(sorted({a.strip() for a in (settings.alias or "").split(",") if a.strip()}))
    spec = ModelSpec(name=aliases[0] if aliases else resolved.name, aliases=aliases, path=resolved.path)
    backend = backend_factory(settings, router=False)(spec, DecodeTurns())
    return ModelRegistry.single(settings, backend), f"loading {resolved.path} (answers 503 until ready)"


def router_registry(settings: ServerSettings) -> tuple[Any, str]:
    """Router mode: every model of the command line, folder and preset, loaded on demand."""
    from kinetic.router.factory import backend_factory
    from kinetic.router.registry import ModelRegistry
    from kinetic.router.sources import model_specs

    specs, ignored = model_specs(settings)
    for key in ignored:
        print(f"warning: preset key {key} is not a per-model setting kinetic implements; ignored", file=sys.stderr)
    names = ", ".join(spec.name for spec in specs)
    return (ModelRegistry(settings, specs, backend_factory(settings), router=True),
            f"router mode, {len(specs)} model(s): {names}")


LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def configure_logging(settings: ServerSettings, root: logging.Logger | None = None) -> None:
    """-v, --log-file, --log-timestamps and --log-disable on the root logger (which main() set up)."""
    root = root or logging.getLogger()
    if settings.verbose:
        root.setLevel(logging.DEBUG)
    else:
        # huggingface_hub's HTTP client logs every request at INFO: noise around the download bar.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if settings.log_file:
        to_file = logging.FileHandler(settings.log_file, encoding="utf-8")
        to_file.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(to_file)
    if settings.log_timestamps:
        formatter = logging.Formatter("%(asctime)s " + LOG_FORMAT)
        for handler in root.handlers:
            handler.setFormatter(formatter)
    if settings.log_disable:
        root.setLevel(logging.CRITICAL + 1)  # nothing logs; the start and error lines still print


def list_devices() -> int:
    """--list-devices: llama-server's list of the devices llama.cpp can offload to, then exit 0."""
    import llama_cpp

    print("Available devices:")
    if not llama_cpp.llama_supports_gpu_offload():
        print("  (none: this llama.cpp build runs on the CPU only)")
    else:
        print("  (this build can offload, but llama-cpp-python binds no call that lists the devices)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if argv and argv[0] == "serve":
        missing = missing_server_dependency()
        if missing is not None:
            print(f"error: kinetic serve needs the server's dependencies ({missing} is missing): "
                  'pip install "kinetic[serve]"', file=sys.stderr)
            return 1
        try:
            scanned = scan_serve_args(argv[1:])
            if scanned.action == "help":
                build_parser().parse_args(["serve", "--help"])  # prints the help and exits 0
            if scanned.action == "version":
                print(f"kinetic {__version__}")
                return 0
            settings = load_settings(scanned.values, os.environ, ignored_flags=tuple(scanned.ignored),
                                     ignored_env=ignored_variables(os.environ))
        except SettingsError as exc:
            for line in str(exc).splitlines():
                print(f"error: {line}", file=sys.stderr)
            return 2
        if settings.list_devices:
            return list_devices()
        configure_logging(settings)
        return serve(settings)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is not None:
        return int(args.run(args))
    parser.print_help()
    return 0 if not argv else 2
