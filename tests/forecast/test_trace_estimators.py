"""Trace-based step-time estimators: per-op medians and the learned early -> steady model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.ets.features import FeatureSchema, encode_trace, with_measured
from ets_hook.ets.regressors import Predictor
from ets_hook.ets.rows import ets_rows
from ets_hook.ets.targets import TargetScaler
from ets_hook.ets.training import TrainConfig, fit_encoded
from ets_hook.forecast.trace_estimators import (
    LearnedTraceEstimator,
    OpMedianEstimator,
    aligned_costs,
    default_trace_estimator,
    early_summary,
    fit_early_schema,
    predict_step_ns,
    training_example,
)
from ets_hook.trace.decode import fill_host_gaps
from ets_hook.trace.events import IterationTrace, OpEvent, Phase, Trace

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


def _accumulating_step(step: int) -> IterationTrace:
    """Two micro-batches: rows of 2 + 3 ms, then the 2nd micro-batch's DataLoader fetch (an
    outermost INPUT op, no row: 1 ms) and 4 ms of the loop's Python work before its rows of
    2 + 3 ms; 1 ms lead-in. 16 ms in all."""
    start = step * 10**9
    t = start + 1 * MS
    ops = []
    for name, cost_ms, phase in (
        ("aten::linear", 2, Phase.FORWARD),
        ("autograd::engine::evaluate_function: AddmmBackward0", 3, Phase.BACKWARD),
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5, Phase.INPUT),
        ("aten::linear", 2, Phase.FORWARD),
        ("autograd::engine::evaluate_function: AddmmBackward0", 3, Phase.BACKWARD),
    ):
        duration = MS if phase is Phase.INPUT else int(cost_ms * MS * 0.8)
        ops.append(OpEvent(name, t, duration, thread=1, phase=phase))
        t += int(cost_ms * MS)
    iteration = IterationTrace(step=step, start_ns=start, end_ns=t, ops=ops)
    fill_host_gaps(iteration)
    return iteration


def test_mid_step_work_outside_the_rows_counts_in_the_step():
    """The 2nd micro-batch's fetch and Python work (5 of 16 ms) are in no row: the op-median
    estimate used to be 11 ms (the rows and the lead-in only)."""
    iterations = [_accumulating_step(step) for step in range(1, 4)]
    assert all(it.duration_ns == 16 * MS for it in iterations)
    assert [iterations[0].ops[i].phase for i in ets_rows(iterations[0])].count(Phase.INPUT) == 0
    estimate = OpMedianEstimator()(Trace(iterations=iterations))
    assert estimate.iteration_s == pytest.approx(0.016, rel=1e-9)
    _, lead_ins = aligned_costs(Trace(iterations=iterations), iterations)
    assert lead_ins.tolist() == pytest.approx([0.006] * 3)  # 1 ms before + 5 ms mid-step


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


EARLY, STEADY = [1, 2, 3], [4, 5, 6]


def _time_scaled(iteration: IterationTrace, factor: float, step: int) -> IterationTrace:
    """A copy of ``iteration`` as step ``step`` with every time interval scaled by ``factor``."""

    def at(t_ns: int) -> int:
        return iteration.start_ns + round((t_ns - iteration.start_ns) * factor)

    ops = [
        dataclasses.replace(
            op,
            start_ns=at(op.start_ns),
            duration_ns=round(op.duration_ns * factor),
            gap_ns=op.gap_ns if op.gap_ns < 0 else round(op.gap_ns * factor),
        )
        for op in iteration.ops
    ]
    return IterationTrace(
        step=step, start_ns=iteration.start_ns, end_ns=at(iteration.end_ns), ops=ops
    )


def _captured(width: int, seed: int, steady_factor: float) -> Trace:
    """A real MLP run captured over steps 1-3, with steps 4-6 appended as copies of them running
    ``steady_factor`` × as long, labelled like a ``collect.py`` trace: the steady state is known
    exactly, whatever the machine's noise."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model,
        optimizer=opt,
        skip_steps=1,
        capture_steps=3,
        record_shapes="all",
        log_every=None,
        deadline=False,
        trace_estimator=None,
    )
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    hook.close()
    trace = hook.wait_for_trace(60)
    assert trace is not None, hook.capture_status
    early = [it for it in trace.iterations if it.step in EARLY]
    assert len(early) == 3
    trace.iterations += [
        _time_scaled(it, steady_factor, step) for it, step in zip(early, STEADY, strict=True)
    ]
    trace.metadata.update(
        early_steps=EARLY,
        steady_steps=STEADY,
        steady_step_s=steady_factor * float(np.median([it.duration_ns for it in early])) / 1e9,
        family=f"mlp{width}",
        workload=f"mlp-{width}-{seed}",
    )
    return trace


def _early_config(**overrides: object) -> TrainConfig:
    """A small ETS-LSTM trained on ratios to the early per-op times."""
    settings: dict = {"kind": "lstm", "layers": 1, "val_fraction": 0.0, "progress": False}
    settings.update(target_transform="measured", **overrides)
    return TrainConfig(**settings)


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return [_captured(w, s, 0.5) for w, s in ((16, 0), (32, 1), (64, 2), (48, 3))]


def test_schema_with_measured_features_round_trips() -> None:
    schema = FeatureSchema(vocabulary=("addmm", "relu"), measured_features=True)
    cols = schema.measured_columns
    assert schema.feature_names[cols[0]] == "log_early_duration_us"
    assert FeatureSchema.from_dict(schema.to_dict()) == schema
    with pytest.raises(ValueError, match="no measured"):
        _ = FeatureSchema(vocabulary=()).measured_columns


def test_measured_target_transform_is_a_ratio_to_the_early_time(traces: list[Trace]) -> None:
    schema = fit_early_schema(traces)
    encoded = encode_trace(traces[0], schema, steps=[1])[0]
    early = np.abs(np.random.default_rng(0).normal(5e4, 1e4, size=(encoded.n_ops, 2)))
    rows = with_measured(encoded, schema, early).features
    scaler = TargetScaler.fit(early * 2.0, "measured", rows, measured_cols=schema.measured_columns)
    z = scaler.transform(early * 2.0, rows)
    np.testing.assert_allclose(scaler.inverse(z, rows), early * 2.0, rtol=1e-3)
    # a constant ratio is (up to the 1 µs floor) one log ratio for every row: log 2
    log_ratio = z[:, 0] * scaler.std[0] + scaler.mean[0]
    np.testing.assert_allclose(log_ratio, np.log(2.0), atol=0.05)
    restored = TargetScaler.from_dict(scaler.to_dict())
    np.testing.assert_allclose(restored.inverse(z, rows), early * 2.0, rtol=1e-3)
    with pytest.raises(ValueError, match="measured"):
        TargetScaler.fit(early, "measured", rows)


def test_training_example_targets_add_up_to_the_unprofiled_step(traces: list[Trace]) -> None:
    schema = fit_early_schema(traces)
    for trace in traces:
        example = training_example(trace, schema)
        total = float(np.nansum(example.encoded.targets_ns)) + example.lead_in_target_ns
        assert total == pytest.approx(example.steady_step_ns, rel=0.02)
        # the early summary holds only early steps
        assert len(example.summary.step_ns) == len(EARLY)
    bare = Trace(device=traces[0].device, iterations=traces[0].iterations, metadata={})
    with pytest.raises(ValueError, match="steady_step_s"):
        training_example(bare, schema)


def test_early_summary_skips_partial_steps(traces: list[Trace]) -> None:
    schema = fit_early_schema(traces)
    trace = traces[0]
    full = early_summary(trace, schema, EARLY)
    trace.metadata["partial_steps"] = [1]
    try:
        partial = early_summary(trace, schema, EARLY)
    finally:
        del trace.metadata["partial_steps"]
    assert full is not None and partial is not None
    assert len(full.step_ns) == 3 and len(partial.step_ns) == 2


def test_training_learns_the_early_to_steady_ratio(traces: list[Trace]) -> None:
    """Steady steps run at half the early per-op time: the trained model must get much closer
    to that on a held-out job than the untrained per-op-median estimate. Each of the four
    jobs is held out in turn (the captured timings move with the machine's load: one split
    alone came within the margin under load); the medians are compared."""
    config = _early_config(hidden=8, epochs=60, lr=3e-3)
    trained_errors, untrained_errors = [], []
    for k in range(len(traces)):
        train, held_out = traces[:k] + traces[k + 1 :], traces[k]
        schema = fit_early_schema(train)
        examples = [training_example(t, schema) for t in train]
        fitted = fit_encoded([e.encoded for e in examples], schema, config).predictor
        test = training_example(held_out, schema)
        predicted = predict_step_ns(fitted, test.summary)
        trained_errors.append(abs(predicted / test.steady_step_ns - 1))
        untrained_errors.append(abs(test.summary.op_median_ns / test.steady_step_ns - 1))
    predictor = fitted  # the last split's (held out: traces[3]), used below
    trained_error, untrained_error = np.median(trained_errors), np.median(untrained_errors)
    assert trained_error < 0.5 * untrained_error, (trained_errors, untrained_errors)

    predictor.training["holdout_rel_error_95"] = 0.1
    estimate = LearnedTraceEstimator(predictor)(held_out)
    assert estimate is not None and estimate.source == "trace:ets-early"
    assert estimate.ci_s >= 0.1 * estimate.iteration_s * 0.99
    # a model file without measured features is refused
    bare_schema = FeatureSchema(vocabulary=())
    plain = fit_encoded(
        encode_trace(train[0], bare_schema),
        bare_schema,
        TrainConfig(kind="mlp", epochs=0, progress=False),
    ).predictor
    with pytest.raises(ValueError, match="measured"):
        LearnedTraceEstimator(plain)


def test_learned_estimator_round_trips_through_a_weights_file(
    traces: list[Trace], tmp_path
) -> None:
    schema = fit_early_schema(traces)
    examples = [training_example(t, schema) for t in traces]
    config = _early_config(hidden=4, epochs=2)
    predictor = fit_encoded([e.encoded for e in examples], schema, config).predictor
    path = predictor.save(tmp_path / "early.npz")
    loaded = Predictor.load(path)
    assert predict_step_ns(loaded, examples[0].summary) == pytest.approx(
        predict_step_ns(predictor, examples[0].summary), rel=1e-5
    )


def test_default_estimator_is_the_shipped_model_on_cpu_and_op_medians_elsewhere() -> None:
    shipped = default_trace_estimator("cpu")
    assert isinstance(shipped, LearnedTraceEstimator)
    info = shipped.predictor.training
    assert info["device_kind"] == "cpu" and 0 < info["holdout_rel_error_95"] < 1
    assert "train_early_model.py" in info["rebuild_command"]
    assert type(default_trace_estimator("cuda")).__name__ == "OpMedianEstimator"
