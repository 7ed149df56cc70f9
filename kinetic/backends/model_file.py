"""The served GGUF's digest, size and mtime (what Ollama calls the digest), read off the event loop
and cached in kinetic's cache dir, so that a model of several GB is hashed once, not on every start."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kinetic.backends.kinetic_cache import cache_dir


@dataclass(frozen=True)
class ModelFile:
    """The served GGUF on disk: its sha256 (what Ollama calls the digest), size and mtime."""

    sha256: str
    size: int
    modified: float  # seconds since the epoch


BUSY_PAUSE_S = 0.05  # per MiB hashed while the engine decodes: at most 20 MiB/s then
DIGEST_CACHE = "digests.json"  # in kinetic's cache dir: path -> size, mtime, sha256


def read_model_file(path: Path, busy: Callable[[], bool] = lambda: False) -> ModelFile:
    """Blocking: the GGUF's sha256, from kinetic's digest cache when the file is unchanged, else
    hashed (seconds for a few GB) and remembered. Hashing slows down while `busy()` (the engine
    is decoding): a core taken by hashing makes llama.cpp's spinning threads stall a stream for a
    second. A model that is not a file on disk (a test engine) gets the hash of its path."""
    try:
        stat = path.stat()
    except OSError:
        return ModelFile(sha256=hashlib.sha256(str(path).encode()).hexdigest(), size=0, modified=0.0)
    cache_file = cache_dir() / DIGEST_CACHE
    try:
        known = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    entry = known.get(str(path.resolve()))
    if isinstance(entry, dict) and entry.get("size") == stat.st_size and entry.get("mtime") == stat.st_mtime:
        return ModelFile(sha256=str(entry["sha256"]), size=stat.st_size, modified=stat.st_mtime)
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                if busy():  # slowed, never stopped: a class keeps the engine busy for hours
                    time.sleep(BUSY_PAUSE_S)
                digest.update(chunk)
    except OSError:
        return ModelFile(sha256=hashlib.sha256(str(path).encode()).hexdigest(), size=0, modified=0.0)
    known[str(path.resolve())] = {"size": stat.st_size, "mtime": stat.st_mtime, "sha256": digest.hexdigest()}
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(known, indent=1), encoding="utf-8")
        temporary.replace(cache_file)
    except OSError:
        pass  # a read-only cache only costs hashing again next start
    return ModelFile(sha256=digest.hexdigest(), size=stat.st_size, modified=stat.st_mtime)
