"""One name's upstream servers: cache-affine routing (affinity.py) over the members in rotation.

A member that refuses connections or answers 5xx before the first byte is taken out of rotation and
the request tried on the next one. Every member is probed (GET /models, then its load: load.py) every
10 seconds (--upstream-probe-interval), and one out of rotation also when a request comes 3 seconds or
more after it failed; it comes back when it answers. A drained member takes no new request and
finishes those it has; undrained, it is back in rotation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from kinetic.backends.sources import UpstreamSpec
from kinetic.backends.upstream.affinity import AffinityTable, PoolPolicy, PromptPrint, Reason, prompt_print
from kinetic.backends.upstream.load import LoadReading, read_load
from kinetic.engine.types import Finished
from kinetic.errors import (
    InvalidRequestError,
    KineticError,
    NotFoundError,
    NotSupportedError,
    RateLimitError,
    UnauthorizedError,
    UnavailableError,
)

log = logging.getLogger(__name__)

RETRY_DOWN_AFTER_S = 3.0  # a member out of rotation is probed again after this long
PROBE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0  # a long generation may pause between chunks while the upstream is busy
DRAIN_POLL_S = 0.05
STATUS_ERRORS: dict[int, type[KineticError]] = {400: InvalidRequestError, 401: UnauthorizedError,
                                                404: NotFoundError, 429: RateLimitError}


@dataclass(eq=False)  # members are told apart by identity: the affinity table keeps their index
class Member:
    spec: UpstreamSpec
    outstanding: int = 0
    healthy: bool = True
    down_since: float = 0.0
    last_error: str = ""
    draining: bool = False
    reading: LoadReading | None = None  # the member's own figures at the last probe
    foreign: int = 0  # requests the member counted that kinetic did not send it, at the last probe
    served: int = 0
    affine: int = 0  # of them, sent because it held the conversation
    prompt_tokens: int = 0  # over the answers that said (usage), and how many its cache answered
    cached_tokens: int = 0

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.spec.key}"} if self.spec.key else {}

    @property
    def root(self) -> str:
        """The server's root, where its native routes (/slots, /metrics, /tokenize) are."""
        return self.spec.url.removesuffix("/v1")

    @property
    def load(self) -> int:
        return self.outstanding + self.foreign

    @property
    def state(self) -> str:
        return "down" if not self.healthy else "draining" if self.draining else "ready"

    def status(self, conversations: int = 0) -> dict[str, Any]:
        """As the admin's /v1/models and the dashboard show it."""
        hit_rate = round(self.cached_tokens / self.prompt_tokens, 3) if self.prompt_tokens else None
        return {"url": self.spec.url, "state": self.state, "healthy": self.healthy, "draining": self.draining,
                "outstanding": self.outstanding, "load": self.load,
                "reported": self.reading.to_dict() if self.reading else None, "served": self.served,
                "affine": self.affine, "conversations": conversations, "cache_hit_rate": hit_rate,
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
    def __init__(self, name: str, specs: tuple[UpstreamSpec, ...], policy: PoolPolicy | None = None):
        self.name = name
        self.members = [Member(spec) for spec in specs]
        self.policy = policy or PoolPolicy()
        self.model = specs[0].model or name if specs else name  # the id the members know it by
        self.affinity = AffinityTable()
        self.routed: dict[str, int] = {}  # requests by why their member was picked (Reason)
        self._client: httpx.AsyncClient | None = None
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ health and load

    def watch(self) -> None:
        """Starts the periodic health check (from the event loop, on first use)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.policy.probe_interval_s)
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
            if not ok:
                member.last_error = f"HTTP {response.status_code} from /models"
        except httpx.HTTPError as exc:
            ok, member.last_error = False, str(exc) or type(exc).__name__
        if ok:
            await self._read_load(member)
        if ok and not member.healthy:
            log.info("upstream %s (%s) is back in rotation", member.spec.url, self.name)
        if not ok and member.healthy:
            self.affinity.forget(self.members.index(member))
        member.healthy = ok
        if not ok:
            member.down_since = time.monotonic()

    async def _read_load(self, member: Member) -> None:
        """The member's own count; what it has beyond kinetic's (before or after the read, whichever is
        more, so a request sent or ended meanwhile is not taken for another's) is added to its load."""
        before = member.outstanding
        source = member.reading.source if member.reading else None
        member.reading = await read_load(self.client, member.root, member.headers, self.model, first=source,
                                         timeout=PROBE_TIMEOUT_S)
        member.foreign = max(0, member.reading.busy - max(before, member.outstanding)) if member.reading else 0

    def mark_down(self, member: Member, reason: str) -> None:
        if member.healthy:
            log.warning("upstream %s (%s) taken out of rotation: %s", member.spec.url, self.name, reason)
            self.affinity.forget(self.members.index(member))
        member.healthy, member.down_since, member.last_error = False, time.monotonic(), reason

    async def candidates(self, fp: PromptPrint | None = None) -> tuple[list[Member], Reason]:
        """The members in rotation in the order to try them (affinity.py), and why the first; members
        down long enough are probed first. A drained member is never one."""
        self.watch()
        down = [m for m in self.members if not m.healthy and not m.draining]
        due = [m for m in down if time.monotonic() - m.down_since >= RETRY_DOWN_AFTER_S]
        if len(down) == sum(not m.draining for m in self.members):
            due = down  # all out of rotation: look at every one again now rather than fail
        if due:
            await asyncio.gather(*(self._probe(m) for m in due))
        loads = {i: m.load for i, m in enumerate(self.members) if m.healthy and not m.draining}
        order, reason = self.affinity.route(fp, loads, self.policy)
        return [self.members[i] for i in order], reason

    def statuses(self) -> list[dict[str, Any]]:
        return [m.status(self.affinity.conversations[i]) for i, m in enumerate(self.members)]

    async def close(self) -> None:
        self.stop_watching()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # ------------------------------------------------------------ maintenance

    def find(self, url: str) -> Member | None:
        """The member at `url` as --upstream gave it or /v1/models shows it (with or without /v1)."""
        wanted = url.strip().rstrip("/").removesuffix("/v1")
        return next((m for m in self.members if m.root == wanted), None)

    async def drain(self, member: Member, *, wait_s: float = 0.0) -> None:
        """No new request goes to `member`; those it has finish. With `wait_s`, returns once they have
        (or that time is up)."""
        if not member.draining:
            log.info("upstream %s (%s) drained: %d requests to finish", member.spec.url, self.name,
                     member.outstanding)
        member.draining = True
        deadline = time.monotonic() + wait_s
        while member.outstanding and member.draining and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    async def undrain(self, member: Member) -> None:
        """Back in rotation, once it answers a probe."""
        member.draining = False
        await self._probe(member)
        log.info("upstream %s (%s) back from drain (%s)", member.spec.url, self.name, member.state)

    # ------------------------------------------------------------ requests

    async def open(self, route: str, payload: dict[str, Any], *, native: bool = False,
                   client: str = "") -> tuple[Member, httpx.Response]:
        """The first member that answers `route` (under its OpenAI base URL, or at the server's root
        when `native`), streaming, its `outstanding` counted until the caller closes the response
        (`done`); members that fail are marked down and the next one tried. `client` (the key's name)
        keys the conversation whose member is looked for."""
        tried: list[str] = []
        fp = None if native else prompt_print(payload, client)
        members, reason = await self.candidates(fp)
        for member in members:
            base = member.root if native else member.spec.url
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
                self._served(member, fp, reason if member is members[0] else "moved")
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
        if drained := sum(m.draining for m in self.members):
            detail += f" ({drained} of its {len(self.members)} servers drained)"
        raise UnavailableError(f"no upstream server for model '{self.name}' is reachable{detail}")

    def _served(self, member: Member, fp: PromptPrint | None, reason: Reason) -> None:
        member.served += 1
        member.affine += reason == "affine"
        self.routed[reason] = self.routed.get(reason, 0) + 1
        if fp is not None:
            self.affinity.record(fp, self.members.index(member))

    def answered(self, member: Member, finished: Finished) -> None:
        """An answer's counts: how much of its prompt the member's cache held (llama-server's and kinetic's
        timings say, else OpenAI's usage)."""
        timings, usage = finished.timings, finished.usage
        cached = max(timings.cache_n, usage.cached_tokens)
        member.prompt_tokens += usage.prompt_tokens or timings.prompt_n + timings.cache_n
        member.cached_tokens += cached

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
