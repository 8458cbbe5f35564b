"""``ets-hook train`` and ``ets-hook evaluate``: argparse wiring for the ETS model pipeline.

``cli.main`` adds these with ``add_train_parser(subparsers)`` / ``add_evaluate_parser(
subparsers)``; each sets ``handler`` on the parsed namespace, a callable taking the namespace and
returning the process exit code (0 ok, 2 bad input: missing files, malformed traces, a model of
another feature-schema version).

TRACES are files or directories, found and loaded by ``trace.discovery.load_traces``: ``.csv``
files are ETS-artifact per-op CSVs, any other file is an ets-hook trace; a directory contributes
every ``*.csv`` (except ``MANIFEST.csv``) and ``*.ets`` below it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..ets.features import DEFAULT_VOCAB_SIZE
from ..ets.regressors import MODEL_KINDS, Evaluation, Predictor, evaluate
from ..ets.targets import TARGET_TRANSFORMS
from ..ets.windows import DEFAULT_STRIDE, DEFAULT_WIDTH
from ..trace.discovery import load_traces

# ---------------------------------------------------------------------------------------------
# train


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train``: fit an ETS model (or a baseline) on traces and write a weights file.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.

    Returns:
        The ``train`` subparser (its ``handler`` is ``run_train``).
    """
    p = subparsers.add_parser(
        "train",
        help="train an ETS predictor (or a baseline) on traces",
        description="Train a per-op (duration, gap) predictor on traces and write a .npz "
        "weights file. The ETS model (lstm) is the paper's sliding-window BiLSTM; mlp is the "
        "op-based PerfNet-like baseline, grouping the DNNPerf-like baseline.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help="trace files or directories")
    p.add_argument("-o", "--output", required=True, help="weights file to write (.npz)")
    p.add_argument("--model", choices=MODEL_KINDS, default="lstm", help="model kind (lstm)")
    p.add_argument("--width", type=int, default=DEFAULT_WIDTH, help="window width (12)")
    p.add_argument("--stride", type=int, default=DEFAULT_STRIDE, help="window stride (3)")
    p.add_argument("--epochs", type=int, default=200, help="maximum epochs (200)")
    p.add_argument("--batch-size", type=int, default=128, help="windows per batch (128)")
    p.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (1e-4)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="Adam weight decay (0)")
    p.add_argument("--layers", type=int, default=None, help="layers (lstm 4, mlp 3, grouping 3)")
    p.add_argument("--hidden", type=int, default=None, help="hidden units (lstm: feature count)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout between layers (0)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument("--ensemble", type=int, default=1, help="members trained with seeds seed+k")
    p.add_argument(
        "--val-fraction", type=float, default=0.2, help="validation share for early stopping"
    )
    p.add_argument("--patience", type=int, default=30, help="early-stopping patience (30)")
    p.add_argument(
        "--target-transform",
        # "measured" needs collected early/steady traces: benchmarks/train_early_model.py
        choices=[t for t in TARGET_TRANSFORMS if t != "measured"],
        default="standard",
        help="target scaling: standard (the paper), log, or roofline (log ratio to a FLOPs/bytes "
        "prior)",
    )
    p.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip scaling predictions so training sums match the measurements",
    )
    p.add_argument(
        "--feature-clamp",
        action="store_true",
        help="clamp features to the training range (guards extrapolation)",
    )
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="op types (25)")
    p.add_argument(
        "--device-features", action="store_true", help="add GPU spec features (cross-device)"
    )
    p.add_argument("--device", default=None, help="GPU name for CSV traces (default: folder)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run_train)
    return p


def run_train(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Implement ``ets-hook train``: load the traces, fit, save the weights file, report.

    Args:
        args: the namespace parsed by the ``train`` subparser.
        out: where the summary goes; None: stdout. Errors and warnings go to stderr.

    Returns:
        0 on success; 2 when the configuration or traces are invalid or unreadable
        (``OSError``, ``ValueError``) or fitting rejects them (``ValueError``).

    Raises:
        OSError: the weights file cannot be written (not caught).
    """
    from ..ets.training import TrainConfig, fit

    out = out or sys.stdout
    try:
        config = TrainConfig(
            kind=args.model,
            width=args.width,
            stride=args.stride,
            layers=args.layers,
            hidden=args.hidden,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            weight_decay=args.weight_decay,
            dropout=args.dropout,
            val_fraction=args.val_fraction,
            patience=args.patience,
            seed=args.seed,
            ensemble=args.ensemble,
            target_transform=args.target_transform,
            calibrate=not args.no_calibrate,
            clamp_features=args.feature_clamp,
            vocab_size=args.vocab_size,
            device_features=args.device_features,
            progress=not args.no_progress,
        )
        traces = load_traces(args.traces, device_name=args.device)
    except (OSError, ValueError) as exc:
        print(f"ets-hook train: error: {exc}", file=sys.stderr)
        return 2
    precisions = {t.metadata.get("precision") for t in traces} - {None}
    if len(precisions) > 1 or "mixed" in precisions:
        print(
            f"ets-hook train: warning: traces mix precisions {sorted(precisions)}; "
            "the dtype feature separates them",
            file=sys.stderr,
        )
    try:
        result = fit(traces, config)
    except ValueError as exc:
        print(f"ets-hook train: error: {exc}", file=sys.stderr)
        return 2
    predictor = result.predictor
    predictor.training["trace_files"] = [str(t.metadata.get("file", "")) for t in traces]
    path = predictor.save(args.output)
    info = predictor.training
    val = [v for v in info.get("val_mre", []) if v is not None]
    print(
        f"trained {predictor.kind} on {info['train_iterations']} iterations "
        f"({info['train_ops']} ops, {len(info['groups'])} models) in {result.seconds:.1f} s; "
        f"epochs {info['epochs_run']}"
        + (f"; validation MRE {min(val):.2%}" if val else "")
        + f"\nwrote {path}",
        file=out,
    )
    return 0


# ---------------------------------------------------------------------------------------------
# evaluate


def add_evaluate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``evaluate``: MRE and RMSE of a weights file on traces, per model.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.

    Returns:
        The ``evaluate`` subparser (its ``handler`` is ``run_evaluate``).
    """
    p = subparsers.add_parser(
        "evaluate",
        help="evaluate a trained predictor on traces",
        description="Predict the iteration time of every iteration in TRACES and compare with "
        "the measurement: MRE = mean(|y - y_hat| / y), RMSE in ms, and a per-model table.",
    )
    p.add_argument("model", help="weights file (.npz) written by ets-hook train")
    p.add_argument("traces", nargs="+", metavar="TRACES", help="trace files or directories")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--device", default=None, help="GPU name for CSV traces (default: folder)")
    p.set_defaults(handler=run_evaluate)
    return p


def format_evaluation(evaluation: Evaluation, predictor: Predictor, model_path: str) -> str:
    """Format an evaluation for people: model line, summary line and a per-model table.

    Args:
        evaluation: the result of ``ets.regressors.evaluate``.
        predictor: the evaluated predictor (its kind, size and window are shown).
        model_path: the weights file, as shown.

    Returns:
        The report, lines joined by newlines (no trailing newline).
    """
    lines = [
        f"model: {model_path} ({predictor.kind}, {predictor.layers} layers x {predictor.hidden}, "
        f"window {predictor.width}/{predictor.stride}, {len(predictor.members)} member(s))",
        f"iterations: {len(evaluation.labels)}   MRE: {evaluation.mre:.2%}   "
        f"RMSE: {evaluation.rmse_ms:.3f} ms",
    ]
    if evaluation.skipped:
        lines.append(f"skipped (no complete measurement): {', '.join(evaluation.skipped)}")
    table = evaluation.by_group()
    width = max([len("model"), *(len(g) for g in table)])
    lines.append("")
    lines.append(
        f"{'model':<{width}}  {'iters':>5}  {'MRE':>7}  {'RMSE ms':>9}  "
        f"{'measured ms':>11}  {'predicted ms':>12}"
    )
    for group, row in table.items():
        lines.append(
            f"{group:<{width}}  {row['iterations']:>5d}  {row['mre']:>7.2%}  "
            f"{row['rmse_ms']:>9.3f}  {row['measured_ms']:>11.3f}  {row['predicted_ms']:>12.3f}"
        )
    return "\n".join(lines)


def run_evaluate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Implement ``ets-hook evaluate``: predict every iteration of the traces and compare.

    Args:
        args: the namespace parsed by the ``evaluate`` subparser.
        out: where the table (or JSON with ``--json``) goes; None: stdout. Errors go to stderr.

    Returns:
        0 on success; 2 when the weights file or the traces are invalid or unreadable
        (``OSError``, ``ValueError``, including a model of another feature-schema version), or
        when no iteration has a complete measurement.
    """
    out = out or sys.stdout
    try:
        predictor = Predictor.load(args.model)
        traces = load_traces(args.traces, device_name=args.device)
    except (OSError, ValueError) as exc:
        print(f"ets-hook evaluate: error: {exc}", file=sys.stderr)
        return 2
    encoded = [e for t in traces for e in predictor.encode(t)]
    evaluation = evaluate(predictor, encoded)
    if not evaluation.labels:
        print("ets-hook evaluate: error: no iteration has a complete measurement", file=sys.stderr)
        return 2
    if args.json:
        doc = {"model_file": str(args.model), "model": predictor.kind, **evaluation.to_dict()}
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        print(format_evaluation(evaluation, predictor, str(args.model)), file=out)
    return 0
