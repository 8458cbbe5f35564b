"""Interpret drained CUPTI ring records: kernel events, a launch table, per-step kernel lists.

Input is a ``RECORD_DTYPE`` array from ``KernelCollector.drain()``; all interpretation lives here
(the C++ side only collects). Contracts:

- Timestamps are shifted by ``clock_offset_ns`` (``time.time_ns() - CUPTI clock``, see
  ``capture.cupti.measure_clock_offset_ns``) so results are on the trace clock.
- GPU records without valid timestamps (0, or end before start: CUPTI could not time them) are
  skipped and counted in ``GpuActivity.invalid``.
- ``KernelEvent.correlation_id`` ties a kernel to the runtime API call that launched it; the launch
  table holds those calls (CPU thread id = ``threading.get_native_id()`` of the launching thread,
  call start/end on the trace clock) for the op <-> kernel join in ``ets_hook.trace.decode``.
- NCCL kernels are marked ``communication=True``: their duration includes waiting for other ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..trace.events import KernelEvent, KernelKind
from .cupti import (
    EXTERNAL_CORRELATION_KIND,
    MEMCPY_KIND_NAMES,
    RECORD_DTYPE,
    RecordKind,
    demangle_names,
    resolve_names,
)

#: One CUDA API call (runtime or driver) as needed to tie kernels to ops.
LAUNCH_DTYPE = np.dtype(
    [
        ("correlation_id", "<u4"),
        ("thread_id", "<u4"),
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("cbid", "<u4"),
        ("kind", "u1"),  # RecordKind.RUNTIME or RecordKind.DRIVER
    ]
)

#: CUPTI correlation id -> id pushed with ``capture.cupti.push_external_id``.
EXTERNAL_DTYPE = np.dtype(
    [("correlation_id", "<u4"), ("external_id", "<u8"), ("external_kind", "u1")]
)

_GPU_KINDS = {
    int(RecordKind.KERNEL): KernelKind.KERNEL,
    int(RecordKind.MEMCPY): KernelKind.MEMCPY,
    int(RecordKind.MEMSET): KernelKind.MEMSET,
}


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """Everything decoded from one drain.

    Attributes:
        kernels: kernels, memcpys and memsets as ``KernelEvent``s, by start time, on the trace
            clock.
        launches: runtime/driver API calls, ``LAUNCH_DTYPE``, by start time, on the trace clock.
        external_ids: ``EXTERNAL_DTYPE`` rows of ets-hook's external kind only.
        invalid: GPU records skipped for missing or inverted timestamps.
    """

    kernels: list[KernelEvent]
    launches: np.ndarray
    external_ids: np.ndarray
    invalid: int


def _check(records: np.ndarray) -> np.ndarray:
    if not isinstance(records, np.ndarray) or records.dtype != RECORD_DTYPE:
        got = getattr(records, "dtype", type(records).__name__)
        raise ValueError(f"expected records with ets_hook.capture.cupti.RECORD_DTYPE, got {got}")
    return records.ravel()


def is_communication_kernel(name: str) -> bool:
    """Whether ``name`` is an NCCL collective / point-to-point kernel.

    Any name containing "nccl" in any case counts (``ncclKernel_*``, ``ncclDevKernel_*``, ...).
    """
    return "nccl" in name.lower()


def memcpy_name(copy_kind: int) -> str:
    """Display name of a memcpy record, e.g. ``"Memcpy HtoD"``.

    Args:
        copy_kind: the CUPTI memcpy kind (the record's ``subkind``).

    Returns:
        ``"Memcpy <direction>"``, or plain ``"Memcpy"`` for an unknown kind.
    """
    direction = MEMCPY_KIND_NAMES.get(int(copy_kind))
    return f"Memcpy {direction}" if direction else "Memcpy"


def kernel_events(
    records: np.ndarray, *, clock_offset_ns: int = 0, demangle: bool = True
) -> list[KernelEvent]:
    """Kernel, memcpy and memset records as ``KernelEvent``s, by start time (``op_index`` -1).

    Decodes the whole drain (``decode_activity``) and keeps the kernels.

    Args:
        records: a ``RECORD_DTYPE`` array from ``KernelCollector.drain()``.
        clock_offset_ns: added to every timestamp (``time.time_ns() - CUPTI clock``).
        demangle: demangle C++ kernel names.

    Returns:
        The events with valid timestamps, on the trace clock.

    Raises:
        ValueError: ``records`` is not an array of ``RECORD_DTYPE``, or a kernel's name id is
            not in the process-wide string table.
    """
    return decode_activity(records, clock_offset_ns=clock_offset_ns, demangle=demangle).kernels


def _kernel_events(
    records: np.ndarray, clock_offset_ns: int, demangle: bool
) -> tuple[list[KernelEvent], int]:
    gpu = records[np.isin(records["kind"], list(_GPU_KINDS))]
    valid = (gpu["start_ns"] > 0) & (gpu["end_ns"] >= gpu["start_ns"])
    invalid = int(gpu.size - np.count_nonzero(valid))
    gpu = gpu[valid]
    gpu = gpu[np.argsort(gpu["start_ns"], kind="stable")]

    kinds = gpu["kind"].tolist()
    name_ids = gpu["name_id"]
    names: list[str] = [""] * gpu.size
    is_kernel = gpu["kind"] == int(RecordKind.KERNEL)
    if np.any(is_kernel):
        unique, inverse = np.unique(name_ids[is_kernel], return_inverse=True)
        unique_names = resolve_names(unique)
        if demangle:
            unique_names = demangle_names(unique_names)
        for position, index in zip(np.flatnonzero(is_kernel).tolist(), inverse.tolist()):
            names[position] = unique_names[index]

    starts = (gpu["start_ns"] + clock_offset_ns).tolist()
    durations = (gpu["end_ns"] - gpu["start_ns"]).tolist()
    # Payload fields share bytes (RECORD_DTYPE is a tagged union): read each for its kinds only.
    geometry = np.zeros((gpu.size, 6), dtype=np.int64)
    for column, field in enumerate(("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")):
        geometry[is_kernel, column] = gpu[field][is_kernel]
    nbytes = np.where(is_kernel, 0, gpu["bytes"]).tolist()
    grids = [tuple(g) for g in geometry[:, :3].tolist()]
    blocks = [tuple(b) for b in geometry[:, 3:].tolist()]
    columns = [gpu[f].tolist() for f in ("device", "stream", "correlation_id", "subkind")]
    events: list[KernelEvent] = []
    for i, (device, stream, correlation_id, subkind) in enumerate(zip(*columns)):
        kind = _GPU_KINDS[kinds[i]]
        if kind is KernelKind.KERNEL:
            name = names[i]
        elif kind is KernelKind.MEMCPY:
            name = memcpy_name(subkind)
        else:
            name = "Memset"
        events.append(
            KernelEvent(
                name=name,
                start_ns=starts[i],
                duration_ns=durations[i],
                kind=kind,
                device=device,
                stream=stream,
                correlation_id=correlation_id,
                grid=grids[i],
                block=blocks[i],
                bytes=nbytes[i],
                communication=kind is KernelKind.KERNEL and is_communication_kernel(name),
            )
        )
    return events, invalid


def launch_table(records: np.ndarray, *, clock_offset_ns: int = 0) -> np.ndarray:
    """Runtime/driver API records as a ``LAUNCH_DTYPE`` table, by start time.

    ``cbid`` is CUPTI's callback id of the call (e.g. 211: ``cudaLaunchKernel``).

    Args:
        records: a ``RECORD_DTYPE`` array from ``KernelCollector.drain()``.
        clock_offset_ns: added to ``start_ns`` and ``end_ns``.

    Returns:
        One ``LAUNCH_DTYPE`` row per runtime or driver record (timestamps not validated).

    Raises:
        ValueError: ``records`` is not an array of ``RECORD_DTYPE``.
    """
    records = _check(records)
    api = records[np.isin(records["kind"], [int(RecordKind.RUNTIME), int(RecordKind.DRIVER)])]
    api = api[np.argsort(api["start_ns"], kind="stable")]
    table = np.empty(api.size, dtype=LAUNCH_DTYPE)
    table["correlation_id"] = api["correlation_id"]
    table["thread_id"] = api["thread_id"]
    table["start_ns"] = api["start_ns"] + clock_offset_ns
    table["end_ns"] = api["end_ns"] + clock_offset_ns
    table["cbid"] = api["cbid"]
    table["kind"] = api["kind"]
    return table


def external_correlation_table(
    records: np.ndarray, *, external_kind: int | None = None
) -> np.ndarray:
    """External-correlation records as an ``EXTERNAL_DTYPE`` table.

    Args:
        records: a ``RECORD_DTYPE`` array from ``KernelCollector.drain()``.
        external_kind: keep only this CUPTI external kind; None: ``EXTERNAL_CORRELATION_KIND``,
            the kind ``push_external_id`` uses (-1 without CUPTI support: nothing matches).

    Returns:
        One ``EXTERNAL_DTYPE`` row per matching record, in record order.

    Raises:
        ValueError: ``records`` is not an array of ``RECORD_DTYPE``.
    """
    records = _check(records)
    kind = EXTERNAL_CORRELATION_KIND if external_kind is None else external_kind
    ext = records[records["kind"] == int(RecordKind.EXTERNAL_CORRELATION)]
    ext = ext[ext["subkind"] == kind]
    table = np.empty(ext.size, dtype=EXTERNAL_DTYPE)
    table["correlation_id"] = ext["correlation_id"]
    table["external_id"] = ext["external_id"]
    table["external_kind"] = ext["subkind"]
    return table


def decode_activity(
    records: np.ndarray, *, clock_offset_ns: int = 0, demangle: bool = True
) -> GpuActivity:
    """Kernel events, launch table and external-id table from one drain of the ring.

    Args:
        records: a ``RECORD_DTYPE`` array from ``KernelCollector.drain()`` (any shape;
            flattened).
        clock_offset_ns: added to every timestamp (``time.time_ns() - CUPTI clock``).
        demangle: demangle C++ kernel names.

    Returns:
        The decoded activity; external ids of ets-hook's own kind only.

    Raises:
        ValueError: ``records`` is not an array of ``RECORD_DTYPE``, or a kernel's name id is
            not in the process-wide string table.
    """
    records = _check(records)
    kernels, invalid = _kernel_events(records, clock_offset_ns, demangle)
    return GpuActivity(
        kernels=kernels,
        launches=launch_table(records, clock_offset_ns=clock_offset_ns),
        external_ids=external_correlation_table(records),
        invalid=invalid,
    )


def ops_by_correlation(
    external_ids: np.ndarray, op_of_handle: Mapping[int, tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    """CUPTI correlation id -> the op whose handle its launch carried as external id.

    Args:
        external_ids: ``EXTERNAL_DTYPE`` rows (``GpuActivity.external_ids``).
        op_of_handle: op handle (``RawOp.handle``) -> (iteration index, op index).

    Returns:
        The mapping for the launches whose external id is a known op handle.
    """
    return {
        corr: op_of_handle[ext]
        for corr, ext in zip(
            external_ids["correlation_id"].tolist(),
            external_ids["external_id"].tolist(),
            strict=True,
        )
        if ext in op_of_handle
    }
