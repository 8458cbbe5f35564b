"""Reading files that may be hostile: regular files only, memory bounded, msgpack pre-scanned.

Shared by the two trace loaders (``io`` for ``.ets`` files, ``importers`` for the ETS paper's
CSV and ``opCodes.dict`` files):

- ``read_regular_file`` refuses a directory, FIFO, socket or device before reading a byte, and
  never allocates more than the file's size (bounded by ``max_bytes``) for it.
- ``scan_msgpack`` walks a msgpack encoding without recursion and without building anything,
  and refuses one whose containers claim more elements than the bytes left can hold, nest too
  deep or hold too many objects, so that msgpack's unpacker, which preallocates each list and
  dict at the size its header claims, stays within memory proportional to the input.
"""

from __future__ import annotations

import operator
import os
import reprlib
import stat
from collections.abc import Callable
from typing import Any

from ..errors import TraceFieldError

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_READ_CHUNK = 1 << 20


def describe_file_type(mode: int) -> str:
    """Name the kind of file an ``st_mode`` describes, for error messages.

    Args:
        mode: ``os.stat(...).st_mode``.

    Returns:
        "a regular file", "a directory", "a FIFO (named pipe)", "a socket", "a character
        device", "a block device", or "a special file" for anything else.
    """
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"


def check_path(path: object, name: str = "path") -> None:
    """Check that an argument is a path: a ``str`` or an ``os.PathLike``.

    An int would pass ``os.stat`` and ``open``, which take it for a file descriptor.

    Args:
        path: the argument.
        name: the argument's name, for the message.

    Raises:
        TypeError: ``path`` is neither (an int, bytes, None, ...), naming ``name`` and it.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{name} must be a str or os.PathLike, got {reprlib.repr(path)} ({type(path).__name__})"
        )


def check_max_bytes(max_bytes: object, name: str = "max_bytes") -> int:
    """Check a size limit: an int of at least 1 (a bool is not one).

    Args:
        max_bytes: the argument.
        name: the argument's name, for the messages.

    Returns:
        ``max_bytes``, as an ``int``.

    Raises:
        TypeError: it is not an int (``None``, a str, a float, a bool), naming ``name`` and it.
        ValueError: it is below 1, naming ``name`` and it.
    """
    try:
        if isinstance(max_bytes, bool):
            raise TypeError("a bool is not a size")
        value = operator.index(max_bytes)  # an int, or a numpy integer
    except TypeError:
        raise TypeError(
            f"{name} must be an int, got {reprlib.repr(max_bytes)} ({type(max_bytes).__name__})"
        ) from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _fill(handle: Any, data: bytearray, start: int) -> int:
    """Read into ``data[start:]`` until it is full or the file ends; the new fill level."""
    with memoryview(data) as view:
        while start < len(data):
            count = handle.readinto(view[start:])
            if not count:
                break
            start += count
    return start


def read_regular_file(
    path: str | os.PathLike[str],
    max_bytes: int,
    *,
    not_regular: Callable[[str], Exception],
    too_large: Callable[[int], Exception],
) -> bytearray:
    """Read a whole regular file; refuse anything else before reading a byte of it.

    ``os.stat`` must say the path is a regular file: a directory, FIFO, socket or device is
    refused without even being opened (opening some devices has effects; reading ``/dev/zero``
    never ends). The file is then opened with ``O_NONBLOCK``, so a FIFO swapped in after the
    check cannot block the open, and ``fstat`` checks what was actually opened. Memory stays
    bounded by the file: at most ``min(size, max_bytes) + 1`` bytes are allocated before the
    first read, then 1 MiB at a time if the file grows, and reading stops past ``max_bytes``.

    Args:
        path: the file.
        max_bytes: the largest size accepted, bytes (at least 1).
        not_regular: builds the error raised for a path that is not a regular file, from a
            description of what it is ("a FIFO (named pipe)", see ``describe_file_type``).
        too_large: builds the error raised for a file over ``max_bytes``, from its size in
            bytes (a lower bound when the file grew while being read).

    Returns:
        The file's contents.

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike`` (an int would be read as a file
            descriptor), or ``max_bytes`` is not an int (a bool included).
        ValueError: ``max_bytes`` is below 1.
        Exception: what ``not_regular`` or ``too_large`` builds, as above.
        OSError: the path cannot be examined, opened or read (``FileNotFoundError``,
            ``PermissionError``, ...).
    """
    check_path(path)
    max_bytes = check_max_bytes(max_bytes)
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(describe_file_type(info.st_mode))
    fd = os.open(path, _OPEN_FLAGS)
    try:
        handle = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed below, it owns fd
    except BaseException:
        os.close(fd)
        raise
    with handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced between stat and open
            raise not_regular(describe_file_type(info.st_mode))
        if info.st_size > max_bytes:
            raise too_large(info.st_size)
        data = bytearray(info.st_size + 1)  # one more: tells whether the file grew
        filled = _fill(handle, data, 0)
        while filled == len(data) and len(data) <= max_bytes:
            data.extend(bytes(min(_READ_CHUNK, max_bytes + 1 - len(data))))
            filled = _fill(handle, data, filled)
    if filled > max_bytes:
        raise too_large(filled)
    del data[filled:]
    return data


# ---------------------------------------------------------------------------------------------
# The msgpack scan

_SCALAR, _FIXMAP, _FIXARRAY, _FIXSTR, _BYTES, _ARRAY, _MAP, _EXT, _INVALID = range(9)


def _msgpack_tables() -> tuple[list[int], list[int]]:
    """Per first byte of a msgpack object: its kind, and its size (scalars) or the width of
    its length field (str, bin, array16/32, map16/32)."""
    kind, size = [_INVALID] * 256, [0] * 256
    for first in [*range(0x00, 0x80), *range(0xE0, 0x100), 0xC0, 0xC2, 0xC3]:
        kind[first], size[first] = _SCALAR, 1  # fixints, nil, false, true
    for first, width in zip(range(0xCA, 0xD4), (4, 8, 1, 2, 4, 8, 1, 2, 4, 8)):
        kind[first], size[first] = _SCALAR, 1 + width  # float32/64, uint8-64, int8-64
    for low, high, what in ((0x80, 0x90, _FIXMAP), (0x90, 0xA0, _FIXARRAY), (0xA0, 0xC0, _FIXSTR)):
        for first in range(low, high):
            kind[first] = what
    for first, what, width in (
        (0xC4, _BYTES, 1),  # bin8/16/32
        (0xC5, _BYTES, 2),
        (0xC6, _BYTES, 4),
        (0xD9, _BYTES, 1),  # str8/16/32
        (0xDA, _BYTES, 2),
        (0xDB, _BYTES, 4),
        (0xDC, _ARRAY, 2),
        (0xDD, _ARRAY, 4),
        (0xDE, _MAP, 2),
        (0xDF, _MAP, 4),
    ):
        kind[first], size[first] = what, width
    for first in (0xC7, 0xC8, 0xC9, *range(0xD4, 0xD9)):
        kind[first] = _EXT
    return kind, size


_KIND, _SIZE = _msgpack_tables()
_STR_FIRST = frozenset([*range(0xA0, 0xC0), 0xD9, 0xDA, 0xDB])


def scan_msgpack(body: bytes | memoryview, source: str, *, max_depth: int, max_objects: int) -> int:
    """Check that ``body`` is exactly one msgpack object that is safe to unpack.

    An iterative walk over the encoding that builds nothing (time linear in the number of
    objects, at most ``max_objects``): every container must claim no more elements than the
    bytes left after it can hold, counting one byte for each element still owed to the
    containers around it, so the lists and dicts msgpack preallocates at their claimed sizes
    add up to at most ``len(body)`` slots; containers nest at most ``max_depth`` deep; there are
    at most ``max_objects`` objects; extension types and the unused byte 0xc1 are refused.

    Args:
        body: the msgpack bytes.
        source: names the data in error messages (a path).
        max_depth: the deepest container nesting accepted (1: no container inside another).
        max_objects: the most objects (scalars and containers, map keys included) accepted.

    Returns:
        The number of objects.

    Raises:
        TraceFieldError: naming ``source``, where in the payload (string map keys and list
            indices, ``"meta.metadata.x[3]"``; ``"payload"`` at the top), the problem and its
            byte offset in ``body``.
    """
    end = len(body)
    position = start = 0
    # One entry per open container, the root (which holds one object) first: elements still
    # owed, elements claimed, and for a map the last string key read (None for a list).
    owed, claimed, keys = [1], [1], [None]
    pending = 1  # sum(owed): the least number of bytes the open containers still need
    objects = 0
    kinds, sizes = _KIND, _SIZE

    def fail(problem: str, offset: int) -> TraceFieldError:
        parts = []
        for level in range(1, len(owed)):
            index, key = claimed[level] - owed[level] - 1, keys[level]
            if key is None:
                parts.append(f"[{index}]")
            elif index % 2:  # a value: named by its key (escaped unless printable)
                shown = key if key.isprintable() and key else repr(key)
                parts.append(f".{shown}" if parts else shown)
        shown = parts if len(parts) <= 10 else [*parts[:8], "...", parts[-1]]
        return TraceFieldError(
            source, "".join(shown) or "payload", f"{problem} (at payload byte {offset})"
        )

    while owed:
        owed[-1] -= 1
        pending -= 1
        if position >= end:
            raise fail("the msgpack data ends inside a container", position)
        start = position
        first = body[position]
        kind = kinds[first]
        elements = 0
        objects += 1
        if kind == _SCALAR:
            position += sizes[first]
        elif kind == _FIXSTR:
            position += 1 + (first & 0x1F)
        elif kind == _FIXARRAY:
            position += 1
            elements = first & 0x0F
        elif kind == _FIXMAP:
            position += 1
            elements = 2 * (first & 0x0F)
        elif kind in (_BYTES, _ARRAY, _MAP):
            width = sizes[first]
            if position + 1 + width > end:
                raise fail("a msgpack length field runs past the end", start)
            length = int.from_bytes(body[position + 1 : position + 1 + width], "big")
            position += 1 + width
            if kind == _BYTES:
                position += length
            else:
                elements = length if kind == _ARRAY else 2 * length
        elif kind == _EXT:
            raise fail(f"msgpack extension type 0x{first:02x} is not part of the format", start)
        else:
            raise fail(f"byte 0x{first:02x} starts no msgpack object", start)
        if position > end:
            raise fail("a msgpack object runs past the end", start)
        if keys[-1] is not None and (claimed[-1] - owed[-1]) % 2 and first in _STR_FIRST:
            begin = start + (1 if first < 0xC0 else 1 + sizes[first])  # a str map key
            keys[-1] = bytes(body[begin : min(position, begin + 64)]).decode("utf-8", "replace")
        if kind in (_FIXMAP, _FIXARRAY, _ARRAY, _MAP):
            if len(owed) > max_depth:
                raise fail(f"containers nested deeper than {max_depth}", start)
            if elements > end - position - pending:
                raise fail(
                    f"a container claims {elements} elements, only {end - position - pending} "
                    "bytes remain for them",
                    start,
                )
            if objects + pending + elements > max_objects:
                raise fail(f"more than {max_objects} msgpack objects", start)
            if elements:
                owed.append(elements)
                claimed.append(elements)
                keys.append("" if kind in (_FIXMAP, _MAP) else None)
                pending += elements
        while owed and owed[-1] == 0:
            owed.pop()
            claimed.pop()
            keys.pop()
    if position != end:
        raise fail(f"{end - position} bytes after the payload's msgpack object", position)
    return objects
