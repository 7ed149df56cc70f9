"""Loading the files a request names by URL (http(s)://, file://) before the chat layer sees the request.

The translators leave such a part as its URL (kinetic/protocols/common/media.py); a local backend fills in
its bytes here. Both doors are guarded, because a server in a classroom sits on the school's network:

- `file://` follows llama-server's rules and words (server-common.cpp `handle_media`, llama.cpp's
  test_security.py `test_local_media_file`): refused without --media-path, the path checked by
  llama.cpp's `fs_validate_filename` (no `..`, no `:`...), read from under that folder only. kinetic also
  resolves symbolic links and refuses a file that a link takes out of the folder, which llama-server reads.
- `http(s)://` fetches are checked before they connect: every address the host resolves to must be a public
  one (unless the policy allows private, loopback, link-local... addresses), and the connection goes to the
  address that was checked, with the name in the Host header and as the TLS server name, so a DNS answer that
  changes between the check and the connection (DNS rebinding) cannot steer it. Redirects are followed by
  hand, each hop checked again. The body is cut at the policy's size (llama-server's 10 MiB) and the whole
  fetch at its timeout (llama-server's 10 s).

Every refusal is a 400 whose `param` is the part's field.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import httpx

from kinetic import __version__
from kinetic.chat.types import ChatRequest, MediaPart, Message, PromptRequest
from kinetic.errors import InvalidRequestError

log = logging.getLogger(__name__)

REDIRECTS = (301, 302, 303, 307, 308)
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from. The defaults are llama-server's (no keys: an open server fetches anything)."""

    media_path: Path | None = None  # --media-path: file:// allowed only under it
    allow_private: bool = True  # fetch from private, loopback, link-local, reserved addresses
    max_bytes: int = 10 * 1024 * 1024  # llama-server's cap
    timeout_s: float = 10.0  # llama-server's
    max_redirects: int = 5


def refused(part: MediaPart, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"Field '{part.param}': {why}", param=part.param)


# ------------------------------------------------------------------------------------ requests


def _to_load(parts: Iterable[MediaPart]) -> list[MediaPart]:
    return [part for part in parts if part.data is None and part.url is not None]


def _chat_media(req: ChatRequest) -> list[MediaPart]:
    return _to_load(part for message in req.messages for part in message.parts or ()
                    if isinstance(part, MediaPart))


async def _load_all(parts: list[MediaPart], policy: MediaPolicy) -> dict[MediaPart, MediaPart]:
    """Each part loaded, side by side (a request's images download at once), as {part: loaded part}. The
    first refusal cancels the other loads."""
    loaded: dict[MediaPart, MediaPart] = {}

    async def one(part: MediaPart) -> None:
        loaded[part] = await load_media(part, policy)

    try:
        async with anyio.create_task_group() as group:
            for part in dict.fromkeys(parts):  # the same file named twice in one field is loaded once
                group.start_soon(one, part)
    except ExceptionGroup as failed:  # the client is told the first refusal, as from a plain call
        first: BaseException = failed
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return loaded


async def resolve_chat(req: ChatRequest, policy: MediaPolicy) -> ChatRequest:
    """The request with every URL part's bytes loaded; the same request when it has none."""
    pending = _chat_media(req)
    if not pending:
        return req
    loaded = await _load_all(pending, policy)

    def message(m: Message) -> Message:
        if m.parts is None:
            return m
        return replace(m, parts=tuple(loaded.get(part, part) if isinstance(part, MediaPart) else part
                                      for part in m.parts))

    return replace(req, messages=tuple(message(m) for m in req.messages))


async def resolve_prompt(req: PromptRequest, policy: MediaPolicy) -> PromptRequest:
    """The prompt with its URL media loaded; the same request when it has none (/completion's files are inline)."""
    pending = _to_load(req.media)
    if not pending:
        return req
    loaded = await _load_all(pending, policy)
    return replace(req, media=tuple(loaded.get(part, part) for part in req.media))


async def load_media(part: MediaPart, policy: MediaPolicy) -> MediaPart:
    """The part with its bytes: read from --media-path, or downloaded; a part that has them is returned as is."""
    if part.data is not None or part.url is None:
        return part
    scheme = part.url.split(":", 1)[0].lower()
    if scheme == "file":
        data = await anyio.to_thread.run_sync(read_local, part, policy)
    elif scheme in ("http", "https"):
        data = await download(part, policy)
    else:
        raise refused(part, f"unsupported URL scheme '{scheme}': use http(s)://, file:// or a data: URL")
    return replace(part, data=data)


# ------------------------------------------------------------------------------------ file://

# llama.cpp's fs_validate_filename: control characters, look-alikes of / \ and ., and : * ? " < > |
_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\uff0e\u2215\u2216\ud800-\udfff\ufffd\ufeff:*?\"<>|]")


def allowed_path(path: str) -> bool:
    """llama.cpp's fs_validate_filename(path, allow_subdirs=true), the check llama-server puts a file:// path to."""
    if not path or len(path) > 255 or _FORBIDDEN.search(path):
        return False
    return not (path[0] == " " or path[-1] in " ." or ".." in path or path == ".")


def read_local(part: MediaPart, policy: MediaPolicy) -> bytes:
    """A file:// part's bytes from under --media-path. Blocking: run in a worker thread."""
    assert part.url is not None
    if policy.media_path is None:
        raise refused(part, "file:// URLs are not allowed unless --media-path is specified")
    relative = part.url[len("file://"):]
    if not allowed_path(relative):
        raise refused(part, f"file path is not allowed: {relative}")
    root = policy.media_path.resolve()
    # as llama-server joins "folder/" + path: leading and doubled separators name the same file
    path = root.joinpath(*(piece for piece in re.split(r"[/\\]", relative) if piece))
    try:
        real = path.resolve(strict=True)
        if not real.is_relative_to(root):  # a symbolic link out of the folder
            raise refused(part, f"file path is not allowed: {relative}")
        with real.open("rb") as file:
            data = file.read(policy.max_bytes + 1)
    except OSError:
        raise refused(part, f"file does not exist or cannot be opened: {relative}") from None
    if len(data) > policy.max_bytes:
        raise refused(part, f"the file is larger than {policy.max_bytes} bytes: {relative}")
    return data


# ------------------------------------------------------------------------------------ http(s)://


def is_public(address: IpAddress) -> bool:
    """A globally routable unicast address, also when an IPv6 address carries an IPv4 one (mapped, 6to4,
    Teredo): what a fetch may reach from a server that does not allow private addresses."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [a for a in (address.ipv4_mapped, address.sixtofour, *(address.teredo or ())) if a is not None]
        if any(not is_public(inner) for inner in embedded):
            return False
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified
                                      or address.is_loopback or address.is_link_local or address.is_private)


async def vetted_address(part: MediaPart, url: httpx.URL, policy: MediaPolicy) -> str:
    """The address to connect to for `url`: every address its host resolves to checked, the first taken."""
    host = url.raw_host.decode("ascii")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise refused(part, f"could not resolve the host '{host}'") from None
        # scope ids (fe80::1%eth0) are dropped: the address's kind is what is checked
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not addresses:
        raise refused(part, f"could not resolve the host '{host}'")
    if not policy.allow_private:
        for address in addresses:
            if not is_public(address):
                raise refused(part, f"the host '{host}' is a private, loopback, link-local or reserved address "
                                    f"({address}), which this server does not fetch from")
    return str(addresses[0])


def checked_url(part: MediaPart, raw: str | httpx.URL) -> httpx.URL:
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as err:
        raise refused(part, f"invalid URL: {err}") from None
    if url.scheme not in ("http", "https"):
        raise refused(part, f"unsupported URL scheme '{url.scheme}': media is fetched over http(s) only")
    if not url.raw_host:
        raise refused(part, "the URL has no host")
    return url


async def download(part: MediaPart, policy: MediaPolicy) -> bytes:
    """An http(s):// part's bytes, within the policy's addresses, redirects, size and time."""
    assert part.url is not None
    log.info("downloading media from %s", part.url)
    try:
        with anyio.fail_after(policy.timeout_s):
            # trust_env off: a proxy from the environment would connect somewhere other than the vetted address
            async with httpx.AsyncClient(timeout=policy.timeout_s, follow_redirects=False, trust_env=False,
                                         headers={"user-agent": f"kinetic/{__version__}"}) as client:
                return await _follow(client, part, policy)
    except TimeoutError:
        raise refused(part, f"the download took longer than {policy.timeout_s:g} s") from None
    except httpx.HTTPError as err:
        raise refused(part, f"the download failed: {str(err) or type(err).__name__}") from None


async def _follow(client: httpx.AsyncClient, part: MediaPart, policy: MediaPolicy) -> bytes:
    assert part.url is not None
    url = checked_url(part, part.url)
    for _ in range(policy.max_redirects + 1):
        address = await vetted_address(part, url, policy)
        host = url.raw_host.decode("ascii")
        netloc = url.netloc.decode("ascii")
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        request = client.build_request("GET", url.copy_with(host=address), headers={"host": netloc},
                                       extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.status_code in REDIRECTS and "location" in response.headers:
                url = checked_url(part, url.join(response.headers["location"]))
                continue
            return await _body(response, part, policy)
        finally:
            await response.aclose()
    raise refused(part, f"too many redirects (more than {policy.max_redirects})")


async def _body(response: httpx.Response, part: MediaPart, policy: MediaPolicy) -> bytes:
    """The body of a final answer, streamed and cut at the size limit."""
    if not 200 <= response.status_code < 300:
        raise refused(part, f"the download failed: HTTP {response.status_code}")
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > policy.max_bytes:
        raise refused(part, f"the file is larger than {policy.max_bytes} bytes ({length})")
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > policy.max_bytes:
            raise refused(part, f"the file is larger than {policy.max_bytes} bytes")
        chunks.append(chunk)
    if not size:
        raise refused(part, "the download was empty")
    return b"".join(chunks)
