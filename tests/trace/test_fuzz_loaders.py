"""Fuzzing both trace-file loaders (issue 13): only typed errors escape, and whatever loads can be
printed as ``ets-hook info`` prints it and saved again.

CI-sized (~15 s of CPU): deterministic (``derandomize=True``) hypothesis runs of 150 examples each,
plus exhaustive loops over every field of a real saved trace. The long run is
``benchmarks/fuzz_loaders.py`` (its mutators are reused here; a smoke run of it closes the file).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import random
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import sample_trace

from ets_hook.errors import ETSCSVError, TraceFileError
from ets_hook.trace.events import Trace
from ets_hook.trace.importers import ETS_CSV_COLUMNS, load_op_codes, read_ets_csv
from ets_hook.trace.io import HEADER_SIZE, MAGIC, dumps, loads
from ets_hook.trace.summary import format_info, info_document

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(
    deadline=None,
    derandomize=True,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fuzz_loaders", ROOT / "benchmarks" / "fuzz_loaders.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _benchmark()
VALID = dumps(sample_trace())
PAYLOAD = msgpack.unpackb(VALID[HEADER_SIZE:], raw=False)
PATHS = bench.field_paths(PAYLOAD)


def _wrap(body: bytes) -> bytes:
    return struct.pack("<8sHHQI", MAGIC, 1, 0, len(body), zlib.crc32(body)) + body


def assert_usable(trace: Trace) -> None:
    """What ``ets-hook info`` does with a loaded trace (text and --json), and saving it again."""
    text = format_info(trace, "fuzz.ets")
    assert text.startswith("trace    fuzz.ets\n")
    assert all(line.isprintable() for line in text.splitlines()), text
    json.dumps(info_document(trace, "fuzz.ets"), allow_nan=False)
    dumps(trace)


def load_or_reject(data: bytes) -> Trace | None:
    """``loads``: a usable trace, or None for a ``TraceFileError``; anything else fails."""
    try:
        trace = loads(data, source="fuzz.ets")
    except TraceFileError as exc:
        assert str(exc).startswith("fuzz.ets: "), exc
        return None
    assert_usable(trace)
    return trace


# ---------------------------------------------------------------------------------------------
# The container


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    load_or_reject(data)
    load_or_reject(MAGIC + data)
    load_or_reject(_wrap(data))  # a valid header and checksum around random msgpack


@FUZZ
@given(st.integers(0, len(VALID) - 1))
def test_truncations(keep: int) -> None:
    assert load_or_reject(VALID[:keep]) is None


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 7)), min_size=1, max_size=8)
)
def test_bit_flips(flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID)
    for at, bit in flips:
        data[at] ^= 1 << bit
    load_or_reject(bytes(data))
    body = bytes(data[HEADER_SIZE:])  # the same flips past the checksum
    load_or_reject(_wrap(body))


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(VALID) - HEADER_SIZE), st.binary(max_size=6), st.integers(0, 6)
        ),
        min_size=1,
        max_size=4,
    )
)
def test_payload_byte_edits_with_the_checksum_recomputed(
    edits: list[tuple[int, bytes, int]],
) -> None:
    body = bytearray(VALID[HEADER_SIZE:])
    for at, insert, remove in edits:
        body[at : at + remove] = insert
    load_or_reject(_wrap(bytes(body)))


# ---------------------------------------------------------------------------------------------
# Structured payload mutations: the right container, the wrong contents


def test_every_field_replaced_by_every_hostile_value() -> None:
    rejected: set[str] = set()
    for path in PATHS:
        for _name, value in bench.HOSTILE:
            data = _wrap(msgpack.packb(bench._set(PAYLOAD, path, value), use_bin_type=True))
            if load_or_reject(data) is None:
                rejected.add(str(path[0]))
    assert {"format", "strings", "signatures", "params", "meta", "iterations"} <= rejected


def test_every_field_spliced_with_raw_hostile_msgpack() -> None:
    for index, path in enumerate(PATHS):
        for name, raw in bench.RAW_HOSTILE:
            marker = b"\x00ETSFUZZ" + index.to_bytes(8, "little")
            body = msgpack.packb(bench._set(PAYLOAD, path, marker), use_bin_type=True)
            spliced = body.replace(b"\xc4\x10" + marker, raw, 1)
            assert spliced != body, (path, name)
            load_or_reject(_wrap(spliced))


def test_every_field_deleted() -> None:
    for path in PATHS:
        load_or_reject(_wrap(msgpack.packb(bench._delete(PAYLOAD, path), use_bin_type=True)))


HOSTILE = st.sampled_from([value for _, value in bench.HOSTILE])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), HOSTILE | VALUES), min_size=1, max_size=4))
def test_structured_mutations(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    payload = PAYLOAD
    for path, value in changes:
        try:
            payload = bench._set(payload, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced a container on this path
    load_or_reject(_wrap(msgpack.packb(payload, use_bin_type=True)))


COLUMNS = [
    ("iterations", 0, side, name)
    for side in ("ops", "kernels")
    for name in PAYLOAD["iterations"][0][side]
]


@FUZZ
@given(st.sampled_from(COLUMNS), st.data())
def test_column_blobs_of_the_right_length_with_any_contents(
    path: tuple[Any, ...], data: Any
) -> None:
    size = len(bench._get(PAYLOAD, path))
    blob = data.draw(
        st.binary(min_size=size, max_size=size) | st.sampled_from([b"\xff" * size, b"\x7f" * size])
    )
    load_or_reject(_wrap(msgpack.packb(bench._set(PAYLOAD, path, blob), use_bin_type=True)))


def test_the_benchmark_mutator_for_a_thousand_inputs() -> None:
    make = bench.EtsInputs(random.Random(13))
    kinds = set()
    for _ in range(1000):
        kind, data = make()
        kinds.add(kind.split(":")[0])
        load_or_reject(data)
    assert {"fields", "raw", "column", "header", "truncated"} <= kinds


# ---------------------------------------------------------------------------------------------
# The CSV importer


def _csv_text(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def read_or_reject(path: Path, data: bytes) -> Trace | None:
    """``read_ets_csv`` on ``data``: a usable trace, or None for an ``ETSCSVError``."""
    path.write_bytes(data)
    try:
        trace = read_ets_csv(path, op_codes={}, device_name="fuzz")
    except ETSCSVError as exc:
        assert str(exc).startswith(str(path)), exc
        assert exc.line >= 0
        return None
    assert_usable(trace)
    return trace


SEED_ROWS = bench.seed_csv_rows()
CELLS = st.one_of(
    st.integers(0, len(bench.HOSTILE_CELLS) - 1).map(bench.HOSTILE_CELLS.__getitem__),
    st.text(max_size=12),
    st.integers().map(str),
    st.floats().map(repr),
)


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(SEED_ROWS) - 1), st.integers(0, len(ETS_CSV_COLUMNS)), CELLS),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["utf-8", "utf-8-sig", "latin-1", "utf-16"]),
)
def test_csv_rows(tmp_path_factory: Any, edits: list[tuple[int, int, str]], encoding: str) -> None:
    rows = [list(r) for r in SEED_ROWS]
    for line, column, cell in edits:
        if column < len(rows[line]):
            rows[line][column] = cell
        else:
            rows[line].append(cell)  # one field too many
    data = _csv_text(rows).encode(encoding, "surrogatepass" if "utf-8" in encoding else "replace")
    read_or_reject(tmp_path_factory.mktemp("csv") / "m.1_7.csv", data)


@FUZZ
@given(st.binary(max_size=400))
def test_csv_random_bytes(tmp_path_factory: Any, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("csv")
    read_or_reject(folder / "m.1_7.csv", data)
    header = ",".join(ETS_CSV_COLUMNS).encode() + b"\n"
    read_or_reject(folder / "h.1_7.csv", header + data)


def test_the_csv_mutator_for_a_thousand_inputs(tmp_path: Path) -> None:
    make = bench.CsvInputs(random.Random(13))
    loaded = 0
    for _ in range(1000):
        _, data = make()
        loaded += read_or_reject(tmp_path / "m.1_7.csv", data) is not None
    assert 0 < loaded < 1000


@FUZZ
@given(
    st.one_of(
        st.integers(0, len(bench.HOSTILE_OPCODES) - 1).map(bench.HOSTILE_OPCODES.__getitem__),
        st.text(max_size=60),
        st.dictionaries(st.text(max_size=8), st.integers(-(2**64), 2**64), max_size=5).map(repr),
        st.dictionaries(SCALARS.filter(lambda v: v == v), VALUES, max_size=3).map(repr),
    )
)
def test_op_code_tables(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("codes") / "opCodes.dict"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        table = load_op_codes(path)
    except ETSCSVError as exc:
        assert exc.path == path and str(exc).startswith(str(path))
        return
    assert all(type(k) is int and type(v) is str for k, v in table.items())


# ---------------------------------------------------------------------------------------------
# The long run's harness


def test_benchmark_smoke_run_finds_no_escape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "fuzz.json"
    assert bench.main(["--inputs", "200", "--json", str(report)]) == 0
    after = json.loads(report.read_text())["after"]
    for loader in ("ets", "csv", "opcodes"):
        assert after[loader]["inputs"] == 200
        assert after[loader]["escaped"] == {}
        assert after[loader]["loaded"] + sum(after[loader]["rejected"].values()) == 200
        assert 0 < after[loader]["peak_tracemalloc_bytes_inputs_le_1MB"] < 64 * 2**20
    assert "escaped classes: 0" in capsys.readouterr().out


def test_benchmark_counts_escapes(tmp_path: Path) -> None:
    """The harness can fail: a loader that leaks a KeyError is reported as escaping."""
    loaders = bench.current_loaders()

    def leaky(data: bytes, **kwargs: Any) -> Trace:
        raise KeyError("meta")

    loaders.loads = leaky
    stats = bench.fuzz("ets", loaders, 20, 0, tmp_path, trace_memory=False)
    assert stats.escaped == {"load:KeyError": 20}
