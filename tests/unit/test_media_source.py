"""Loading media named by URL (kinetic/backends/media_source.py): file:// under --media-path with llama-server's
rules (llama.cpp's tools/server/tests/unit/test_security.py `test_local_media_file`), and http(s):// fetches
against a real HTTP server on 127.0.0.1: allowed addresses, redirects checked hop by hop, the size cap, the
timeout and failed statuses."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from kinetic.backends import media_source
from kinetic.backends.media_source import MediaPolicy, is_public, load_media, resolve_chat, resolve_prompt
from kinetic.chat.types import ChatRequest, MediaPart, Message, PromptRequest, TextPart
from kinetic.config.args import parse_serve_args
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.errors import InvalidRequestError
from kinetic.model_registry.factory import media_policy

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 10
PARAM = "messages[0].content[1].image_url.url"


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


class Handler(BaseHTTPRequestHandler):
    """/img, /big (a Content-Length over the cap), /endless (no length, more than the cap), /slow,
    /to?where (302 there), /loop (302 to itself), /host (answers with the Host header it got); else 404."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            for name, value in (headers or {"content-length": str(len(body))}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the timeout and size tests)

    def do_GET(self) -> None:  # noqa: N802  http.server's name
        path, _, query = self.path.partition("?")
        if path == "/img":
            self._send(200, PNG)
        elif path == "/big":
            self._send(200, b"", {"content-length": str(64 * 1024)})
        elif path == "/endless":
            self._send(200, b"x" * 4096, {"connection": "close"})  # no length: read until closed
        elif path == "/slow":
            time.sleep(1.5)
            self._send(200, PNG)
        elif path == "/to":
            self._send(302, b"", {"location": query, "content-length": "0"})
        elif path == "/loop":
            self._send(302, b"", {"location": "/loop", "content-length": "0"})
        elif path == "/host":
            self._send(200, (self.headers.get("host") or "").encode())
        else:
            self._send(404, b"not here")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.block_on_close = False
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def image(url: str) -> MediaPart:
    return MediaPart("image_url", "image", url=url, param=PARAM)


async def refusal(part: MediaPart, policy: MediaPolicy) -> str:
    with pytest.raises(InvalidRequestError) as err:
        await load_media(part, policy)
    assert err.value.param == part.param and part.param in err.value.message
    return err.value.message


# ------------------------------------------------------------------------------------ http(s)://


@pytest.mark.anyio
async def test_a_loopback_server_is_fetched_when_private_addresses_are_allowed(server: str) -> None:
    loaded = await load_media(image(f"{server}/img"), MediaPolicy())
    assert loaded.data == PNG and loaded.url == f"{server}/img" and loaded.param == PARAM


@pytest.mark.anyio
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_loopback_server_is_refused_when_private_addresses_are_not(server: str, host: str) -> None:
    url = server.replace("127.0.0.1", host) + "/img"
    assert "private, loopback" in await refusal(image(url), MediaPolicy(allow_private=False))


@pytest.mark.anyio
async def test_the_connection_goes_to_the_vetted_address_with_the_name_as_host(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No second lookup between the check and the connection: the name is only ever resolved once."""
    port = int(server.rsplit(":", 1)[1])
    lookups: list[str] = []

    async def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        lookups.append(host)
        return [(2, 1, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(media_source.anyio, "getaddrinfo", getaddrinfo)
    loaded = await load_media(image(f"http://media.test:{port}/host"), MediaPolicy())
    assert loaded.data == f"media.test:{port}".encode() and lookups == ["media.test"]


@pytest.mark.anyio
async def test_redirects_are_followed_and_each_hop_is_checked(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await load_media(image(f"{server}/to?/img"), MediaPolicy())).data == PNG
    # the test server stands for a public one; a hop to another loopback address is refused before it connects
    monkeypatch.setattr(media_source, "is_public", lambda address: address == ipaddress.ip_address("127.0.0.1"))
    strict = MediaPolicy(allow_private=False)
    assert (await load_media(image(f"{server}/to?/img"), strict)).data == PNG
    message = await refusal(image(f"{server}/to?http://127.0.0.2:1/img"), strict)
    assert "127.0.0.2" in message
    assert "unsupported URL scheme 'file'" in await refusal(image(f"{server}/to?file:///etc/passwd"), MediaPolicy())


@pytest.mark.anyio
async def test_a_redirect_loop_stops_at_the_limit(server: str) -> None:
    assert "too many redirects (more than 2)" in await refusal(image(f"{server}/loop"), MediaPolicy(max_redirects=2))


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/big", "/endless"])
async def test_a_body_over_the_cap_is_refused(server: str, path: str) -> None:
    assert "larger than 1000 bytes" in await refusal(image(server + path), MediaPolicy(max_bytes=1000))


@pytest.mark.anyio
async def test_a_slow_server_hits_the_timeout(server: str) -> None:
    started = time.monotonic()
    assert "longer than 0.3 s" in await refusal(image(f"{server}/slow"), MediaPolicy(timeout_s=0.3))
    assert time.monotonic() - started < 1.2


def test_a_failed_status_is_refused_with_it(server: str) -> None:
    assert "HTTP 404" in anyio.run(refusal, image(f"{server}/nothing"), MediaPolicy())


@pytest.mark.anyio
async def test_an_unreachable_host_or_port_is_a_400() -> None:
    assert "could not resolve" in await refusal(image("http://no-such-host.invalid/a.png"), MediaPolicy())
    assert "the download failed" in await refusal(image("http://127.0.0.1:1/a.png"), MediaPolicy())


@pytest.mark.parametrize("address, public", [
    ("93.184.215.14", True), ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.10", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False),
    ("240.0.0.1", False), ("255.255.255.255", False), ("::1", False), ("::", False), ("fe80::1", False),
    ("fc00::1", False), ("ff02::1", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False),
    ("2002:7f00:1::", False),  # 6to4 carrying 127.0.0.1
])
def test_public_addresses(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


# ------------------------------------------------------------------------------------ file://


@pytest.fixture()
def media_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "media"
    (folder / "mtmd").mkdir(parents=True)
    (folder / "mtmd" / "test-1.jpeg").write_bytes(PNG)
    (tmp_path / "secret.txt").write_bytes(b"secret")
    return folder


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["file://mtmd/test-1.jpeg", "file:////mtmd//test-1.jpeg"])  # the same file
async def test_a_local_file_under_media_path_is_read(media_dir: Path, url: str) -> None:
    assert (await load_media(image(url), MediaPolicy(media_path=media_dir))).data == PNG


@pytest.mark.anyio
@pytest.mark.parametrize("url, message", [
    ("file://mtmd/notfound.jpeg", "file does not exist or cannot be opened: mtmd/notfound.jpeg"),
    ("file://../mtmd/test-1.jpeg", "file path is not allowed: ../mtmd/test-1.jpeg"),
    ("file://mtmd/../../secret.txt", "file path is not allowed: mtmd/../../secret.txt"),
    ("file://C:/secret.txt", "file path is not allowed: C:/secret.txt"),
    ("file://", "file path is not allowed: "),
    ("file://mtmd", "file does not exist or cannot be opened: mtmd"),  # a folder
])
async def test_local_files_follow_llama_servers_rules(media_dir: Path, url: str, message: str) -> None:
    assert message in await refusal(image(url), MediaPolicy(media_path=media_dir))


@pytest.mark.anyio
async def test_file_urls_need_media_path(media_dir: Path) -> None:
    message = await refusal(image("file://mtmd/test-1.jpeg"), MediaPolicy())
    assert "file:// URLs are not allowed unless --media-path is specified" in message


def test_a_symbolic_link_out_of_media_path_is_refused(media_dir: Path) -> None:
    (media_dir / "escape.txt").symlink_to(media_dir.parent / "secret.txt")
    (media_dir / "out").symlink_to(media_dir.parent, target_is_directory=True)
    (media_dir / "inside.jpeg").symlink_to(media_dir / "mtmd" / "test-1.jpeg")
    policy = MediaPolicy(media_path=media_dir)
    assert "file path is not allowed: escape.txt" in anyio.run(refusal, image("file://escape.txt"), policy)
    assert "file path is not allowed: out/secret.txt" in anyio.run(refusal, image("file://out/secret.txt"), policy)
    assert anyio.run(load_media, image("file://inside.jpeg"), policy).data == PNG  # a link that stays inside


@pytest.mark.anyio
async def test_a_local_file_over_the_cap_is_refused(media_dir: Path) -> None:
    policy = MediaPolicy(media_path=media_dir, max_bytes=10)
    assert "larger than 10 bytes" in await refusal(image("file://mtmd/test-1.jpeg"), policy)


# ------------------------------------------------------------------------------------ requests


@pytest.mark.anyio
async def test_a_chat_request_gets_every_url_part_loaded_and_keeps_the_rest(server: str, media_dir: Path) -> None:
    inline = MediaPart("image_url", "image", data=b"inline", param="messages[0].content[0].image_url.url")
    req = ChatRequest(messages=(
        Message(role="user", parts=(inline, TextPart("compare"), image(f"{server}/img"))),
        Message(role="assistant", tool_calls=()),
        Message(role="user", parts=(MediaPart("image_url", url="file://mtmd/test-1.jpeg", param="messages[2]"),))))
    resolved = await resolve_chat(req, MediaPolicy(media_path=media_dir))
    first, _, last = resolved.messages
    assert first.parts == (inline, TextPart("compare"),
                           MediaPart("image_url", "image", data=PNG, url=f"{server}/img", param=PARAM))
    assert last.parts is not None and isinstance(last.parts[0], MediaPart) and last.parts[0].data == PNG
    assert resolved.messages[1] is req.messages[1]


@pytest.mark.anyio
async def test_a_request_without_url_parts_is_returned_as_is() -> None:
    req = ChatRequest(messages=(Message(role="user", parts=(TextPart("hi"),)),))
    assert await resolve_chat(req, MediaPolicy()) is req
    prompt = PromptRequest(prompt="<m> hi", media=(MediaPart("multimodal_data", data=b"x"),))
    assert await resolve_prompt(prompt, MediaPolicy()) is prompt


@pytest.mark.anyio
async def test_a_prompt_requests_url_media_is_loaded_and_the_first_refusal_is_raised(server: str) -> None:
    prompt = PromptRequest(prompt="<m><m>", media=(image(f"{server}/img"), MediaPart("multimodal_data", data=b"x")))
    assert [part.data for part in (await resolve_prompt(prompt, MediaPolicy())).media] == [PNG, b"x"]
    failing = PromptRequest(prompt="<m><m>", media=(image(f"{server}/img"), MediaPart(
        "images", url=f"{server}/gone", param="images[1]")))
    with pytest.raises(InvalidRequestError) as err:  # one 400, not an exception group
        await resolve_prompt(failing, MediaPolicy())
    assert err.value.param == "images[1]" and "HTTP 404" in err.value.message


# ------------------------------------------------------------------------------------ the flags


def test_the_keys_decide_whether_private_addresses_are_fetched(tmp_path: Path) -> None:
    """Open server: as llama-server. With keys: refused, unless --media-allow-private."""
    keys = tmp_path / "keys.txt"
    keys.write_text("alice: sk-alice\n")
    assert media_policy(ServerSettings()).allow_private
    assert not media_policy(ServerSettings(api_key="k")).allow_private
    assert not media_policy(ServerSettings(api_key_file=str(keys))).allow_private
    assert media_policy(ServerSettings(api_key="k", media_allow_private=True)).allow_private
    assert not media_policy(ServerSettings(media_allow_private=False)).allow_private
    assert media_policy(ServerSettings()).media_path is None
    assert media_policy(ServerSettings(media_path=str(tmp_path))).media_path == tmp_path
    assert media_policy(ServerSettings()) == MediaPolicy()  # llama-server's size, time and redirect limits


def test_media_path_must_be_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="media_path"):
        ServerSettings(media_path=str(tmp_path / "missing"))


def test_the_flags_and_their_variables(tmp_path: Path) -> None:
    settings = parse_serve_args(["--media-path", str(tmp_path), "--api-key", "k", "--media-allow-private"], environ={})
    assert settings.media_path == str(tmp_path) and media_policy(settings).allow_private
    assert parse_serve_args(["--no-media-allow-private"], environ={}).media_allow_private is False
    assert parse_serve_args([], environ={"KINETIC_MEDIA_ALLOW_PRIVATE": "1"}).media_allow_private is True
    with pytest.raises(SettingsError, match="--media-path"):
        parse_serve_args(["--media-path", str(tmp_path / "missing")], environ={})
