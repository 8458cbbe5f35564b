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
(input shapes, input dtypes) signature once. Writes are atomic. The loader checks size, header,
length and checksum before it decodes anything, checks every index before it uses it, and
raises a ``TraceFileError`` subclass naming the problem; it never reads more than ``max_bytes``.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from ..errors import (
    CorruptTraceError,
    NotATraceFileError,
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

MAGIC = b"ETSTRACE"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

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


def dumps(trace: Trace) -> bytes:
    """Serialise ``trace`` to the complete ``.ets`` file contents (header + payload).

    Args:
        trace: the trace to encode; ``metadata`` must be msgpack-serialisable.

    Returns:
        The file's bytes.

    Raises:
        TypeError: ``trace.metadata`` holds a value msgpack cannot serialise.
        ValueError: an op's ``phase`` or a kernel's ``kind`` is not a valid enum value.
        OverflowError: an integer field does not fit its column's width.
    """
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
        TypeError, ValueError, OverflowError: as ``dumps``.
        OSError: the file cannot be written.
    """
    target = Path(path)
    atomic_write_bytes(target, dumps(trace))
    return target


# ---------------------------------------------------------------------------------------------
# Decoding


def _check(condition: bool, source: str, what: str) -> None:
    if not condition:
        raise CorruptTraceError(f"{source}: {what}")


def _read_columns(
    raw: Any, spec: dict[str, str], count: int, source: str, where: str
) -> dict[str, np.ndarray]:
    _check(isinstance(raw, dict), source, f"{where} is not a column map")
    columns: dict[str, np.ndarray] = {}
    for name, dtype in spec.items():
        blob = raw.get(name)
        _check(isinstance(blob, bytes), source, f"{where}: column {name!r} missing")
        width = 3 if name in _TRIPLES else 1
        expected = count * width * np.dtype(dtype).itemsize
        _check(
            len(blob) == expected,
            source,
            f"{where}: column {name!r} has {len(blob)} bytes, expected {expected}",
        )
        column = np.frombuffer(blob, dtype=dtype)
        columns[name] = column.reshape(count, 3) if width == 3 else column
    return columns


def _in_range(values: np.ndarray, low: int, high: int) -> bool:
    return values.size == 0 or (int(values.min()) >= low and int(values.max()) < high)


def _decode_iteration(
    raw: Any,
    strings: list[str],
    signatures: list[tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]],
    params: list[tuple[int, ...]],
    source: str,
    index: int,
) -> IterationTrace:
    where = f"iteration {index}"
    _check(isinstance(raw, dict), source, f"{where} is not a map")
    header_fields = ("step", "start_ns", "end_ns", "n_ops", "n_kernels")
    for key in header_fields:
        _check(isinstance(raw.get(key), int), source, f"{where}: {key!r} missing or not an int")
    n_ops, n_kernels = raw["n_ops"], raw["n_kernels"]
    _check(n_ops >= 0 and n_kernels >= 0, source, f"{where}: negative event count")
    ops = _read_columns(raw.get("ops"), _OP_COLUMNS, n_ops, source, f"{where} ops")
    kernels = _read_columns(
        raw.get("kernels"), _KERNEL_COLUMNS, n_kernels, source, f"{where} kernels"
    )

    checks = [
        (ops["name"], len(strings), "op name id"),
        (ops["phase"], len(_PHASES), "op phase"),
        (ops["signature"], len(signatures), "op signature id"),
        (ops["params"], len(params), "op params id"),
        (ops["parent"] + 1, n_ops + 1, "op parent index"),
        (kernels["name"], len(strings), "kernel name id"),
        (kernels["kind"], len(_KINDS), "kernel kind"),
        (kernels["op_index"] + 1, n_ops + 1, "kernel op index"),
    ]
    for values, limit, what in checks:
        _check(_in_range(values, 0, limit), source, f"{where}: {what} out of range")

    base = raw["start_ns"]
    phases = [Phase(p) for p in _PHASES]
    op_events: list[OpEvent] = []
    for i in range(n_ops):
        shapes, dtypes = signatures[int(ops["signature"][i])]
        op_events.append(
            OpEvent(
                name=strings[int(ops["name"][i])],
                start_ns=base + int(ops["start_ns"][i]),
                duration_ns=int(ops["duration_ns"][i]),
                thread=int(ops["thread"][i]),
                phase=phases[int(ops["phase"][i])],
                depth=int(ops["depth"][i]),
                parent=int(ops["parent"][i]),
                sequence_nr=int(ops["sequence_nr"][i]),
                input_shapes=shapes,
                input_dtypes=dtypes,
                flops=int(ops["flops"][i]),
                bytes_moved=int(ops["bytes_moved"][i]),
                params=params[int(ops["params"][i])],
                kernel_duration_ns=int(ops["kernel_duration_ns"][i]),
                kernel_count=int(ops["kernel_count"][i]),
                gap_ns=int(ops["gap_ns"][i]),
            )
        )
    kinds = [KernelKind(k) for k in _KINDS]
    kernel_events = [
        KernelEvent(
            name=strings[int(kernels["name"][i])],
            start_ns=base + int(kernels["start_ns"][i]),
            duration_ns=int(kernels["duration_ns"][i]),
            kind=kinds[int(kernels["kind"][i])],
            device=int(kernels["device"][i]),
            stream=int(kernels["stream"][i]),
            correlation_id=int(kernels["correlation_id"][i]),
            op_index=int(kernels["op_index"][i]),
            grid=tuple(int(v) for v in kernels["grid"][i]),  # type: ignore[arg-type]
            block=tuple(int(v) for v in kernels["block"][i]),  # type: ignore[arg-type]
            bytes=int(kernels["bytes"][i]),
            communication=bool(kernels["communication"][i]),
        )
        for i in range(n_kernels)
    ]
    return IterationTrace(
        step=raw["step"], start_ns=base, end_ns=raw["end_ns"], ops=op_events, kernels=kernel_events
    )


def _dataclass_from(cls: type, raw: Any, source: str, what: str) -> Any:
    _check(isinstance(raw, dict), source, f"{what} is not a map")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in raw.items() if k in names})


def _decode(payload: Any, source: str) -> Trace:
    _check(isinstance(payload, dict), source, "payload is not a map")
    _check(payload.get("format") == "ets-hook-trace", source, "payload format tag missing")
    _check(payload.get("phases") == _PHASES, source, "unknown phase table")
    _check(payload.get("kernel_kinds") == _KINDS, source, "unknown kernel kind table")
    strings = payload.get("strings")
    _check(
        isinstance(strings, list) and all(isinstance(s, str) for s in strings),
        source,
        "string table is not a list of strings",
    )
    raw_signatures = payload.get("signatures")
    _check(isinstance(raw_signatures, list), source, "signature table missing")
    signatures = []
    for entry in raw_signatures:
        ok = (
            isinstance(entry, list)
            and len(entry) == 2
            and all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in entry[0])
            and all(isinstance(d, int) and 0 <= d < len(strings) for d in entry[1])
        )
        _check(ok, source, "malformed shape signature")
        signatures.append((tuple(tuple(s) for s in entry[0]), tuple(strings[d] for d in entry[1])))
    raw_params = payload.get("params")
    _check(
        isinstance(raw_params, list)
        and all(isinstance(p, list) and all(isinstance(v, int) for v in p) for p in raw_params),
        source,
        "params table malformed",
    )
    params = [tuple(p) for p in raw_params]
    meta = payload.get("meta")
    _check(isinstance(meta, dict), source, "meta missing")
    raw_iterations = payload.get("iterations")
    _check(isinstance(raw_iterations, list), source, "iterations missing")
    iterations = [
        _decode_iteration(raw, strings, signatures, params, source, i)
        for i, raw in enumerate(raw_iterations)
    ]
    step_times = meta.get("step_times_s", [])
    _check(
        isinstance(step_times, list) and all(isinstance(t, (int, float)) for t in step_times),
        source,
        "step_times_s malformed",
    )
    metadata = meta.get("metadata", {})
    _check(isinstance(metadata, dict), source, "metadata is not a map")
    try:
        return Trace(
            iterations=iterations,
            device=_dataclass_from(DeviceInfo, meta.get("device", {}), source, "device"),
            host=_dataclass_from(HostInfo, meta.get("host", {}), source, "host"),
            capture=_dataclass_from(CaptureInfo, meta.get("capture", {}), source, "capture"),
            torch_version=str(meta.get("torch_version", "")),
            ets_hook_version=str(meta.get("ets_hook_version", "")),
            step_times_s=[float(t) for t in step_times],
            rank=int(meta.get("rank", 0)),
            world_size=int(meta.get("world_size", 1)),
            metadata=metadata,
        )
    except (TypeError, ValueError) as exc:
        raise CorruptTraceError(f"{source}: {exc}") from exc


def loads(data: bytes, *, source: str = "<bytes>", max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Parse complete ``.ets`` file contents.

    Args:
        data: the whole file.
        source: names the data in error messages (a path).
        max_bytes: the largest ``data`` accepted, bytes.

    Returns:
        The decoded trace.

    Raises:
        TraceTooLargeError: ``data`` is longer than ``max_bytes``.
        NotATraceFileError: the magic is wrong.
        TruncatedTraceError: ``data`` ends inside the header (including empty ``data``) or
            before the payload length it announces.
        UnsupportedTraceVersionError: another format version.
        CorruptTraceError: stray bytes after the payload, checksum mismatch, invalid msgpack,
            or a payload that breaks the format (missing tables, indices out of range, ...).
    """
    if len(data) > max_bytes:
        raise TraceTooLargeError(f"{source}: {len(data)} bytes exceeds max_bytes={max_bytes}")
    if len(data) < HEADER_SIZE:
        if not MAGIC.startswith(data[: len(MAGIC)]):
            raise NotATraceFileError(f"{source}: not an ets-hook trace (bad magic)")
        raise TruncatedTraceError(f"{source}: {len(data)} bytes, shorter than the header")
    magic, version, _flags, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise NotATraceFileError(f"{source}: not an ets-hook trace (bad magic)")
    if version != FORMAT_VERSION:
        raise UnsupportedTraceVersionError(
            f"{source}: trace format version {version}; this ets-hook reads {FORMAT_VERSION}"
        )
    available = len(data) - HEADER_SIZE
    if length > available:
        raise TruncatedTraceError(f"{source}: payload of {length} bytes, {available} present")
    if length < available:
        raise CorruptTraceError(f"{source}: {available - length} stray bytes after the payload")
    payload_bytes = data[HEADER_SIZE:]
    if zlib.crc32(payload_bytes) != crc:
        raise CorruptTraceError(f"{source}: checksum mismatch")
    try:
        # unpackb bounds every container by the payload's own length.
        payload = msgpack.unpackb(payload_bytes, raw=False, strict_map_key=True)
    except (ValueError, TypeError) as exc:  # msgpack's errors derive from these
        raise CorruptTraceError(f"{source}: payload is not valid msgpack ({exc})") from exc
    return _decode(payload, source)


def load_trace(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Read a ``.ets`` file.

    Memory stays bounded: the size is checked against ``max_bytes`` before anything is read.

    Args:
        path: the file.
        max_bytes: the largest file accepted, bytes (default 512 MiB).

    Returns:
        The decoded trace.

    Raises:
        TraceFileError: a subclass, as ``loads``, for anything malformed; ``TraceTooLargeError``
            when the file exceeds ``max_bytes``.
        OSError: the file cannot be opened (``FileNotFoundError``, ...).
    """
    source = str(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise TraceTooLargeError(f"{source}: {size} bytes exceeds max_bytes={max_bytes}")
        data = handle.read(max_bytes + 1)
    return loads(data, source=source, max_bytes=max_bytes)
