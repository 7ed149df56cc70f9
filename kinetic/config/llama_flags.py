"""llama-server's complete flag table, as data: every spelling, how many values it reads, its variable.

The table (`llama_server_flags.json`) is generated from the vendored llama.cpp's `common/arg.cpp` by
scripts/gen_llama_server_flags.py, and a test checks it still matches. kinetic uses it so that any
command line that starts llama-server starts kinetic: flags kinetic implements act, the others are
consumed with exactly their values and warned about.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal

VALUE_COUNT = {"switch": 0, "value": 1, "value2": 2}
# Switches older llama-server versions took and many command lines still carry; the vendored llama.cpp
# replaced them with --load-mode, so they are not in its table. Accepted (and ignored) all the same.
LEGACY_SWITCHES = ((("--mlock",), ()), (("--mmap",), ("--no-mmap",)))  # (names, negations)


@dataclass(frozen=True)
class LlamaFlag:
    names: tuple[str, ...]
    negations: tuple[str, ...]  # `--no-x` spellings of a boolean switch
    kind: Literal["switch", "value", "value2"]
    value_hint: str | None
    env: str | None
    sampling: bool

    @property
    def values(self) -> int:
        """How many of the following arguments the flag consumes (llama-server never reads `=`)."""
        return VALUE_COUNT[self.kind]

    @property
    def negative_env(self) -> str | None:
        """llama-server also honours LLAMA_ARG_NO_X (set to anything) for a switch with `--no-x`."""
        if self.env and self.negations and self.env.startswith("LLAMA_ARG_"):
            return "LLAMA_ARG_NO_" + self.env.removeprefix("LLAMA_ARG_")
        return None


@lru_cache(maxsize=1)
def table() -> dict:
    text = resources.files("kinetic.config").joinpath("llama_server_flags.json").read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def llama_server_flags() -> tuple[LlamaFlag, ...]:
    return tuple(LlamaFlag(names=tuple(row["names"]), negations=tuple(row["negations"]), kind=row["kind"],
                           value_hint=row["value_hint"], env=row["env"], sampling=row["sampling"])
                 for row in table()["flags"])


@lru_cache(maxsize=1)
def by_spelling() -> dict[str, LlamaFlag]:
    """Every spelling (names and negations, legacy switches too) -> its flag."""
    spellings = {name: LlamaFlag(names, negations, "switch", None, None, False)
                 for names, negations in LEGACY_SWITCHES for name in (*names, *negations)}
    spellings.update({name: flag for flag in llama_server_flags() for name in (*flag.names, *flag.negations)})
    return spellings
