"""``train`` / ``evaluate`` subcommands, driven through a parser built here."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from support import write_ets_tree

from ets_hook.cli.common import InputError
from ets_hook.cli.train import add_evaluate_parser, add_train_parser
from ets_hook.ets.regressors import Predictor
from ets_hook.trace.importers import ETS_CSV_COLUMNS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ets-hook")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_evaluate_parser(sub)
    return parser


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return write_ets_tree(tmp_path / "traces")


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


def test_bad_inputs_raise_input_errors(data_dir: Path, tmp_path: Path) -> None:
    """Handlers raise ``InputError`` (``cli.main`` prints it and exits 2), naming the problem."""
    args = _parser().parse_args(["train", str(tmp_path / "nope"), "-o", str(tmp_path / "m.npz")])
    with pytest.raises(InputError, match="No such file"):
        args.handler(args)
    args = _parser().parse_args(
        ["train", str(data_dir), "-o", str(tmp_path / "m.npz"), "--width", "2", "--stride", "3"]
    )
    with pytest.raises(InputError, match="--stride 3 must be <= --width 2"):
        args.handler(args)
    bad = tmp_path / "bad" / "x.1_7.csv"
    bad.parent.mkdir()
    bad.write_text(",".join(ETS_CSV_COLUMNS) + "\n1,2\n")
    args = _parser().parse_args(["evaluate", str(tmp_path / "m.npz"), str(bad)])
    with pytest.raises(InputError, match=r"m\.npz: No such file"):  # the model file is missing
        args.handler(args)
    assert not (tmp_path / "m.npz").exists()


def test_exclude_holds_files_out(data_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "no_b.npz"
    args = _parser().parse_args(
        [
            *("train", str(data_dir), "-o", str(model), "--exclude", "net_b.*"),
            *("--model", "mlp", "--epochs", "1", "--hidden", "8", "--no-progress"),
            *("--threads", "1"),
        ]
    )
    assert args.handler(args, out=io.StringIO()) == 0
    predictor = Predictor.load(model)
    assert len(predictor.training["trace_files"]) == 6
    assert predictor.training["groups"] == ["net_a", "net_c"]
    args = _parser().parse_args(
        ["train", str(data_dir), "-o", str(model), "--exclude", "net_*", "--epochs", "1"]
    )
    with pytest.raises(InputError, match="every trace file matches --exclude"):
        args.handler(args)
    args = _parser().parse_args(
        ["train", str(data_dir), "-o", str(model), "--ignore-features", "log_nope", "--epochs", "1"]
    )
    with pytest.raises(InputError, match="no such feature columns"):
        args.handler(args)


SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "ets-traces"


@pytest.mark.skipif(
    not (SHARED_TRACES / "MANIFEST.csv").is_file(), reason="ETS artifact sample not present"
)
def test_readme_family_hold_out_on_the_artifact_sample(tmp_path: Path) -> None:
    """The README's held-out-family commands on the shared artifact sample (few epochs)."""
    t4 = SHARED_TRACES / "T4"
    model = tmp_path / "t4-no-mobilenet.npz"
    args = _parser().parse_args(
        [
            *("train", str(t4), "--exclude", "mobilenet*", "-o", str(model)),
            *("--target-transform", "roofline", "--hidden", "16", "--layers", "1"),
            *("--lr", "1e-3", "--epochs", "2", "--val-fraction", "0", "--threads", "1"),
            *("--feature-clamp", "--ignore-features", "log_batch,log_input_h,log_input_w"),
            "--no-progress",
        ]
    )
    assert args.handler(args, out=io.StringIO()) == 0
    predictor = Predictor.load(model)
    assert not any(g.startswith("mobilenet") for g in predictor.training["groups"])
    held_out = sorted(str(p) for p in t4.glob("mobilenet*.csv"))
    assert held_out
    args = _parser().parse_args(["evaluate", str(model), *held_out, "--json"])
    out = io.StringIO()
    assert args.handler(args, out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["iterations"] == len(held_out) and doc["mre"] >= 0
