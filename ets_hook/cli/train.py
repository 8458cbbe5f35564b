"""``ets-hook train`` and ``ets-hook evaluate``: argparse wiring for the ETS model pipeline.

``cli.main`` adds these with ``add_train_parser(subparsers)`` / ``add_evaluate_parser(
subparsers)``; each sets ``handler`` on the parsed namespace, a callable taking the namespace and
returning the process exit code (0). Out-of-range option values are argparse usage errors; bad
inputs (missing or malformed traces and weights files, a model of another feature-schema
version, an output path that cannot be written) raise ``cli.common.InputError``, which
``cli.main`` prints as one line and exits 2.

TRACES are files or directories, found and loaded by ``trace.discovery.load_traces``: ``.csv``
files are ETS-artifact per-op CSVs, any other file is an ets-hook trace; a directory contributes
every ``*.csv`` (except ``MANIFEST.csv``) and ``*.ets`` below it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from ..ets.features import DEFAULT_VOCAB_SIZE
from ..ets.regressors import MODEL_KINDS, Evaluation, Predictor, evaluate
from ..ets.targets import TARGET_TRANSFORMS
from ..ets.windows import DEFAULT_STRIDE, DEFAULT_WIDTH
from ..trace.discovery import load_traces, trace_files
from .common import (
    EXIT_OK,
    HelpFormatter,
    InputError,
    exit_codes_epilog,
    float_in,
    int_at_least,
    parse_seed,
    reading,
    require_file,
    require_file_name,
    require_output,
)

_TRACES_INPUT = (
    "a TRACES path that is missing, unreadable or not a regular file or directory, or a file in "
    "it that is not a valid .ets trace or ETS CSV"
)
_UNEXPECTED = "an unexpected failure while running (Python's traceback)"
_POSITIVE = int_at_least(1)

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
        epilog=exit_codes_epilog(
            "the weights file was written",
            "usage error or an option value out of range (--stride above --width included), "
            f"{_TRACES_INPUT}, traces no model can be fitted on, or an -o path that cannot "
            "be written",
            _UNEXPECTED,
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help="trace files or directories")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="weights file to write (.npz appended unless it ends so; missing folders are made)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out trace files whose name matches GLOB (repeatable), e.g. 'resnet*' to "
        "hold a model family out",
    )
    p.add_argument("--model", choices=MODEL_KINDS, default="lstm", help="model kind (lstm)")
    p.add_argument("--width", type=_POSITIVE, default=DEFAULT_WIDTH, help="window width (12)")
    p.add_argument("--stride", type=_POSITIVE, default=DEFAULT_STRIDE, help="window stride (3)")
    p.add_argument("--epochs", type=int_at_least(0), default=200, help="maximum epochs (200)")
    p.add_argument("--batch-size", type=_POSITIVE, default=128, help="windows per batch (128)")
    p.add_argument(
        "--lr", type=float_in(0, low_open=True), default=1e-4, help="Adam learning rate (1e-4)"
    )
    p.add_argument("--weight-decay", type=float_in(0), default=0.0, help="Adam weight decay (0)")
    p.add_argument(
        "--layers", type=_POSITIVE, default=None, help="layers (lstm 4, mlp 3, grouping 3)"
    )
    p.add_argument(
        "--hidden", type=_POSITIVE, default=None, help="hidden units (lstm: feature count)"
    )
    p.add_argument("--dropout", type=float_in(0, 1), default=0.0, help="dropout between layers (0)")
    p.add_argument("--seed", type=parse_seed, default=0, help="random seed, 0 to 2**63 - 1 (0)")
    p.add_argument(
        "--ensemble", type=_POSITIVE, default=1, help="members trained with seeds seed+k"
    )
    p.add_argument(
        "--val-fraction",
        type=float_in(0, 1),
        default=0.2,
        help="validation share for early stopping",
    )
    p.add_argument("--patience", type=_POSITIVE, default=30, help="early-stopping patience (30)")
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
    p.add_argument(
        "--ignore-features",
        default="",
        metavar="NAMES",
        help="comma-separated feature columns the model never sees, e.g. "
        "log_batch,log_input_h,log_input_w (the per-file batch and input size)",
    )
    p.add_argument("--vocab-size", type=_POSITIVE, default=DEFAULT_VOCAB_SIZE, help="op types (25)")
    p.add_argument(
        "--device-features", action="store_true", help="add GPU spec features (cross-device)"
    )
    p.add_argument("--device", default=None, help="GPU name for CSV traces (default: folder)")
    p.add_argument(
        "--threads",
        type=int_at_least(0),
        default=0,
        help="torch threads (0: torch's default; 1 is fastest on a busy machine)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run_train)
    return p


def run_train(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Implement ``ets-hook train``: load the traces, fit, save the weights file, report.

    Args:
        args: the namespace parsed by the ``train`` subparser.
        out: where the summary goes; None: stdout. Warnings go to stderr.

    Returns:
        0: the weights file was written.

    Raises:
        InputError: the configuration is invalid (``--stride`` above ``--width``), the output
            path cannot be written (checked before loading: ``-o`` empty, a directory or ending
            with a path separator, or a folder on its path that is a file, read-only or holds
            no new files), a trace is missing, unreadable or malformed, ``--exclude`` leaves no
            trace file, fitting rejects the traces, or writing the weights file fails.
    """
    out = out or sys.stdout
    if args.stride > args.width:
        raise InputError(f"--stride {args.stride} must be <= --width {args.width}")
    output = require_output(_weights_path(args.output), create_folder=True, option="-o")
    with reading():
        files = [
            f
            for f in trace_files(args.traces)
            if not any(fnmatch.fnmatchcase(f.name, g) for g in args.exclude)
        ]
        if not files:
            raise InputError(f"every trace file matches --exclude {' '.join(args.exclude)}")
        traces = load_traces(files, device_name=args.device)
    from ..ets.training import TrainConfig, fit  # imports torch: after the inputs are checked

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    with reading(errors=(ValueError,)):
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
            ignore_features=tuple(n.strip() for n in args.ignore_features.split(",") if n.strip()),
            vocab_size=args.vocab_size,
            device_features=args.device_features,
            progress=not args.no_progress,
        )
    precisions = {t.metadata.get("precision") for t in traces} - {None}
    if len(precisions) > 1 or "mixed" in precisions:
        print(
            f"ets-hook train: warning: traces mix precisions {sorted(precisions)}; "
            "the dtype feature separates them",
            file=sys.stderr,
        )
    with reading(errors=(ValueError,)):
        result = fit(traces, config)
    predictor = result.predictor
    predictor.training["trace_files"] = [str(t.metadata.get("file", "")) for t in traces]
    with reading(output, errors=(OSError,)):
        path = predictor.save(output)
    info = predictor.training
    val = [v for v in info.get("val_mre", []) if v is not None]
    print(
        f"trained {predictor.kind} on {info['train_iterations']} iterations "
        f"({info['train_ops']} ops, {len(info['groups'])} model"
        f"{'s' if len(info['groups']) != 1 else ''}) in {result.seconds:.1f} s; "
        f"epochs {info['epochs_run']}"
        + (f"; validation MRE {min(val):.2%}" if val else "")
        + f"\nwrote {path}",
        file=out,
    )
    return EXIT_OK


def _weights_path(output: str) -> Path:
    """The file ``Predictor.save`` writes for ``-o``: ``.npz`` appended unless it ends so.

    Args:
        output: ``-o`` as given.

    Returns:
        The weights file's path.

    Raises:
        InputError: ``output`` does not name a file: it is empty, ends with a path separator
            or in ``.`` or ``..``, or is an existing directory (``out`` would become
            ``out.npz`` beside it).
    """
    path = require_file_name(output, option="-o")
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


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
        epilog=exit_codes_epilog(
            "the table (or JSON) was printed",
            "usage error; a MODEL that is missing, not a regular file, not an ets-hook weights "
            f"file or of another feature-schema version; {_TRACES_INPUT}; or no iteration in "
            "TRACES with a complete measurement",
            _UNEXPECTED,
        ),
        formatter_class=HelpFormatter,
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
        out: where the table (or JSON with ``--json``) goes; None: stdout.

    Returns:
        0: the evaluation was printed.

    Raises:
        InputError: the weights file is missing, not a regular file, not a readable ets-hook
            model or of another feature-schema version; a trace is missing, unreadable or
            malformed, or the model cannot encode it; or no iteration has a complete
            measurement.
    """
    out = out or sys.stdout
    model = require_file(args.model)  # before np.load, which would block on a FIFO
    with reading(model, errors=(OSError, ValueError, KeyError, IndexError, TypeError)):
        predictor = Predictor.load(model)
    with reading():
        traces = load_traces(args.traces, device_name=args.device)
    encoded = []
    for trace in traces:
        with reading(str(trace.metadata.get("file", "")) or None, errors=(ValueError,)):
            encoded.extend(predictor.encode(trace))
    evaluation = evaluate(predictor, encoded)
    if not evaluation.labels:
        raise InputError("no iteration in TRACES has a complete measurement")
    if args.json:
        doc = {"model_file": str(args.model), "model": predictor.kind, **evaluation.to_dict()}
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        print(format_evaluation(evaluation, predictor, str(args.model)), file=out)
    return EXIT_OK
