#!/usr/bin/env python
"""Train and evaluate the shipped early → steady-state model on our own CPU dataset.

Input: the ``.ets`` files of ``benchmarks/collect.py`` (early steps [1, 6) and a steady window
of every zoo job, with the job's unprofiled steady step time). Steps:

1. Leave-one-family-out evaluation: for every architecture family, the models are trained on
   the other families' jobs and predict the held-out family's steady step time from its early
   steps. Compared: ETS-LSTM (sliding windows, the shipped kind), the op-based MLP and the
   grouping model (same features and targets), the untrained per-op-median estimate, and
   whole-step baselines (first captured step, mean and median of the captured steps).
   Error: |predicted - actual| / actual per job; median, P90 and mean (MRE) over jobs.
2. The final model, trained on every job, written to ``ets_hook/data/early_cpu.npz`` with the
   held-out error it is used with (95th percentile of the LSTM's held-out errors).

Training length: a fixed epoch budget (``--epochs``, the default), or with ``--val-fraction``
early stopping on a validation split by family inside the training families (each fold's own;
``--epochs`` is then the maximum and ``--patience`` the epochs without improvement tolerated),
which watches the calibrated validation MRE (``ets.training``).

Per-family results are also summed up over "old" zoo families and the "new" ones of
``collect.py``'s variants (``--new-families``). ``--shipped MODEL`` also scores a saved model
(the shipped one) directly on every job: held out for the families it was not trained on
(``training["families"]``), in-sample for the others.

Usage::

    python benchmarks/collect.py --out results/dataset
    python benchmarks/train_early_model.py results/dataset --out ets_hook/data/early_cpu.npz
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ets_hook.ets.features import FeatureSchema  # noqa: E402
from ets_hook.ets.regressors import Predictor  # noqa: E402
from ets_hook.ets.training import TrainConfig, fit_encoded  # noqa: E402
from ets_hook.forecast.trace_estimators import (  # noqa: E402
    EarlyExample,
    early_summary,
    fit_early_schema,
    predict_step_ns,
    training_example,
)
from ets_hook.trace.io import load_trace  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from ets_paper import KIND_LABEL  # noqa: E402

KINDS = ("lstm", "mlp", "grouping")  # the trainable kinds (``ets.regressors.MODEL_KINDS``)
# collect.py's variant families (issue 16); every other family is the zoo's.
NEW_FAMILIES = ("mlp-loader", "transformer-varlen", "gpt-accum2")

LABEL = {
    **KIND_LABEL,
    "lstm": "ETS-LSTM (the shipped kind)",
    "shipped": "shipped model file, as is",
    "op_median": "per-op medians (untrained)",
    "first_step": "first captured step",
    "mean_steps": "mean of captured steps",
    "median_steps": "median of captured steps",
}


def config(
    kind: str, epochs: int, seed: int = 0, val_fraction: float = 0.0, patience: int = 5
) -> TrainConfig:
    """The training setting: ``val_fraction`` 0 is a fixed epoch budget; above 0, early stopping
    on that share of the training families (``val_split="group"``), ``epochs`` at most."""
    size: dict[str, Any] = {"hidden": 32, "layers": 2} if kind == "lstm" else {}
    return TrainConfig(
        kind=kind,
        **size,
        epochs=epochs,
        lr=1e-3,
        val_fraction=val_fraction,
        val_split="group",
        patience=patience,
        target_transform="measured",
        seed=seed,
        progress=False,
    )


def train(
    examples: list[EarlyExample], schema: FeatureSchema, kind: str, settings: dict[str, Any]
) -> Predictor:
    return fit_encoded([e.encoded for e in examples], schema, config(kind, **settings)).predictor


def baselines(example: EarlyExample) -> dict[str, float]:
    s = example.summary
    return {
        "op_median": s.op_median_ns,
        "first_step": s.step_ns[0],
        "mean_steps": float(np.mean(s.step_ns)),
        "median_steps": float(np.median(s.step_ns)),
    }


def summarize(errors: list[float]) -> dict[str, float]:
    a = np.abs(np.asarray(errors))
    return {
        "median_pct": float(np.median(a) * 100),
        "p90_pct": float(np.quantile(a, 0.9) * 100),
        "mre_pct": float(a.mean() * 100),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path, help="directory of collect.py .ets files")
    ap.add_argument("--out", type=Path, default=None, help="write the final model here")
    ap.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="epochs (a fixed budget), or the most with --val-fraction (default 2: the best "
        "held out of 2, 4, 8 and early stopping on the 102-job dataset)",
    )
    ap.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        help="share of the training families held out for early stopping (default 0: none)",
    )
    ap.add_argument("--patience", type=int, default=5, help="early stopping's patience")
    ap.add_argument("--seed", type=int, default=0, help="training seed (of every model)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument(
        "--new-families",
        default=",".join(NEW_FAMILIES),
        help="families summed up as 'new' (the rest: 'old')",
    )
    ap.add_argument(
        "--shipped",
        type=Path,
        default=None,
        help="also score this saved model (e.g. ets_hook/data/early_cpu.npz) on every job",
    )
    ap.add_argument(
        "--fold-dir",
        type=Path,
        default=None,
        help="also save each fold's ETS-LSTM as FAMILY.npz (a model that never saw FAMILY; "
        "benchmarks/accuracy.py --held-out-models uses them)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    files = sorted(args.dataset.glob("*.ets"))
    if not files:
        ap.error(f"no .ets files in {args.dataset}")
    traces = [load_trace(f) for f in files]
    kinds = [k for k in args.kinds.split(",") if k]
    settings = {
        "epochs": args.epochs,
        "val_fraction": args.val_fraction,
        "patience": args.patience,
        "seed": args.seed,
    }
    families = sorted({str(t.metadata.get("family", "")) for t in traces})
    new_families = {f for f in args.new_families.split(",") if f}
    print(f"{len(traces)} jobs, families {families}", file=sys.stderr)
    if args.fold_dir is not None:
        args.fold_dir.mkdir(parents=True, exist_ok=True)

    # Encode once with every op type in the vocabulary; each fold projects onto its own.
    full_schema = fit_early_schema(traces, vocab_size=1_000_000)
    every = [training_example(t, full_schema) for t in traces]
    shipped: dict[str, float] = {}  # workload -> the saved model's prediction, ns
    shipped_families: list[str] = []
    if args.shipped is not None:
        saved = Predictor.load(args.shipped)
        shipped_families = list(saved.training.get("families", []))
        for trace in traces:
            summary = early_summary(trace, saved.schema, trace.metadata["early_steps"])
            assert summary is not None  # training_example above found early steps with ops
            shipped[str(trace.metadata.get("workload", ""))] = predict_step_ns(saved, summary)
    print(f"encoded in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    records: list[dict[str, Any]] = []
    train_s: dict[str, float] = dict.fromkeys(kinds, 0.0)
    best_epochs: dict[str, list[int]] = {kind: [] for kind in kinds}
    for family in families:
        train_traces = [t for t in traces if t.metadata.get("family") != family]
        schema = fit_early_schema(train_traces)  # vocabulary from training families only
        train_ex = [e.reschema(full_schema, schema) for e in every if e.family != family]
        test_ex = [e.reschema(full_schema, schema) for e in every if e.family == family]
        predicted: dict[str, list[float]] = {}
        for kind in kinds:
            t0 = time.perf_counter()
            model = train(train_ex, schema, kind, settings)
            train_s[kind] += time.perf_counter() - t0
            best_epochs[kind] += list(model.training.get("best_epoch", []))
            predicted[kind] = [predict_step_ns(model, e.summary) for e in test_ex]
            if kind == "lstm" and args.fold_dir is not None:
                model.training.update(device_kind="cpu", held_out_family=family)
                model.save(args.fold_dir / f"{family}.npz")
        for k, e in enumerate(test_ex):
            row: dict[str, Any] = {
                "family": family,
                "workload": e.workload,
                "actual_ms": e.steady_step_ns / 1e6,
                "ops": e.encoded.n_ops,
            }
            estimates = {kind: predicted[kind][k] for kind in kinds} | baselines(e)
            if shipped:
                estimates["shipped"] = shipped[e.workload]
            for method, value_ns in estimates.items():
                row[f"{method}_ms"] = value_ns / 1e6
                row[f"{method}_err"] = value_ns / e.steady_step_ns - 1.0
            records.append(row)
        print(f"  held out {family}: {len(test_ex)} jobs", file=sys.stderr)

    methods = [*kinds, "op_median", "first_step", "mean_steps", "median_steps"]
    methods += ["shipped"] if shipped else []
    table = {m: summarize([r[f"{m}_err"] for r in records]) for m in methods}
    per_family = {
        f: {m: summarize([r[f"{m}_err"] for r in records if r["family"] == f]) for m in methods}
        for f in families
    }
    groups = {
        "old": [f for f in families if f not in new_families],
        "new": [f for f in families if f in new_families],
    }
    per_group = {
        g: {
            m: summarize([r[f"{m}_err"] for r in records if r["family"] in members])
            for m in methods
        }
        for g, members in groups.items()
        if members
    }
    results: dict[str, Any] = {
        "machine": {"host": platform.node(), "python": platform.python_version()},
        "jobs": len(traces),
        "families": families,
        "new_families": groups["new"],
        "settings": settings,
        "best_epochs": best_epochs,
        "shipped_model": str(args.shipped) if args.shipped else None,
        "shipped_model_families": shipped_families,
        "table": table,
        "per_group": per_group,
        "per_family": per_family,
        "records": records,
        "cv_train_seconds": train_s,
    }

    if args.out is not None and "lstm" in kinds:
        schema = fit_early_schema(traces)
        examples = [e.reschema(full_schema, schema) for e in every]
        t0 = time.perf_counter()
        result = fit_encoded([e.encoded for e in examples], schema, config("lstm", **settings))
        results["final_train_seconds"] = time.perf_counter() - t0
        predictor = result.predictor
        errors = np.abs([r["lstm_err"] for r in records])
        predictor.training.update(
            {
                "device_kind": "cpu",
                "train_jobs": len(examples),
                "families": families,
                "holdout_rel_error_95": float(np.quantile(errors, 0.95)),
                "holdout_mre": float(errors.mean()),
                "rebuild_command": "python benchmarks/collect.py --out results/dataset && "
                "python benchmarks/train_early_model.py results/dataset "
                f"--out ets_hook/data/early_cpu.npz --epochs {args.epochs}"
                + (
                    f" --val-fraction {args.val_fraction} --patience {args.patience}"
                    if args.val_fraction
                    else ""
                )
                + (f" --seed {args.seed}" if args.seed else ""),
            }
        )
        predictor.save(args.out)
        results["model_file"] = str(args.out)
        results["model_bytes"] = args.out.stat().st_size
    results["seconds"] = time.perf_counter() - started

    training = (
        f"early stopping on {args.val_fraction:.0%} of the training families, at most "
        f"{args.epochs} epochs, patience {args.patience}; ETS-LSTM's best epochs "
        f"{sorted(best_epochs.get('lstm', []))}"
        if args.val_fraction
        else f"{args.epochs} epochs"
    )
    lines = [
        f"Steady-state step time predicted from the early steps [1, 6), leave-one-family-out "
        f"over {len(traces)} CPU jobs ({len(families)} families; {training}); |error| over jobs.",
        "",
        "| method | median | P90 | MRE |" + "".join(f" {g} MRE |" for g in per_group),
        "|---|---:|---:|---:|" + "---:|" * len(per_group),
    ]
    for m in methods:
        t = table[m]
        lines.append(
            f"| {LABEL[m]} | {t['median_pct']:.1f}% | {t['p90_pct']:.1f}% | {t['mre_pct']:.1f}% |"
            + "".join(f" {per_group[g][m]['mre_pct']:.1f}% |" for g in per_group)
        )
    lines += ["", "MRE (median) per held-out family:", ""]
    lines += ["| held-out family | jobs | " + " | ".join(LABEL[m] for m in methods) + " |"]
    lines.append("|---|---:|" + "---:|" * len(methods))
    for f in families:
        jobs = sum(r["family"] == f for r in records)
        cells = [
            f"{per_family[f][m]['mre_pct']:.1f}% ({per_family[f][m]['median_pct']:.1f}%)"
            for m in methods
        ]
        lines.append(
            f"| {f}{' (new)' if f in new_families else ''} | {jobs} | " + " | ".join(cells) + " |"
        )
    if shipped:
        lines += [
            "",
            f"The shipped model file was trained on {', '.join(shipped_families) or '?'}: "
            "its figures are held out only for the other families.",
        ]
    lines += ["", f"Total {results['seconds'] / 60:.1f} min."]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
