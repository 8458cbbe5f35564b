"""CUPTI collector on a CPU: synthetic activity buffers and every unavailable-CUPTI path.

A fake libcupti function table (``_C._testing.install_fake_cupti``) replaces the real library
inside the native controller. Its ``cuptiActivityFlushAll`` hands queued buffers, built from the
real CUPTI header structs, to the registered buffer callbacks: the same trampolines, buffer pool
and decode path CUPTI's worker thread drives on a GPU machine.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ets_hook import _C
from ets_hook.capture import cupti
from ets_hook.capture.cupti import RECORD_DTYPE, KernelCollector, RecordKind
from ets_hook.capture.gpu_records import decode_activity

T = _C._testing
pytestmark = pytest.mark.skipif(
    not T.CUPTI_COMPILED, reason="this build has no CUPTI headers (see test_native_build.py)"
)

# CUPTI constants from the headers this build used (cupti_activity.h / cupti_result.h).
KIND_MEMCPY, KIND_MEMSET, KIND_DRIVER, KIND_RUNTIME = 1, 2, 4, 5
KIND_CONCURRENT_KERNEL, KIND_EXTERNAL = 10, 39
ERR_INSUFFICIENT_PRIVILEGES = 35
ERR_MULTIPLE_SUBSCRIBERS = 39
ERR_NOT_INITIALIZED = 15
CBID_LAUNCH_KERNEL = 211
OTHER_CLIENT_ENV = [var for var, _ in cupti._ENV_CLIENTS]


@pytest.fixture(autouse=True)
def clean_cupti(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in OTHER_CLIENT_ENV:
        monkeypatch.delenv(var, raising=False)
    T.reset_cupti()
    yield
    if cupti._active is not None:
        cupti._active.close()
    T.reset_cupti()


@pytest.fixture
def fake() -> None:
    T.install_fake_cupti()


def small_collector(**kwargs: object) -> KernelCollector:
    options: dict[str, object] = {
        "ring_capacity": 1024,
        "buffer_size_bytes": 1 << 16,
        "buffer_count": 4,
    }
    options.update(kwargs)
    return KernelCollector(**options)  # type: ignore[arg-type]


def kernel(corr: int, start: int, name: str = "my_kernel", **fields: int) -> dict[str, int | str]:
    record: dict[str, int | str] = {
        "kind": "concurrent_kernel",
        "name": name,
        "start": start,
        "end": start + 1000,
        "correlationId": corr,
    }
    record.update(fields)
    return record


# ---------------------------------------------------------------- decode


def test_every_enabled_kind_decodes_to_the_right_record(fake: None) -> None:
    collector = small_collector()
    assert collector.start().available
    names = ["_Z6kernelv", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
    buffer = T.build_activity_buffer(
        [
            {"kind": "runtime", "cbid": CBID_LAUNCH_KERNEL, "start": 1_000, "end": 1_500,
             "processId": 4242, "threadId": 77, "correlationId": 11, "returnValue": 0},
            {"kind": "concurrent_kernel", "name": names[0], "start": 2_000, "end": 2_600,
             "deviceId": 1, "contextId": 3, "streamId": 7, "correlationId": 11,
             "gridX": 64, "gridY": 2, "gridZ": 1, "blockX": 256, "blockY": 4, "blockZ": 2},
            {"kind": "kernel", "name": names[1], "start": 3_000, "end": 3_100, "deviceId": 0,
             "streamId": 9, "correlationId": 12, "gridX": 1, "gridY": 1, "gridZ": 1,
             "blockX": 32, "blockY": 1, "blockZ": 1},
            {"kind": "memcpy", "start": 4_000, "end": 4_200, "deviceId": 1, "contextId": 3,
             "streamId": 7, "correlationId": 13, "bytes": 1 << 20, "copyKind": 1},
            {"kind": "memset", "start": 5_000, "end": 5_050, "deviceId": 1, "contextId": 3,
             "streamId": 8, "correlationId": 14, "bytes": 4096, "value": 0},
            {"kind": "external_correlation", "externalKind": _C.EXTERNAL_CORRELATION_KIND,
             "externalId": 2**40 + 5, "correlationId": 11},
            {"kind": "driver", "cbid": 307, "start": 6_000, "end": 6_010, "threadId": 78,
             "correlationId": 15},
        ]
    )  # fmt: skip
    T.queue_activity_buffer(buffer)
    assert collector.flush().available
    out = collector.drain()
    assert out.dtype == RECORD_DTYPE
    assert out["kind"].tolist() == [
        RecordKind.RUNTIME, RecordKind.KERNEL, RecordKind.KERNEL, RecordKind.MEMCPY,
        RecordKind.MEMSET, RecordKind.EXTERNAL_CORRELATION, RecordKind.DRIVER,
    ]  # fmt: skip
    runtime, k1, k2, memcpy, memset, ext, driver = out

    assert (runtime["cbid"], runtime["thread_id"], runtime["correlation_id"]) == (211, 77, 11)
    assert (runtime["start_ns"], runtime["end_ns"], runtime["device"]) == (
        1_000,
        1_500,
        T.NO_DEVICE,
    )

    assert (k1["start_ns"], k1["end_ns"], k1["device"], k1["context_id"]) == (2_000, 2_600, 1, 3)
    assert (k1["stream"], k1["correlation_id"]) == (7, 11)
    assert (k1["grid_x"], k1["grid_y"], k1["grid_z"]) == (64, 2, 1)
    assert (k1["block_x"], k1["block_y"], k1["block_z"]) == (256, 4, 2)
    assert cupti.resolve_names([k1["name_id"], k2["name_id"]]) == names
    assert (k2["stream"], k2["correlation_id"], k2["block_x"]) == (9, 12, 32)

    assert (memcpy["bytes"], memcpy["subkind"], memcpy["stream"]) == (1 << 20, 1, 7)
    assert (memcpy["start_ns"], memcpy["end_ns"], memcpy["correlation_id"]) == (4_000, 4_200, 13)
    assert (memset["bytes"], memset["stream"], memset["correlation_id"]) == (4096, 8, 14)
    assert (memset["start_ns"], memset["end_ns"], memset["name_id"]) == (5_000, 5_050, 0)

    assert (ext["external_id"], ext["correlation_id"]) == (2**40 + 5, 11)
    assert ext["subkind"] == _C.EXTERNAL_CORRELATION_KIND
    assert (driver["cbid"], driver["thread_id"], driver["correlation_id"]) == (307, 78, 15)

    stats = collector.stats()
    assert stats.records_decoded == 7
    assert stats.buffers_requested == stats.buffers_completed == 1
    assert stats.buffers_outstanding == 0
    assert stats.decode_errors == stats.dropped == 0


def test_synthetic_buffers_use_the_compiled_struct_versions() -> None:
    kernel_struct, memcpy_struct, memset_struct, api, ext = T.activity_struct_names()
    assert (api, ext) == ("CUpti_ActivityAPI", "CUpti_ActivityExternalCorrelation")
    assert kernel_struct.startswith("CUpti_ActivityKernel")
    assert memcpy_struct.startswith("CUpti_ActivityMemcpy")
    assert memset_struct.startswith("CUpti_ActivityMemset")
    info = T.cupti_info()
    assert (info["kernel_struct"], info["memcpy_struct"], info["memset_struct"]) == (
        kernel_struct, memcpy_struct, memset_struct,
    )  # fmt: skip
    records = [
        {"kind": k}
        for k in ("concurrent_kernel", "memcpy", "memset", "runtime", "external_correlation")
    ]
    sizes = [T.activity_record_size(r["kind"]) for r in records]
    assert all(s % 8 == 0 for s in sizes)
    assert len(T.build_activity_buffer(records)) == sum(sizes)


def test_unknown_synthetic_fields_are_rejected() -> None:
    with pytest.raises(ValueError, match="gridQ"):
        T.build_activity_buffer([{"kind": "concurrent_kernel", "gridQ": 1}])
    with pytest.raises(ValueError, match="teleport"):
        T.build_activity_buffer([{"kind": "teleport"}])


def test_unsupported_kinds_are_skipped_and_counted(fake: None) -> None:
    collector = small_collector()
    collector.start()
    T.queue_activity_buffer(
        T.build_activity_buffer([{"kind": "name"}, kernel(1, 10), {"kind": "name"}])
    )
    collector.flush()
    assert collector.drain()["correlation_id"].tolist() == [1]
    stats = collector.stats()
    assert (stats.records_decoded, stats.records_skipped) == (1, 2)


def test_a_truncated_buffer_keeps_the_complete_records_and_counts_the_error(fake: None) -> None:
    collector = small_collector()
    collector.start()
    data = T.build_activity_buffer([kernel(1, 10), kernel(2, 20), kernel(3, 30)])
    T.queue_activity_buffer(data[:-16])  # last record cut short, as a corrupt buffer would be
    collector.flush()
    assert collector.drain()["correlation_id"].tolist() == [1, 2]
    assert collector.stats().decode_errors == 1


def test_a_full_ring_drops_and_counts(fake: None) -> None:
    collector = small_collector(ring_capacity=4)
    collector.start()
    T.queue_activity_buffer(T.build_activity_buffer([kernel(i, 100 * i) for i in range(1, 11)]))
    collector.flush()
    assert collector.drain()["correlation_id"].tolist() == [1, 2, 3, 4]
    stats = collector.stats()
    assert (stats.records_decoded, stats.ring_dropped, collector.dropped) == (4, 6, 6)


def test_records_cupti_could_not_buffer_are_counted(fake: None) -> None:
    T.install_fake_cupti(dropped_records=5)
    collector = small_collector()
    collector.start()
    collector.flush()
    assert collector.stats().cupti_dropped == 5
    assert collector.dropped == 5


# Run in a child: before the fix the fake CUPTI completed the too-small buffer while holding its
# own mutex, and the completion callback's cuptiActivityGetNumDroppedRecords took that mutex again
# (a self-deadlock of the flushing thread that would hang this process, not fail it).
TOO_SMALL_BUFFER = textwrap.dedent(
    """
    from ets_hook import _C
    from ets_hook.capture.cupti import KernelCollector
    T = _C._testing
    T.install_fake_cupti()
    collector = KernelCollector(ring_capacity=1024, buffer_size_bytes=4096, buffer_count=4)
    assert collector.start().available
    kernels = [
        {"kind": "concurrent_kernel", "name": "k", "start": 10 * i, "end": 10 * i + 5,
         "correlationId": i}
        for i in range(64)
    ]
    data = T.build_activity_buffer(kernels)
    assert len(data) > 4096, len(data)
    T.queue_activity_buffer(data)
    assert collector.flush().available
    assert T.deliver_activity_buffer(data) is False
    stats = collector.stats()
    print("RESULT", collector.drain().size, stats.cupti_dropped, stats.buffers_requested,
          stats.buffers_completed, stats.buffers_outstanding)
    assert collector.stop().available
    """
)


def test_a_buffer_too_small_for_the_records_drops_them_without_deadlock() -> None:
    env = {k: v for k, v in os.environ.items() if k not in OTHER_CLIENT_ENV}
    run = subprocess.run(
        [sys.executable, "-c", TOO_SMALL_BUFFER],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = next(line for line in run.stdout.splitlines() if line.startswith("RESULT"))
    # nothing decoded, every record of both deliveries counted as dropped by CUPTI, and each
    # buffer handed back to the pool through the completion callback
    assert result.split()[1:] == ["0", "128", "2", "2", "0"]


def test_buffers_of_another_client_are_left_alone(fake: None) -> None:
    collector = small_collector()
    collector.start()
    T.complete_foreign_buffer(T.build_activity_buffer([kernel(1, 10)]))
    assert collector.drain().size == 0
    stats = collector.stats()
    assert stats.foreign_buffers == 1
    assert stats.records_decoded == 0
    assert "another CUPTI client" in T.cupti_last_error()


def test_concurrent_buffer_callbacks_lose_nothing(fake: None) -> None:
    # CUPTI's worker thread and a thread calling flush() both complete buffers: the collector
    # serialises them as the ring's single producer.
    collector = small_collector(ring_capacity=1 << 16, buffer_count=8)
    collector.start()
    per_buffer = 50
    data = T.build_activity_buffer([kernel(i, 10 * i) for i in range(per_buffer)])
    worker = T.Deliverer(data, 200)
    flushed = 0
    for _ in range(200):
        T.queue_activity_buffer(data)
        collector.flush()
        flushed += 1
    delivered = worker.join()
    out = collector.drain()
    assert delivered == 200
    assert out.size == (delivered + flushed) * per_buffer
    # each buffer's records stay contiguous and in order
    np.testing.assert_array_equal(
        out["correlation_id"].reshape(-1, per_buffer), np.tile(np.arange(per_buffer), (400, 1))
    )
    assert collector.stats().buffers_outstanding == 0


# ---------------------------------------------------------------- lifecycle


def test_start_enables_exactly_the_requested_kinds_and_stop_disables_them(fake: None) -> None:
    collector = small_collector()
    status = collector.start()
    assert status == cupti.CuptiStatus(True, "ok", status.reason)
    assert sorted(T.fake_enabled_kinds()) == sorted(
        [KIND_MEMCPY, KIND_MEMSET, KIND_DRIVER, KIND_RUNTIME, KIND_CONCURRENT_KERNEL, KIND_EXTERNAL]
    )
    assert T.fake_subscriber_count() == 0  # the subscriber probe unsubscribed
    assert collector.active and T.cupti_active()
    assert collector.stop().available
    assert T.fake_enabled_kinds() == []
    assert not collector.active and not T.cupti_active()
    assert collector.stop().available  # idempotent


def test_start_with_a_subset_of_kinds(fake: None) -> None:
    collector = small_collector(activities=("kernel", "runtime"))
    assert collector.start().available
    assert sorted(T.fake_enabled_kinds()) == [KIND_RUNTIME, KIND_CONCURRENT_KERNEL]


def test_records_flushed_by_stop_are_still_drained(fake: None) -> None:
    collector = small_collector()
    collector.start()
    T.queue_activity_buffer(T.build_activity_buffer([kernel(7, 70)]))
    collector.stop()
    assert collector.drain()["correlation_id"].tolist() == [7]


def test_stop_without_flush_leaves_records_for_collect(fake: None) -> None:
    collector = small_collector()
    collector.start()
    T.queue_activity_buffer(T.build_activity_buffer([kernel(8, 80)]))
    assert collector.stop(flush=False).available
    assert T.fake_enabled_kinds() == []
    assert collector.drain().size == 0  # still queued inside "CUPTI"
    records, _, _ = collector.collect()
    assert records["correlation_id"].tolist() == [8]


def test_only_one_collection_per_process(fake: None) -> None:
    first = small_collector()
    assert first.start().available
    second = small_collector()
    status = second.start()
    assert (status.available, status.code) == (False, "already_active")
    first.stop()
    assert second.start().available


def test_the_native_controller_refuses_a_second_start(fake: None) -> None:
    ring = cupti.RingBuffer(16)
    assert _C.cupti_start(ring, 1 << 16, 4, ["kernel"])[0] == "ok"
    assert _C.cupti_start(ring, 1 << 16, 4, ["kernel"])[0] == "already_active"
    _C.cupti_stop()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ring_capacity": 0}, "ring_capacity"),
        ({"buffer_size_bytes": 100}, "buffer_size_bytes"),
        ({"buffer_count": 1}, "buffer_count"),
        ({"activities": ("kernel", "warp_stalls")}, "warp_stalls"),
        ({"activities": ()}, "activities"),
    ],
)
def test_bad_collector_arguments_are_value_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KernelCollector(**kwargs)  # type: ignore[arg-type]


def test_collector_before_start_is_inert() -> None:
    collector = small_collector()
    assert collector.drain().size == 0
    assert collector.flush().available is False
    assert collector.stop().available is False
    assert collector.dropped == 0
    assert collector.clock_offset_ns is None


def test_context_manager_stops(fake: None) -> None:
    with small_collector() as collector:
        assert collector.active
    assert not collector.active
    assert T.fake_enabled_kinds() == []


# ---------------------------------------------------------------- unavailable CUPTI


def _libcuda_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_libcuda_loadable(), reason="this machine has an NVIDIA driver")
def test_no_driver_here_is_reported_not_raised() -> None:
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "no_driver")
    assert "libcuda.so.1" in status.reason
    collector = small_collector()
    assert collector.start().code == "no_driver"
    assert not collector.active
    assert cupti.cupti_timestamp_ns() is None
    assert cupti.measure_clock_offset_ns() is None
    assert cupti.push_external_id(1) is False
    assert cupti.pop_external_id() is None


def test_missing_driver_library() -> None:
    T.set_loader_options(driver_library="libcuda-ets-hook-missing.so.1")
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "no_driver")
    assert "libcuda-ets-hook-missing.so.1" in status.reason


def test_driver_present_but_libcupti_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    T.set_loader_options(
        check_driver=False, use_loaded=False, use_sonames=False, extra_dirs=[str(tmp_path)]
    )
    monkeypatch.setattr(cupti, "cupti_library_dirs", lambda: [str(tmp_path / "nvidia" / "lib")])
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "no_libcupti")
    assert str(tmp_path) in status.reason
    assert small_collector().start().code == "no_libcupti"


def test_a_file_that_is_not_libcupti_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "libcupti.so").write_bytes(b"not an ELF file")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    T.set_loader_options(
        check_driver=False, use_loaded=False, use_sonames=False, extra_dirs=[str(tmp_path)]
    )
    status = cupti.cupti_status()
    assert status.code == "no_libcupti"
    assert "libcupti.so" in status.reason


def _toolkit_libcupti_dir() -> Path | None:
    root = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    for sub in ("extras/CUPTI/lib64", "lib64", "lib"):
        if list((root / sub).glob("libcupti.so*")):
            return root / sub
    return None


@pytest.mark.skipif(_toolkit_libcupti_dir() is None, reason="no libcupti under CUDA_HOME")
def test_libcupti_is_found_under_cuda_home_without_the_soname() -> None:
    # Real dlopen of the toolkit's libcupti, found by directory search. Without a driver CUPTI
    # itself then fails (the subscriber probe), which must come back as a status.
    already = _C.loaded_libraries("libcupti.so")
    if already:  # a second copy of libcupti in one process would collide with the first
        pytest.skip(f"a libcupti is already loaded in this process: {already}")
    T.set_loader_options(
        check_driver=False, use_env_override=False, use_loaded=False, use_sonames=False
    )
    status = cupti.cupti_status()
    assert status.code not in {"no_libcupti", "no_headers"}
    info = T.cupti_info()
    assert Path(str(info["library_path"])).parent.resolve() == _toolkit_libcupti_dir().resolve()
    assert int(info["runtime_version"]) > 0
    assert cupti.cupti_timestamp_ns() is not None


def test_version_mismatch_newer_major_than_the_headers() -> None:
    newer = (
        (T.COMPILED_CUPTI_VERSION // 10000 + 1) * 10000
        if T.COMPILED_CUPTI_VERSION >= 10000
        else 130000
    )
    T.install_fake_cupti(version=newer)
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "version_mismatch")
    assert "rebuild" in status.reason
    collector = small_collector()
    assert collector.start().code == "version_mismatch"
    assert T.fake_enabled_kinds() == []


def test_version_mismatch_too_old() -> None:
    T.install_fake_cupti(version=12)  # CUDA 10.x
    assert cupti.cupti_status().code == "version_mismatch"


@pytest.mark.parametrize(
    ("compiled", "runtime", "ok"),
    [
        (130001, 130001, True),
        (130001, 130000, True),
        (130001, 26, True),  # headers 13.0, torch's libcupti 12.8: records keep the same prefix
        (130001, 18, True),  # CUDA 11.8
        (24, 28, True),  # 12.6 headers, 12.9 library
        (28, 130000, False),  # 12.x headers, 13.0 library
        (130001, 140000, False),
        (130001, 12, False),
    ],
)
def test_version_policy(compiled: int, runtime: int, ok: bool) -> None:
    result, reason = T.cupti_version_check(compiled, runtime)
    assert result is ok
    assert str(runtime) in reason


def test_multiple_subscribers_from_the_probe() -> None:
    T.install_fake_cupti(subscribe_result=ERR_MULTIPLE_SUBSCRIBERS)
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "multiple_subscribers")
    assert "MULTIPLE_SUBSCRIBERS" in status.reason
    collector = small_collector()
    assert collector.start().code == "multiple_subscribers"
    assert T.fake_enabled_kinds() == []
    # the caller can take responsibility for sharing CUPTI
    assert small_collector(allow_other_client=True).start().available


def test_insufficient_privileges_from_the_probe() -> None:
    T.install_fake_cupti(subscribe_result=ERR_INSUFFICIENT_PRIVILEGES)
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "insufficient_privileges")


def test_insufficient_privileges_when_enabling_rolls_back_enabled_kinds() -> None:
    T.install_fake_cupti(enable_result=ERR_INSUFFICIENT_PRIVILEGES, enable_fail_kind=KIND_RUNTIME)
    collector = small_collector()
    status = collector.start()
    assert (status.available, status.code) == (False, "insufficient_privileges")
    assert T.fake_enabled_kinds() == []  # kernel/memcpy/memset were enabled, then disabled again
    assert not collector.active and not T.cupti_active()


def test_other_cupti_errors_are_reported_with_the_cupti_name() -> None:
    T.install_fake_cupti(register_result=ERR_NOT_INITIALIZED)
    status = small_collector().start()
    assert (status.available, status.code) == (False, "cupti_error")
    assert "cuptiActivityRegisterCallbacks" in status.reason
    assert "CUPTI_ERROR_NOT_INITIALIZED" in status.reason


def test_flush_errors_are_statuses() -> None:
    T.install_fake_cupti(flush_result=ERR_NOT_INITIALIZED)
    collector = small_collector()
    assert collector.start().available
    status = collector.flush()
    assert (status.available, status.code) == (False, "cupti_error")
    assert "cuptiActivityFlushAll" in status.reason
    assert collector.stop().code == "cupti_error"  # kinds are disabled all the same
    assert T.fake_enabled_kinds() == []


@pytest.mark.parametrize("var", ["NSYS_PROFILING_SESSION_ID", "CUDA_INJECTION64_PATH"])
def test_nsight_environment_is_another_client(
    fake: None, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    monkeypatch.setenv(var, "/opt/nsight/libToolsInjection64.so")
    status = cupti.cupti_status()
    assert (status.available, status.code) == (False, "other_client")
    assert var in status.reason
    collector = small_collector()
    assert collector.start().code == "other_client"
    assert T.fake_enabled_kinds() == []  # nothing was stolen
    assert cupti.cupti_status(allow_other_client=True).available


def test_an_active_torch_profiler_is_another_client(fake: None) -> None:
    torch = pytest.importorskip("torch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        status = small_collector().start()
    assert (status.available, status.code) == (False, "other_client")
    assert "torch profiler" in status.reason
    assert small_collector().start().available  # fine once the profiler is gone


# ---------------------------------------------------------------- correlation and clocks


def test_external_correlation_push_pop(fake: None) -> None:
    assert cupti.push_external_id(5)
    assert cupti.push_external_id(2**63 + 1)
    assert T.fake_external_stack() == [5, 2**63 + 1]
    assert cupti.pop_external_id() == 2**63 + 1
    assert cupti.pop_external_id() == 5
    assert cupti.pop_external_id() is None
    with pytest.raises(ValueError, match="-1"):
        cupti.push_external_id(-1)


def test_clock_offset_is_measured_against_time_time_ns(fake: None) -> None:
    T.install_fake_cupti(timestamp_offset_ns=-3_000_000_000)  # CUPTI clock 3 s behind
    offset = cupti.measure_clock_offset_ns()
    assert offset is not None
    assert abs(offset - 3_000_000_000) < 5_000_000
    collector = small_collector()
    collector.start()
    collector.stop()
    assert collector.clock_offset_ns is not None
    assert abs(collector.clock_offset_ns - 3_000_000_000) < 5_000_000


def test_runtime_api_names(fake: None) -> None:
    assert T.cupti_callback_name(CBID_LAUNCH_KERNEL) == "cudaLaunchKernel"
    assert T.cupti_callback_name(99_999) == ""


def test_collected_records_decode_to_trace_objects_on_the_host_clock(fake: None) -> None:
    collector = small_collector()
    collector.start()
    T.queue_activity_buffer(
        T.build_activity_buffer(
            [
                {
                    "kind": "runtime",
                    "cbid": CBID_LAUNCH_KERNEL,
                    "start": 100,
                    "end": 150,
                    "threadId": 9,
                    "correlationId": 1,
                },
                kernel(1, 1_000, name="gemm"),
            ]
        )
    )
    records, _, dropped = collector.collect()
    activity = decode_activity(records, clock_offset_ns=10)
    kernels, launches = activity.kernels, activity.launches
    assert [(k.name, k.start_ns, k.duration_ns, k.correlation_id) for k in kernels] == [
        ("gemm", 1_010, 1000, 1)
    ]
    assert launches[["correlation_id", "thread_id", "start_ns"]].tolist() == [(1, 9, 110)]
    assert dropped == 0
