"""Atomic file writes: a reader sees the old file or the new one, never a half-written one.

The temp file lives beside the target as ``.<name>.<host>.<pid>.<random>.tmp`` and gets the mode
a plain ``open()`` would give (``0o666`` less the process umask: 0644 under umask 022), so
schedulers and dashboards running as other users can read the result. A writer killed with
``kill -9`` between creating and renaming its temp file leaves it behind; the first write of a
process to a target removes such leftovers of dead writers on the same host.

Errors name the target the caller gave, never the temp file: an ``OSError`` about the temp file
is raised again as the same class, with the same ``errno`` and ``strerror``, whose ``filename``
is the target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
import threading
from pathlib import Path

_lock = threading.RLock()  # re-entrant: a SIGTERM handler may write while it is held
_swept: set[Path] = set()


def process_umask() -> int:
    """The process umask, read without changing it where Linux allows (``/proc``).

    Returns:
        The umask bits (e.g. ``0o022``).
    """
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii", errors="replace") as status,
    ):
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _lock:  # elsewhere: set and restore (briefly visible to other threads)
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace(os.sep, "_") or "host"


def _temp_prefix(target: Path) -> str:
    return f".{target.name}.{_host()}."


def remove_orphan_temp_files(target: str | os.PathLike[str]) -> list[Path]:
    """Delete temp files of ``target`` left by dead writers on this host.

    Args:
        target: the file whose writers' leftovers to look for (in its folder).

    Returns:
        The temp files removed. Files of live processes, of other hosts, or not matching the
        pattern are left alone; errors (a folder that cannot be listed) remove nothing.
    """
    target = Path(target)
    prefix = _temp_prefix(target)
    removed: list[Path] = []
    with contextlib.suppress(OSError), os.scandir(target.parent) as entries:
        for entry in entries:
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid_text = name[len(prefix) :].split(".", 1)[0]
            if not pid_text.isdigit() or _alive(int(pid_text)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists (another user's), or cannot tell: keep its file
    return True


def _about(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """``exc`` (about the temp file) as the same kind of error about ``path``.

    Args:
        exc: the error creating, writing or renaming the temp file.
        path: the target the caller gave.

    Returns:
        An error of ``exc``'s class with its ``errno`` and ``strerror`` and ``path`` as its
        ``filename`` (``exc`` itself when it carries no ``errno``).
    """
    if exc.errno is None:
        return exc
    try:
        return type(exc)(exc.errno, exc.strerror, os.fspath(path))
    except Exception:  # a subclass with another constructor: the class the errno maps to
        return OSError(exc.errno, exc.strerror, os.fspath(path))


def names_a_directory(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s own name is a directory's, whatever exists there: it ends with a
    path separator, or its last part is ``.`` or ``..``.

    Args:
        path: the path, as given (``Path`` would drop a trailing separator).

    Returns:
        True for such a name.
    """
    text = os.fspath(path)
    separators = tuple(s for s in (os.sep, os.altsep) if s)
    return text.endswith(separators) or os.path.basename(text) in (".", "..")


def _refuse_directory(path: str | os.PathLike[str], target: Path) -> None:
    """Raise ``IsADirectoryError`` naming ``path`` where it names a directory: an existing one
    (or a link to one), or a name ending with a path separator or in ``.`` or ``..``;
    ``FileNotFoundError`` where it is empty (as ``open`` does); an ``OSError`` naming it where
    it cannot be examined."""
    text = os.fspath(path)
    if not text:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), text)
    try:
        directory = names_a_directory(text) or target.is_dir()
    except OSError as exc:
        raise _about(exc, path) from exc
    if directory:
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), text)


def _temp_file(target: Path) -> tuple[int, str]:
    """Create the temp file beside ``target``: its descriptor (open for writing) and name."""
    return tempfile.mkstemp(
        prefix=f"{_temp_prefix(target)}{os.getpid()}.", suffix=".tmp", dir=target.parent
    )


def check_writable(path: str | os.PathLike[str]) -> None:
    """Check that ``atomic_write_bytes(path, ...)`` could create its temp file now.

    Creates the temp file the write would create beside ``path`` and removes it at once; ``path``
    itself is neither created nor touched (it need not exist). Meant for a check before long
    work whose result goes to ``path``: a folder that is missing, read-only, or holds no new
    files (``/proc``, where even root cannot create one) fails here, not after the work.

    Args:
        path: the target file.

    Raises:
        IsADirectoryError: ``path`` names a directory (see ``atomic_write_bytes``).
        OSError: ``path`` is empty (``FileNotFoundError``), or the temp file cannot be created
            (``FileNotFoundError``, ``PermissionError``, ...); the error names ``path``.
    """
    target = Path(path)
    _refuse_directory(path, target)
    try:
        fd, tmp_name = _temp_file(target)
    except OSError as exc:
        raise _about(exc, path) from exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp_name)


def check_writable_argument(name: str, path: str | os.PathLike[str]) -> None:
    """``check_writable`` for an argument checked before the work it is for.

    Args:
        name: the argument's name, for the message.
        path: its value, the target file.

    Raises:
        ValueError: ``{name} cannot be written: {path} ({reason})`` where ``check_writable``
            raises an ``OSError``.
    """
    try:
        check_writable(path)
    except OSError as exc:
        raise ValueError(f"{name} cannot be written: {path} ({exc.strerror or exc})") from exc


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``.

    The temp file is removed if anything fails, so no partial file is ever left behind. The
    file gets mode ``0o666 & ~umask``. The first write of this process to ``path`` also removes
    temp files of dead writers (``remove_orphan_temp_files``).

    Args:
        path: the target file; its folder must exist. An existing file is replaced.
        data: the complete new contents.
        fsync: flush the data to disk before the rename (durability across a crash).

    Raises:
        IsADirectoryError: ``path`` names a directory: an existing one (or a link to one), or
            a name ending with a path separator or in ``.`` or ``..`` (nothing is written).
        OSError: ``path`` is empty (``FileNotFoundError``, as ``open`` says), or the temp file
            cannot be created, written or renamed onto ``path``: an error of the class the
            system gave (``FileNotFoundError`` for a missing folder, ``PermissionError``, ...),
            its ``filename`` ``path`` as given.
    """
    target = Path(path)
    _refuse_directory(path, target)
    key = target.absolute()
    with _lock:
        sweep = key not in _swept
        _swept.add(key)
    if sweep:
        remove_orphan_temp_files(target)
    try:
        fd, tmp_name = _temp_file(target)
    except OSError as exc:
        raise _about(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as tmp:
            os.fchmod(tmp.fileno(), 0o666 & ~process_umask())
            tmp.write(data)
            if fsync:
                tmp.flush()
                os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise _about(exc, path) from exc
        raise
