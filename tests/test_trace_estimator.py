"""The op-median trace estimator: per-op robust statistics over the captured steps."""

from __future__ import annotations

import numpy as np
import pytest

from ets_hook.forecast.trace_estimators import OpMedianEstimator, aligned_costs
from ets_hook.trace.events import IterationTrace, OpEvent, Trace

MS = 1_000_000


def iteration(step: int, costs_ms, names=None, lead_in_ms: float = 1.0) -> IterationTrace:
    """Outermost ops back to back: each op's duration + gap = its cost; the step ends at the end."""
    names = names or [f"aten::op{i}" for i in range(len(costs_ms))]
    start = step * 10**9
    t = start + int(lead_in_ms * MS)
    ops = []
    for name, cost in zip(names, costs_ms):
        duration = int(cost * MS * 0.8)
        gap = int(cost * MS) - duration
        ops.append(OpEvent(name, t, duration, thread=1, gap_ns=gap))
        t += duration + gap
    return IterationTrace(step=step, start_ns=start, end_ns=t, ops=ops)


def test_one_spike_per_step_is_removed_by_per_op_medians():
    true_costs = np.array([2.0, 3.0, 1.0, 4.0, 5.0])
    iterations = []
    for step in range(5):
        costs = true_costs.copy()
        costs[step] += 20.0  # a preemption hits a different op in every step
        iterations.append(iteration(step + 1, costs))
    trace = Trace(iterations=iterations)
    estimate = OpMedianEstimator()(trace)
    expected_s = (true_costs.sum() + 1.0) / 1e3  # ops + lead-in
    assert estimate.iteration_s == pytest.approx(expected_s, rel=1e-6)
    step_totals = [it.duration_ns / 1e9 for it in iterations]
    assert min(step_totals) > expected_s + 0.019, "every whole step carries a spike"
    assert estimate.step == 5 and estimate.source == "trace:op-median"


def test_bootstrap_interval_reflects_the_spread_across_steps():
    rng = np.random.default_rng(1)
    quiet = Trace(iterations=[iteration(s, [5.0] * 20) for s in range(1, 6)])
    noisy = Trace(iterations=[iteration(s, 5.0 + rng.normal(0, 1.0, 20)) for s in range(1, 6)])
    quiet_estimate, noisy_estimate = OpMedianEstimator()(quiet), OpMedianEstimator()(noisy)
    assert quiet_estimate.ci_s == pytest.approx(0.01 * quiet_estimate.iteration_s)  # the floor
    assert noisy_estimate.ci_s > 2 * quiet_estimate.ci_s
    assert abs(noisy_estimate.iteration_s - 0.101) < 3 * noisy_estimate.ci_s


def test_partial_steps_are_left_out_and_missing_ops_aligned():
    names = ["aten::linear", "aten::relu", "aten::linear", "aten::sum"]
    complete = [iteration(s, [1.0, 2.0, 3.0, 4.0], names) for s in (1, 3)]
    partial = iteration(2, [9.0, 9.0], names[2:])  # capture began mid-step
    trace = Trace(iterations=[complete[0], partial, complete[1]], metadata={"partial_steps": [2]})
    estimate = OpMedianEstimator()(trace)
    assert estimate.iteration_s == pytest.approx((10.0 + 1.0) / 1e3)

    # Alignment by op names: the ops a step lacks are NaN (imputed later from the other steps).
    matrix, _ = aligned_costs(trace, [complete[0], partial])
    assert matrix.shape == (2, 4)
    assert np.isnan(matrix[1, :2]).all() and matrix[1, 2:].tolist() == pytest.approx([0.009] * 2)


def test_one_step_gets_a_wide_interval_and_empty_traces_none():
    estimate = OpMedianEstimator()(Trace(iterations=[iteration(1, [1.0, 2.0])]))
    assert estimate.ci_s == pytest.approx(0.25 * estimate.iteration_s)
    assert OpMedianEstimator()(Trace()) is None
    with pytest.raises(ValueError, match="bootstrap"):
        OpMedianEstimator(bootstrap=3)
