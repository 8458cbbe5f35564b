"""The ``.ets`` trace file: a versioned, checksummed, columnar msgpack container.

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic  b"ETSTRACE"
    8       2     format version (uint16, currently 1)
    10      2     flags (uint16, 0)
    12      8     payload length in bytes (uint64)
    20      4     CRC-32 of the payload (uint32)
    24      n     payload: one msgpack map (see ``_encode``)

The payload stores each iteration's ops and kernels as columns of packed numpy arrays (times
relative to the iteration start), names and dtypes interned in a string table, and each distinct
(input shapes, input dtypes) signature once. Writes are atomic.

Reading treats the file as hostile. ``load_trace`` refuses anything but a regular file before
reading a byte and never reads more than ``max_bytes`` (``untrusted.read_regular_file``).
``loads`` checks size, header, length and checksum; then a scan of the msgpack encoding
(``untrusted.scan_msgpack``: no recursion, nothing allocated) checks that every container fits
in the bytes left after it, nesting within ``MAX_DEPTH`` and the object count within
``MAX_OBJECTS``, before msgpack builds any object (with explicit ``max_*_len`` limits); then
every field's type and range is checked before it is used. Every failure is a
``TraceFileError`` subclass whose message names the file, the field and the problem
(``TraceFieldError`` also carries the field as ``.field``). Only an ``OSError`` (a missing or
unreadable path) is not.
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from ..errors import (
    CorruptTraceError,
    NotARegularFileError,
    NotATraceFileError,
    TraceFieldError,
    TraceTooLargeError,
    TruncatedTraceError,
    UnsupportedTraceVersionError,
)
from .atomic import atomic_write_bytes
from .events import (
    CaptureInfo,
    DeviceInfo,
    HostInfo,
    IterationTrace,
    KernelEvent,
    KernelKind,
    OpEvent,
    Phase,
    Trace,
)
from .untrusted import check_max_bytes, check_path, read_regular_file, scan_msgpack

MAGIC = b"ETSTRACE"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

#: Deepest container nesting accepted in a payload. The format itself nests 5 deep (payload,
#: signatures, entry, shapes, shape); the rest is room for free-form ``metadata``.
MAX_DEPTH = 32
#: Most msgpack objects (scalars and containers) accepted in one payload. Columns are single
#: ``bin`` objects, so real traces hold a few per op signature and step: ~10^4-10^5. The bound keeps
#: a payload of tiny objects (an empty list is 1 byte, 56 as a Python object) from costing
#: ~60x its size in memory: at most ~4M objects, ~250 MB, whatever ``max_bytes`` allows.
MAX_OBJECTS = 1 << 22
#: Longest string accepted (op and kernel names, metadata values), bytes.
MAX_STR_LEN = 1 << 24
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

_PHASES = [phase.value for phase in Phase]
_KINDS = [kind.value for kind in KernelKind]

# Column name -> numpy dtype. Order and dtypes are part of format version 1.
_OP_COLUMNS: dict[str, str] = {
    "name": "<u4",
    "start_ns": "<i8",  # relative to the iteration's start_ns
    "duration_ns": "<i8",
    "thread": "<i8",
    "phase": "<u1",
    "depth": "<i4",
    "parent": "<i4",
    "sequence_nr": "<i8",
    "signature": "<u4",
    "params": "<u4",
    "flops": "<i8",
    "bytes_moved": "<i8",
    "kernel_duration_ns": "<i8",
    "kernel_count": "<i4",
    "gap_ns": "<i8",
}
_KERNEL_COLUMNS: dict[str, str] = {
    "name": "<u4",
    "start_ns": "<i8",  # relative to the iteration's start_ns
    "duration_ns": "<i8",
    "kind": "<u1",
    "device": "<i4",
    "stream": "<i8",
    "correlation_id": "<i8",
    "op_index": "<i4",
    "grid": "<i4",  # 3 per kernel
    "block": "<i4",  # 3 per kernel
    "bytes": "<i8",
    "communication": "<u1",
}
_TRIPLES = {"grid", "block"}


# ---------------------------------------------------------------------------------------------
# Encoding


class _Interner:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self._ids: dict[Any, int] = {}

    def __call__(self, item: Any) -> int:
        found = self._ids.get(item)
        if found is None:
            found = self._ids[item] = len(self.items)
            self.items.append(item)
        return found


def _columns(rows: list[tuple[Any, ...]], spec: dict[str, str]) -> dict[str, bytes]:
    names = list(spec)
    out: dict[str, bytes] = {}
    for position, name in enumerate(names):
        values = [row[position] for row in rows]
        out[name] = np.asarray(values, dtype=spec[name]).reshape(-1).tobytes()
    return out


def _encode_iteration(
    iteration: IterationTrace, strings: _Interner, signatures: _Interner, params: _Interner
) -> dict[str, Any]:
    base = iteration.start_ns
    op_rows = [
        (
            strings(op.name),
            op.start_ns - base,
            op.duration_ns,
            op.thread,
            _PHASES.index(Phase(op.phase).value),
            op.depth,
            op.parent,
            op.sequence_nr,
            signatures(
                (
                    tuple(tuple(int(d) for d in shape) for shape in op.input_shapes),
                    tuple(strings(dtype) for dtype in op.input_dtypes),
                )
            ),
            params(tuple(int(p) for p in op.params)),
            op.flops,
            op.bytes_moved,
            op.kernel_duration_ns,
            op.kernel_count,
            op.gap_ns,
        )
        for op in iteration.ops
    ]
    kernel_rows = [
        (
            strings(k.name),
            k.start_ns - base,
            k.duration_ns,
            _KINDS.index(KernelKind(k.kind).value),
            k.device,
            k.stream,
            k.correlation_id,
            k.op_index,
            tuple(k.grid),
            tuple(k.block),
            k.bytes,
            int(k.communication),
        )
        for k in iteration.kernels
    ]
    return {
        "step": iteration.step,
        "start_ns": iteration.start_ns,
        "end_ns": iteration.end_ns,
        "n_ops": len(op_rows),
        "n_kernels": len(kernel_rows),
        "ops": _columns(op_rows, _OP_COLUMNS),
        "kernels": _columns(kernel_rows, _KERNEL_COLUMNS),
    }


def _encode(trace: Trace) -> bytes:
    strings, signatures, params = _Interner(), _Interner(), _Interner()
    params(())  # id 0 is "no parameters"
    iterations = [_encode_iteration(it, strings, signatures, params) for it in trace.iterations]
    payload = {
        "format": "ets-hook-trace",
        "phases": _PHASES,
        "kernel_kinds": _KINDS,
        "meta": {
            "torch_version": trace.torch_version,
            "ets_hook_version": trace.ets_hook_version,
            "rank": trace.rank,
            "world_size": trace.world_size,
            "step_times_s": [float(t) for t in trace.step_times_s],
            "metadata": trace.metadata,
            "device": dataclasses.asdict(trace.device),
            "host": dataclasses.asdict(trace.host),
            "capture": dataclasses.asdict(trace.capture),
        },
        "strings": strings.items,
        "signatures": [[list(map(list, sh)), list(dt)] for sh, dt in signatures.items],
        "params": [list(p) for p in params.items],
        "iterations": iterations,
    }
    return msgpack.packb(payload, use_bin_type=True)


def _check_trace(trace: object) -> None:
    """Raise ``TypeError`` naming ``trace`` and its type unless it is a ``Trace``."""
    if not isinstance(trace, Trace):
        raise TypeError(
            f"trace must be a Trace, got {reprlib.repr(trace)} ({type(trace).__name__})"
        )


def dumps(trace: Trace) -> bytes:
    """Serialise ``trace`` to the complete ``.ets`` file contents (header + payload).

    Args:
        trace: the trace to encode; ``metadata`` must be msgpack-serialisable.

    Returns:
        The file's bytes.

    Raises:
        TypeError: ``trace`` is not a ``Trace``, or ``trace.metadata`` holds a value msgpack
            cannot serialise.
        ValueError: an op's ``phase`` or a kernel's ``kind`` is not a valid enum value.
        OverflowError: an integer field does not fit its column's width.
    """
    _check_trace(trace)
    payload = _encode(trace)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(payload), zlib.crc32(payload))
    return header + payload


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` to ``path`` atomically (a reader never sees a half-written file).

    Args:
        trace: the trace to save.
        path: the target file; its folder must exist. An existing file is replaced.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        TypeError: ``trace`` is not a ``Trace`` or ``path`` not a ``str`` or ``os.PathLike``
            (both checked before anything is encoded or written); as ``dumps``.
        ValueError, OverflowError: as ``dumps``.
        IsADirectoryError: ``path`` names a directory (an existing one, or a name ending with a
            path separator); nothing is written.
        OSError: the file cannot be written (``FileNotFoundError`` for a missing folder,
            ``PermissionError``, ...); the error's ``filename`` is ``path``, and no temp file
            is left behind (``trace.atomic.atomic_write_bytes``).
    """
    _check_trace(trace)
    check_path(path)
    atomic_write_bytes(path, dumps(trace))
    return Path(path)


# ---------------------------------------------------------------------------------------------
# Decoding: field checks


_MISSING: Any = object()


def _describe(value: Any) -> str:
    """A short description of a decoded value for an error message (never a deep repr)."""
    if value is _MISSING:
        return "nothing (missing)"
    if value is None or isinstance(value, (bool, float, int)):
        return repr(value)
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {shown!r}"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes of binary"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    return f"a {type(value).__name__}"


def _int(value: Any, source: str, field: str, low: int = _INT64_MIN, high: int = _INT64_MAX) -> int:
    if type(value) is not int:  # bool is not an int here
        raise TraceFieldError(source, field, f"expected an int, got {_describe(value)}")
    if not low <= value <= high:
        raise TraceFieldError(source, field, f"{value} is out of range [{low}, {high}]")
    return value


def _str(value: Any, source: str, field: str) -> str:
    if type(value) is not str:
        raise TraceFieldError(source, field, f"expected a string, got {_describe(value)}")
    return value


def _list(value: Any, source: str, field: str) -> list[Any]:
    if type(value) is not list:
        raise TraceFieldError(source, field, f"expected a list, got {_describe(value)}")
    return value


def _map(value: Any, source: str, field: str) -> dict[Any, Any]:
    if type(value) is not dict:
        raise TraceFieldError(source, field, f"expected a map, got {_describe(value)}")
    return value


def _seconds(value: Any, source: str, field: str) -> float:
    if type(value) not in (int, float):
        raise TraceFieldError(source, field, f"expected a number, got {_describe(value)}")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds >= 0.0):
        raise TraceFieldError(source, field, f"{value!r} is not a finite time >= 0")
    return seconds


_PLAIN_TYPES = (type(None), bool, int, float, str, bytes)


def _check_metadata(value: Any, source: str) -> dict[str, Any]:
    """Free-form metadata: a map of msgpack plain values, checked without recursion (the scan
    already bounded its depth)."""
    root = _map(value, source, "meta.metadata")
    stack: list[tuple[Any, str]] = [(root, "meta.metadata")]
    while stack:
        item, where = stack.pop()
        if type(item) is dict:
            entries = []
            for key, inner in item.items():
                if type(key) is not str:
                    raise TraceFieldError(source, where, f"key {_describe(key)} is not a string")
                name = f"{where}.{key}" if key.isidentifier() else f"{where}[{key[:40]!r}]"
                entries.append((name, inner))
        else:
            entries = [(f"{where}[{index}]", inner) for index, inner in enumerate(item)]
        for name, inner in entries:
            if type(inner) in (dict, list):
                stack.append((inner, name))
            elif type(inner) not in _PLAIN_TYPES:  # pragma: no cover - msgpack makes no other
                raise TraceFieldError(source, name, f"unexpected {_describe(inner)}")
    return root


#: Lowest value of each int field of the info dataclasses (others: 0).
_INFO_LOW = {"index": -1}


def _info(cls: type, raw: Any, source: str, field: str) -> Any:
    """A DeviceInfo/HostInfo/CaptureInfo from its map: known keys type-checked, others ignored."""
    values = _map(raw, source, field)
    kwargs: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):
        value = values.get(spec.name, _MISSING)
        if value is _MISSING:
            continue  # written by an older ets-hook: the default
        where = f"{field}.{spec.name}"
        if spec.type == "str":
            kwargs[spec.name] = _str(value, source, where)
        elif spec.type == "int":
            kwargs[spec.name] = _int(value, source, where, low=_INFO_LOW.get(spec.name, 0))
        else:  # pragma: no cover - a new field type needs a check here
            raise TypeError(f"{cls.__name__}.{spec.name}: no loader check for {spec.type}")
    return cls(**kwargs)


def _read_columns(
    raw: Any, spec: dict[str, str], count: int, source: str, where: str
) -> dict[str, np.ndarray]:
    columns: dict[str, np.ndarray] = {}
    table = _map(raw, source, where)
    for name, dtype in spec.items():
        blob = table.get(name, _MISSING)
        if type(blob) is not bytes:
            raise TraceFieldError(
                source, f"{where}.{name}", f"expected a binary column, got {_describe(blob)}"
            )
        width = 3 if name in _TRIPLES else 1
        expected = count * width * np.dtype(dtype).itemsize
        if len(blob) != expected:
            raise TraceFieldError(
                source, f"{where}.{name}", f"{len(blob)} bytes, expected {expected} for {count}"
            )
        column = np.frombuffer(blob, dtype=dtype)
        columns[name] = column.reshape(count, 3) if width == 3 else column
    return columns


def _check_column(values: np.ndarray, low: int, high: int, source: str, field: str) -> None:
    """Every value within ``[low, high]``; the error names the first one that is not."""
    if values.size == 0:
        return
    if int(values.min()) >= low and int(values.max()) <= high:
        return
    info = np.iinfo(values.dtype)
    low, high = max(low, info.min), min(high, info.max)
    index = int(np.flatnonzero((values < low) | (values > high))[0])
    raise TraceFieldError(
        source,
        field,
        f"value {int(values[index])} at index {index} is out of range [{low}, {high}]",
    )


def _check_times(base: int, relative: np.ndarray, source: str, field: str) -> None:
    """``base + relative`` stays within int64 (the start of every event)."""
    if relative.size and not (
        base + int(relative.min()) >= _INT64_MIN and base + int(relative.max()) <= _INT64_MAX
    ):
        raise TraceFieldError(source, field, "start times overflow int64 once made absolute")


_Signature = tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]


def _decode_iteration(
    raw: Any,
    strings: list[str],
    signatures: list[_Signature],
    params: list[tuple[int, ...]],
    source: str,
    index: int,
    n_phases: int,
) -> IterationTrace:
    where = f"iterations[{index}]"
    table = _map(raw, source, where)
    step = _int(table.get("step", _MISSING), source, f"{where}.step")
    base = _int(table.get("start_ns", _MISSING), source, f"{where}.start_ns")
    end = _int(table.get("end_ns", _MISSING), source, f"{where}.end_ns", low=base)
    n_ops = _int(table.get("n_ops", _MISSING), source, f"{where}.n_ops", low=0)
    n_kernels = _int(table.get("n_kernels", _MISSING), source, f"{where}.n_kernels", low=0)
    ops = _read_columns(table.get("ops", _MISSING), _OP_COLUMNS, n_ops, source, f"{where}.ops")
    kernels = _read_columns(
        table.get("kernels", _MISSING), _KERNEL_COLUMNS, n_kernels, source, f"{where}.kernels"
    )
    for values, low, high, field in (
        (ops["name"], 0, len(strings) - 1, "ops.name"),
        (ops["phase"], 0, n_phases - 1, "ops.phase"),
        (ops["signature"], 0, len(signatures) - 1, "ops.signature"),
        (ops["params"], 0, len(params) - 1, "ops.params"),
        (ops["parent"], -1, n_ops - 1, "ops.parent"),
        (ops["depth"], 0, _INT64_MAX, "ops.depth"),
        (ops["kernel_count"], 0, _INT64_MAX, "ops.kernel_count"),
        (kernels["name"], 0, len(strings) - 1, "kernels.name"),
        (kernels["kind"], 0, len(_KINDS) - 1, "kernels.kind"),
        (kernels["op_index"], -1, n_ops - 1, "kernels.op_index"),
        (kernels["communication"], 0, 1, "kernels.communication"),
    ):
        _check_column(values, low, high, source, f"{where}.{field}")
    later = np.flatnonzero(ops["parent"] >= np.arange(n_ops))
    if later.size:
        raise TraceFieldError(
            source, f"{where}.ops.parent", f"op {int(later[0])} does not follow its parent"
        )
    _check_times(base, ops["start_ns"], source, f"{where}.ops.start_ns")
    _check_times(base, kernels["start_ns"], source, f"{where}.kernels.start_ns")

    phases = [Phase(p) for p in _PHASES]
    op_events = [
        OpEvent(
            name=strings[name],
            start_ns=base + start,
            duration_ns=duration,
            thread=thread,
            phase=phases[phase],
            depth=depth,
            parent=parent,
            sequence_nr=sequence_nr,
            input_shapes=signatures[signature][0],
            input_dtypes=signatures[signature][1],
            flops=flops,
            bytes_moved=moved,
            params=params[param],
            kernel_duration_ns=kernel_ns,
            kernel_count=kernel_count,
            gap_ns=gap,
        )
        for (
            name,
            start,
            duration,
            thread,
            phase,
            depth,
            parent,
            sequence_nr,
            signature,
            param,
            flops,
            moved,
            kernel_ns,
            kernel_count,
            gap,
        ) in zip(*(ops[column].tolist() for column in _OP_COLUMNS))
    ]
    kinds = [KernelKind(k) for k in _KINDS]
    kernel_events = [
        KernelEvent(
            name=strings[name],
            start_ns=base + start,
            duration_ns=duration,
            kind=kinds[kind],
            device=device,
            stream=stream,
            correlation_id=correlation_id,
            op_index=op_index,
            grid=tuple(grid),  # type: ignore[arg-type]
            block=tuple(block),  # type: ignore[arg-type]
            bytes=nbytes,
            communication=bool(communication),
        )
        for (
            name,
            start,
            duration,
            kind,
            device,
            stream,
            correlation_id,
            op_index,
            grid,
            block,
            nbytes,
            communication,
        ) in zip(*(kernels[column].tolist() for column in _KERNEL_COLUMNS))
    ]
    return IterationTrace(
        step=step, start_ns=base, end_ns=end, ops=op_events, kernels=kernel_events
    )


def _decode_signatures(raw: Any, strings: list[str], source: str) -> list[_Signature]:
    signatures: list[_Signature] = []
    for index, entry in enumerate(_list(raw, source, "signatures")):
        where = f"signatures[{index}]"
        pair = _list(entry, source, where)
        if len(pair) != 2:
            raise TraceFieldError(
                source, where, f"expected [shapes, dtypes], got {len(pair)} items"
            )
        shapes = []
        for position, shape in enumerate(_list(pair[0], source, f"{where}.shapes")):
            dims = _list(shape, source, f"{where}.shapes[{position}]")
            for dim in dims:
                _int(dim, source, f"{where}.shapes[{position}]", low=0)
            shapes.append(tuple(dims))
        dtypes = [
            strings[_int(d, source, f"{where}.dtypes", 0, len(strings) - 1)]
            for d in _list(pair[1], source, f"{where}.dtypes")
        ]
        signatures.append((tuple(shapes), tuple(dtypes)))
    return signatures


def _decode(payload: Any, source: str) -> Trace:
    root = _map(payload, source, "payload")
    if root.get("format") != "ets-hook-trace":
        raise TraceFieldError(
            source, "format", f"expected 'ets-hook-trace', got {_describe(root.get('format'))}"
        )
    # Tables only grow at their end (older files: a prefix of ours, e.g. before Phase.INPUT).
    for key, expected in (("phases", _PHASES), ("kernel_kinds", _KINDS)):
        table = root.get(key)
        if not (isinstance(table, list) and table and table == expected[: len(table)]):
            raise TraceFieldError(source, key, f"unknown table: expected {expected}")
    strings = _list(root.get("strings", _MISSING), source, "strings")
    for index, text in enumerate(strings):
        _str(text, source, f"strings[{index}]")
    signatures = _decode_signatures(root.get("signatures", _MISSING), strings, source)
    params = []
    for index, entry in enumerate(_list(root.get("params", _MISSING), source, "params")):
        values = _list(entry, source, f"params[{index}]")
        for value in values:
            _int(value, source, f"params[{index}]")
        params.append(tuple(values))
    meta = _map(root.get("meta", _MISSING), source, "meta")
    iterations = [
        _decode_iteration(raw, strings, signatures, params, source, index, len(root["phases"]))
        for index, raw in enumerate(_list(root.get("iterations", _MISSING), source, "iterations"))
    ]
    step_times = [
        _seconds(t, source, f"meta.step_times_s[{i}]")
        for i, t in enumerate(_list(meta.get("step_times_s", []), source, "meta.step_times_s"))
    ]
    return Trace(
        iterations=iterations,
        device=_info(DeviceInfo, meta.get("device", {}), source, "meta.device"),
        host=_info(HostInfo, meta.get("host", {}), source, "meta.host"),
        capture=_info(CaptureInfo, meta.get("capture", {}), source, "meta.capture"),
        torch_version=_str(meta.get("torch_version", ""), source, "meta.torch_version"),
        ets_hook_version=_str(meta.get("ets_hook_version", ""), source, "meta.ets_hook_version"),
        step_times_s=step_times,
        rank=_int(meta.get("rank", 0), source, "meta.rank", low=0),
        world_size=_int(meta.get("world_size", 1), source, "meta.world_size", low=1),
        metadata=_check_metadata(meta.get("metadata", {}), source),
    )


# ---------------------------------------------------------------------------------------------
# Loading


def loads(
    data: bytes | bytearray | memoryview,
    *,
    source: str = "<bytes>",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Trace:
    """Parse complete ``.ets`` file contents, treating them as hostile.

    Input shorter than the header is a ``TruncatedTraceError`` when it agrees with the magic
    as far as it goes (empty input included: it is the start of every trace), else a
    ``NotATraceFileError``.

    Args:
        data: the whole file (any contiguous bytes-like object; not copied).
        source: names the data in error messages (a path).
        max_bytes: the largest ``data`` accepted, bytes: an int, at least 1.

    Returns:
        The decoded trace; every field has been checked (types, ranges, indices, ``parent``
        before child) and ``ets-hook info`` can print it.

    Raises:
        TraceTooLargeError: ``data`` is longer than ``max_bytes``.
        NotATraceFileError: the magic is wrong.
        TruncatedTraceError: ``data`` ends inside the header (including empty ``data``) or
            before the payload length it announces.
        UnsupportedTraceVersionError: another format version.
        TraceFieldError: a field of the payload has the wrong type or an out-of-range value
            (a ``CorruptTraceError``; ``.field`` names it).
        CorruptTraceError: unknown header flags, stray bytes after the payload, checksum
            mismatch, or a payload that is not msgpack or breaks the scan's bounds.
        TypeError: ``data`` is not a bytes-like object, or ``max_bytes`` not an int (a bool
            included): a programming error, not a bad file.
        ValueError: ``max_bytes`` is below 1 (a plain ``ValueError``, not a ``TraceFileError``).
    """
    max_bytes = check_max_bytes(max_bytes)
    view = memoryview(data).cast("B")
    size = len(view)
    if size > max_bytes:
        raise TraceTooLargeError(f"{source}: {size} bytes exceeds max_bytes={max_bytes}")
    if size < HEADER_SIZE:
        if not MAGIC.startswith(bytes(view[: len(MAGIC)])):
            raise NotATraceFileError(f"{source}: not an ets-hook trace (bad magic)")
        what = "empty" if size == 0 else f"{size} bytes"
        raise TruncatedTraceError(
            f"{source}: header: {what}, shorter than the {HEADER_SIZE}-byte header"
        )
    magic, version, flags, length, crc = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise NotATraceFileError(f"{source}: not an ets-hook trace (bad magic)")
    if version != FORMAT_VERSION:
        raise UnsupportedTraceVersionError(
            f"{source}: header.version: trace format version {version}; this ets-hook reads "
            f"{FORMAT_VERSION}"
        )
    if flags != 0:
        raise CorruptTraceError(f"{source}: header.flags: unknown flags 0x{flags:04x}")
    available = size - HEADER_SIZE
    if length > available:
        raise TruncatedTraceError(
            f"{source}: header.length: payload of {length} bytes, {available} present"
        )
    if length < available:
        raise CorruptTraceError(
            f"{source}: header.length: {available - length} stray bytes after the payload"
        )
    body = view[HEADER_SIZE:]
    if zlib.crc32(body) != crc:
        raise CorruptTraceError(f"{source}: header.crc32: checksum mismatch")
    scan_msgpack(body, source, max_depth=MAX_DEPTH, max_objects=MAX_OBJECTS)
    try:
        payload = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=min(length, MAX_STR_LEN),
            max_bin_len=length,
            max_array_len=length,
            max_map_len=length,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        # invalid UTF-8 in a string, a non-string map key, a string over MAX_STR_LEN
        raise CorruptTraceError(f"{source}: payload: not valid msgpack ({exc})") from exc
    return _decode(payload, source)


def load_trace(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Read a ``.ets`` file, treating it as hostile.

    A path that is not a regular file (a directory, FIFO, socket or device such as
    ``/dev/zero``) is refused before anything is read; the size is checked against
    ``max_bytes`` before reading, and memory stays bounded by the file's size (see
    ``read_regular_file``).

    Args:
        path: the file, a ``str`` or ``os.PathLike``.
        max_bytes: the largest file accepted, bytes: an int, at least 1 (default 512 MiB).

    Returns:
        The decoded trace.

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike`` (an int would be read as a file
            descriptor), or ``max_bytes`` is not an int (a bool included); checked before the
            file is touched.
        ValueError: ``max_bytes`` is below 1 (a plain ``ValueError``, not a
            ``TraceFileError``).
        NotARegularFileError: ``path`` is not a regular file.
        TraceTooLargeError: the file exceeds ``max_bytes``.
        TraceFileError: another subclass, as ``loads``, for anything malformed.
        OSError: the path does not exist or cannot be opened or read (``FileNotFoundError``,
            ``PermissionError``, ...).
    """
    source = str(path)
    data = read_regular_file(  # checks path and max_bytes first
        path,
        max_bytes,
        not_regular=lambda kind: NotARegularFileError(
            f"{source}: {kind}, not a regular file: refused without reading it"
        ),
        too_large=lambda size: TraceTooLargeError(
            f"{source}: {size} bytes exceeds max_bytes={max_bytes}"
        ),
    )
    return loads(data, source=source, max_bytes=max_bytes)
