"""Interpretation of drained records: kernel events, launch table, per-step kernel lists."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from ets_hook import _C
from ets_hook.capture.cupti import RECORD_DTYPE, RecordKind, name_table
from ets_hook.capture.gpu_records import (
    EXTERNAL_DTYPE,
    LAUNCH_DTYPE,
    decode_activity,
    external_correlation_table,
    is_communication_kernel,
    kernel_events,
    launch_table,
    memcpy_name,
)
from ets_hook.trace.events import KernelEvent, KernelKind


def records(*rows: dict[str, int]) -> np.ndarray:
    out = np.zeros(len(rows), dtype=RECORD_DTYPE)
    for i, row in enumerate(rows):
        for key, value in row.items():
            out[i][key] = value
    return out


def kernel_row(name: str, corr: int, start: int, end: int, **extra: int) -> dict[str, int]:
    row = {
        "kind": RecordKind.KERNEL,
        "name_id": name_table().intern(name),
        "correlation_id": corr,
        "start_ns": start,
        "end_ns": end,
    }
    row.update(extra)
    return row


def launch_row(corr: int, start: int, end: int, thread: int = 1, cbid: int = 211) -> dict[str, int]:
    return {
        "kind": RecordKind.RUNTIME,
        "correlation_id": corr,
        "start_ns": start,
        "end_ns": end,
        "thread_id": thread,
        "cbid": cbid,
        "device": _C._testing.NO_DEVICE,
    }


def test_kernel_events_carry_every_field_sorted_by_start_and_shifted() -> None:
    recs = records(
        kernel_row("late_kernel", 2, 5_000, 5_400, device=1, stream=3),
        kernel_row("gemm", 1, 1_000, 1_900, device=1, stream=7, grid_x=8, grid_y=4, grid_z=2,
                   block_x=128, block_y=2, block_z=1),
        {"kind": RecordKind.MEMCPY, "subkind": 1, "correlation_id": 3, "start_ns": 2_000,
         "end_ns": 2_500, "bytes": 4096, "device": 1, "stream": 7},
        {"kind": RecordKind.MEMSET, "correlation_id": 4, "start_ns": 3_000, "end_ns": 3_010,
         "bytes": 64, "device": 1, "stream": 7},
        launch_row(1, 900, 950),
    )  # fmt: skip
    events = kernel_events(recs, clock_offset_ns=1_000_000)
    assert [e.name for e in events] == ["gemm", memcpy_name(1), "Memset", "late_kernel"]
    gemm, memcpy, memset, late = events
    assert gemm == KernelEvent(
        name="gemm",
        start_ns=1_001_000,
        duration_ns=900,
        kind=KernelKind.KERNEL,
        device=1,
        stream=7,
        correlation_id=1,
        op_index=-1,
        grid=(8, 4, 2),
        block=(128, 2, 1),
        bytes=0,
        communication=False,
    )
    assert (memcpy.kind, memcpy.bytes, memcpy.start_ns, memcpy.duration_ns) == (
        KernelKind.MEMCPY, 4096, 1_002_000, 500,
    )  # fmt: skip
    assert (memset.kind, memset.bytes, memset.correlation_id) == (KernelKind.MEMSET, 64, 4)
    assert (late.device, late.stream, late.start_ns) == (1, 3, 1_005_000)
    assert all(isinstance(e.start_ns, int) and isinstance(e.device, int) for e in events)


def test_memcpy_directions_come_from_the_cupti_headers() -> None:
    if not _C._testing.CUPTI_COMPILED:
        assert memcpy_name(1) == "Memcpy"
        return
    assert memcpy_name(1) == "Memcpy HtoD"
    assert memcpy_name(2) == "Memcpy DtoH"
    assert memcpy_name(8) == "Memcpy DtoD"
    assert memcpy_name(250) == "Memcpy"


def test_nccl_kernels_are_communication() -> None:
    recs = records(
        kernel_row("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1, 10, 20),
        kernel_row("_Z28ncclKernel_AllGather_RING_LLv", 2, 30, 40),
        kernel_row("void at::native::vectorized_elementwise_kernel<4>()", 3, 50, 60),
    )
    assert [e.communication for e in kernel_events(recs)] == [True, True, False]
    assert is_communication_kernel("ncclDevKernel_SendRecv")
    assert not is_communication_kernel("volta_sgemm_128x64_nn")


def test_names_are_demangled_once_per_distinct_name() -> None:
    mangled = "_ZN2at6native18elementwise_kernelILi128ELi2EEEvi"
    recs = records(*(kernel_row(mangled, i, 10 * i + 10, 10 * i + 15) for i in range(5)))
    events = kernel_events(recs)
    assert {e.name for e in events} == {"void at::native::elementwise_kernel<128, 2>(int)"}
    assert kernel_events(recs, demangle=False)[0].name == mangled


def test_records_without_timestamps_are_skipped_and_counted() -> None:
    recs = records(
        kernel_row("ok", 1, 100, 200),
        kernel_row("untimed", 2, 0, 0),  # CUPTI lacked device memory to time it
        kernel_row("inverted", 3, 500, 400),
    )
    activity = decode_activity(recs)
    assert [e.name for e in activity.kernels] == ["ok"]
    assert activity.invalid == 2


def test_launch_table_holds_runtime_and_driver_calls_on_the_host_clock() -> None:
    recs = records(
        launch_row(7, 300, 340, thread=42, cbid=211),
        kernel_row("k", 7, 1_000, 1_100),
        launch_row(5, 100, 120, thread=43, cbid=311),
        {"kind": RecordKind.DRIVER, "correlation_id": 6, "start_ns": 200, "end_ns": 230,
         "thread_id": 42, "cbid": 307},
    )  # fmt: skip
    table = launch_table(recs, clock_offset_ns=-50)
    assert table.dtype == LAUNCH_DTYPE
    assert table.tolist() == [
        (5, 43, 50, 70, 311, RecordKind.RUNTIME),
        (6, 42, 150, 180, 307, RecordKind.DRIVER),
        (7, 42, 250, 290, 211, RecordKind.RUNTIME),
    ]


def test_external_correlation_table_keeps_our_kind_only() -> None:
    ours = _C.EXTERNAL_CORRELATION_KIND
    recs = records(
        {
            "kind": RecordKind.EXTERNAL_CORRELATION,
            "subkind": ours,
            "correlation_id": 1,
            "external_id": 2**40,
        },
        {
            "kind": RecordKind.EXTERNAL_CORRELATION,
            "subkind": 3,
            "correlation_id": 1,
            "external_id": 9,
        },
        kernel_row("k", 1, 10, 20),
    )
    table = external_correlation_table(recs)
    assert table.dtype == EXTERNAL_DTYPE
    assert table.tolist() == [(1, 2**40, ours)]
    assert external_correlation_table(recs, external_kind=3).tolist() == [(1, 9, 3)]


def test_decode_activity_bundles_everything() -> None:
    ours = _C.EXTERNAL_CORRELATION_KIND
    recs = records(
        launch_row(1, 100, 150),
        kernel_row("k", 1, 200, 300),
        {
            "kind": RecordKind.EXTERNAL_CORRELATION,
            "subkind": ours,
            "correlation_id": 1,
            "external_id": 77,
        },
    )
    activity = decode_activity(recs, clock_offset_ns=5)
    assert [(k.name, k.start_ns) for k in activity.kernels] == [("k", 205)]
    assert activity.launches["start_ns"].tolist() == [105]
    assert activity.external_ids["external_id"].tolist() == [77]
    assert activity.invalid == 0


def test_empty_input() -> None:
    activity = decode_activity(np.empty(0, dtype=RECORD_DTYPE))
    assert activity.kernels == []
    assert activity.launches.size == activity.external_ids.size == 0


def test_wrong_dtype_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="RECORD_DTYPE"):
        decode_activity(np.zeros(3, dtype=np.int64))


# ---------------------------------------------------------------- per-step lists


def ev(name: str, corr: int, start: int, duration: int = 10) -> KernelEvent:
    return KernelEvent(name=name, start_ns=start, duration_ns=duration, correlation_id=corr)


@dataclass
class Bounds:
    step: int
    start_ns: int
    end_ns: int
