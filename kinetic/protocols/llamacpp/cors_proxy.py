"""llama-server's CORS proxy: `GET|POST /cors-proxy?url=...` sends the request on for a browser page
(llama-server's web UI uses it to reach MCP servers that send no CORS headers).

Off unless `--ui-mcp-proxy` (or `--agent`) is given: then the route answers 403 feature_disabled, as
llama-server's does. The safety limits are llama-server's (tools/server/server-cors-proxy.h and
server_http_proxy in server-models.cpp):
- only http and https targets, and no credentials inside the URL;
- none of the caller's own headers travel (its Authorization, cookies, API key stay here): only those
  it spells `x-llama-server-proxy-header-NAME`, sent as NAME; Accept-Encoding, Transfer-Encoding and
  Content-Length among them are dropped, and Host is the target's;
- the answer comes back streamed with its status and headers, less Server, Transfer-Encoding,
  Content-Length, Keep-Alive and the target's Access-Control-* (this server's CORS headers apply);
- redirects are followed, and the target has 10 minutes to answer.
The caller needs a valid API key like any other route (the gate checks it first).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from kinetic.errors import FeatureDisabledError, InvalidRequestError, ServerError
from kinetic.model_registry.deps import RegistryDep

router = APIRouter()

HEADER_PREFIX = "x-llama-server-proxy-header-"
DROPPED_REQUEST_HEADERS = frozenset({"accept-encoding", "transfer-encoding", "content-length", "host"})
DROPPED_RESPONSE_HEADERS = frozenset({"server", "transfer-encoding", "content-length", "keep-alive"})
TIMEOUT_S = 600.0  # llama-server's read and write timeout for the proxied request


def target_url(raw: str | None) -> str:
    """The `url` parameter, checked as llama-server checks it (400 naming the problem)."""
    if not raw:
        raise InvalidRequestError("invalid target URL: missing host", param="url")
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise InvalidRequestError(f"unsupported URL scheme in target URL: {parts.scheme}", param="url")
    if parts.password is not None or parts.username is not None:
        raise InvalidRequestError("authentication in target URL is not supported", param="url")
    if not parts.hostname:
        raise InvalidRequestError("invalid target URL: missing host", param="url")
    return raw if parts.path else raw.replace(parts.netloc, parts.netloc + "/", 1)


def forwarded_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Only the headers the page spelled for the target, without their prefix."""
    out: dict[str, str] = {}
    for key, value in headers:
        lowered = key.lower()
        if not lowered.startswith(HEADER_PREFIX):
            continue
        name = key[len(HEADER_PREFIX):]
        if name and name.lower() not in DROPPED_REQUEST_HEADERS:
            out[name] = value
    return out


def returned_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items()
            if k.lower() not in DROPPED_RESPONSE_HEADERS and not k.lower().startswith("access-control-")}


async def proxy(request: Request, registry: RegistryDep, method: str) -> StreamingResponse:
    if not registry.settings.cors_proxy:
        raise FeatureDisabledError("this feature is disabled")
    url = target_url(request.query_params.get("url"))
    body = await request.body() if method == "POST" else None
    client = httpx.AsyncClient(follow_redirects=True, timeout=TIMEOUT_S, trust_env=False)
    del client.headers["accept-encoding"]  # the body comes back as sent: no compression asked for
    try:
        upstream = await client.send(client.build_request(method, url, headers=forwarded_headers(
            request.headers.items()), content=body), stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise ServerError(f"proxy error: {type(exc).__name__}: {exc}") from None

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    # aiter_raw: byte for byte, Content-Encoding and all
    return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                             headers=returned_headers(upstream.headers), background=BackgroundTask(close))


@router.get("/cors-proxy")
async def cors_proxy_get(request: Request, registry: RegistryDep) -> StreamingResponse:
    return await proxy(request, registry, "GET")


@router.post("/cors-proxy")
async def cors_proxy_post(request: Request, registry: RegistryDep) -> StreamingResponse:
    return await proxy(request, registry, "POST")
