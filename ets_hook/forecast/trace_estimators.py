"""Trace-based step-time estimators: from captured iterations to a steady-state ``TraceEstimate``.

Both read a step as its ETS rows (``ets.rows.ets_rows``) with a (duration, gap) per row and the
lead-in before the first row (data loading, Python), built once here by ``_step_rows``.

``OpMedianEstimator`` (no model): aligning the ops of the captured steps and taking each op's
median removes noise that hits one op in one step (a preemption, a page fault), which whole-step
wall times keep: five steps, each with one spike in a different op, have five spiky totals but
spike-free per-op medians. The interval comes from a bootstrap over the captured steps.

``LearnedTraceEstimator``: the shipped early -> steady-state ETS model (``ets.regressors``) fed
with the per-op medians of the early steps as measured features (``early_summary``); its interval
combines the op-median bootstrap with the model's held-out error.
``default_trace_estimator`` picks one of the two for the hook.
"""

from __future__ import annotations

import difflib
import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ModelFileError
from ..ets.features import (
    EncodedIteration,
    FeatureSchema,
    encode_iteration,
    project_features,
    with_measured,
)
from ..ets.features import fit_schema as _fit_schema
from ..ets.regressors import Predictor
from ..ets.rows import ets_rows
from ..ets.targets import host_targets, iteration_targets
from ..trace.events import IterationTrace, Trace
from .stats import TraceEstimate

DEFAULT_BOOTSTRAP = 200

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


def _step_rows(trace: Trace, iteration: IterationTrace, *, host_time: bool = False) -> _StepRows:
    """The ETS rows of one step with their (duration, gap) targets and its lead-in: the time
    before the first row, plus, on host times, the step's time that no row's duration or gap
    covers. A row's gap runs to the next outermost op, so the work of an outermost op that is
    no row and its own gap were in no row: mid-step input work, such as the DataLoader fetches
    and the loop's Python work of the 2nd..Nth micro-batch of an accumulating step (11 of
    17 ms a step in a trial, missing from the trace estimate). Like the lead-in, it is the
    step's time outside the model's ops, and is scaled alike.

    ``host_time`` takes the ops' host times on every device (the op-median estimator times the
    step as the host sees it); otherwise the ETS targets (kernel times on CUDA traces, which do
    not add up to the host's step: no remainder is added there).
    """
    rows = ets_rows(iteration)
    names = [iteration.ops[i].name for i in rows]
    if rows:
        first_start = min(iteration.ops[i].start_ns for i in rows)
        lead_in = float(max(0, first_start - iteration.start_ns))
    else:
        lead_in = float(iteration.duration_ns)
    if host_time:
        targets = host_targets(iteration, rows)
    else:
        targets = iteration_targets(trace, iteration, rows)
    if rows and (host_time or trace.device.kind != "cuda"):
        unaccounted_ns = iteration.duration_ns - lead_in - float(np.nansum(targets))
        lead_in += max(0.0, unaccounted_ns)
    return _StepRows(iteration, rows, names, targets, lead_in)


def align_by_name(
    reference: Sequence[str], names: Sequence[str], values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (one row per name) moved onto the reference's rows by op-name order (``difflib``).

    Args:
        reference: op names of the target rows.
        names: op names of the rows of ``values``.
        values: one row per entry of ``names`` (any trailing shape).

    Returns:
        ``(aligned, matched)``: float64 ``[len(reference), *values.shape[1:]]``, NaN where a
        reference op has no match; bool ``[len(names)]``, which rows of ``values`` were used.
    """
    out = np.full((len(reference), *values.shape[1:]), np.nan)
    matched = np.zeros(len(names), dtype=bool)
    if list(names) == list(reference):  # the usual case: every step runs the same ops
        out[:] = values
        matched[:] = True
        return out, matched
    matcher = difflib.SequenceMatcher(None, list(reference), list(names), autojunk=False)
    for block in matcher.get_matching_blocks():
        out[block.a : block.a + block.size] = values[block.b : block.b + block.size]
        matched[block.b : block.b + block.size] = True
    return out, matched


def captured_steps(trace: Trace, steps: Collection[int] | None = None) -> list[IterationTrace]:
    """The iterations with ops (of ``steps`` when given), without those listed in
    ``trace.metadata["partial_steps"]`` (op capture began inside them) while at least two
    complete ones remain.

    Args:
        trace: the captured trace.
        steps: step numbers (``IterationTrace.step``) to consider; None for all.

    Returns:
        The selected iterations in trace order; empty when none has ops.
    """
    partial = set(trace.metadata.get("partial_steps", ()))
    iterations = [it for it in trace.iterations if it.ops and (steps is None or it.step in steps)]
    complete = [it for it in iterations if it.step not in partial]
    return complete if len(complete) >= 2 else iterations


def _nanmedian_steps(stacked: np.ndarray) -> np.ndarray:
    """Median over axis 0 ignoring NaN; NaN where a row has no value in any step."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows
        return np.nanmedian(stacked, axis=0)


def aligned_costs(
    trace: Trace, iterations: Sequence[IterationTrace]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-op cost matrix (steps x ops of the reference step) and per-step lead-ins.

    The reference is the iteration with the most ops; ops of other steps are matched by name
    order (``difflib``); an op a step lacks is NaN there. Costs of ops a step has but the
    reference lacks are added to that step's lead-in so the row still sums to the step time.
    Costs are host times (duration + gap per row).

    Args:
        trace: the captured trace.
        iterations: the steps to compare, non-empty.

    Returns:
        ``(matrix, lead_ins)``: float64 ``[steps, ops]`` and ``[steps]``, in seconds.

    Raises:
        ValueError: ``iterations`` is empty.
    """
    rows = [_step_rows(trace, it, host_time=True) for it in iterations]
    reference = max(rows, key=lambda r: r.n_ops)
    matrix = np.full((len(rows), reference.n_ops), np.nan)
    lead_ins = np.zeros(len(rows))
    for i, step in enumerate(rows):
        costs_s = np.nansum(step.targets_ns, axis=1) / 1e9
        matrix[i], matched = align_by_name(reference.names, step.names, costs_s)
        lead_ins[i] = step.lead_in_ns / 1e9 + float(costs_s[~matched].sum())
    return matrix, lead_ins


def _impute_missing(matrix: np.ndarray) -> np.ndarray:
    """Fill an op's missing steps (NaN) with its median over the steps that have it (0 if none)."""
    if not np.isnan(matrix).any():
        return matrix
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        fill = np.nan_to_num(np.nanmedian(matrix, axis=0))
    return np.where(np.isnan(matrix), fill[None, :], matrix)


def _robust_totals(matrix: np.ndarray, lead_ins: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """Sum of per-op medians plus the median lead-in, for each row of step indices in ``picks``.

    ``matrix`` has no NaN (see ``_impute_missing``); ``picks`` is (resamples, steps). One
    vectorised pass, so a bootstrap costs a few numpy calls.
    """
    per_op = np.median(matrix[picks], axis=1)  # (resamples, ops)
    return per_op.sum(axis=1) + np.median(lead_ins[picks], axis=1)


class OpMedianEstimator:
    """Steady-state step time as the sum of per-op medians over the captured steps
    (``captured_steps``: partial ones left out while two complete ones remain).

    Its 95% interval is a bootstrap over the captured steps (at least ±1% of the estimate);
    from one step alone, a fixed ±25%.

    Attributes:
        bootstrap: bootstrap resamples.
        seed: seed of the resampling; the same trace gives the same estimate.
    """

    def __init__(self, bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0) -> None:
        """Configure the estimator.

        Args:
            bootstrap: bootstrap resamples, >= 10.
            seed: seed of the resampling.

        Raises:
            ValueError: ``bootstrap`` < 10.
        """
        if bootstrap < 10:
            raise ValueError(f"bootstrap must be >= 10, got {bootstrap}")
        self.bootstrap = bootstrap
        self.seed = seed

    def __call__(self, trace: Trace) -> TraceEstimate | None:
        """The estimate from ``trace`` (source "trace:op-median"); None when no step has ops."""
        iterations = captured_steps(trace)
        if not iterations:
            return None
        matrix, lead_ins = aligned_costs(trace, iterations)
        matrix = _impute_missing(matrix)
        steps = len(iterations)
        estimate_s = float(_robust_totals(matrix, lead_ins, np.arange(steps)[None, :])[0])
        if steps == 1:
            # One step: no spread to bootstrap; a deliberately wide ±25% (the CPU prior's
            # step-to-step spread) lets fusion weigh it against measured step times.
            half_width_s = 0.25 * estimate_s
        else:
            rng = np.random.default_rng(self.seed)
            picks = rng.integers(0, steps, size=(self.bootstrap, steps))
            low, high = np.quantile(_robust_totals(matrix, lead_ins, picks), [0.025, 0.975])
            half_width_s = max(float(high - low) / 2.0, 0.01 * estimate_s)
        last_step = max(it.step for it in iterations)
        return TraceEstimate(
            iteration_s=estimate_s, ci_s=half_width_s, source="trace:op-median", step=last_step
        )


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
    """What the model sees of a job's early steps.

    Attributes:
        encoded: the reference step's rows, measured features filled, targets NaN.
        names: op name of each row.
        early_ns: ``[n, 2]`` per-row median (duration, gap) over the early steps, ns.
        lead_in_ns: median lead-in over the early steps, ns.
        step_ns: wall duration of each early step (as captured), ns.
    """

    encoded: EncodedIteration
    names: list[str]
    early_ns: np.ndarray
    lead_in_ns: float
    step_ns: list[float]

    @property
    def rows_ns(self) -> float:
        """Sum of the rows' median durations and gaps, ns (NaN counts as 0)."""
        return float(np.nansum(self.early_ns))

    @property
    def op_median_ns(self) -> float:
        """The untrained-model estimate: per-op medians + median lead-in."""
        return self.rows_ns + self.lead_in_ns


def fit_early_schema(traces: Sequence[Trace], vocab_size: int = 25) -> FeatureSchema:
    """The encoder's schema fitted on ``traces``, with the measured early-time features.

    Args:
        traces: the traces whose row op types form the vocabulary.
        vocab_size: most frequent op types kept, >= 0.

    Raises:
        ValueError: ``vocab_size`` < 0.
    """
    return replace(_fit_schema(traces, vocab_size), measured_features=True)


def early_summary(
    trace: Trace, schema: FeatureSchema, steps: Sequence[int] | None = None
) -> EarlySummary | None:
    """Summarise the complete captured steps of ``trace`` (or those with the given step numbers).

    Steps in ``metadata["partial_steps"]`` are left out while two complete ones remain. The
    reference step is the latest one with the most common op sequence; the others are aligned
    to it by name.

    Args:
        trace: the captured trace.
        schema: a schema with measured features (``fit_early_schema``).
        steps: step numbers (``IterationTrace.step``) to use; None for all.

    Returns:
        The summary; ``None`` when no step has a row op.

    Raises:
        ValueError: ``schema`` has no measured early-time features.
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
    """One collected job as a training / evaluation example.

    Attributes:
        summary: what the model sees of the early steps.
        encoded: the summary's rows with steady-state targets (ns).
        lead_in_target_ns: steady-state lead-in, ns.
        steady_step_ns: the job's unprofiled steady-state step time, ns.
        family: model family from the trace metadata ("" when absent).
        workload: workload name from the trace metadata ("" when absent).
    """

    summary: EarlySummary
    encoded: EncodedIteration
    lead_in_target_ns: float
    steady_step_ns: float
    family: str
    workload: str

    def reschema(self, source: FeatureSchema, target: FeatureSchema) -> EarlyExample:
        """This example in ``target``, a sub-vocabulary of ``source`` (``project_features``).

        Args:
            source: the schema the example is encoded in.
            target: a schema with the same flags and a vocabulary inside the source's.

        Raises:
            ValueError: the schemas differ in flags, or ``target`` has op types ``source``
                lacks.
        """

        def move(e: EncodedIteration) -> EncodedIteration:
            return replace(e, features=project_features(e.features, source, target))

        summary = replace(self.summary, encoded=move(self.summary.encoded))
        return replace(self, summary=summary, encoded=move(self.encoded))


def training_example(trace: Trace, schema: FeatureSchema) -> EarlyExample:
    """A ``benchmarks/collect.py`` trace → an example.

    Steady-state row targets are the per-row medians over the steady steps, scaled so rows plus
    lead-in add up to the unprofiled step time (``metadata["steady_step_s"]``).

    Args:
        trace: a trace whose metadata holds ``early_steps``, ``steady_steps`` and
            ``steady_step_s``.
        schema: a schema with measured features (``fit_early_schema``).

    Raises:
        ValueError: the metadata lacks a key; no early or no steady step has ops; or
            ``schema`` has no measured features.
    """
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
    """Steady-state step time (ns) the model predicts from an early summary.

    The lead-in is scaled by the same ratio as the rows (predicted / early).

    Args:
        predictor: a model trained with measured early-time features.
        summary: from ``early_summary`` with the predictor's schema.
    """
    predicted_rows = predictor.predict_encoded(summary.encoded).iteration_ns
    ratio = predicted_rows / summary.rows_ns if summary.rows_ns > 0 else 1.0
    return predicted_rows + summary.lead_in_ns * ratio


class LearnedTraceEstimator:
    """``trace_estimator`` for ``ETSHook``: the early → steady-state model on the captured trace.

    The 95% interval combines the captured steps' bootstrap spread (``OpMedianEstimator``) with
    the model's own held-out error (``training["holdout_rel_error_95"]`` in its weights file).
    Traces of another device kind than the model was trained on get the per-op-median estimate.

    Attributes:
        predictor: the early → steady-state model.
        device_kind: the device kind it was trained on (``training["device_kind"]``, "cpu" by
            default).
        rel_error_95: its held-out 95% relative error (``FALLBACK_REL_ERROR_95`` when absent).
    """

    def __init__(self, predictor: Predictor) -> None:
        """Wrap ``predictor``.

        Raises:
            ValueError: ``predictor`` was not trained with measured early-time features.
        """
        if not predictor.schema.measured_features:
            raise ValueError("the predictor was not trained with measured early-time features")
        self.predictor = predictor
        self.device_kind = str(predictor.training.get("device_kind", "cpu"))
        rel = predictor.training.get("holdout_rel_error_95")
        self.rel_error_95 = float(rel) if rel is not None else FALLBACK_REL_ERROR_95
        self._op_median = OpMedianEstimator()

    def __call__(self, trace: Trace) -> TraceEstimate | None:
        """The model's estimate from ``trace`` (source "trace:ets-early").

        Returns:
            The estimate; the op-median estimate instead for another device kind, no row ops or
            a non-finite or non-positive prediction; None when no step has ops.
        """
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
    """The shipped early → steady model for ``device_type`` (CPU only so far), or ``None``.

    Args:
        device_type: exactly "cpu" (no index, lower case) selects the CPU model.

    Returns:
        The model; None for another device type, a missing file, or a file that fails to load
        (``ModelFileError``, ``SchemaVersionError`` and other ``ValueError`` are caught).
    """
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


def default_trace_estimator(device_type: str) -> Callable[[Trace], TraceEstimate | None] | None:
    """The estimator the hook uses with ``trace_estimator="auto"``: the shipped early → steady
    ETS model for the device type when there is one (CPU), else per-op medians.

    Args:
        device_type: the trace's device type ("cpu", "cuda").

    Returns:
        A ``LearnedTraceEstimator`` or an ``OpMedianEstimator``; never None.

    Raises:
        ValueError: the shipped model loads but was not trained with measured features.
    """
    model = load_default_model(device_type)
    return LearnedTraceEstimator(model) if model is not None else OpMedianEstimator()


def check_trace_estimator(choice: object) -> None:
    """``ETSHook``'s ``trace_estimator``: ``"auto"``, None or a callable.

    Raises:
        ValueError: ``choice`` is none of those.
    """
    if choice is None or (callable(choice) and not isinstance(choice, str)) or choice == "auto":
        return
    raise ValueError(f"trace_estimator must be 'auto', None or a callable, got {choice!r}")


def resolve_trace_estimator(
    choice: Callable[[Trace], TraceEstimate | None] | str | None, device_type: str
) -> Callable[[Trace], TraceEstimate | None] | None:
    """The estimator for ``ETSHook(trace_estimator=...)``.

    Args:
        choice: ``"auto"`` (the shipped model for the device type), None, or a callable.
        device_type: the training device's type (``"cpu"``, ``"cuda"``).

    Returns:
        ``choice`` itself unless it is ``"auto"``; for ``"auto"`` the default estimator, or
        None (logged) when it cannot be loaded: the hook then keeps its measured estimate.

    Raises:
        ValueError: ``choice`` is none of those.
    """
    check_trace_estimator(choice)
    if choice is None or callable(choice):
        return choice
    try:
        return default_trace_estimator(device_type)
    except Exception as exc:
        logging.getLogger("ets_hook").info("trace-based estimator unavailable: %r", exc)
        return None
