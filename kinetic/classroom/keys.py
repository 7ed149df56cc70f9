"""API keys with names: `--api-key` values and `--api-key-file` lines `KEY [name]` (`#` comments).

The name is who the key belongs to (a student); the server passes it on (ledger, fair queue,
dashboard) and never the key itself. A key without a name gets `key-N`, its position, so that
even an anonymous key can be told apart without writing it anywhere.

Admin keys open the instructor's dashboard: `--admin-key` values, and any key named `admin` in the
key file. On a server that requires keys, an `--admin-key` is also a valid API key (named `admin`);
on an open server it only guards the dashboard.
"""

from __future__ import annotations

import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

NAME_RE = re.compile(r"^[\w.@+-]{1,64}$")


@dataclass(frozen=True)
class KeyEntry:
    key: str
    name: str


class KeyFileError(ValueError):
    """A line of the key file that cannot be read: says which line and why."""


def parse_key_lines(text: str, *, first_index: int = 1, source: str = "key file") -> list[KeyEntry]:
    """`KEY [name]` per line; blank lines and `#` comments (whole line or after the entry) ignored."""
    entries: list[KeyEntry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        # A comment is a whole line starting with #, or " #..." after the entry (keys may hold a #).
        line = "" if raw.lstrip().startswith("#") else re.split(r"\s#", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise KeyFileError(f"{source}, line {number}: expected `KEY [name]`, got {len(parts)} words")
        name = parts[1] if len(parts) == 2 else f"key-{first_index + len(entries)}"
        if not NAME_RE.match(name):
            raise KeyFileError(f"{source}, line {number}: the name {name!r} may only hold letters, digits "
                               "and . _ @ + -")
        entries.append(KeyEntry(parts[0], name))
    return entries


def parse_inline_keys(value: str | None) -> list[KeyEntry]:
    """`--api-key a,b`: unnamed keys, `key-1`, `key-2`..."""
    keys = [k.strip() for k in (value or "").split(",") if k.strip()]
    return [KeyEntry(key, f"key-{index}") for index, key in enumerate(keys, start=1)]


class KeyRing:
    """Every key the server accepts and its name; `reload()` rereads the file (e.g. a student added)."""

    ADMIN = "admin"

    def __init__(self, inline: str | None = None, file: str | Path | None = None, admin: str | None = None):
        self._inline = parse_inline_keys(inline)
        self._file = Path(file) if file else None
        self.admin_keys = tuple(entry.key for entry in parse_inline_keys(admin))
        self._lock = threading.Lock()
        self._entries: tuple[KeyEntry, ...] = ()
        self.reload()

    def reload(self) -> None:
        entries = list(self._inline)
        if self._file is not None:
            text = self._file.read_text(encoding="utf-8")
            entries += parse_key_lines(text, first_index=len(entries) + 1, source=str(self._file))
        if entries:  # a keyed server: the admin may call the API too (an open server needs no key)
            entries += [KeyEntry(key, self.ADMIN) for key in self.admin_keys]
        with self._lock:
            self._entries = tuple(entries)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(entry.key for entry in self._entries)

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(entry.name for entry in self._entries))

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def name_for(self, sent: str) -> str | None:
        """The name of the key sent, or None. Compares against every key in constant time each."""
        sent_bytes = sent.encode()
        found = None
        for entry in self._entries:
            if secrets.compare_digest(sent_bytes, entry.key.encode()) and found is None:
                found = entry.name
        return found

    @property
    def has_file(self) -> bool:
        return self._file is not None

    @property
    def has_admin(self) -> bool:
        return bool(self.admin_keys) or self.ADMIN in self.names

    def is_admin(self, sent: str) -> bool:
        """An `--admin-key`, or a key the key file names `admin`."""
        sent_bytes = sent.encode()
        by_flag = any([secrets.compare_digest(sent_bytes, key.encode()) for key in self.admin_keys])
        return by_flag or (bool(sent) and self.name_for(sent) == self.ADMIN)


def key_from_headers(headers: dict[str, str]) -> str:
    """The key a client sent: `Authorization: Bearer K` or `x-api-key: K` (Anthropic's header)."""
    sent = headers.get("authorization", "") or headers.get("x-api-key", "")
    return sent[len("Bearer "):] if sent.startswith("Bearer ") else sent
