"""ETS artifact CSV importer: mapping, half precision, malformed rows, directories."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from support import SHARED_DATA

from ets_hook.errors import ETSCSVError
from ets_hook.trace.discovery import load_traces
from ets_hook.trace.events import Phase
from ets_hook.trace.importers import (
    ETS_CSV_COLUMNS,
    load_op_codes,
    parse_ets_file_name,
    read_ets_csv,
)

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


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(dir=4), "'dir'"),
        (lambda r: r.update(kduration="abc"), "'kduration'"),
        (lambda r: r.update(params="[1, 2, 3]"), "30 ints"),
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


@pytest.mark.skipif(not (SAMPLE / "MANIFEST.csv").is_file(), reason="shared ETS sample absent")
def test_shared_sample_imports_as_the_manifest_says() -> None:
    manifest = {
        (row["gpu"], row["file"]): row for row in csv.DictReader((SAMPLE / "MANIFEST.csv").open())
    }
    traces = load_traces([SAMPLE])
    assert len(traces) == len(manifest)
    for trace in traces:
        row = manifest[(trace.device.name, trace.metadata["file"])]
        assert len(trace.iterations[0].ops) == int(row["rows"])
        assert trace.metadata["model"] == row["model"]
        assert trace.metadata["batch_size"] == int(row["batch"])
        assert trace.metadata["precision"] == "fp32"
        ops = trace.iterations[0].ops
        total = sum(op.kernel_duration_ns + op.gap_ns for op in ops)
        assert total > 0 and all(op.gap_ns >= 0 for op in ops)
