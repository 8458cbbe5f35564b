"""Atomic file writes: a reader sees the old file or the new one, never a half-written one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``.

    The temp file is removed if anything fails, so no partial file is ever left behind.

    Args:
        path: the target file; its folder must exist. An existing file is replaced.
        data: the complete new contents.
        fsync: flush the data to disk before the rename (durability across a crash).

    Raises:
        OSError: the temp file cannot be created, written or renamed onto ``path``.
    """
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            if fsync:
                tmp.flush()
                os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
