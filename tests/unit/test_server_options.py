"""llama-server's server flags kinetic acts on: --api-prefix, --ssl-key-file/--ssl-cert-file,
--embd-normalize, --reasoning-effort (their e2e tests: tests/e2e/test_server_flags.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.responses import JSONResponse

from kinetic.config.args import parse_serve_args
from kinetic.config.settings import SettingsError
from kinetic.server.api_prefix import ApiPrefix
from kinetic.server.app import error_response


async def echo_path(scope, receive, send) -> None:
    await JSONResponse({"path": scope["path"]})(scope, receive, send)


@pytest.mark.anyio
async def test_api_prefix_serves_inside_and_404s_outside() -> None:
    app = ApiPrefix(echo_path, "/llama/", error_response)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/llama/v1/models")).json() == {"path": "/v1/models"}
        assert (await client.get("/llama")).json() == {"path": "/"}
        outside = await client.get("/llamas/health")
        assert outside.status_code == 404 and "--api-prefix" in outside.json()["error"]["message"]
        assert (await client.get("/api/tags")).status_code == 404  # Ollama's path, outside the prefix too


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


def test_ssl_files_go_together_and_must_exist(tmp_path: Path) -> None:
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    key.write_text("k")
    cert.write_text("c")
    s = parse_serve_args(["--ssl-key-file", str(key), "--ssl-cert-file", str(cert)], environ={})
    assert (s.ssl_key_file, s.ssl_cert_file) == (str(key), str(cert))
    with pytest.raises(SettingsError, match="go together"):
        parse_serve_args(["--ssl-key-file", str(key)], environ={})
    with pytest.raises(SettingsError, match="for --ssl-cert-file: no such file"):
        parse_serve_args(["--ssl-key-file", str(key), "--ssl-cert-file", str(tmp_path / "none.pem")], environ={})


def test_reasoning_effort_is_a_default_template_variable() -> None:
    preserve = {"preserve_reasoning": True}  # --reasoning-preserve, on by default as in llama-server
    assert parse_serve_args([], environ={}).template_kwargs() == preserve
    assert parse_serve_args(["--reasoning-effort", "high"], environ={}).template_kwargs() == \
        {**preserve, "reasoning_effort": "high"}
    both = parse_serve_args(["--reasoning-effort", "high", "--chat-template-kwargs", '{"reasoning_effort": "low"}'],
                            environ={})
    assert both.template_kwargs() == {**preserve, "reasoning_effort": "low"}
    assert parse_serve_args([], environ={"LLAMA_ARG_REASONING_EFFORT": "max"}).template_kwargs() == \
        {**preserve, "reasoning_effort": "max"}


def test_embd_normalize_is_the_native_default() -> None:
    from kinetic.protocols.llamacpp.types import EmbeddingRequest

    assert parse_serve_args([], environ={}).embd_normalize == 2
    assert parse_serve_args(["--embd-normalize", "-1"], environ={}).embd_normalize == -1
    assert EmbeddingRequest(content="x").embd_normalize is None  # not sent: the server's applies


def test_timeout_sets_both_read_timeouts_unless_they_are_given() -> None:
    s = parse_serve_args(["-to", "5"], environ={})
    assert (s.timeout, s.header_timeout, s.body_timeout) == (5, 5, 5)
    s = parse_serve_args(["--timeout", "5", "--header-timeout", "2"], environ={})
    assert (s.header_timeout, s.body_timeout) == (2, 5)
    assert parse_serve_args([], environ={"LLAMA_ARG_TIMEOUT": "7"}).body_timeout == 7
    defaults = parse_serve_args([], environ={})
    assert (defaults.header_timeout, defaults.body_timeout) == (30, 30)


def test_log_flags_configure_the_log(tmp_path: Path) -> None:
    import logging

    from kinetic.cli import LOG_FORMAT, configure_logging

    root = logging.getLogger("kinetic-test-root")
    root.propagate = False
    stream = logging.StreamHandler()
    stream.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(stream)
    log_file = tmp_path / "server.log"
    configure_logging(parse_serve_args(["--log-file", str(log_file)], environ={}), root)
    root.warning("plain")
    assert log_file.read_text() == "WARNING kinetic-test-root: plain\n"
    configure_logging(parse_serve_args(["--log-timestamps"], environ={}), root)
    root.warning("hello")
    last = log_file.read_text().splitlines()[-1]
    assert len(root.handlers) == 2 and last.endswith(" WARNING kinetic-test-root: hello")
    assert last[:4].isdigit()  # the time comes first
    configure_logging(parse_serve_args(["--log-disable"], environ={}), root)
    root.critical("nothing")
    assert "nothing" not in log_file.read_text()
    for handler in root.handlers:
        handler.close()
    with pytest.raises(SettingsError, match="for --log-file: its folder does not exist"):
        parse_serve_args(["--log-file", str(tmp_path / "no" / "x.log")], environ={})


def test_reuse_port_lets_two_sockets_listen_on_one_port() -> None:
    import socket

    from kinetic.cli import bind_socket

    first = bind_socket("127.0.0.1", 0, reuse_port=True)
    try:
        port = first.getsockname()[1]
        if hasattr(socket, "SO_REUSEPORT"):
            bind_socket("127.0.0.1", port, reuse_port=True).close()
        with pytest.raises(OSError):
            bind_socket("127.0.0.1", port).close()  # without it, the port is taken
    finally:
        first.close()


def test_cache_prompt_is_the_servers_default_for_requests_that_do_not_say() -> None:
    from kinetic.chat.prepare import ChatLayer, ServerDefaults
    from kinetic.chat.templates import ChatTemplate, builtin_template
    from kinetic.chat.types import GenerationOptions, PromptRequest
    from tests.scripted import ScriptedEngine

    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    layer = ChatLayer(engine, ChatTemplate(builtin_template("gemma"), "builtin:gemma"),
                      ServerDefaults(cache_prompt=parse_serve_args(["--no-cache-prompt"], environ={}).cache_prompt))
    assert layer.prepare_prompt(PromptRequest(prompt="hi")).cache_prompt is False
    own = PromptRequest(prompt="hi", options=GenerationOptions(cache_prompt=True))
    assert layer.prepare_prompt(own).cache_prompt is True
    assert parse_serve_args([], environ={}).cache_prompt is True


def test_ui_config_from_text_or_file(tmp_path: Path) -> None:
    assert parse_serve_args([], environ={}).ui_settings() == {}
    assert parse_serve_args(["--webui-config", '{"theme": "dark"}'], environ={}).ui_settings() == {"theme": "dark"}
    (tmp_path / "ui.json").write_text('{"a": 1}')
    assert parse_serve_args(["--ui-config-file", str(tmp_path / "ui.json")], environ={}).ui_settings() == {"a": 1}
    with pytest.raises(SettingsError, match="for --ui-config: expected a JSON object"):
        parse_serve_args(["--ui-config", "[1]"], environ={})


def test_spm_infill_puts_the_suffix_first() -> None:
    """--spm-infill: llama-server's Suffix/Prefix/Middle order (format_prompt_infill), BOS still leading."""
    from kinetic.chat.infill import infill_tokens

    fim = {"pre": 1001, "suf": 1002, "mid": 1003, "rep": -1, "sep": -1}
    tokens = infill_tokens(lambda text: [ord(c) for c in text], fim, prefix="ab", suffix="cd", extra=(), prompt=[7],
                           n_batch=2048, n_predict=-1, n_ctx=4096, bos=2, spm=True)
    assert tokens == [2, 1002, ord("c"), ord("d"), 1001, ord("a"), ord("b"), 7, 1003]
    assert parse_serve_args(["--spm-infill"], environ={}).spm_infill


def test_threads_http_caps_the_worker_threads() -> None:
    import anyio
    import anyio.to_thread

    from kinetic.cli import limit_worker_threads

    async def limits(n: int) -> float:
        limit_worker_threads(n)
        return anyio.to_thread.current_default_thread_limiter().total_tokens

    assert anyio.run(limits, 3) == 3
    assert anyio.run(limits, -1) == 40  # not given: anyio's default
    assert parse_serve_args(["--threads-http", "6"], environ={}).threads_http == 6


def test_cors_methods_headers_and_credentials_reach_the_preflight() -> None:
    from fastapi.testclient import TestClient

    from kinetic.engine.llama import LlamaEngine
    from tests.scripted import single_model_app

    def preflight(*argv: str) -> httpx.Headers:
        app = single_model_app(parse_serve_args(list(argv), environ={}), LlamaEngine(Path("unused.gguf")), "x")
        client = TestClient(app)  # not entered: the model never loads, the gate still answers
        return client.options("/v1/chat/completions", headers={
            "Origin": "http://example.org", "Access-Control-Request-Headers": "authorization"}).headers

    default = preflight()
    assert default["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert default["access-control-allow-headers"] == "authorization"  # kinetic's default (a differences row)
    assert (default["access-control-allow-credentials"], default["access-control-allow-origin"]) == \
        ("true", "http://example.org")
    chosen = preflight("--cors-methods", "GET, POST", "--cors-headers", "*", "--no-cors-credentials")
    assert (chosen["access-control-allow-methods"], chosen["access-control-allow-headers"]) == ("GET, POST", "*")
    assert (chosen["access-control-allow-credentials"], chosen["access-control-allow-origin"]) == ("false", "*")


@pytest.mark.anyio
async def test_path_serves_a_folder_ahead_of_the_routes(tmp_path: Path) -> None:
    from kinetic.server.static_path import StaticPath

    (tmp_path / "index.html").write_text("<h1>my ui</h1>")
    (tmp_path / "app.js").write_text("console.log(1)")
    (tmp_path.parent / "secret.txt").write_text("no")
    app = StaticPath(echo_path, str(tmp_path))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/")).text == "<h1>my ui</h1>"
        assert (await client.get("/app.js")).text == "console.log(1)"
        assert (await client.get("/v1/models")).json() == {"path": "/v1/models"}  # no such file: the routes
        assert app.file_for("/../secret.txt") is None  # never outside the folder (a raw path a client may send)
        assert (await client.post("/app.js")).json() == {"path": "/app.js"}
    with pytest.raises(SettingsError, match="for --path: no such folder"):
        parse_serve_args(["--path", str(tmp_path / "none")], environ={})
