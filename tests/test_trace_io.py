"""The .ets file format: round trips, and typed errors for every kind of bad file."""

from __future__ import annotations

import struct
import zlib

import msgpack
import pytest

import ets_hook
from ets_hook.errors import (
    CorruptTraceError,
    NotATraceFileError,
    TraceFileError,
    TraceTooLargeError,
    TruncatedTraceError,
    UnsupportedTraceVersionError,
)
from ets_hook.trace.events import (
    CaptureInfo,
    DeviceInfo,
    IterationTrace,
    KernelEvent,
    KernelKind,
    OpEvent,
    Phase,
    Trace,
)
from ets_hook.trace.io import HEADER_SIZE, MAGIC, dumps, load_trace, loads, save_trace


def sample_trace() -> Trace:
    ops = [
        OpEvent(
            "aten::linear",
            1_000,
            500,
            thread=1,
            phase=Phase.FORWARD,
            input_shapes=((32, 64), (128, 64), (128,)),
            input_dtypes=("float",) * 3,
            sequence_nr=7,
            gap_ns=20,
        ),
        OpEvent(
            "aten::addmm",
            1_100,
            300,
            thread=1,
            phase=Phase.FORWARD,
            depth=1,
            parent=0,
            input_shapes=((128,), (32, 64), (64, 128)),
            input_dtypes=("float",) * 3,
        ),
        OpEvent(
            "autograd::engine::evaluate_function: AddmmBackward0",
            2_000,
            900,
            thread=2,
            phase=Phase.BACKWARD,
            kernel_duration_ns=400,
            kernel_count=2,
            gap_ns=0,
        ),
        OpEvent(
            "aten::add_",
            3_000,
            50,
            thread=1,
            phase=Phase.OPTIMIZER,
            flops=128,
            bytes_moved=1024,
            params=(1, 2, 3),
        ),
    ]
    kernels = [
        KernelEvent(
            "volta_sgemm_128x64_nn",
            1_200,
            250,
            device=0,
            stream=7,
            correlation_id=11,
            op_index=1,
            grid=(4, 2, 1),
            block=(256, 1, 1),
        ),
        KernelEvent(
            "Memcpy HtoD",
            1_500,
            30,
            kind=KernelKind.MEMCPY,
            stream=7,
            correlation_id=12,
            bytes=4096,
        ),
        KernelEvent(
            "ncclDevKernel_AllReduce",
            2_100,
            700,
            stream=9,
            correlation_id=13,
            op_index=2,
            communication=True,
        ),
    ]
    iterations = [
        IterationTrace(step=1, start_ns=900, end_ns=3_200, ops=ops, kernels=kernels),
        IterationTrace(step=2, start_ns=3_200, end_ns=5_000),
    ]
    return Trace(
        iterations=iterations,
        device=DeviceInfo(kind="cuda", name="Test GPU", index=0, uuid="GPU-1234"),
        capture=CaptureInfo(skip_steps=1, capture_steps=2, op_capture="test", dropped_records=3),
        torch_version="2.13.0",
        ets_hook_version="0.1.0",
        step_times_s=[0.5, 0.25, 0.24],
        rank=1,
        world_size=2,
        metadata={"model": "MLP", "batch_size": 32, "tags": ["a", "b"]},
    )


def test_round_trip_preserves_every_field(tmp_path):
    trace = sample_trace()
    path = save_trace(trace, tmp_path / "t.ets")
    assert load_trace(path) == trace
    assert ets_hook.load_trace(path) == trace  # the top-level export is the same function


def test_save_trace_is_atomic_and_leaves_no_temp_files(tmp_path):
    trace = sample_trace()
    ets_hook.save_trace(trace, tmp_path / "a.ets")
    ets_hook.save_trace(trace, tmp_path / "a.ets")  # overwrite
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ets"]


def test_interning_keeps_files_small():
    op = OpEvent("aten::relu", 0, 10, input_shapes=((64, 128),), input_dtypes=("float",))
    iteration = IterationTrace(
        step=0,
        start_ns=0,
        end_ns=10**6,
        ops=[OpEvent(**{**_fields(op), "start_ns": i}) for i in range(1000)],
    )
    size = len(dumps(Trace(iterations=[iteration])))
    # 15 fixed-width columns (at most 8 bytes each) per op; names and shapes stored once.
    assert size < 1000 * 15 * 8


def _fields(op: OpEvent) -> dict:
    return {name: getattr(op, name) for name in op.__slots__}


def test_garbage_is_not_a_trace():
    with pytest.raises(NotATraceFileError):
        loads(b"hello, this is not a trace file at all")
    with pytest.raises(NotATraceFileError):
        loads(b"{}")


@pytest.mark.parametrize("keep", [0, 5, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 10, -1])
def test_truncated_file_raises_truncated(keep):
    data = dumps(sample_trace())
    cut = data[:keep] if keep >= 0 else data[:-1]
    with pytest.raises(TruncatedTraceError):
        loads(cut)


def test_flipped_payload_byte_is_a_checksum_error():
    data = bytearray(dumps(sample_trace()))
    data[HEADER_SIZE + 40] ^= 0xFF
    with pytest.raises(CorruptTraceError, match="checksum"):
        loads(bytes(data))


def test_trailing_bytes_are_corruption():
    with pytest.raises(CorruptTraceError):
        loads(dumps(sample_trace()) + b"\x00")


def test_wrong_version_names_both_versions():
    data = bytearray(dumps(sample_trace()))
    struct.pack_into("<H", data, 8, 99)
    with pytest.raises(UnsupportedTraceVersionError, match="99"):
        loads(bytes(data))


def _with_payload(payload: object) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    return struct.pack("<8sHHQI", MAGIC, 1, 0, len(body), zlib.crc32(body)) + body


def _valid_payload() -> dict:
    data = dumps(sample_trace())
    return msgpack.unpackb(data[HEADER_SIZE:], raw=False)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(format="other"),
        lambda p: p.update(strings=[1, 2]),
        lambda p: p["iterations"][0].update(n_ops=10**6),
        lambda p: p["iterations"][0]["ops"].update(name=b"\xff" * 4 * 4),
        lambda p: p["iterations"][0]["ops"].pop("phase"),
        lambda p: p["iterations"][0]["kernels"].update(op_index=b"\x09\x00\x00\x00" * 3),
        lambda p: p.update(signatures=[[["x"], []]]),
        lambda p: p["meta"].update(step_times_s="fast"),
        lambda p: p.update(iterations="none"),
    ],
)
def test_structurally_invalid_payloads_are_corrupt(mutate):
    payload = _valid_payload()
    mutate(payload)
    with pytest.raises(CorruptTraceError):
        loads(_with_payload(payload))


def test_msgpack_garbage_payload_is_corrupt():
    body = b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    data = struct.pack("<8sHHQI", MAGIC, 1, 0, len(body), zlib.crc32(body)) + body
    with pytest.raises(CorruptTraceError):
        loads(data)


def test_oversized_file_is_rejected_before_reading(tmp_path):
    path = save_trace(sample_trace(), tmp_path / "t.ets")
    with pytest.raises(TraceTooLargeError):
        load_trace(path, max_bytes=100)


def test_every_error_is_a_value_error_subclass():
    for cls in (
        NotATraceFileError,
        TruncatedTraceError,
        CorruptTraceError,
        UnsupportedTraceVersionError,
        TraceTooLargeError,
    ):
        assert issubclass(cls, TraceFileError)
        assert issubclass(cls, ValueError)
