"""The .ets file format: round trips, and typed errors for every kind of bad file."""

from __future__ import annotations

import struct
import zlib

import msgpack
import pytest
from support import sample_trace

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
    IterationTrace,
    OpEvent,
    Trace,
)
from ets_hook.trace.io import HEADER_SIZE, MAGIC, dumps, load_trace, loads, save_trace


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
