"""Trace-based step-time estimators: from captured iterations to a steady-state ``TraceEstimate``.

``OpMedianEstimator`` (no model): an iteration is a sequence of outermost ops, each with its
duration and the gap after it, plus the lead-in before the first op (data loading, Python).
Aligning the ops of the captured steps and taking each op's median removes noise that hits one
op in one step (a preemption, a page fault), which whole-step wall times keep: five steps, each
with one spike in a different op, have five spiky totals but spike-free per-op medians. The
interval comes from a bootstrap over the captured steps.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Collection, Sequence

import numpy as np

from .estimators import TraceEstimate
from .trace import IterationTrace, Trace

DEFAULT_BOOTSTRAP = 200


def _step_rows(iteration: IterationTrace) -> tuple[list[str], np.ndarray, float]:
    """Names, per-op (duration + gap) in seconds, and the lead-in, for one iteration.

    Only outermost ops of the thread that starts the step count (the training thread); their
    durations and gaps tile the iteration from the first op to the step's end.
    """
    top = [op for op in iteration.ops if op.depth == 0]
    if not top:
        return [], np.zeros(0), iteration.duration_ns / 1e9
    thread = top[0].thread
    rows = [op for op in top if op.thread == thread]
    costs = np.array([op.duration_ns + max(op.gap_ns, 0) for op in rows], dtype=np.float64) / 1e9
    lead_in_s = max(0, rows[0].start_ns - iteration.start_ns) / 1e9
    return [op.name for op in rows], costs, lead_in_s


def align_by_name(
    reference: Sequence[str], names: Sequence[str], values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (one row per name) moved onto the reference's rows by op-name order
    (``difflib``): NaN where a reference op has no match. Also returns which rows of ``values``
    were matched."""
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
    complete ones remain."""
    partial = set(trace.metadata.get("partial_steps", ()))
    iterations = [it for it in trace.iterations if it.ops and (steps is None or it.step in steps)]
    complete = [it for it in iterations if it.step not in partial]
    return complete if len(complete) >= 2 else iterations


def aligned_costs(iterations: Sequence[IterationTrace]) -> tuple[np.ndarray, np.ndarray]:
    """Per-op cost matrix (steps x ops of the reference step) and per-step lead-ins.

    The reference is the iteration with the most ops; ops of other steps are matched by name
    order (``difflib``); an op a step lacks is NaN there. Costs of ops a step has but the
    reference lacks are added to that step's lead-in so the row still sums to the step time.
    """
    rows = [_step_rows(it) for it in iterations]
    reference = max(range(len(rows)), key=lambda i: len(rows[i][0]))
    ref_names = rows[reference][0]
    matrix = np.full((len(rows), len(ref_names)), np.nan)
    lead_ins = np.zeros(len(rows))
    for i, (names, costs, lead_in_s) in enumerate(rows):
        matrix[i], matched = align_by_name(ref_names, names, costs)
        lead_ins[i] = lead_in_s + float(costs[~matched].sum())
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
    (``captured_steps``: partial ones left out while two complete ones remain)."""

    def __init__(self, bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0) -> None:
        if bootstrap < 10:
            raise ValueError(f"bootstrap must be >= 10, got {bootstrap}")
        self.bootstrap = bootstrap
        self.seed = seed

    def __call__(self, trace: Trace) -> TraceEstimate | None:
        iterations = captured_steps(trace)
        if not iterations:
            return None
        matrix, lead_ins = aligned_costs(iterations)
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


def default_trace_estimator(device_type: str) -> Callable[[Trace], TraceEstimate | None] | None:
    """The estimator the hook uses with ``trace_estimator="auto"``: the shipped early → steady
    ETS model for the device type when there is one (CPU), else per-op medians."""
    from .early_model import default_estimator  # imports torch-free numpy inference only

    return default_estimator(device_type)
