"""API keys with names: `--api-key` values and `--api-key-file` lines `KEY [name] [field=value ...]`
(`#` comments). The fields are the key's limits (budget, dates, hours, models, priority), and a line
`* field=value ...` sets them for every key line below it: see limits.py.

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

from kinetic.classroom.limits import LimitError, Limits, apply_fields, parse_fields

NAME_RE = re.compile(r"^[\w.@+-]{1,64}$")


@dataclass(frozen=True)
class KeyEntry:
    key: str
    name: str
    limits: Limits = Limits()


class KeyFileError(ValueError):
    """A line of the key file that cannot be read: says which line and why."""


def parse_key_lines(text: str, *, first_index: int = 1, source: str = "key file") -> list[KeyEntry]:
    """`KEY [name] [field=value ...]` per line, and `* field=value ...` for the defaults of the lines
    below; blank lines and `#` comments (whole line or after the entry) ignored."""
    entries: list[KeyEntry] = []
    defaults = Limits()
    for number, raw in enumerate(text.splitlines(), start=1):
        # A comment is a whole line starting with #, or " #..." after the entry (keys may hold a #).
        line = "" if raw.lstrip().startswith("#") else re.split(r"\s#", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        parts = line.split()
        named = len(parts) > 1 and "=" not in parts[1] and parts[0] != "*"
        try:
            limits = apply_fields(Limits() if parts[0] == "*" else defaults, parse_fields(parts[2 if named else 1:]))
        except LimitError as exc:
            raise KeyFileError(f"{source}, line {number}: {exc}") from None
        if parts[0] == "*":
            defaults = limits
            continue
        name = parts[1] if named else f"key-{first_index + len(entries)}"
        if not NAME_RE.match(name):
            raise KeyFileError(f"{source}, line {number}: the name {name!r} may only hold letters, digits "
                               "and . _ @ + -")
        entries.append(KeyEntry(parts[0], name, limits))
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
        """The name of the key sent, or None."""
        entry = self.entry_for(sent)
        return entry.name if entry is not None else None

    def entry_for(self, sent: str) -> KeyEntry | None:
        """The entry of the key sent, or None. Compares against every key in constant time each."""
        sent_bytes = sent.encode()
        found = None
        with self._lock:
            entries = self._entries
        for entry in entries:
            if secrets.compare_digest(sent_bytes, entry.key.encode()) and found is None:
                found = entry
        return found

    def entry_named(self, name: str) -> KeyEntry | None:
        """The first key of that name: whose limits a batch's line runs under, looked up when it runs."""
        with self._lock:
            entries = self._entries
        return next((entry for entry in entries if entry.name == name), None)

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
