"""Ollama's model names, read by Ollama's own grammar (ollama/ollama, types/model/name.go), so that a name
Ollama answers with a 400 is a 400 here too, on every route that takes one (/api/create, /api/copy,
/api/delete, /api/pull, /api/show). Pure.

A name is `[host/][namespace/]model[:tag]` (an `http://` or `https://` before the host is dropped); a part
left out takes Ollama's default, a part promised by its separator but empty (`x:`, `/x`) is invalid. Each
part starts with a letter, digit or `_` and goes on with those, `-` and `.` (never `.` in a namespace; `:`
only in a host, for its port); a host is at most 350 bytes, any other part at most 80. So `../escaped` (a
namespace `..`) and `a b` are refused, `hf.co/owner/repo:Q4_K_M` and `tutor` are not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kinetic.errors import InvalidRequestError

DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
# One pattern per part; `re.ASCII` so that \w-like ranges stay bytes Ollama accepts.
_PART = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}", re.ASCII),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}", re.ASCII),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}", re.ASCII),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}", re.ASCII),
}
GRAMMAR = ("[host/][namespace/]model[:tag], each part letters, digits, '_', '-' and '.' (none in a namespace), "
           "starting with a letter, a digit or '_'")


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    @property
    def is_valid(self) -> bool:
        return all(_PART[part].fullmatch(getattr(self, part)) for part in _PART)


def parse_name(name: str) -> OllamaName:
    """The parts of `name`, Ollama's defaults in those it leaves out (ParseName, then IsValid to check)."""
    rest, tag = name, DEFAULT_TAG
    if rest.rfind(":") > rest.rfind("/"):  # a tag never holds '/', so a ':' after the last '/' starts it
        rest, tag = rest.rsplit(":", 1)
    if "/" not in rest:
        return OllamaName(DEFAULT_HOST, DEFAULT_NAMESPACE, rest, tag)
    rest, model = rest.rsplit("/", 1)
    if "/" not in rest:
        return OllamaName(DEFAULT_HOST, rest, model, tag)
    host, namespace = rest.rsplit("/", 1)
    return OllamaName(host.split("://", 1)[-1], namespace, model, tag)


def is_valid_name(name: str) -> bool:
    return parse_name(name).is_valid


def check_name(name: str, field: str) -> str:
    """`name` when Ollama's grammar takes it; else a 400 in Ollama's words (/api/copy's `destination "x" is
    invalid`), naming the field, and the grammar."""
    if not is_valid_name(name):
        raise InvalidRequestError(f'{field} "{name}" is invalid: an Ollama model name is {GRAMMAR}', param=field)
    return name
