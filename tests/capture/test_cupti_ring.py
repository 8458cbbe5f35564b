"""The SPSC ring buffer and its record layout (ets_hook._C.RingBuffer, csrc/ring_buffer.h)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ets_hook import _C
from ets_hook.capture.cupti import RECORD_DTYPE, RecordKind, RingBuffer

T = _C._testing


def make_records(n: int, first: int = 0) -> np.ndarray:
    """Records with every exported field set to a value derived from its index."""
    rec = np.zeros(n, dtype=RECORD_DTYPE)
    i = np.arange(first, first + n)
    for k, name in enumerate(RECORD_DTYPE.names):
        info = np.iinfo(RECORD_DTYPE[name])
        rec[name] = (i * (k + 3) + k) % min(info.max, 2**40)
    return rec


def drain_all(ring: RingBuffer) -> np.ndarray:
    out = ring.drain()
    assert len(ring) == 0
    return out


# ---------------------------------------------------------------- layout


def test_dtype_is_generated_from_the_native_field_table() -> None:
    fields = _C.record_fields()
    assert RECORD_DTYPE.itemsize == _C.RECORD_ITEMSIZE
    assert list(RECORD_DTYPE.names) == [name for name, _, _ in fields]
    for name, fmt, offset in fields:
        dtype, field_offset = RECORD_DTYPE.fields[name][:2]
        assert dtype == np.dtype(fmt)
        assert field_offset == offset
    # The extension builds the very same dtype for drain().
    assert T.record_dtype() == RECORD_DTYPE
    assert RingBuffer(4).drain().dtype == RECORD_DTYPE


def test_only_per_kind_payload_fields_share_bytes() -> None:
    def span(name: str) -> range:
        offset = RECORD_DTYPE.fields[name][1]
        return range(offset, offset + RECORD_DTYPE[name].itemsize)

    names = RECORD_DTYPE.names
    overlapping = {
        frozenset((a, b))
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if set(span(a)) & set(span(b))
    }
    # the tagged union documented in csrc/record.h: kernel geometry vs. API / copy / external ids
    assert overlapping == {
        frozenset(p)
        for p in [
            ("grid_x", "thread_id"),
            ("grid_y", "bytes"), ("grid_z", "bytes"),
            ("grid_y", "external_id"), ("grid_z", "external_id"),
            ("bytes", "external_id"),
            ("block_x", "cbid"),
        ]
    }  # fmt: skip
    header = ["kind", "subkind", "device", "correlation_id", "start_ns", "end_ns", "name_id"]
    assert not any(set(span(h)) & set(span(n)) for h in header for n in names if n != h)
    assert RECORD_DTYPE.itemsize == 64
    assert max(span(n).stop for n in names) <= RECORD_DTYPE.itemsize


def test_record_kinds_match_the_native_enum() -> None:
    assert {k.name: int(k) for k in RecordKind} == T.record_kinds()


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize("capacity", [0, -1, 2**28 + 1])
def test_bad_capacity_is_a_value_error_naming_the_value(capacity: int) -> None:
    with pytest.raises(ValueError, match=str(capacity)):
        RingBuffer(capacity)


@pytest.mark.parametrize(("asked", "actual"), [(1, 1), (2, 2), (3, 4), (1000, 1024), (4096, 4096)])
def test_capacity_rounds_up_to_a_power_of_two(asked: int, actual: int) -> None:
    assert RingBuffer(asked).capacity == actual


# ---------------------------------------------------------------- push / drain


def test_drain_returns_exactly_what_was_pushed_in_order() -> None:
    ring = RingBuffer(64)
    records = make_records(40)
    assert T.ring_push(ring, records) == 40
    assert len(ring) == 40
    out = drain_all(ring)
    assert out.dtype == RECORD_DTYPE
    np.testing.assert_array_equal(out, records)
    assert T.ring_counters(ring) == (40, 40)


def test_push_sequence_writes_every_field_in_place() -> None:
    ring = RingBuffer(16)
    assert T.push_sequence(ring, 100, 10) == 10
    out = drain_all(ring)
    i = np.arange(100, 110)
    np.testing.assert_array_equal(out["kind"], RecordKind.KERNEL)
    np.testing.assert_array_equal(out["start_ns"], i)
    np.testing.assert_array_equal(out["end_ns"], i + 1)
    np.testing.assert_array_equal(out["correlation_id"], i)
    np.testing.assert_array_equal(out["name_id"], i % 1000)
    np.testing.assert_array_equal(out["stream"], i & 15)
    np.testing.assert_array_equal(out["grid_x"], i & 1023)
    np.testing.assert_array_equal(out[["grid_y", "grid_z"]].tolist(), [(2, 3)] * 10)
    np.testing.assert_array_equal(
        out[["block_x", "block_y", "block_z"]].tolist(), [(256, 1, 1)] * 10
    )


def test_wraparound_keeps_order_across_the_end_of_the_storage() -> None:
    ring = RingBuffer(8)
    expected = []
    pushed = 0
    for round_size in [5, 6, 7, 8, 3, 8, 1]:  # positions cross the 8-slot boundary repeatedly
        chunk = make_records(round_size, first=pushed)
        assert T.ring_push(ring, chunk) == round_size
        pushed += round_size
        expected.append(chunk)
        # drain in two parts so the read position lands mid-storage too
        head = ring.drain(max_records=round_size // 2)
        tail = ring.drain()
        np.testing.assert_array_equal(np.concatenate([head, tail]), chunk)
    assert ring.dropped == 0
    assert T.ring_counters(ring) == (pushed, pushed)


def test_overflow_drops_and_counts_exactly() -> None:
    ring = RingBuffer(16)
    assert T.push_sequence(ring, 0, 25) == 16
    assert ring.dropped == 9
    out = drain_all(ring)
    np.testing.assert_array_equal(out["start_ns"], np.arange(16))  # the oldest are kept
    # after draining there is room again; drops keep accumulating only when full
    assert T.push_sequence(ring, 25, 20) == 16
    assert ring.dropped == 13
    np.testing.assert_array_equal(drain_all(ring)["start_ns"], np.arange(25, 41))


def test_push_from_python_counts_drops_too() -> None:
    ring = RingBuffer(4)
    assert T.ring_push(ring, make_records(6)) == 4
    assert ring.dropped == 2


def test_drain_into_a_preallocated_array() -> None:
    ring = RingBuffer(32)
    records = make_records(20)
    T.ring_push(ring, records)
    out = np.zeros(8, dtype=RECORD_DTYPE)
    assert T.ring_drain_into(ring, out) == 8
    np.testing.assert_array_equal(out, records[:8])
    big = np.zeros(100, dtype=RECORD_DTYPE)
    assert T.ring_drain_into(ring, big) == 12
    np.testing.assert_array_equal(big[:12], records[8:])
    assert T.ring_drain_into(ring, big) == 0


def test_drain_of_an_empty_ring_is_an_empty_record_array() -> None:
    out = RingBuffer(4).drain()
    assert out.shape == (0,)
    assert out.dtype == RECORD_DTYPE


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(4, dtype=np.float64),
        np.zeros(4, dtype=[("kind", "u1")]),
        np.zeros((2, 2), dtype=RECORD_DTYPE),
        np.zeros(8, dtype=RECORD_DTYPE)[::2],
    ],
)
def test_foreign_arrays_are_rejected(bad: np.ndarray) -> None:
    ring = RingBuffer(4)
    with pytest.raises(ValueError):
        T.ring_drain_into(ring, bad)
    with pytest.raises(ValueError):
        T.ring_push(ring, bad)


def test_read_only_output_is_rejected() -> None:
    out = np.zeros(4, dtype=RECORD_DTYPE)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        T.ring_drain_into(RingBuffer(4), out)


# ---------------------------------------------------------------- concurrency


def _consume(ring: RingBuffer, producer: T.Producer) -> list[np.ndarray]:
    chunks = []
    while True:
        done = producer.done  # read before draining: nothing is published after done
        chunk = ring.drain()
        if chunk.size:
            chunks.append(chunk[["start_ns", "end_ns", "correlation_id", "grid_x"]].copy())
        elif done:
            return chunks
        if chunk.size < ring.capacity // 4:
            time.sleep(0.0002)  # let the producer fill; do not spin on 2 shared cores


def test_threaded_producer_ten_million_records_no_loss_no_duplicates() -> None:
    n = 10_000_000
    ring = RingBuffer(1 << 16)
    producer = T.Producer(ring, 0, n, wait_when_full=True)
    chunks = _consume(ring, producer)
    assert producer.join() == n
    got = np.concatenate(chunks)
    assert got.size == n
    assert ring.dropped == 0
    expected = np.arange(n, dtype=np.int64)
    np.testing.assert_array_equal(got["start_ns"], expected)
    np.testing.assert_array_equal(got["end_ns"], expected + 1)
    np.testing.assert_array_equal(got["correlation_id"], expected.astype(np.uint32))
    np.testing.assert_array_equal(got["grid_x"], expected & 1023)


def test_threaded_producer_that_outruns_the_consumer_drops_but_never_duplicates() -> None:
    n = 2_000_000
    ring = RingBuffer(1 << 10)
    producer = T.Producer(ring, 0, n, wait_when_full=False)
    chunks = _consume(ring, producer)
    pushed = producer.join()
    starts = np.concatenate([c["start_ns"] for c in chunks]) if chunks else np.empty(0, np.int64)
    assert starts.size == pushed
    assert pushed + ring.dropped == n
    assert np.all(np.diff(starts) > 0)  # strictly increasing: order kept, nothing twice
