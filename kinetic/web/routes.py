"""The server's own web pages: the chat page at `/`, the instructor's `/dashboard`, their assets.

Plain static files (kinetic/web/static: no build step, no CDN, since a class may run offline) that
talk to the server's public routes. The pages and their assets need no key, as in llama-server;
what they fetch does: the chat page asks for the key and keeps it in the tab's sessionStorage,
the dashboard asks for an admin key (see classroom.keys) and polls `/dashboard/stats`.

`GET /v1/me` is a key's own standing (its budget used and left, its limits, its last requests),
which the chat page shows in one line; it never shows another key's.

`GET /` is content-negotiated: a browser (`Accept: text/html`) gets the chat page, any other
client Ollama's `Ollama is running`, which Ollama tools probe for. `--no-ui` turns the chat page off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response

from kinetic.backends.base import Slots
from kinetic.classroom.keys import KeyRing
from kinetic.errors import NotFoundError
from kinetic.model_registry.deps import CallerDep, RegistryDep, server_state
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.store_database import StoreDatabase
from kinetic.web.chats import router as chats_router

router = APIRouter()
router.include_router(chats_router)

STATIC = Path(__file__).resolve().parent / "static"
OLLAMA_TEXT = "Ollama is running"
# Assets by name: which page needs them (the chat page's go away with --no-ui).
CHAT_ASSETS = frozenset({"chat.js"})
SHARED_ASSETS = frozenset({"style.css", "dashboard.js", "common.js"})
PUBLIC_PAGES = frozenset({"/", "/dashboard"})


def is_public_page(method: str, path: str) -> bool:
    """The pages and assets: served without a key, and while the model loads (the page says so)."""
    return method in ("GET", "HEAD") and (path in PUBLIC_PAGES or path.startswith("/ui/"))


def wants_html(accept: str) -> bool:
    """Whether an Accept header asks for HTML (a browser), rather than anything (`*/*`, curl, Ollama
    clients) or JSON. `text/html;q=0` refuses it."""
    for part in accept.split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        if media.lower() != "text/html":
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _page(name: str) -> FileResponse:
    # no-cache: a browser revalidates (cheap, ETag) so an upgraded server never runs yesterday's page
    return FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})


def _ui_on(request: Request) -> bool:
    return server_state(request.app).registry.settings.ui


@router.api_route("/", methods=["GET", "HEAD"])
async def index(request: Request) -> Response:
    if _ui_on(request) and wants_html(request.headers.get("accept", "")):
        response: Response = _page("chat.html")
    else:
        response = PlainTextResponse(OLLAMA_TEXT)
    response.headers["Vary"] = "Accept"
    return response


@router.get("/ui/config.json")
async def page_config(request: Request) -> dict[str, Any]:
    """What the pages must know before their first API call: whether to ask for a key first (so a
    student opening the page does not make a 401 that the dashboard would count as their lab's)."""
    keys = server_state(request.app).keys
    return {"api_key_required": bool(keys), "admin_key_required": bool(keys) or keys.has_admin,
            "chat_history": server_state(request.app).chat_store is not None}


@router.get("/v1/me")
async def me(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The caller's own standing: who the key is, its limits, its budget now and its last requests."""
    budgets = server_state(request.app).budgets
    now = budgets.clock()
    standing = budgets.standing(caller, now)
    return {
        "name": caller.name,
        "role": caller.role.value,
        "priority": caller.priority,
        "limits": caller.limits.describe(),
        "budget": standing.describe(now) if standing is not None else None,
        "refused": caller.limits.window_refusal(now) if caller.name is not None else None,
        "recent": budgets.recent(caller.name),
    }


@router.api_route("/ui/{name}", methods=["GET", "HEAD"])
async def asset(name: str, request: Request) -> Response:
    if name in SHARED_ASSETS or (name in CHAT_ASSETS and _ui_on(request)):
        return _page(name)
    raise NotFoundError("File Not Found")


@router.api_route("/dashboard", methods=["GET", "HEAD"])
async def dashboard() -> Response:
    return _page("dashboard.html")  # a shell: every number comes from /dashboard/stats, admin only


@router.get("/dashboard/stats")
async def dashboard_stats(request: Request, registry: RegistryDep) -> dict[str, Any]:
    """Slots and queue of every loaded model (one, or several in router mode), the upstream servers, and
    the class's totals."""
    state = server_state(request.app)  # the gate lets only the admin through (classroom/roles.py)
    keys, stats = state.keys, state.class_stats
    models: list[dict[str, Any]] = []
    slots: list[dict[str, Any]] = []
    upstreams: list[dict[str, Any]] = []  # the servers of each upstream pool, as the admin's /v1/models shows them
    processing = deferred = 0
    by_key: dict[str, int] = {}
    for entry in registry.entries.values():
        backend = entry.backend
        if backend is None or not backend.ready:  # a router's model that is not loaded: no slots to show
            continue
        engine_stats, described = backend.stats(), backend.describe()
        models.append({"name": entry.name, "n_ctx": described.n_ctx, "n_slots": described.n_slots})
        states = backend.slot_states() if isinstance(backend, Slots) else []  # a remote model's are its server's
        slots += [{"model": entry.name, "id": slot.id, "state": "processing" if slot.is_processing else "idle",
                   "key": slot.client if slot.is_processing else None, "n_prompt_tokens": slot.n_prompt_tokens,
                   "n_prompt_tokens_cache": slot.n_prompt_tokens_cache, "n_decoded": slot.n_decoded}
                  for slot in states]
        upstreams += [{"model": entry.name, **member} for member in described.members]
        processing += engine_stats.requests_processing
        deferred += engine_stats.requests_deferred
        for name, count in engine_stats.deferred_by_client.items():
            by_key[name] = by_key.get(name, 0) + count
    return {
        "models": models,
        "slots": slots,
        "upstreams": upstreams,
        "queue": {"processing": processing, "deferred": deferred, "deferred_by_key": dict(sorted(by_key.items())),
                  "max_queue": registry.settings.max_queue},
        # None without --ledger; else "ok" or why the class record cannot be written (the page shows it)
        "ledger": None if state.ledger is None else ("ok" if state.ledger.writable() else state.ledger.problem),
        # what the OpenAI surface keeps for the students (responses, conversations, files, batches): bounded per key
        "store": installed(request.app, StoreDatabase).sizes(),
        **stats.snapshot([name for name in keys.names if name != KeyRing.ADMIN]),
    }
