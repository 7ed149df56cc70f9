"""Who may call what: the two roles of a class server and the routes only the admin may call.

A server with keys has two roles. A *student* holds a key of `--api-key` or `--api-key-file`: it
uses the server (generation, embeddings, tokenizer, model lists) and sees only its own traffic. The
*admin* holds an `--admin-key` (or a key the key file names `admin`): it also manages the server
(models, slots, props, the CORS proxy, the dashboard's data) and sees everyone. Without any key the
server is open, as llama-server is: every caller is the admin. Two cases keep llama-server's
meaning of a key: with `--api-key` alone (no key file, no admin key) every key may do everything;
with `--admin-key` alone the API stays open and only management needs the admin key.

The gate (app.RequestGate) puts the caller's role in the request's scope; `ADMIN_ROUTES` is the one
list of management routes, and docs/reference/routes.md the table of every route, which
tests/unit/test_roles.py walks against the app.
"""

from __future__ import annotations

import re
from enum import Enum

from kinetic.classroom.keys import KeyRing
from kinetic.errors import ForbiddenError, UnauthorizedError

ADMIN_KEY_HINT = "start kinetic with --admin-key KEY, or name a key `admin` in the key file"


class Role(str, Enum):  # noqa: UP042  StrEnum would change str() and format() of members
    STUDENT = "student"
    ADMIN = "admin"


# (method, path template): the management routes. HEAD goes with GET.
ADMIN_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/models"),  # a download from Hugging Face into the server's disk
    ("DELETE", "/models"),
    ("POST", "/models/load"),
    ("POST", "/models/unload"),
    ("POST", "/api/pull"),
    ("POST", "/api/create"),  # a derived model every student is then served
    ("POST", "/api/copy"),
    ("DELETE", "/api/delete"),
    ("POST", "/api/push"),
    ("POST", "/models/drain"),
    ("POST", "/models/undrain"),
    ("POST", "/slots/{id_slot}"),
    ("POST", "/props"),
    ("POST", "/lora-adapters"),  # the adapters' scales apply to every request
    ("GET", "/cors-proxy"),
    ("POST", "/cors-proxy"),
    ("GET", "/dashboard/stats"),
)


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(template)) + "$")


_ADMIN_PATTERNS = tuple((method, _pattern(template)) for method, template in ADMIN_ROUTES)


def needs_admin(method: str, path: str) -> bool:
    method = "GET" if method == "HEAD" else method
    return any(method == m and pattern.match(path) for m, pattern in _ADMIN_PATTERNS)


def role_of(keys: KeyRing, sent: str) -> Role:
    """The role of a caller that sent `sent` (maybe empty). The gate has already refused a wrong key on
    a keyed server; on an open server with an admin key, a caller without it is a student."""
    if not keys and not keys.admin_keys:
        return Role.ADMIN  # no keys at all: a laptop alone, everything open as on llama-server
    if keys.is_admin(sent):
        return Role.ADMIN
    if keys and not keys.has_admin and not keys.has_file and keys.name_for(sent) is not None:
        return Role.ADMIN  # --api-key alone: llama-server's operator key, which may do everything
    return Role.STUDENT


def admin_refusal(keys: KeyRing) -> str:
    """The 403's message for a student on a management route."""
    if not keys.has_admin:
        return f"this route needs the admin key, and this server has none: {ADMIN_KEY_HINT}"
    return "this route needs the admin key (--admin-key, or a key named `admin` in the key file): a student's " \
           "key may not call it"


def require_admin(keys: KeyRing, sent: str) -> None:
    """Passes the admin; a student's valid key gets a 403 that says why, no key or a wrong one a 401."""
    if role_of(keys, sent) is Role.ADMIN:
        return
    if sent and keys.name_for(sent) is not None:
        raise ForbiddenError(admin_refusal(keys))
    raise UnauthorizedError("Invalid API Key")
