"""Files a crash cannot half-write: the saved chats and the derived models are each replaced whole."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kinetic.errors import InsufficientStorageError


def write_whole(path: Path, data: bytes, *, what: str) -> None:
    """`path` holds `data` or what it held before, whatever happens: a temporary file beside it, flushed to the
    disk (fsync), then renamed over it (one atomic step on a POSIX file system). A disk that cannot take it
    (full, an I/O error, read-only) is a 507 naming `what`; the old file is left as it was."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    except OSError as exc:
        raise InsufficientStorageError(f"cannot save {what}: {exc.strerror}") from exc
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise InsufficientStorageError(f"cannot save {what}: {exc.strerror}; the saved copy is unchanged") from exc
        raise
