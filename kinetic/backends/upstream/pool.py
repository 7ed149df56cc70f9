"""One name's upstream servers: least outstanding requests first, failing members out of rotation.

A member that refuses connections or answers 5xx before the first byte is taken out of rotation and
the request tried on the next one. Every member is probed (GET /models) every 10 seconds, and one out
of rotation also when a request comes 3 seconds or more after it failed; it comes back when it answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from kinetic.errors import (
    InvalidRequestError,
    KineticError,
    NotFoundError,
    NotSupportedError,
    RateLimitError,
    UnauthorizedError,
    UnavailableError,
)
from kinetic.model_registry.sources import UpstreamSpec

log = logging.getLogger(__name__)

RETRY_DOWN_AFTER_S = 3.0  # a member out of rotation is probed again after this long
HEALTH_INTERVAL_S = 10.0  # every member is probed this often while the server runs
PROBE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0  # a long generation may pause between chunks while the upstream is busy
STATUS_ERRORS: dict[int, type[KineticError]] = {400: InvalidRequestError, 401: UnauthorizedError,
                                                404: NotFoundError, 429: RateLimitError}


@dataclass
class Member:
    spec: UpstreamSpec
    outstanding: int = 0
    healthy: bool = True
    down_since: float = 0.0
    last_error: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.spec.key}"} if self.spec.key else {}

    def status(self) -> dict[str, Any]:
        """As /v1/models shows it: its URL, whether it is in rotation, its requests outstanding."""
        return {"url": self.spec.url, "healthy": self.healthy, "outstanding": self.outstanding,
                **({"error": self.last_error} if not self.healthy and self.last_error else {})}


def upstream_error(status: int, body: bytes) -> KineticError:
    """The upstream's 4xx as kinetic's own error kind, with its message."""
    try:
        parsed = json.loads(body)
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
        message = error.get("message") if isinstance(error, dict) else str(error)
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = None
    message = f"upstream: {message or body[:200].decode('utf-8', 'replace') or f'HTTP {status}'}"
    kind = STATUS_ERRORS.get(status, InvalidRequestError)
    return kind(message) if kind is not RateLimitError else RateLimitError(message)


class UpstreamPool:
    def __init__(self, name: str, specs: tuple[UpstreamSpec, ...]):
        self.name = name
        self.members = [Member(spec) for spec in specs]
        self._client: httpx.AsyncClient | None = None
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ health

    def watch(self) -> None:
        """Starts the periodic health check (from the event loop, on first use)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await asyncio.gather(*(self._probe(m) for m in self.members))

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        return self._client

    async def check_now(self) -> None:
        """Probes every member at once (at load time)."""
        await asyncio.gather(*(self._probe(m) for m in self.members))

    async def _probe(self, member: Member) -> None:
        try:
            response = await self.client.get(member.spec.url + "/models", headers=member.headers,
                                              timeout=PROBE_TIMEOUT_S)
            ok = response.is_success
        except httpx.HTTPError as exc:
            ok, member.last_error = False, str(exc) or type(exc).__name__
        if ok and not member.healthy:
            log.info("upstream %s (%s) is back in rotation", member.spec.url, self.name)
        member.healthy = ok
        if not ok:
            member.down_since = time.monotonic()

    def mark_down(self, member: Member, reason: str) -> None:
        if member.healthy:
            log.warning("upstream %s (%s) taken out of rotation: %s", member.spec.url, self.name, reason)
        member.healthy, member.down_since, member.last_error = False, time.monotonic(), reason

    async def candidates(self) -> list[Member]:
        """Healthy members, fewest outstanding first; members down long enough are probed first."""
        self.watch()
        down = [m for m in self.members if not m.healthy]
        due = [m for m in down if time.monotonic() - m.down_since >= RETRY_DOWN_AFTER_S]
        if len(down) == len(self.members):
            due = down  # all out of rotation: look at every one again now rather than fail
        if due:
            await asyncio.gather(*(self._probe(m) for m in due))
        return sorted((m for m in self.members if m.healthy), key=lambda m: m.outstanding)

    async def close(self) -> None:
        self.stop_watching()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # ------------------------------------------------------------ requests

    async def open(self, route: str, payload: dict[str, Any], *,
                   native: bool = False) -> tuple[Member, httpx.Response]:
        """The first member that answers `route` (under its OpenAI base URL, or at the server's root
        when `native`), streaming, its `outstanding` counted until the caller closes the response
        (`done`); members that fail are marked down and the next one tried."""
        tried: list[str] = []
        for member in await self.candidates():
            base = member.spec.url.removesuffix("/v1") if native else member.spec.url
            member.outstanding += 1
            try:
                request = self.client.build_request("POST", base + route, json=payload, headers=member.headers)
                response = await self.client.send(request, stream=True)
            except httpx.HTTPError as exc:
                member.outstanding -= 1
                self.mark_down(member, str(exc) or type(exc).__name__)
                tried.append(member.spec.url)
                continue
            if response.status_code < 400:
                return member, response
            body = await response.aread()
            await response.aclose()
            member.outstanding -= 1
            if native and response.status_code in (404, 405, 501):
                raise NotSupportedError(
                    f"model '{self.name}' cannot serve {route}: its upstream server ({member.spec.url}) has no "
                    "such route (a kinetic or llama-server upstream has it; an OpenAI-only server does not), "
                    "and kinetic has no tokenizer or chat template of its own for the model")
            if response.status_code >= 500:
                self.mark_down(member, f"HTTP {response.status_code}")
                tried.append(member.spec.url)
                continue
            raise upstream_error(response.status_code, body)
        detail = f" (tried {', '.join(tried)})" if tried else ""
        raise UnavailableError(f"no upstream server for model '{self.name}' is reachable{detail}")

    async def done(self, member: Member, response: httpx.Response) -> None:
        member.outstanding -= 1
        await response.aclose()

    async def json(self, route: str, payload: dict[str, Any], *, native: bool = False) -> Any:
        """A non-streamed call's JSON answer, with the same failover."""
        member, response = await self.open(route, payload, native=native)
        try:
            return json.loads(await response.aread())
        finally:
            await self.done(member, response)
