"""`kinetic serve` (llama-server's flags) and `kinetic grade` (lab deliverables)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path
from typing import Any, Sequence

from kinetic import __version__
from kinetic.classroom.keys import KeyFileError
from kinetic.errors import ModelLoadError
from kinetic.settings import FLAGS, IGNORED_FLAGS_WITH_VALUE, ServerSettings, env_defaults

log = logging.getLogger("kinetic")


def build_serve_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_path", nargs="?", metavar="MODEL", help="GGUF model path (same as -m)")
    for flag in FLAGS:
        env = " / ".join(n for n in (flag.kinetic_env, flag.llama_env) if n)
        default = f" (default: {flag.default})" if flag.default not in (None, False) else ""
        help_text = f"{flag.help}{default} [env: {env}]"
        if flag.is_bool:
            parser.add_argument(*flag.names, dest=flag.dest, action="store_true", default=None, help=help_text)
            if flag.negation:
                parser.add_argument(flag.negation, dest=flag.dest, action="store_false", default=None,
                                    help=f"turn {flag.names[-1]} off")
        else:
            parser.add_argument(*flag.names, dest=flag.dest, type=flag.type, default=None, metavar=flag.metavar,
                                help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kinetic", description="Serve a GGUF model the way llama-server does.")
    parser.add_argument("--version", action="version", version=f"kinetic {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve a model over HTTP (llama-server compatible)",
        description="Serve a GGUF model over HTTP: llama-server's routes plus the OpenAI, Ollama and "
                    "Anthropic APIs. Without a model, serves the bundled Gemma 3 270M Q4_K_M. Flags not "
                    "listed here but known to llama-server are accepted with a warning.",
    )
    build_serve_parser(serve)
    try:
        from kinetic.grading.cli import add_grade_command
    except ImportError:
        pass
    else:
        add_grade_command(commands)
    return parser


def split_ignored_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Removes llama-server flags kinetic does not implement (with their values)."""
    kept: list[str] = []
    ignored: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        name = token.split("=", 1)[0]
        if name in IGNORED_FLAGS_WITH_VALUE:
            ignored.append(token)
            if "=" not in token and index + 1 < len(argv):
                index += 1
        else:
            kept.append(token)
        index += 1
    return kept, ignored


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None,
                       ignored: Sequence[str] = ()) -> ServerSettings:
    values: dict[str, Any] = env_defaults(environ)
    for flag in FLAGS:
        value = getattr(args, flag.dest, None)
        if value is not None:
            values[flag.dest] = value
    if getattr(args, "model_path", None):
        values["model"] = args.model_path
    return ServerSettings(**values, ignored_flags=tuple(ignored))


def parse_serve_args(argv: Sequence[str], environ: dict[str, str] | None = None) -> ServerSettings:
    kept, ignored = split_ignored_flags(argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(["serve", *kept])
    stray = [u for u in unknown if not u.startswith("-")]
    if stray:
        parser.error(f"unexpected argument(s): {' '.join(stray)}")
    return settings_from_args(args, environ, [*ignored, *unknown])


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve(settings: ServerSettings) -> int:
    try:
        import llama_cpp  # noqa: F401  (only checked here: the engine imports it when it loads)
        import uvicorn

        from kinetic.app import create_app
        from kinetic.engine.llama import LlamaEngine
        from kinetic.models import resolve_model
        from kinetic.service import Service
    except ImportError as exc:  # `pip install kinetic` alone is the grader: the server is an extra
        print(f"error: kinetic serve needs the server's dependencies ({exc.name} is missing): "
              'pip install "kinetic[serve]"', file=sys.stderr)
        return 1

    for flag in settings.ignored_flags:
        if flag.startswith("-"):
            print(f"warning: {flag} is a llama-server flag kinetic does not implement; ignored", file=sys.stderr)
    try:
        resolved = resolve_model(settings.model, settings.hf_repo, settings.hf_file, settings.offline)
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
    keyed = bool(settings.api_keys())
    engine = LlamaEngine(resolved.path, n_ctx=settings.ctx_size, n_parallel=settings.parallel,
                         n_threads=settings.threads, n_batch=settings.batch_size,
                         n_ubatch=settings.ubatch_size, embeddings=settings.embeddings,
                         fair_share=settings.fair_share,
                         max_in_flight_per_client=settings.max_in_flight if keyed else 0,
                         verbose=settings.verbose)
    service = Service.create(settings, engine, resolved.name)
    config_holder: dict[str, uvicorn.Server] = {}

    def stop_on_load_failure(exc: BaseException) -> None:
        config_holder["server"].should_exit = True

    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host

    def announce() -> None:
        # llama-server's readiness line: printed once the model answers, as the lab tells students to wait for.
        print(f"listening on http://{shown_host}:{port}", flush=True)

    app = create_app(service, on_ready=announce, on_load_failure=stop_on_load_failure)
    config = uvicorn.Config(app, log_level="info" if settings.verbose else "warning", access_log=settings.verbose,
                            limit_concurrency=64, timeout_keep_alive=30, h11_max_incomplete_event_size=64 * 1024,
                            server_header=False)
    server = uvicorn.Server(config)
    config_holder["server"] = server
    print(f"kinetic {__version__}: loading {resolved.path} (http://{shown_host}:{port} answers 503 until ready)",
          file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    if app.state.load_error is not None:
        print(f"error: {app.state.load_error}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if argv and argv[0] == "serve":
        settings = parse_serve_args(argv[1:])
        if settings.verbose:
            logging.getLogger().setLevel(logging.DEBUG)
        return serve(settings)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is not None:
        return int(args.run(args))
    parser.print_help()
    return 0 if not argv else 2
