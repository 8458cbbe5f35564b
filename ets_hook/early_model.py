"""Learned trace estimator: the hook's captured early steps → the steady-state step time.

The ETS model trained for the hook's own question (issue 3, estimator 1a). The rows are the
ETS rows (encoder) of one captured step; their features are the encoder's static features plus
each op's measured early time (median duration and gap over the captured steps); the model
predicts each op's steady-state (duration, gap) as a ratio to its early time (the ``"measured"``
target transform), so an untrained model (ratio 1) is exactly the per-op-median estimate. The
step time is the sum over rows plus the lead-in (time before the first row op: data loading,
Python), scaled by the rows' predicted ratio.

Training data (``benchmarks/collect.py``): one ``.ets`` per job with early steps and steady
steps. Per-op targets are the steady steps' per-op medians, scaled so that rows + lead-in add
up to the job's *unprofiled* steady step time: the steady window was itself captured, so the
scaling takes the capture's own cost out of the targets (spread in proportion to op time).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .encoder import (
    EncodedIteration,
    FeatureSchema,
    encode_iteration,
    ets_rows,
    iteration_targets,
    project_features,
    with_measured,
)
from .encoder import fit_schema as _fit_schema
from .estimators import TraceEstimate
from .predictor import ModelFileError, Predictor
from .trace import IterationTrace, Trace
from .trace_estimator import OpMedianEstimator, align_by_name, captured_steps

__all__ = [
    "DEFAULT_MODEL_FILE",
    "EarlyExample",
    "EarlySummary",
    "LearnedTraceEstimator",
    "default_estimator",
    "early_summary",
    "fit_early_schema",
    "load_default_model",
    "predict_step_ns",
    "training_example",
]

DEFAULT_MODEL_FILE = "early_cpu.npz"
# Used when a model file carries no held-out error: a deliberately wide 95% relative error.
FALLBACK_REL_ERROR_95 = 0.25


@dataclass(frozen=True, slots=True)
class _StepRows:
    """One step's ETS rows as timings only: featurising is the costly part, so
    ``early_summary`` featurises the reference step alone."""

    iteration: IterationTrace
    rows: list[int]  # ETS row op indices into iteration.ops
    names: list[str]
    targets_ns: np.ndarray  # [n, 2] (duration, gap) per row
    lead_in_ns: float

    @property
    def n_ops(self) -> int:
        return len(self.rows)


def _step_rows(trace: Trace, iteration: IterationTrace) -> _StepRows:
    rows = ets_rows(iteration)
    names = [iteration.ops[i].name for i in rows]
    if rows:
        first_start = min(iteration.ops[i].start_ns for i in rows)
        lead_in = max(0, first_start - iteration.start_ns)
    else:
        lead_in = iteration.duration_ns
    targets = iteration_targets(trace, iteration, rows)
    return _StepRows(iteration, rows, names, targets, float(lead_in))


def _nanmedian_steps(stacked: np.ndarray) -> np.ndarray:
    """Median over axis 0 ignoring NaN; NaN where a row has no value in any step."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows
        return np.nanmedian(stacked, axis=0)


def _median_rows(steps: Sequence[_StepRows], reference: _StepRows) -> np.ndarray:
    stacked = np.stack(
        [align_by_name(reference.names, s.names, s.targets_ns)[0] for s in steps]
    )  # (steps, rows, 2)
    med = _nanmedian_steps(stacked)
    return np.where(np.isfinite(med), med, reference.targets_ns)


def _pick_reference(steps: Sequence[_StepRows]) -> _StepRows:
    """The latest step whose op sequence is the most common one among ``steps``."""
    counts = Counter(tuple(s.names) for s in steps)
    common = max(counts.values())
    return [s for s in steps if counts[tuple(s.names)] == common][-1]


@dataclass(frozen=True, slots=True)
class EarlySummary:
    """What the model sees of a job's early steps."""

    encoded: EncodedIteration  # reference step's rows, measured features filled, no targets
    names: list[str]  # op name of each row
    early_ns: np.ndarray  # [n, 2] per-row median (duration, gap) over the early steps
    lead_in_ns: float  # median lead-in over the early steps
    step_ns: list[float]  # wall duration of each early step (as captured)

    @property
    def rows_ns(self) -> float:
        return float(np.nansum(self.early_ns))

    @property
    def op_median_ns(self) -> float:
        """The untrained-model estimate: per-op medians + median lead-in."""
        return self.rows_ns + self.lead_in_ns


def fit_early_schema(traces: Sequence[Trace], vocab_size: int = 25) -> FeatureSchema:
    """The encoder's schema fitted on ``traces``, with the measured early-time features."""
    return replace(_fit_schema(traces, vocab_size), measured_features=True)


def early_summary(
    trace: Trace, schema: FeatureSchema, steps: Sequence[int] | None = None
) -> EarlySummary | None:
    """Summarise the complete captured steps of ``trace`` (or those with the given step numbers).

    Steps in ``metadata["partial_steps"]`` are left out while two complete ones remain. ``None``
    when no step has a row op.
    """
    iterations = captured_steps(trace, None if steps is None else set(steps))
    rows = [_step_rows(trace, it) for it in iterations]
    rows = [r for r in rows if r.n_ops]
    if not rows:
        return None
    reference = _pick_reference(rows)
    early = _median_rows(rows, reference)
    reference_encoded = encode_iteration(trace, reference.iteration, schema)
    encoded = with_measured(reference_encoded, schema, early)
    encoded = replace(encoded, targets_ns=np.full_like(early, np.nan))
    return EarlySummary(
        encoded=encoded,
        names=reference.names,
        early_ns=early,
        lead_in_ns=float(np.median([r.lead_in_ns for r in rows])),
        step_ns=[float(it.duration_ns) for it in iterations],
    )


@dataclass(frozen=True, slots=True)
class EarlyExample:
    """One collected job as a training / evaluation example."""

    summary: EarlySummary
    encoded: EncodedIteration  # summary rows with steady-state targets (ns)
    lead_in_target_ns: float
    steady_step_ns: float  # the job's unprofiled steady-state step time
    family: str
    workload: str

    def reschema(self, source: FeatureSchema, target: FeatureSchema) -> EarlyExample:
        """This example in ``target``, a sub-vocabulary of ``source`` (``project_features``)."""

        def move(e: EncodedIteration) -> EncodedIteration:
            return replace(e, features=project_features(e.features, source, target))

        summary = replace(self.summary, encoded=move(self.summary.encoded))
        return replace(self, summary=summary, encoded=move(self.encoded))


def training_example(trace: Trace, schema: FeatureSchema) -> EarlyExample:
    """A ``benchmarks/collect.py`` trace → an example; ``ValueError`` naming what is missing."""
    md = trace.metadata
    missing = [k for k in ("early_steps", "steady_steps", "steady_step_s") if k not in md]
    if missing:
        raise ValueError(f"not a collected trace: metadata lacks {missing}")
    summary = early_summary(trace, schema, md["early_steps"])
    steady_its = [it for it in trace.iterations if it.step in set(md["steady_steps"]) and it.ops]
    if summary is None or not steady_its:
        raise ValueError(f"{md.get('workload', '?')}: no early or no steady steps with ops")
    steady = [_step_rows(trace, it) for it in steady_its]
    stacked = np.stack([align_by_name(summary.names, s.names, s.targets_ns)[0] for s in steady])
    steady_rows = _nanmedian_steps(stacked)
    steady_lead_in = float(np.median([s.lead_in_ns for s in steady]))
    profiled_step = float(np.nansum(steady_rows)) + steady_lead_in
    steady_step_ns = float(md["steady_step_s"]) * 1e9
    # Take the capture's own cost out: rows + lead-in must add up to the unprofiled step time.
    scale = steady_step_ns / profiled_step if profiled_step > 0 else 1.0
    targets = steady_rows * scale
    return EarlyExample(
        summary=summary,
        encoded=replace(
            summary.encoded,
            targets_ns=targets,
            label=str(md.get("workload", "")),
            group=str(md.get("family", md.get("workload", ""))),
        ),
        lead_in_target_ns=steady_lead_in * scale,
        steady_step_ns=steady_step_ns,
        family=str(md.get("family", "")),
        workload=str(md.get("workload", "")),
    )


def predict_step_ns(predictor: Predictor, summary: EarlySummary) -> float:
    """Steady-state step time (ns) the model predicts from an early summary."""
    predicted_rows = predictor.predict_encoded(summary.encoded).iteration_ns
    ratio = predicted_rows / summary.rows_ns if summary.rows_ns > 0 else 1.0
    return predicted_rows + summary.lead_in_ns * ratio


class LearnedTraceEstimator:
    """``trace_estimator`` for ``ETSHook``: the early → steady-state model on the captured trace.

    The 95% interval combines the captured steps' bootstrap spread (``OpMedianEstimator``) with
    the model's own held-out error (``training["holdout_rel_error_95"]`` in its weights file).
    Traces of another device kind than the model was trained on get the per-op-median estimate.
    """

    def __init__(self, predictor: Predictor) -> None:
        if not predictor.schema.measured_features:
            raise ValueError("the predictor was not trained with measured early-time features")
        self.predictor = predictor
        self.device_kind = str(predictor.training.get("device_kind", "cpu"))
        rel = predictor.training.get("holdout_rel_error_95")
        self.rel_error_95 = float(rel) if rel is not None else FALLBACK_REL_ERROR_95
        self._op_median = OpMedianEstimator()

    def __call__(self, trace: Trace) -> TraceEstimate | None:
        spread = self._op_median(trace)
        if spread is None or trace.device.kind != self.device_kind:
            return spread
        summary = early_summary(trace, self.predictor.schema)
        if summary is None:
            return spread
        estimate_s = predict_step_ns(self.predictor, summary) / 1e9
        if not (math.isfinite(estimate_s) and estimate_s > 0):
            return spread
        spread_rel = spread.ci_s / spread.iteration_s if spread.iteration_s > 0 else 0.0
        half_width_s = estimate_s * math.hypot(spread_rel, self.rel_error_95)
        return TraceEstimate(
            iteration_s=estimate_s, ci_s=half_width_s, source="trace:ets-early", step=spread.step
        )


def load_default_model(device_type: str) -> Predictor | None:
    """The shipped early → steady model for ``device_type`` (CPU only so far), or ``None``."""
    if device_type != "cpu":
        return None
    resource = resources.files("ets_hook") / "data" / DEFAULT_MODEL_FILE
    if not resource.is_file():
        return None
    with resources.as_file(resource) as path:
        try:
            return Predictor.load(Path(path))
        except (ModelFileError, ValueError):
            return None


def default_estimator(device_type: str) -> Callable[[Trace], TraceEstimate | None]:
    """The learned estimator when a shipped model exists for the device, else per-op medians."""
    model = load_default_model(device_type)
    return LearnedTraceEstimator(model) if model is not None else OpMedianEstimator()


def describe(predictor: Predictor) -> dict[str, Any]:
    """The facts of a model worth showing (``ets-hook info`` style)."""
    info = predictor.training
    return {
        "kind": predictor.kind,
        "device_kind": info.get("device_kind"),
        "train_jobs": info.get("train_jobs"),
        "holdout_rel_error_95": info.get("holdout_rel_error_95"),
        "rebuild": info.get("rebuild_command"),
    }
