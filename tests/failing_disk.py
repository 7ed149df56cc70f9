"""A disk that answers EIO on demand: a FUSE file system (mfusepy over libfuse 3) that passes every call through to a
real folder, until `failing` is set; then every call that would change a file fails with EIO, as a disk whose
controller has died does. The kernel really returns EIO to the process that writes (a `kinetic serve`): nothing is
mocked.

The mount runs in a thread of the test process. Attributes are never cached (`attr_timeout=0`), so a writer that
reads its file's size after a write (the ledger does, to cut back a failed line) sees the real one.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

CHANGES = ("create", "write", "truncate", "fsync", "rename", "unlink", "mkdir", "rmdir", "chmod", "utimens")


def fuse_unavailable() -> str | None:
    """Why a FUSE mount cannot be made here, or None."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian: apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401  (it loads libfuse when imported)
    except (ImportError, OSError) as exc:  # libfuse missing: mfusepy raises at import
        return f"mfusepy cannot load libfuse: {exc}"
    return None


class FailingDisk:
    """`mount` shows `backing`; set `failing` to make every change fail with EIO."""

    def __init__(self, root: Path):
        self.backing = root / "backing"
        self.mount = root / "mount"
        self.backing.mkdir()
        self.mount.mkdir()
        self.failing = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import mfusepy

        operations = _passthrough(self, mfusepy)
        self._thread = threading.Thread(target=mfusepy.FUSE, args=(operations, str(self.mount)), daemon=True,
                                        kwargs={"foreground": True, "nothreads": False, "attr_timeout": 0,
                                                "entry_timeout": 0, "negative_timeout": 0, "direct_io": True})
        self._thread.start()
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mount):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the FUSE mount at {self.mount} did not come up")
            time.sleep(0.05)

    def stop(self) -> None:
        subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False, timeout=30)
        if self._thread is not None:
            self._thread.join(timeout=10)


def _passthrough(disk: FailingDisk, mfusepy: Any) -> Any:
    """The operations, written against mfusepy's class (imported only where FUSE is there)."""

    class Passthrough(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def _path(self, path: str) -> str:
            return str(disk.backing / path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self._path(path))
            return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_size": st.st_size, "st_uid": st.st_uid,
                    "st_gid": st.st_gid, "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                    "st_ctime": st.st_ctime_ns}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._path(path))]

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._path(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(self._path(path))
            return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                      "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return os.open(self._path(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

        def open(self, path: str, flags: int) -> int:
            return os.open(self._path(path), flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return os.pwrite(fh, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            os.truncate(self._path(path), length)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            os.fsync(fh)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def rename(self, old: str, new: str) -> int:
            os.replace(self._path(old), self._path(new))
            return 0

        def unlink(self, path: str) -> int:
            os.unlink(self._path(path))
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._path(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._path(path))
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._path(path), mode)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                os.utime(self._path(path))
            else:
                os.utime(self._path(path), ns=times)
            return 0

    def failing_first(change: Any) -> Any:
        def checked(self: Any, *args: Any) -> Any:
            if disk.failing:
                raise mfusepy.FuseOSError(errno.EIO)
            return change(self, *args)
        return checked

    for name in CHANGES:  # mfusepy calls each operation by name: the switch goes in front of each change
        setattr(Passthrough, name, failing_first(getattr(Passthrough, name)))
    return Passthrough()
