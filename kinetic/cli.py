"""`kinetic serve` (llama-server's flags) and `kinetic grade` (lab deliverables)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib.util
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from kinetic import __version__
from kinetic.classroom.keys import KeyFileError, KeyRing
from kinetic.classroom.ledger import ledger_path_problem
from kinetic.config.args import InfoRequested, parse_serve_args
from kinetic.config.flag_status import variable_warning, warning
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.errors import ModelLoadError
from kinetic.server.log_setup import LOG_FORMAT, configure_logging

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from kinetic.server.vertex import VertexSettings
    from kinetic.server.welcome import Served

log = logging.getLogger("kinetic")


def build_parser() -> argparse.ArgumentParser:
    """`kinetic --help`, `kinetic --version` and `kinetic grade`; `kinetic serve` has its own reader
    (kinetic.config.args, for the run and its --help alike) and is listed here for the overview only."""
    parser = argparse.ArgumentParser(prog="kinetic", description="Serve a GGUF model the way llama-server does.")
    parser.add_argument("--version", action="version", version=f"kinetic {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("serve", help="serve a model over HTTP (llama-server compatible; kinetic serve --help)",
                        add_help=False)
    try:
        from kinetic.grading.cli import add_grade_command
    except ImportError:
        pass
    else:
        add_grade_command(commands)
    return parser


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
        print(f"reloaded the keys and their limits: {len(keys.keys)} key(s)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGHUP, reload)


def vertex_environment(port: int) -> VertexSettings | None:
    """Vertex AI's AIP_* variables when it runs the server (AIP_MODE=PREDICTION), whose AIP_HTTP_PORT replaces
    --port as in llama-server (raises VertexSetupError for values it cannot serve)."""
    from kinetic.server.vertex import vertex_settings

    vertex = vertex_settings(os.environ)
    if vertex is not None and vertex.port != port:
        print(f"warning: Vertex AI (AIP_MODE=PREDICTION): listening on AIP_HTTP_PORT {vertex.port}, not --port {port}",
              file=sys.stderr)
    return vertex


def ledger_start_problem(path: str | None) -> str | None:
    """Why --ledger cannot be used, in one line (None when it can): a device or a FIFO would be read
    back without end, a directory or an unwritable file would fail every request."""
    if not path:
        return None
    if (problem := ledger_path_problem(path)) is not None:
        return problem
    try:
        Path(path).open("a", encoding="utf-8").close()
    except OSError as exc:
        return f"cannot write the ledger {path}: {exc.strerror}"
    return None


def serve(settings: ServerSettings) -> int:
    from kinetic.model_registry.deps import server_state
    from kinetic.protocols.common.app_parts import installed
    from kinetic.protocols.responses.store import ResponseStore
    from kinetic.server.api_prefix import ApiPrefix
    from kinetic.server.app import create_app, error_response
    from kinetic.server.shutdown import DrainingServer
    from kinetic.server.static_path import StaticPath
    from kinetic.server.transport import TransportConfig, TransportLimits

    for flag in settings.ignored_flags:
        print(warning(flag), file=sys.stderr)
    if settings.agent_features:
        print("warning: llama-server's built-in tools and MCP servers do not exist in kinetic; as llama-server "
              f"does, CORS origins are limited to {settings.cors_policy}"
              + ("" if settings.cors_origins is not None else " (change with --cors-origins)"), file=sys.stderr)
    for name in settings.ignored_env:
        print(variable_warning(name), file=sys.stderr)
    if (problem := ledger_start_problem(settings.ledger)) is not None:  # before the model loads
        print(f"error: {problem}", file=sys.stderr)
        return 1
    port = vertex.port if (vertex := vertex_environment(settings.port)) is not None else settings.port
    try:
        if settings.router_mode or cache_router(settings):
            models, loading = router_registry(settings)
        else:
            models, loading = single_model(settings)
        settings.api_keys()  # an unreadable --api-key-file should stop us now, not on the first request
        open_derived_models(models, settings)
    except (ModelLoadError, KeyFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    config_holder: dict[str, DrainingServer] = {}

    def stop_on_load_failure(exc: BaseException) -> None:
        config_holder["server"].should_exit = True

    try:
        sockets = bind_sockets(settings.hosts, port, reuse_port=settings.reuse_port)
    except OSError as exc:
        print(f"error: cannot listen on {exc.filename}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    addresses = []
    scheme = "https" if settings.ssl_cert_file else "http"
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        addresses.append(f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")

    app = create_app(models, on_ready=announcer(settings, addresses, models), on_load_failure=stop_on_load_failure,
                     vertex=vertex)
    limits = TransportLimits(max_connections=settings.max_connections, header_timeout=settings.header_timeout,
                             max_header_bytes=settings.max_header_size, max_body_bytes=settings.max_body_size)
    served: ASGIApp = StaticPath(app, settings.path) if settings.path else app
    served = ApiPrefix(served, settings.api_prefix, error_response) if settings.api_prefix else served
    config = TransportConfig(served, limits=limits, error_response=error_response,
                             ssl_keyfile=settings.ssl_key_file, ssl_certfile=settings.ssl_cert_file,
                             log_level="info" if settings.verbose else "warning", access_log=settings.verbose,
                             timeout_keep_alive=30, server_header=False)
    state = server_state(app)
    server = DrainingServer(config, drain_s=settings.drain_timeout, end_streams=state.end_streams,
                            refuse_waiting=state.refuse_waiting)
    config_holder["server"] = server
    reload_keys_on_sighup(state.keys)
    print(f"kinetic {__version__}: {loading}", file=sys.stderr, flush=True)
    where = installed(app, ResponseStore).database.where
    print(f"stored responses (/v1/responses): {where}", file=sys.stderr, flush=True)
    gc.freeze()  # what the start built lives as long as the server (run_serve)
    gc.enable()
    server.run(sockets=sockets)
    if state.load_error is not None:
        print(f"error: {state.load_error}", file=sys.stderr)
        return 1
    return 0


def announcer(settings: ServerSettings, addresses: list[str], registry: Any) -> Callable[[], None]:
    """What runs on the event loop once the model answers, before the first request is let through: llama-server's
    readiness line (the lab tells students to wait for it, scripts read it), then where to go from here."""
    from kinetic.server.welcome import welcome_lines

    def announce() -> None:
        limit_worker_threads(settings.threads_http)
        print(f"listening on {', '.join(addresses)}", flush=True)
        for line in welcome_lines(addresses[0], served_model(registry), chat_page=settings.ui,
                                  keyed=bool(settings.api_keys()), api_prefix=settings.api_prefix or ""):
            print(line, flush=True)

    return announce


def served_model(registry: Any) -> Served:
    """What the welcome lines say of the model: the one loaded, or a router's list and its default."""
    from kinetic.server.welcome import Served

    if registry.router:
        default = registry.default
        return Served(name=default.name if default else "", router_models=len(registry.entries))
    about = registry.only.backend.describe()
    return Served(name=about.name, n_ctx=about.n_ctx, n_slots=about.n_slots)


def open_derived_models(registry: Any, settings: ServerSettings) -> None:
    """The models /api/create made on an earlier run, stored beside the models (model_registry/derived.py)."""
    from kinetic.model_registry.derived import DerivedStore, store_folder

    registry.open_store(DerivedStore(store_folder(settings.models_dir)))


def share_hub_cache() -> None:
    """-hf (through huggingface_hub) reads and writes the folder the router lists: llama.cpp takes LLAMA_CACHE as
    the hub folder before HF_HUB_CACHE (backends/hub_cache.py), huggingface_hub reads only the latter, at import."""
    if llama_cache := os.environ.get("LLAMA_CACHE"):
        os.environ["HF_HUB_CACHE"] = llama_cache


def cache_router(settings: ServerSettings) -> bool:
    """No model named and models in the Hugging Face cache: a router over them and the bundled model, as
    llama-server with no model is a router over its cache (docs/router.md)."""
    from kinetic.backends.hub_cache import cached_models
    from kinetic.backends.sources import names_no_model

    return names_no_model(settings) and bool(cached_models())


def single_model(settings: ServerSettings) -> tuple[Any, str]:
    """Today's server: one model (-m, -hf or the bundled one), loaded at start; `model` fields ignored."""
    from kinetic.backends.gguf_files import resolve_model
    from kinetic.backends.sources import ModelSpec
    from kinetic.engine.turns import DecodeTurns
    from kinetic.model_registry.factory import backend_factory, finds_projector
    from kinetic.model_registry.registry import ModelRegistry

    resolved = resolve_model(settings.model, settings.hf_repo, settings.hf_file, settings.offline,
                             token=settings.hf_token, mmproj=finds_projector(settings), bundled=settings.bundled)
    if resolved.note:
        print(f"warning: {resolved.note}", file=sys.stderr)
    aliases = tuple(sorted({a.strip() for a in (settings.alias or "").split(",") if a.strip()}))
    spec = ModelSpec(name=aliases[0] if aliases else resolved.name, aliases=aliases, path=resolved.path,
                     mmproj=resolved.mmproj)
    backend = backend_factory(settings, router=False)(spec, DecodeTurns())
    return ModelRegistry.single(settings, backend), f"loading {resolved.path} (answers 503 until ready)"


def router_registry(settings: ServerSettings) -> tuple[Any, str]:
    """Router mode: every model of the command line, folder and preset, loaded on demand."""
    from kinetic.backends.bundled import default_model
    from kinetic.backends.sources import model_specs, names_no_model
    from kinetic.model_registry.factory import backend_factory
    from kinetic.model_registry.registry import ModelRegistry

    specs, ignored = model_specs(settings)
    if names_no_model(settings) and (note := default_model(settings.bundled)[1]) is not None:
        print(f"warning: {note}", file=sys.stderr)
    for key in ignored:
        print(f"warning: preset key {key} is not a per-model setting kinetic implements; ignored", file=sys.stderr)
    names = ", ".join(spec.name for spec in specs)
    registry = ModelRegistry(settings, specs, backend_factory(settings), router=True,
                             reread=lambda: model_specs(settings)[0])
    return registry, f"router mode, {len(specs)} model(s): {names}"


def list_devices() -> int:
    """--list-devices: llama-server's list of the devices llama.cpp can offload to, then exit 0."""
    from kinetic.engine.llama.devices import list_devices_text

    print(list_devices_text())
    return 0


def entry() -> NoReturn:
    """The `kinetic` command (and `python -m kinetic`). A server that has shut down has already closed what it
    keeps (its lifespan closed the models, the stores and the ledger, whose lines are written as they come), so it
    exits without the interpreter's teardown, which frees every module's objects and a model's buffers one by one:
    0.3 s of each stop on 2 cores, where a restart or a supervisor waits. The exit handlers still run (logging's
    flush among them)."""
    code = main()
    if sys.argv[1:2] == ["serve"]:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
                stream.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if argv and argv[0] == "serve":
        return run_serve(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is not None:
        return int(args.run(args))
    parser.print_help()
    return 0 if not argv else 2


def run_serve(argv: Sequence[str]) -> int:
    """`kinetic serve ARGS`: the settings parse_serve_args reads (or the help or version it asks for), then serve.
    The start builds some 100,000 long-lived objects (the models of every protocol's bodies, the routes): the cyclic
    collector would walk them all a few times while they are made (0.13 s of a 0.9 s start on 2 cores), and again at
    every full collection while the server runs. It is off until the server is built, which then sets them aside
    (gc.freeze) so that only what requests make is ever walked."""
    gc.disable()
    try:
        return _run_serve(argv)
    finally:
        gc.enable()


def _run_serve(argv: Sequence[str]) -> int:
    share_hub_cache()
    missing = missing_server_dependency()
    if missing is not None:
        print(f"error: kinetic serve needs the server's dependencies ({missing} is missing): "
              'pip install "kinetic[serve]"', file=sys.stderr)
        return 1
    try:
        settings = parse_serve_args(argv)
    except InfoRequested as asked:
        print(asked.text)
        return 0
    except SettingsError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    if settings.list_devices:
        return list_devices()
    configure_logging(settings)
    # the server's modules need the serve extra: imported here, as serve() imports them
    from kinetic.server.vertex import VertexSetupError

    try:
        return serve(settings)
    except VertexSetupError as exc:  # AIP_* values the server cannot serve, found before it listens or as it starts
        print(f"error: {exc}", file=sys.stderr)
        return 1
