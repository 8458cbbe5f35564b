"""``train`` / ``evaluate`` subcommands, driven through a parser built here."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pytest

from ets_hook.cli.train import add_evaluate_parser, add_train_parser
from ets_hook.ets.regressors import Predictor
from ets_hook.trace.discovery import load_traces
from ets_hook.trace.events import IterationTrace, OpEvent, Phase, Trace
from ets_hook.trace.importers import ETS_CSV_COLUMNS

OP_CODES = {"conv2d": 203, "relu": 152, "add_": 12}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ets-hook")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_evaluate_parser(sub)
    return parser


def _write_csv(path: Path, batch: int, n_layers: int) -> None:
    rows = []
    t = 0
    plan = [(203, 1), (152, 1)] * n_layers + [(152, 2), (203, 2)] * n_layers + [(12, 3)] * n_layers
    for k, (op, direction) in enumerate(plan):
        kdur = (3000 if op == 203 else 400) * batch * (2 if direction == 2 else 1)
        space = 2000 + 100 * (k % 3)
        params = [batch, 8, 16, 16, 8, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 4] + [0] * 13
        row = dict.fromkeys(ETS_CSV_COLUMNS, 0)
        row.update(
            op=op,
            dir=direction,
            params=str(params),
            flops=float(1e6 * batch),
            bytes=4e5 * batch,
            rStartTime=t,
            rEndTime=t + 100,
            kStartTime=t + 50,
            kEndTime=t + 50 + kdur,
            space=space,
            seq=k,
            kernels=1,
            kduration=kdur,
            batch=batch,
            h=16,
            w=16,
            input_type=1,
        )
        rows.append(row)
        t += kdur + space
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ETS_CSV_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "traces"
    root.mkdir()
    (root / "opCodes.dict").write_text(repr(OP_CODES))
    for model, layers in (("net_a", 3), ("net_b", 5), ("net_c", 4)):
        for batch in (1, 2, 4):
            _write_csv(root / "T4" / f"{model}.{batch}_7.csv", batch, layers)
    return root


def test_train_then_evaluate(data_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "out" / "model.npz"
    args = _parser().parse_args(
        [
            "train",
            str(data_dir / "T4"),
            "-o",
            str(model),
            "--model",
            "mlp",
            "--epochs",
            "5",
            "--lr",
            "1e-3",
            "--hidden",
            "16",
            "--no-progress",
            "--seed",
            "3",
        ]
    )
    out = io.StringIO()
    assert args.handler(args, out=out) == 0
    assert "wrote" in out.getvalue() and model.is_file()
    predictor = Predictor.load(model)
    assert predictor.kind == "mlp" and predictor.hidden == 16
    assert len(predictor.training["trace_files"]) == 9

    args = _parser().parse_args(["evaluate", str(model), str(data_dir)])
    out = io.StringIO()
    assert args.handler(args, out=out) == 0
    text = out.getvalue()
    assert "MRE:" in text and "RMSE:" in text
    for name in ("net_a", "net_b", "net_c"):
        assert name in text

    args = _parser().parse_args(
        ["evaluate", str(model), str(data_dir / "T4" / "net_a.2_7.csv"), "--json"]
    )
    out = io.StringIO()
    assert args.handler(args, out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["iterations"] == 1 and set(doc["by_model"]) == {"net_a"}
    row = doc["per_iteration"][0]
    assert doc["mre"] == pytest.approx(
        abs(row["measured_ms"] - row["predicted_ms"]) / row["measured_ms"]
    )


def test_defaults_and_lstm_options(data_dir: Path, tmp_path: Path) -> None:
    args = _parser().parse_args(["train", str(data_dir), "-o", str(tmp_path / "m.npz")])
    assert (args.model, args.width, args.stride, args.lr, args.batch_size) == (
        "lstm",
        12,
        3,
        1e-4,
        128,
    )
    args = _parser().parse_args(
        [
            "train",
            str(data_dir),
            "-o",
            str(tmp_path / "m"),
            "--width",
            "6",
            "--stride",
            "2",
            "--layers",
            "1",
            "--hidden",
            "8",
            "--epochs",
            "2",
            "--no-progress",
            "--ensemble",
            "2",
        ]
    )
    assert args.handler(args, out=io.StringIO()) == 0
    predictor = Predictor.load(tmp_path / "m.npz")
    assert (predictor.width, predictor.stride, predictor.layers) == (6, 2, 1)
    assert len(predictor.members) == 2


def test_bad_inputs_exit_with_2(data_dir: Path, tmp_path: Path, capsys) -> None:
    args = _parser().parse_args(["train", str(tmp_path / "nope"), "-o", str(tmp_path / "m.npz")])
    assert args.handler(args) == 2
    assert "no such file" in capsys.readouterr().err
    args = _parser().parse_args(
        ["train", str(data_dir), "-o", str(tmp_path / "m.npz"), "--width", "2", "--stride", "3"]
    )
    assert args.handler(args) == 2
    assert "stride" in capsys.readouterr().err
    bad = tmp_path / "bad" / "x.1_7.csv"
    bad.parent.mkdir()
    bad.write_text(",".join(ETS_CSV_COLUMNS) + "\n1,2\n")
    args = _parser().parse_args(["evaluate", str(tmp_path / "m.npz"), str(bad)])
    assert args.handler(args) == 2  # the model file does not exist
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.csv or \.ets"):
        load_traces([tmp_path / "empty"])


def test_ets_trace_files_are_loaded_through_trace_io(tmp_path: Path) -> None:
    trace_io = pytest.importorskip("ets_hook.trace.io")
    ops = [
        OpEvent(
            "aten::relu",
            1000 * k,
            400,
            phase=Phase.FORWARD,
            input_shapes=((8, 8),),
            input_dtypes=("float",),
        )
        for k in range(20)
    ]
    trace = Trace(iterations=[IterationTrace(0, 0, 20_000, ops)], metadata={"model": "toy"})
    trace_io.save_trace(trace, tmp_path / "toy.ets")
    (loaded,) = load_traces([tmp_path])
    assert loaded.metadata["file"] == "toy.ets"
    assert len(loaded.iterations[0].ops) == 20
