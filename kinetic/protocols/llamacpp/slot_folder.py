"""The folder of slot files (`--slot-save-path`): names that stay inside it, and a cap on its size.

A slot file is a KV cache: tens of MiB on a small model, GBs on a large one. The admin alone may
write them (classroom/roles.py), but one loop of saves under new names would still fill the disk,
so the folder has a size cap (`--slot-save-max`, MiB): a save that takes the folder past it is
deleted again and refused with a message that says what to do.
"""

from __future__ import annotations

from pathlib import Path

from kinetic.errors import InsufficientStorageError, InvalidRequestError

MiB = 1024 * 1024


def slot_path(folder: str | Path, filename: str) -> Path:
    """`filename` (already a bare name, translate.slot_filename) inside `folder`, and nowhere else:
    a name that resolves outside it (a link planted there) is refused like `..`."""
    root = Path(folder).resolve()
    path = (root / filename).resolve()
    if path.parent != root:
        raise InvalidRequestError("Invalid filename: slot files stay inside --slot-save-path", param="filename")
    return path


def folder_bytes(folder: str | Path) -> int:
    root = Path(folder)
    if not root.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in root.iterdir() if entry.is_file())


def check_room(folder: str | Path, max_mib: int, written: Path | None = None) -> None:
    """Raises the 507 when the folder holds more than `max_mib` MiB (0: no cap); `written`, the file
    just saved, is deleted first so that the refusal leaves the folder as it was."""
    if max_mib <= 0:
        return
    total = folder_bytes(folder)
    if total <= max_mib * MiB:
        return
    if written is not None:
        written.unlink(missing_ok=True)
    raise InsufficientStorageError(
        f"the slot files would take {total / MiB:.1f} MiB, more than --slot-save-max {max_mib} MiB: delete old "
        "files from --slot-save-path or start kinetic with a larger --slot-save-max")
