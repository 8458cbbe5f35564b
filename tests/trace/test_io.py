"""The .ets file format: round trips, and typed errors for every kind of bad file."""

from __future__ import annotations

import math
import os
import pickle
import re
import socket
import struct
import tracemalloc
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from support import call_in_thread, sample_trace

import ets_hook
from ets_hook.errors import (
    CorruptTraceError,
    NotARegularFileError,
    NotATraceFileError,
    TraceFieldError,
    TraceFileError,
    TraceTooLargeError,
    TruncatedTraceError,
    UnsupportedTraceVersionError,
)
from ets_hook.trace import io as trace_io
from ets_hook.trace import untrusted
from ets_hook.trace.events import (
    IterationTrace,
    OpEvent,
    Trace,
)
from ets_hook.trace.io import (
    HEADER_SIZE,
    MAGIC,
    MAX_DEPTH,
    dumps,
    load_trace,
    loads,
    save_trace,
)
from ets_hook.trace.summary import TEXT_LIMIT, format_info


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
        TraceFieldError,
        UnsupportedTraceVersionError,
        TraceTooLargeError,
        NotARegularFileError,
    ):
        assert issubclass(cls, TraceFileError)
        assert issubclass(cls, ValueError)


# ---------------------------------------------------------------------------------------------
# Hostile files (issue 13): special files, bounded memory, typed errors naming file and field


def _fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "pipe.ets"
    os.mkfifo(path)
    return path


def test_fifo_is_refused_without_blocking(tmp_path):
    path = _fifo(tmp_path)
    with pytest.raises(NotARegularFileError, match="FIFO") as info:
        call_in_thread(lambda: load_trace(path))
    assert str(path) in str(info.value)
    assert isinstance(info.value, TraceFileError) and isinstance(info.value, ValueError)


def test_directory_is_refused(tmp_path):
    with pytest.raises(NotARegularFileError, match="directory") as info:
        call_in_thread(lambda: load_trace(tmp_path))
    assert str(tmp_path) in str(info.value)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_never_read(monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(
        untrusted.os, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k)
    )
    with pytest.raises(NotARegularFileError, match="character device"):
        call_in_thread(lambda: load_trace("/dev/zero"))
    assert opened == []  # refused on os.stat alone: not even opened


def test_socket_is_refused(tmp_path):
    if not hasattr(socket, "AF_UNIX"):
        pytest.skip("no Unix sockets here")
    path = tmp_path / "s.ets"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
    except OSError:  # path too long for a socket address
        pytest.skip("cannot bind a Unix socket under tmp_path")
    try:
        with pytest.raises(NotARegularFileError, match="socket"):
            call_in_thread(lambda: load_trace(path))
    finally:
        server.close()


def test_fifo_swapped_in_after_the_check_cannot_block_the_open(tmp_path, monkeypatch):
    """os.stat said "regular file"; then the path became a FIFO with no writer. The O_NONBLOCK
    open returns at once and fstat refuses what was opened."""
    path = _fifo(tmp_path)
    regular = os.stat(__file__)
    monkeypatch.setattr(untrusted.os, "stat", lambda p: regular)
    with pytest.raises(NotARegularFileError, match="FIFO"):
        call_in_thread(lambda: load_trace(path))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no procfs")
def test_a_file_longer_than_its_reported_size_is_read_to_its_end():
    # procfs files report st_size 0; the content must still be read (and is not a trace)
    with pytest.raises(NotATraceFileError):
        call_in_thread(lambda: load_trace("/proc/self/status"))


def test_empty_input_is_truncated_both_ways(tmp_path):
    """The documented rule: shorter than the header and agreeing with the magic as far as it
    goes (empty agrees with everything) is truncated; disagreeing is not a trace."""
    empty = tmp_path / "empty.ets"
    empty.write_bytes(b"")
    with pytest.raises(TruncatedTraceError, match="empty"):
        loads(b"")
    with pytest.raises(TruncatedTraceError, match=re.escape(str(empty))):
        load_trace(empty)
    with pytest.raises(TruncatedTraceError):
        loads(MAGIC[:3])
    with pytest.raises(NotATraceFileError):
        loads(b"ETX")


def _array_bomb(size: int = 25_000) -> bytes:
    """A 25 KB file whose payload nests array32 headers each claiming 5000 elements."""
    body = ((b"\xdd" + struct.pack(">I", 5000)) * 1000 + b"\x00" * size)[: size - HEADER_SIZE]
    return struct.pack("<8sHHQI", MAGIC, 1, 0, len(body), zlib.crc32(body)) + body


def test_nested_array_bomb_is_refused_before_any_allocation():
    data = _array_bomb()
    assert len(data) == 25_000
    tracemalloc.start()
    try:
        with pytest.raises(TraceFieldError, match="claims 5000 elements"):
            loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak  # msgpack alone preallocated ~40-85 MB for it


def test_every_container_bomb_stays_within_the_input_size():
    """However the claimed lengths nest, what is preallocated is bounded by the bytes left."""
    for bomb in (b"\xdc\xff\xff" * 300, b"\xde\xff\xff" * 300, b"\x9f" * 2000, b"\x8f\xc0" * 900):
        body = bomb + b"\xc0" * 2000
        data = struct.pack("<8sHHQI", MAGIC, 1, 0, len(body), zlib.crc32(body)) + body
        tracemalloc.start()
        try:
            with pytest.raises(CorruptTraceError):
                loads(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 256 * 1024, (bomb[:3], peak)


def test_deep_nesting_is_refused_without_recursion():
    body = b"\x91" * 100_000 + b"\xc0"  # deeper than any recursion limit
    data = struct.pack("<8sHHQI", MAGIC, 1, 0, len(body), zlib.crc32(body)) + body
    with pytest.raises(TraceFieldError, match=f"deeper than {MAX_DEPTH}"):
        loads(data)


def test_metadata_may_nest_until_the_depth_bound():
    trace = sample_trace()
    value: object = "leaf"
    for _ in range(MAX_DEPTH - 4):  # payload > meta > metadata > "deep" > ...
        value = [value]
    trace.metadata["deep"] = value
    assert loads(dumps(trace)).metadata["deep"] == value
    trace.metadata["deep"] = [[value]]
    with pytest.raises(TraceFieldError, match=r"meta\.metadata\.deep") as info:
        loads(dumps(trace))
    assert "deeper" in str(info.value)


def test_object_count_is_bounded(monkeypatch):
    monkeypatch.setattr(trace_io, "MAX_OBJECTS", 50)
    with pytest.raises(TraceFieldError, match="more than 50 msgpack objects"):
        loads(dumps(sample_trace()))


def test_string_length_is_bounded(monkeypatch):
    monkeypatch.setattr(trace_io, "MAX_STR_LEN", 10)
    with pytest.raises(CorruptTraceError, match="max_str_len"):
        loads(dumps(sample_trace()))


def _mutated(mutate) -> bytes:
    payload = _valid_payload()
    mutate(payload)
    return _with_payload(payload)


def _col(side: str, name: str, index: int, value: int):
    """A mutation setting one value of a column of the first iteration."""
    spec = trace_io._OP_COLUMNS if side == "ops" else trace_io._KERNEL_COLUMNS

    def mutate(payload: dict) -> None:
        column = np.frombuffer(payload["iterations"][0][side][name], dtype=spec[name]).copy()
        column[index] = value
        payload["iterations"][0][side][name] = column.tobytes()

    return mutate


@pytest.mark.parametrize(
    ("field", "mutate", "problem"),
    [
        ("meta.device.name", lambda p: p["meta"]["device"].update(name=[1]), "expected a string"),
        ("meta.device.index", lambda p: p["meta"]["device"].update(index=True), "expected an int"),
        ("meta.device.index", lambda p: p["meta"]["device"].update(index=-2), "out of range"),
        ("meta.host.hostname", lambda p: p["meta"]["host"].update(hostname=None), "string"),
        ("meta.host.memory_bytes", lambda p: p["meta"]["host"].update(memory_bytes=2**64 - 1), ""),
        ("meta.capture.skip_steps", lambda p: p["meta"]["capture"].update(skip_steps=1.5), "int"),
        ("meta.torch_version", lambda p: p["meta"].update(torch_version=[[1]]), "string"),
        ("meta.rank", lambda p: p["meta"].update(rank=math.inf), "expected an int"),
        ("meta.rank", lambda p: p["meta"].update(rank=-1), "out of range"),
        ("meta.world_size", lambda p: p["meta"].update(world_size=0), "out of range"),
        ("meta.step_times_s[1]", lambda p: p["meta"]["step_times_s"].__setitem__(1, math.nan), ""),
        ("meta.step_times_s[0]", lambda p: p["meta"]["step_times_s"].__setitem__(0, -1.0), ""),
        ("meta.step_times_s[0]", lambda p: p["meta"]["step_times_s"].__setitem__(0, True), ""),
        ("meta.metadata", lambda p: p["meta"].update(metadata=[1]), "expected a map"),
        ("meta.metadata", lambda p: p["meta"]["metadata"].update({b"k": 1}), "not a string"),
        ("strings[0]", lambda p: p["strings"].__setitem__(0, b"x"), "expected a string"),
        ("signatures[0].shapes[0]", lambda p: p["signatures"][0][0][0].append(-1), "range"),
        ("params[0]", lambda p: p["params"].__setitem__(0, [2**63]), "out of range"),
        ("iterations[0].step", lambda p: p["iterations"][0].update(step=None), "int"),
        ("iterations[1].end_ns", lambda p: p["iterations"][1].update(end_ns=0), "out of range"),
        ("iterations[0].n_ops", lambda p: p["iterations"][0].update(n_ops=-1), "out of range"),
        ("iterations[0].start_ns", lambda p: p["iterations"][0].pop("start_ns"), "missing"),
        ("iterations[0].ops.depth", _col("ops", "depth", 0, -5), "-5"),
        ("iterations[0].ops.parent", _col("ops", "parent", 1, 1), "follow"),
        ("iterations[0].ops.parent", _col("ops", "parent", 0, -2), ""),
        ("iterations[0].ops.start_ns", _col("ops", "start_ns", 0, 2**63 - 1), "overflow"),
        ("iterations[0].kernels.communication", _col("kernels", "communication", 0, 2), ""),
        ("iterations[0].kernels.op_index", _col("kernels", "op_index", 0, 4), ""),
    ],
)  # fmt: skip
def test_a_bad_field_is_named_with_the_file(tmp_path, field, mutate, problem):
    path = tmp_path / "bad.ets"
    path.write_bytes(_mutated(mutate))
    with pytest.raises(TraceFieldError) as info:
        load_trace(path)
    assert info.value.field == field
    assert str(info.value).startswith(f"{path}: {field}: ")
    assert problem in info.value.problem


def test_unknown_header_flags_are_refused():
    data = bytearray(dumps(sample_trace()))
    struct.pack_into("<H", data, 10, 1)
    with pytest.raises(CorruptTraceError, match=r"header\.flags"):
        loads(bytes(data))


def test_loads_accepts_any_bytes_like_without_copying():
    data = dumps(sample_trace())
    assert loads(bytearray(data)) == loads(memoryview(data)) == sample_trace()


def test_typed_errors_survive_pickling():
    error = TraceFieldError("t.ets", "meta.rank", "out of range")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.source, copy.field, copy.problem, str(copy)) == (
        "t.ets",
        "meta.rank",
        "out of range",
        str(error),
    )


def test_hostile_strings_print_escaped():
    trace = sample_trace()
    trace.device.name = "\x1b[2J\x1b]0;owned\x07GPU\nfake line"
    trace.host.hostname = "h" * 500
    loaded = loads(dumps(trace))
    text = format_info(loaded, "t.ets")
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and "\\x0afake line" in text
    assert len(text.splitlines()) == len(format_info(sample_trace(), "t.ets").splitlines())
    assert "h" * TEXT_LIMIT + "..." in text and "h" * (TEXT_LIMIT + 1) not in text


def test_a_file_from_before_the_input_phase_loads_and_its_phases_stay_in_range():
    payload = _valid_payload()
    assert payload["phases"][-1] == "input"
    payload["phases"] = payload["phases"][:-1]  # the table files had before Phase.INPUT
    trace = loads(_with_payload(payload))
    assert trace.iterations
    # An index past that older table is corrupt, even though today's table has it.
    ops = payload["iterations"][0]["ops"]
    width = len(ops["phase"]) // payload["iterations"][0]["n_ops"]
    ops["phase"] = (len(payload["phases"])).to_bytes(width, "little") * payload["iterations"][0][
        "n_ops"
    ]
    with pytest.raises(CorruptTraceError):
        loads(_with_payload(payload))


def test_an_unknown_or_reordered_phase_table_is_corrupt():
    payload = _valid_payload()
    payload["phases"] = list(reversed(payload["phases"]))
    with pytest.raises(CorruptTraceError, match="phases"):
        loads(_with_payload(payload))


# ---------------------------------------------------------------------------------------------
# Arguments: a wrong type or value is the caller's error (TypeError / ValueError naming the
# argument and the value), checked before any file is touched, never a TraceFileError


#: max_bytes -> (error, what its message says)
BAD_MAX_BYTES = {
    -1: (ValueError, "max_bytes must be >= 1, got -1"),
    0: (ValueError, "max_bytes must be >= 1, got 0"),
    "big": (TypeError, "max_bytes must be an int, got 'big' (str)"),
    None: (TypeError, "max_bytes must be an int, got None (NoneType)"),
    True: (TypeError, "max_bytes must be an int, got True (bool)"),
    1.5: (TypeError, "max_bytes must be an int, got 1.5 (float)"),
}


@pytest.mark.parametrize("max_bytes", list(BAD_MAX_BYTES), ids=repr)
def test_load_trace_checks_max_bytes(tmp_path, max_bytes):
    path = save_trace(sample_trace(), tmp_path / "t.ets")
    error, says = BAD_MAX_BYTES[max_bytes]
    for load in (lambda: load_trace(path, max_bytes=max_bytes),
                 lambda: loads(path.read_bytes(), max_bytes=max_bytes)):  # fmt: skip
        with pytest.raises(error) as info:
            load()
        assert str(info.value) == says
        assert not isinstance(info.value, TraceFileError)  # not a bad file: a bad argument
    assert load_trace(path, max_bytes=np.int64(path.stat().st_size)) == sample_trace()


@pytest.mark.parametrize("path", [5, None, b"t.ets"], ids=repr)
def test_load_trace_path_must_be_a_path(tmp_path, path, monkeypatch):
    """An int is not taken for a file descriptor (``os.stat(5)`` would read fd 5)."""
    monkeypatch.chdir(tmp_path)
    save_trace(sample_trace(), tmp_path / "t.ets")
    with pytest.raises(TypeError, match=r"^path must be a str or os\.PathLike, got ") as info:
        load_trace(path)
    assert repr(path) in str(info.value)


def test_save_trace_checks_its_arguments_before_writing(tmp_path):
    target = tmp_path / "x.ets"
    with pytest.raises(TypeError, match=r"^trace must be a Trace, got 'hello' \(str\)$"):
        save_trace("hello", target)
    with pytest.raises(TypeError, match=r"^trace must be a Trace, got None \(NoneType\)$"):
        dumps(None)
    with pytest.raises(TypeError, match=r"^path must be a str or os\.PathLike, got 5 \(int\)$"):
        save_trace(sample_trace(), 5)
    assert list(tmp_path.iterdir()) == []


def test_save_trace_errors_name_the_path_given_and_leave_no_temp_file(tmp_path):
    """Not ets-hook's own temp file (``/nonexistent/.x.ets.host.pid.xyz.tmp``), and not EBUSY
    for ``"."``: the path the caller gave, as ``open(path, "wb")`` would say it."""
    trace = sample_trace()
    missing = tmp_path / "no-such-dir" / "x.ets"
    with pytest.raises(FileNotFoundError) as info:
        save_trace(trace, missing)
    assert info.value.filename == str(missing) and info.value.filename2 is None
    assert ".tmp" not in str(info.value)
    (tmp_path / "folder").mkdir()
    for path in (tmp_path / "folder", str(tmp_path / "new") + os.sep, "."):
        with pytest.raises(IsADirectoryError) as info:
            save_trace(trace, path)
        assert info.value.filename == os.fspath(path), info.value
        assert ".tmp" not in str(info.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["folder"]  # no temp file anywhere
