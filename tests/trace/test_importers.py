"""ETS artifact CSV importer: mapping, half precision, malformed rows, directories."""

from __future__ import annotations

import ast
import csv
import logging
import os
import pickle
import sys
from pathlib import Path

import pytest
from support import SHARED_DATA, call_in_thread

from ets_hook.errors import (
    ETSCSVError,
    ETSCSVNotARegularFileError,
    ETSCSVTooLargeError,
    NotARegularFileError,
    TraceFileError,
)
from ets_hook.trace.discovery import load_traces
from ets_hook.trace.events import Phase
from ets_hook.trace.importers import (
    ETS_CSV_COLUMNS,
    ETS_PARAM_COUNT,
    load_op_codes,
    parse_ets_file_name,
    read_ets_csv,
)
from ets_hook.trace.io import dumps
from ets_hook.trace.summary import format_info

OP_CODES = {"conv2d": 203, "relu": 152, "add_": 12, "mul_": 16}
CONV_PARAMS = [2, 3, 8, 8, 4, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 4] + [0] * 13


def _row(
    op: int,
    direction: int,
    *,
    kdur: int,
    space: int,
    start: int,
    input_type: int = 1,
    params: list[int] | None = None,
    flops: float = 100.0,
) -> dict[str, object]:
    values = {c: 0 for c in ETS_CSV_COLUMNS}
    values.update(
        op=op,
        dir=direction,
        params=str(params or [4, 2, 4, 8, 8] + [0] * 25),
        grid=4,
        block=128,
        flops=flops,
        bytes=400.0,
        rStartTime=start,
        rEndTime=start + 500,
        kStartTime=start + 1000,
        kEndTime=start + 1000 + kdur,
        space=space,
        space1=space,
        seq=7 if direction < 3 else -1,
        kernels=1,
        rduration=500,
        kduration=kdur,
        batch=2,
        h=8,
        w=8,
        input_type=input_type,
    )
    return values


def _write(
    path: Path, rows: list[dict[str, object]], header: tuple[str, ...] = ETS_CSV_COLUMNS
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(header), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _sample_rows() -> list[dict[str, object]]:
    return [
        _row(203, 1, kdur=3000, space=200, start=0, params=CONV_PARAMS, flops=2 * 2 * 4 * 64 * 27),
        _row(152, 1, kdur=500, space=-40, start=10_000),
        _row(152, 2, kdur=600, space=300, start=20_000),
        _row(203, 2, kdur=6000, space=100, start=30_000, params=CONV_PARAMS),
        _row(16, 3, kdur=200, space=50, start=40_000),
        _row(12, 3, kdur=250, space=0, start=50_000),
    ]


def test_read_ets_csv_maps_every_column(tmp_path: Path) -> None:
    (tmp_path / "T4").mkdir()
    (tmp_path / "opCodes.dict").write_text(repr(OP_CODES))
    path = _write(tmp_path / "T4" / "resnet18.40_7.csv", _sample_rows())
    trace = read_ets_csv(path)
    assert trace.device.kind == "cuda" and trace.device.name == "T4"
    assert trace.metadata["model"] == "resnet18"
    assert trace.metadata["config"] == "40"
    assert (trace.metadata["batch_size"], trace.metadata["input_h"], trace.metadata["input_w"]) == (
        2,
        8,
        8,
    )
    assert trace.metadata["precision"] == "fp32"
    (iteration,) = trace.iterations
    assert iteration.step == 7
    ops = iteration.ops
    assert [op.name for op in ops] == ["conv2d", "relu", "relu", "conv2d", "mul_", "add_"]
    assert [op.phase for op in ops] == [Phase.FORWARD] * 2 + [Phase.BACKWARD] * 2 + [
        Phase.OPTIMIZER
    ] * 2
    assert all(op.depth == 0 and op.parent == -1 for op in ops)
    conv = ops[0]
    assert conv.params == tuple(CONV_PARAMS)
    assert conv.flops == 2 * 2 * 4 * 64 * 27 and conv.bytes_moved == 400
    assert conv.kernel_duration_ns == 3000 and conv.kernel_count == 1 and conv.gap_ns == 200
    assert conv.start_ns == 0 and conv.duration_ns == 500
    assert conv.sequence_nr == 7 and ops[-1].sequence_nr == -1
    assert ops[1].gap_ns == 0  # negative space clipped at 0
    assert conv.input_dtypes == ("float",)
    # the iteration spans the GPU side: first kernel start .. last kernel end + its gap
    assert iteration.start_ns == 1000
    assert iteration.end_ns == 50_000 + 1000 + 250


def test_half_precision_rows_are_marked(tmp_path: Path) -> None:
    rows = _sample_rows()
    rows[1]["input_type"] = 2
    path = _write(tmp_path / "gpu" / "m.1_7.csv", rows)
    trace = read_ets_csv(path, op_codes={v: k for k, v in OP_CODES.items()}, device_name="P4")
    assert trace.device.name == "P4"
    assert trace.metadata["precision"] == "mixed"
    assert trace.metadata["half_rows"] == 1
    assert trace.iterations[0].ops[1].input_dtypes == ("half",)
    all_half = [dict(r, input_type=2) for r in _sample_rows()]
    half = read_ets_csv(_write(tmp_path / "gpu" / "h.1_7.csv", all_half), op_codes={})
    assert half.metadata["precision"] == "fp16"
    assert half.iterations[0].ops[0].name == "ets_op_203"  # code missing from the table


def test_params_not_recorded_read_as_zeros_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The artifact's transformer traces write "[0, 0]" for ops whose tensors it did not record
    # (attention, concatenation): read as a row without tensors, counted, one warning.
    rows = _sample_rows()
    rows[1]["params"] = "[0, 0]"
    rows[2]["params"] = "[0]"
    path = _write(tmp_path / "gpu" / "vit.1_7.csv", rows)
    with caplog.at_level(logging.WARNING, logger="ets_hook.trace.importers"):
        trace = read_ets_csv(path, op_codes={})
    ops = trace.iterations[0].ops
    assert ops[1].params == ops[2].params == (0,) * ETS_PARAM_COUNT
    assert ops[0].params == tuple(CONV_PARAMS)
    assert trace.metadata["unrecorded_params_rows"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 2 of {len(rows)} rows have no params recorded (e.g. [0, 0]): read as zeros"
    ]
    whole = read_ets_csv(_write(tmp_path / "gpu" / "full.1_7.csv", _sample_rows()), op_codes={})
    assert whole.metadata["unrecorded_params_rows"] == 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(dir=4), "'dir'"),
        (lambda r: r.update(kduration="abc"), "'kduration'"),
        (lambda r: r.update(params="[1, 2, 3]"), "30 ints"),
        (lambda r: r.update(params="[0, 5]"), "shorter list of zeros"),
        (lambda r: r.update(params="[]"), "30 ints"),
        (lambda r: r.update(params="1 2 3"), "'params'"),
        (lambda r: r.update(input_type=3), "'input_type'"),
        (lambda r: r.update(kduration=-5), "negative"),
        (lambda r: r.update(rEndTime=-1), "precedes"),
        (lambda r: r.update(flops="nan"), "not finite"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, mutate, message: str) -> None:
    rows = _sample_rows()
    mutate(rows[2])  # the third data row: line 4 of the file
    path = _write(tmp_path / "bad.1_7.csv", rows)
    with pytest.raises(ETSCSVError, match=message) as info:
        read_ets_csv(path, op_codes={})
    assert isinstance(info.value, ValueError)
    assert info.value.line == 4
    assert f"{path}:4:" in str(info.value)


def test_row_length_missing_columns_and_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "short.1_7.csv", _sample_rows())
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 2)[0]  # drop two fields of the third row
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ETSCSVError, match=r"short\.1_7\.csv:4:"):
        read_ets_csv(path, op_codes={})
    no_space = _write(
        tmp_path / "nospace.1_7.csv",
        _sample_rows(),
        tuple(c for c in ETS_CSV_COLUMNS if c != "space"),
    )
    with pytest.raises(ETSCSVError, match="missing columns: space"):
        read_ets_csv(no_space, op_codes={})
    empty = _write(tmp_path / "empty.1_7.csv", [])
    with pytest.raises(ETSCSVError, match="no rows"):
        read_ets_csv(empty, op_codes={})


def test_op_code_table(tmp_path: Path) -> None:
    (tmp_path / "opCodes.dict").write_text(repr(OP_CODES))
    assert load_op_codes(tmp_path / "opCodes.dict")[203] == "conv2d"
    (tmp_path / "bad.dict").write_text("[1, 2]")
    with pytest.raises(ETSCSVError, match="dict"):
        load_op_codes(tmp_path / "bad.dict")


def test_file_name_parts() -> None:
    parts = parse_ets_file_name("T4/mobilenet_v3_small.12_7.csv")
    assert (parts.model, parts.config, parts.step) == ("mobilenet_v3_small", "12", 7)
    assert parse_ets_file_name("odd.csv").model == "odd"


SAMPLE = SHARED_DATA / "ets-traces"
# More files of the artifact: its transformer traces carry "[0, 0]" params on some ops (the
# manifest's short_params_rows), and one trace is fp16 (input_type 2).
EXTRA = SHARED_DATA / "ets-traces-extra"


@pytest.mark.parametrize("folder", [SAMPLE, EXTRA], ids=["sample", "extra"])
def test_shared_traces_import_as_their_manifest_says(folder: Path) -> None:
    if not (folder / "MANIFEST.csv").is_file():
        pytest.skip(f"shared traces absent: {folder}")
    manifest = {
        (row["gpu"], row["file"]): row for row in csv.DictReader((folder / "MANIFEST.csv").open())
    }
    traces = load_traces([folder])
    assert len(traces) == len(manifest)
    for trace in traces:
        row = manifest[(trace.device.name, trace.metadata["file"])]
        assert len(trace.iterations[0].ops) == int(row["rows"])
        assert trace.metadata["model"] == row["model"]
        assert trace.metadata["batch_size"] == int(row["batch"])
        assert trace.metadata["precision"] == ("fp16" if row["input_type"] == "2" else "fp32")
        assert trace.metadata["unrecorded_params_rows"] == int(row.get("short_params_rows", 0))
        ops = trace.iterations[0].ops
        total = sum(op.kernel_duration_ns + op.gap_ns for op in ops)
        assert total > 0 and all(op.gap_ns >= 0 for op in ops)


# ---------------------------------------------------------------------------------------------
# Hostile files (issue 13)


def _special_paths(tmp_path: Path) -> list[tuple[Path, str]]:
    found = [(tmp_path / "folder.1_7.csv", "directory")]
    found[0][0].mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.1_7.csv")
        found.append((tmp_path / "pipe.1_7.csv", "FIFO"))
    if Path("/dev/zero").exists():
        found.append((Path("/dev/zero"), "character device"))
    return found


@pytest.mark.parametrize("loader", ["csv", "opcodes"])
def test_special_files_are_refused_before_reading(tmp_path: Path, loader: str) -> None:
    for path, kind in _special_paths(tmp_path):
        if loader == "csv":
            call = lambda p=path: read_ets_csv(p, op_codes={})  # noqa: E731
        else:
            call = lambda p=path: load_op_codes(p)  # noqa: E731
        with pytest.raises(ETSCSVNotARegularFileError, match=kind) as info:
            call_in_thread(call)
        assert isinstance(info.value, ETSCSVError)
        assert isinstance(info.value, NotARegularFileError)
        assert isinstance(info.value, TraceFileError)
        assert info.value.path == path and str(path) in str(info.value)


def test_files_over_max_bytes_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.1_7.csv", _sample_rows())
    with pytest.raises(ETSCSVTooLargeError, match="max_bytes=100"):
        read_ets_csv(path, op_codes={}, max_bytes=100)
    (tmp_path / "opCodes.dict").write_text(repr(OP_CODES))
    with pytest.raises(ETSCSVTooLargeError):
        load_op_codes(tmp_path / "opCodes.dict", max_bytes=10)


def test_invalid_utf8_names_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.1_7.csv", _sample_rows())
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"0", b"\xff", 1)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ETSCSVError, match="not UTF-8") as info:
        read_ets_csv(path, op_codes={})
    assert info.value.line == 4


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.1_7.csv", _sample_rows())
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert len(read_ets_csv(path, op_codes={}).iterations[0].ops) == len(_sample_rows())


def test_a_field_over_the_csv_limit_names_its_line(tmp_path: Path) -> None:
    rows = _sample_rows()
    rows[1]["flops"] = "9" * (csv.field_size_limit() + 1)
    path = _write(tmp_path / "m.1_7.csv", rows)
    with pytest.raises(ETSCSVError, match="field larger than field limit") as info:
        read_ets_csv(path, op_codes={})
    assert info.value.line == 3


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("flops", "9" * 5000, "not finite"),  # over the int digit limit; as a float: inf
        ("flops", "1e300", "out of range"),
        ("bytes", str(2**63), "out of range"),
        ("seq", str(-(2**63) - 1), "out of range"),
        ("rStartTime", str(2**62), "out of range"),
        ("kEndTime", "-1e19", "out of range"),
        ("kernels", str(2**31), "out of range"),
        ("params", "[" + ",".join(["9" * 20] * 30) + "]", "64 bits"),
        ("params", "[" + "," * 100_000 + "]", "30 ints"),
    ],
)
def test_numbers_out_of_range_are_errors(
    tmp_path: Path, column: str, value: str, message: str
) -> None:
    rows = _sample_rows()
    rows[0][column] = value
    path = _write(tmp_path / "m.1_7.csv", rows)
    with pytest.raises(ETSCSVError, match=message) as info:
        read_ets_csv(path, op_codes={})
    assert info.value.line == 2
    assert len(str(info.value)) < 300  # the offending cell is shortened in the message


def test_an_imported_trace_can_always_be_saved_and_printed(tmp_path: Path) -> None:
    rows = _sample_rows()
    for row in rows:
        row.update(kernels=2**31 - 1, flops=2**63 - 1, seq=-(2**63))
    rows[-1].update(kStartTime=2**61, kEndTime=2**61, space=2**61)
    rows[0].update(rStartTime=-(2**61), kStartTime=-(2**61))
    path = _write(tmp_path / ("x" * 30 + ".1_" + "9" * 19 + ".csv"), rows)
    trace = read_ets_csv(path, op_codes={})
    assert trace.iterations[0].step == 0  # a step suffix over 18 digits is not a step
    assert load_trace_bytes(dumps(trace)) == trace
    format_info(trace, str(path))


def load_trace_bytes(data: bytes):
    from ets_hook.trace.io import loads

    return loads(data)


@pytest.mark.skipif(sys.platform != "linux", reason="bytes file names")
def test_an_undecodable_folder_name_becomes_a_printable_device_name(tmp_path: Path) -> None:
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/gpu\xff"))
    path = _write(folder / "m.1_7.csv", _sample_rows())
    trace = read_ets_csv(path, op_codes={})
    assert trace.device.name == "gpu\ufffd"
    dumps(trace)


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("{[1]: 2}", "expected an op name", 1),
        ("{'a': True}", "'True}' is not a 64-bit int", 1),
        ("{'a': 1.5}", "expected ',' or '}', found '.'", 1),
        ("{'a': 1j}", "not a 64-bit int", 1),
        ("{1: 2}", "expected an op name", 1),
        ("{b'a': 1}", "expected an op name", 1),
        ("{'\\ud800': 1}", "not a UTF-8 string", 1),
        ("{'a': " + "-" * 100_000 + "1}", "not a 64-bit int", 1),
        ("{'a': " + "9" * 5000 + "}", "not a 64-bit int", 1),
        ("{'a': 99999999999999999999}", "not a 64-bit int", 1),
        ("{'a': +-1}", "not a 64-bit int", 1),
        ("{'a': 007}", "not a 64-bit int", 1),
        ("(" * 300 + ")" * 300, r"expected '\{', found '\('", 1),
        ("{'a': 1,\n 'b': 2,\n 'c' 3}", "expected ':', found '3'", 3),
        ("{'a': 1", "found the end of the file", 1),
        ("{'a\n': 1}", "a string literal does not end", 1),
        ("\x00", r"expected '\{'", 1),
        ("{'a': 1} {'b': 2}", "text after the dict", 1),
        ("dict(a=1)", r"expected '\{'", 1),
        ("", r"expected '\{', found the end of the file", 1),
    ],
)
def test_malformed_op_code_tables_are_typed_errors(
    tmp_path: Path, text: str, message: str, line: int
) -> None:
    path = tmp_path / "opCodes.dict"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(ETSCSVError, match=message) as info:
        load_op_codes(path)
    assert info.value.line == line
    assert str(path) in str(info.value)


def test_op_code_tables_read_like_python_literals(tmp_path: Path) -> None:
    text = (
        "  {'a' 'b': 0x10,  # comment\n 'c': -3, 'd': + 4, 'e': 1_0, 'a' r\"b\": 5,\n"
        " '''f\ng''': \\\n 0o7, 'h\\x41': 0b11,}\n"
    )
    path = tmp_path / "opCodes.dict"
    path.write_text(text)
    assert load_op_codes(path) == {5: "ab", -3: "c", 4: "d", 10: "e", 7: "f\ng", 3: "hA"}
    assert ast.literal_eval(text) == {"ab": 5, "c": -3, "d": 4, "e": 10, "f\ng": 7, "hA": 3}
    (tmp_path / "bad.dict").write_bytes(b"{'a\xff': 1}")
    with pytest.raises(ETSCSVError, match="not UTF-8"):
        load_op_codes(tmp_path / "bad.dict")


@pytest.mark.skipif(
    not (SHARED_DATA / "ets-traces" / "opCodes.dict").is_file(), reason="shared ETS sample absent"
)
def test_the_artifacts_op_code_table_reads_as_python_reads_it() -> None:
    path = SHARED_DATA / "ets-traces" / "opCodes.dict"
    expected: dict[int, str] = {}
    for name, code in ast.literal_eval(path.read_text()).items():
        expected.setdefault(code, name)
    assert load_op_codes(path) == expected


def test_csv_errors_survive_pickling() -> None:
    error = ETSCSVNotARegularFileError("/data/x.csv", 0, "a FIFO (named pipe)")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ETSCSVNotARegularFileError
    assert (copy.path, copy.line, copy.reason, str(copy)) == (
        Path("/data/x.csv"),
        0,
        "a FIFO (named pipe)",
        str(error),
    )
