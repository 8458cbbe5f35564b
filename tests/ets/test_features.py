"""ETS encoder: rows, features, targets, sliding windows, aggregation, streaming."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from ets_hook.errors import SchemaVersionError
from ets_hook.ets.features import (
    FEATURE_SCHEMA_VERSION,
    FeatureSchema,
    Standardizer,
    device_spec,
    encode_iteration,
    encode_trace,
    fit_schema,
    project_features,
)
from ets_hook.ets.flops import op_cost
from ets_hook.ets.rows import ets_rows
from ets_hook.ets.targets import TargetScaler
from ets_hook.ets.windows import aggregate_windows, build_windows, window_index, window_starts
from ets_hook.trace.events import DeviceInfo, IterationTrace, OpEvent, Phase, Trace

F = "float"


# ---------------------------------------------------------------------------------------------
# synthetic captured iterations: (name, phase, shapes, seq, children) trees laid out in time


def _layout(specs, *, thread: int = 1, start: int = 1_000, gap: int = 300) -> list[OpEvent]:
    """Flatten op trees into start-ordered OpEvents with parents, depths and nested times."""
    ops: list[OpEvent] = []

    def place(spec, t0: int, depth: int, parent: int) -> int:
        name, phase, shapes, seq, children = spec
        index = len(ops)
        ops.append(
            OpEvent(
                name=name,
                start_ns=t0,
                duration_ns=0,
                thread=thread,
                phase=phase,
                depth=depth,
                parent=parent,
                sequence_nr=seq,
                input_shapes=tuple(tuple(s) for s in shapes),
                input_dtypes=tuple(F if s else "" for s in shapes),
            )
        )
        t = t0 + 50
        for child in children:
            t = place(child, t, depth + 1, index) + 20
        end = t + 100 + 10 * len(name)
        ops[index].duration_ns = end - t0
        return end

    t = start
    for spec in specs:
        t = place(spec, t, 0, -1) + gap
    return ops


def _block(seq0: int, n_in: int, n_out: int) -> tuple[list, list, list]:
    fw, bw = Phase.FORWARD, Phase.BACKWARD
    x, w, b = [32, n_in], [n_out, n_in], [n_out]
    forward = [
        (
            "aten::linear",
            fw,
            [x, w, b],
            seq0,
            [
                ("aten::t", fw, [w], seq0, []),
                ("aten::addmm", fw, [b, x, [n_in, n_out]], seq0 + 1, []),
            ],
        ),
        (
            "aten::relu",
            fw,
            [[32, n_out]],
            seq0 + 2,
            [("aten::clamp_min", fw, [[32, n_out], []], -1, [])],
        ),
    ]
    backward = [
        (
            "autograd::engine::evaluate_function: ReluBackward0",
            bw,
            [],
            seq0 + 2,
            [
                (
                    "ReluBackward0",
                    bw,
                    [[32, n_out]],
                    seq0 + 2,
                    [("aten::threshold_backward", bw, [[32, n_out], [32, n_out], []], -1, [])],
                )
            ],
        ),
        (
            "autograd::engine::evaluate_function: AddmmBackward0",
            bw,
            [],
            seq0 + 1,
            [
                (
                    "AddmmBackward0",
                    bw,
                    [[32, n_out]],
                    seq0 + 1,
                    [
                        ("aten::mm", bw, [[32, n_out], [n_out, n_in]], -1, []),
                        ("aten::mm", bw, [[n_out, 32], x], -1, []),
                    ],
                )
            ],
        ),
        (
            "autograd::engine::evaluate_function: TBackward0",
            bw,
            [],
            seq0,
            [("TBackward0", bw, [[n_in, n_out]], seq0, [])],
        ),
    ]
    optim = [
        ("aten::add_", Phase.OPTIMIZER, [w, w, []], -1, []),
        ("aten::add_", Phase.OPTIMIZER, [b, b, []], -1, []),
    ]
    return forward, backward, optim


def _captured_iteration(n_blocks: int = 3) -> IterationTrace:
    forward, backward, optim = [], [], []
    for k in range(n_blocks):
        f, b, o = _block(10 * k, 64 + 16 * k, 128 - 8 * k)
        forward += f
        backward = b + backward
        optim += o
    specs = [
        (
            "aten::to",
            Phase.FORWARD,
            [[32, 64]],
            -1,
            [("aten::_to_copy", Phase.FORWARD, [[32, 64]], -1, [])],
        )
    ]
    specs += forward
    specs += [("ProfilerStep#3", Phase.OTHER, [], -1, [])]  # an annotation at depth 0: not a row
    specs += backward
    specs += [("aten::norm", Phase.OTHER, [[128, 64]], -1, [])]  # grad clipping: training thread
    specs += optim
    ops = _layout(specs)
    # a pin-memory thread: phase-less work that is not part of the step's critical path
    other = _layout(
        [("aten::pin_memory", Phase.OTHER, [[32, 64]], -1, [])], thread=9, start=ops[5].start_ns + 1
    )
    ops = sorted([*ops, *other], key=lambda op: op.start_ns)
    # parents were indices into each thread's own list: remap after merging
    by_id = {id(op): i for i, op in enumerate(ops)}
    main = [op for op in ops if op.thread == 1]
    remap = {i: by_id[id(op)] for i, op in enumerate(main)}
    for op in ops:
        if op.thread == 1 and op.parent >= 0:
            op.parent = remap[op.parent]
    end = max(op.end_ns for op in ops) + 500
    return IterationTrace(step=3, start_ns=900, end_ns=end, ops=ops)


def _trace(iteration: IterationTrace, **metadata) -> Trace:
    return Trace(iterations=[iteration], metadata={"model": "mlp", "batch_size": 32, **metadata})


# ---------------------------------------------------------------------------------------------
# rows, features, targets


def test_ets_rows_are_the_training_threads_outermost_ops() -> None:
    it = _captured_iteration(2)
    names = [it.ops[i].name for i in ets_rows(it)]
    assert names[0] == "aten::to"
    assert "ProfilerStep#3" not in names
    assert "aten::pin_memory" not in names  # phase-less op of another thread
    assert "aten::norm" in names  # phase-less op of the training thread
    assert all(it.ops[i].depth == 0 for i in ets_rows(it))
    assert names.count("autograd::engine::evaluate_function: AddmmBackward0") == 2
    assert names[-2:] == ["aten::add_", "aten::add_"]


def _column(schema: FeatureSchema, name: str) -> int:
    return schema.feature_names.index(name)


def test_backward_rows_take_their_cost_from_the_forward_op() -> None:
    it = _captured_iteration(1)
    trace = _trace(it)
    schema = fit_schema([trace])
    enc = encode_iteration(trace, it, schema)
    rows = [it.ops[i] for i in enc.op_indices]
    flops = enc.features[:, _column(schema, "log_flops")]
    by_name = {op.name: k for k, op in enumerate(rows)}
    addmm = op_cost("aten::addmm", [[128], [32, 64], [64, 128]], [F, F, F]).flops
    k = by_name["autograd::engine::evaluate_function: AddmmBackward0"]
    assert math.isclose(flops[k], math.log1p(2 * addmm), rel_tol=1e-6)
    relu = op_cost("aten::relu", [[32, 128]], [F]).flops
    k = by_name["autograd::engine::evaluate_function: ReluBackward0"]
    assert math.isclose(flops[k], math.log1p(relu), rel_tol=1e-6)
    # direction one-hots
    dirs = enc.features[
        :, [_column(schema, f"dir={d}") for d in ("forward", "backward", "optimizer")]
    ]
    assert dirs[by_name["aten::linear"]].tolist() == [1, 0, 0]
    assert dirs[k].tolist() == [0, 1, 0]
    assert dirs[-1].tolist() == [0, 0, 1]
    assert dirs[by_name["aten::norm"]].tolist() == [0, 0, 0]
    # batch size from metadata; h from the first forward input when metadata lacks it
    assert enc.features[0, _column(schema, "log_batch")] == pytest.approx(math.log1p(32))
    assert enc.features[0, _column(schema, "log_input_h")] == pytest.approx(math.log1p(64))
    # padding flag is 0 on real rows; dtype float32
    assert not enc.features[:, schema.padding_column].any()
    assert enc.features[:, _column(schema, "dtype=float32")].sum() >= len(rows) - 4


def test_backward_node_without_forward_match_uses_its_kernels() -> None:
    it = _captured_iteration(1)
    for op in it.ops:
        if op.phase is Phase.FORWARD:
            op.sequence_nr = -1
    trace = _trace(it)
    schema = fit_schema([trace])
    enc = encode_iteration(trace, it, schema)
    k = [it.ops[i].name for i in enc.op_indices].index(
        "autograd::engine::evaluate_function: AddmmBackward0"
    )
    mm = 2 * 32 * 128 * 64  # each of the two aten::mm kernels
    assert math.isclose(
        enc.features[k, _column(schema, "log_flops")], math.log1p(2 * mm), rel_tol=1e-6
    )


def test_cpu_targets_gap_to_the_next_op_of_the_thread() -> None:
    it = _captured_iteration(2)
    trace = _trace(it)
    schema = fit_schema([trace])
    enc = encode_iteration(trace, it, schema)
    rows = [it.ops[i] for i in enc.op_indices]
    for k, op in enumerate(rows):
        assert enc.targets_ns[k, 0] == op.duration_ns
        following = rows[k + 1].start_ns if k + 1 < len(rows) else it.end_ns
        assert enc.targets_ns[k, 1] == max(0, following - op.end_ns)
    assert enc.measured_ns == pytest.approx(it.end_ns - rows[0].start_ns)
    # a gap filled by the decoder wins over the timestamps
    rows[0].gap_ns = 7
    assert encode_iteration(trace, it, schema).targets_ns[0, 1] == 7


def test_cuda_targets() -> None:
    it = _captured_iteration(1)
    trace = replace(_trace(it), device=DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3"))
    schema = fit_schema([trace])
    assert np.isnan(encode_iteration(trace, it, schema).targets_ns).all()  # decoder never ran
    rows = [it.ops[i] for i in ets_rows(it)]
    for k, op in enumerate(rows):
        op.kernel_duration_ns, op.kernel_count, op.gap_ns = (100 * k, 1, 5) if k % 2 else (0, 0, -1)
    enc = encode_iteration(trace, it, schema)
    assert enc.targets_ns[0].tolist() == [0, 0]  # launched nothing: no device time
    assert enc.targets_ns[1].tolist() == [100, 5]
    assert np.isfinite(enc.measured_ns)
    assert device_spec(trace.device) == (66.9, 3350.0, 132)
    assert device_spec(DeviceInfo(kind="cuda", name="Tesla T4")) == (8.1, 320.0, 40)
    assert device_spec(DeviceInfo(kind="cuda", name="NVIDIA GeForce RTX 2080 Ti"))[2] == 68
    assert device_spec(DeviceInfo(kind="cuda", name="mystery")) is None


def test_ops_without_shapes_still_encode() -> None:
    it = _captured_iteration(1)
    for op in it.ops:
        op.input_shapes, op.input_dtypes = (), ()
    trace = Trace(iterations=[it])
    schema = fit_schema([trace])
    enc = encode_iteration(trace, it, schema)
    assert np.isfinite(enc.features).all()
    assert (enc.features[:, _column(schema, "dtype=other")] == 1).all()


def test_imported_rows_use_their_own_cost_and_params() -> None:
    params = (2, 3, 64, 64, 64, 15, 15, 11, 11, 2, 2, 4, 4, 1, 1, 1, 4) + (0,) * 13
    op = OpEvent(
        "conv2d",
        0,
        10,
        phase=Phase.FORWARD,
        flops=1000,
        bytes_moved=50,
        params=params,
        input_dtypes=("half",),
        kernel_duration_ns=9,
        gap_ns=4,
    )
    trace = Trace(
        iterations=[IterationTrace(0, 0, 100, [op])],
        device=DeviceInfo(kind="cuda", name="T4"),
        metadata={"batch_size": 2, "input_h": 64, "input_w": 64, "model": "alexnet"},
    )
    schema = fit_schema([trace], device_features=True)
    (enc,) = encode_trace(trace, schema)
    row = enc.features[0]
    assert row[_column(schema, "log_flops")] == pytest.approx(math.log1p(1000))
    assert row[_column(schema, "log_bytes")] == pytest.approx(math.log1p(50))
    assert row[_column(schema, "log_param_7")] == pytest.approx(math.log1p(11))
    assert row[_column(schema, "dtype=float16")] == 1
    assert row[_column(schema, "dev_log_sms")] == pytest.approx(math.log1p(40))
    assert enc.targets_ns.tolist() == [[9, 4]]
    assert enc.group == "alexnet"


# ---------------------------------------------------------------------------------------------
# schema and scalers


def test_schema_vocabulary_layout_and_versions() -> None:
    it = _captured_iteration(2)
    schema = fit_schema([_trace(it)], vocab_size=3)
    assert schema.vocabulary[0] == "add_"  # most frequent; ties broken by name
    assert len(schema.vocabulary) == 3
    names = schema.feature_names
    assert names[:4] == (*tuple(f"op={v}" for v in schema.vocabulary), "op=<other>")
    assert names[-1] == "padding" and len(names) == schema.n_features
    assert sum(n.startswith("log_param_") for n in names) == 30
    assert FeatureSchema.from_dict(schema.to_dict()) == schema
    future = {**schema.to_dict(), "version": FEATURE_SCHEMA_VERSION + 1}
    with pytest.raises(SchemaVersionError) as info:
        FeatureSchema.from_dict(future, source="model.npz")
    text = str(info.value)
    assert (
        f"version {FEATURE_SCHEMA_VERSION + 1}" in text
        and f"version {FEATURE_SCHEMA_VERSION}" in text
    )
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match="vocab_size"):
        fit_schema([], vocab_size=-1)


def test_scalers() -> None:
    rng = np.random.default_rng(0)
    schema = FeatureSchema(vocabulary=("a", "b"))
    rows = rng.normal(5.0, 3.0, size=(200, schema.n_features)).astype(np.float32)
    scaler = Standardizer.fit(rows, schema.continuous)
    z = scaler.transform(rows)
    cont = schema.continuous
    assert np.allclose(z[:, cont].mean(axis=0), 0, atol=1e-4)
    assert np.allclose(z[:, ~cont], rows[:, ~cont])  # one-hots and flags untouched
    assert Standardizer.from_dict(scaler.to_dict()).transform(rows) == pytest.approx(z)
    clamped = Standardizer.fit(rows, schema.continuous, clamp_margin=0.5)
    assert np.array_equal(clamped.transform(rows), z)  # training rows are inside the range
    far = rows[:1] * 0 + 1e6
    far_z = clamped.transform(far)
    assert (far_z[0, cont] == pytest.approx(clamped.hi[cont])) and (far_z[0, cont] < 10).all()
    assert far_z[0, ~cont] == pytest.approx(far[0, ~cont])  # one-hot columns are not clamped
    restored = Standardizer.from_dict(json.loads(json.dumps(clamped.to_dict())))
    assert np.array_equal(restored.transform(far), far_z)
    with pytest.raises(ValueError, match="clamp_margin"):
        Standardizer.fit(rows, schema.continuous, clamp_margin=-1.0)
    # ignored columns always read 0, with or without clamping, also after a JSON round trip
    ignore = np.isin(schema.feature_names, ["log_batch", "op=a"])
    for margin in (None, 0.5):
        hidden = Standardizer.fit(rows, schema.continuous, clamp_margin=margin, ignore=ignore)
        for probe in (rows, far):
            out = hidden.transform(probe)
            assert (out[:, ignore] == 0).all()
            expected = (clamped if margin else scaler).transform(probe)
            assert np.array_equal(out[:, ~ignore], expected[:, ~ignore])
        restored = Standardizer.from_dict(json.loads(json.dumps(hidden.to_dict())))
        assert np.array_equal(restored.transform(far), hidden.transform(far))
    with pytest.raises(ValueError, match="ignore"):
        Standardizer.fit(rows, schema.continuous, ignore=ignore[:3])
    y = rng.uniform(0, 1e6, size=(50, 2))
    for kind in ("standard", "log"):
        ts = TargetScaler.fit(y, kind)
        assert ts.inverse(ts.transform(y)) == pytest.approx(y, rel=1e-4, abs=1.0)
        assert TargetScaler.from_dict(ts.to_dict()).transform_kind == kind
    with pytest.raises(ValueError, match="transform"):
        TargetScaler.fit(y, "sqrt")


def test_roofline_targets_scale_with_work_and_outputs_are_clamped() -> None:
    rng = np.random.default_rng(1)
    schema = FeatureSchema(vocabulary=("conv2d",))
    fcol, bcol = _column(schema, "log_flops"), _column(schema, "log_bytes")
    n = 300
    flops = rng.uniform(1e6, 1e9, size=n)
    moved = rng.uniform(1e4, 1e7, size=n)
    features = np.zeros((n, schema.n_features), dtype=np.float32)
    features[:, fcol], features[:, bcol] = np.log1p(flops), np.log1p(moved)
    y = np.stack([flops / 5.0 + 2000.0, rng.uniform(0, 1e5, size=n)], axis=1)  # 5 FLOP/ns
    ts = TargetScaler.fit(y, "roofline", features, flops_col=fcol, bytes_col=bcol)
    assert 4.0 < ts.flops_per_ns <= 5.0 + 1e-9
    z = ts.transform(y, features)
    assert ts.inverse(z, features) == pytest.approx(y, rel=1e-3, abs=1.0)
    # an op 100x larger than any seen keeps the learned efficiency: its time scales with work
    big = features[:1].copy()
    big[0, fcol] = np.log1p(1e11)
    assert ts.inverse(z[:1] * 0 + z[np.argmax(flops)], big)[0, 0] == pytest.approx(
        1e11 / 5.0, rel=0.05
    )
    # outputs far outside the training range are clamped
    huge = ts.inverse(np.full((1, 2), 1e6, dtype=np.float32), features[:1])
    assert np.isfinite(huge).all() and huge[0, 1] <= 1.5e5 * np.e ** ts.std[1]
    restored = TargetScaler.from_dict(json.loads(json.dumps(ts.to_dict())))
    assert restored.inverse(z, features) == pytest.approx(ts.inverse(z, features))
    with pytest.raises(ValueError, match="roofline"):
        TargetScaler.fit(y, "roofline")
    with pytest.raises(ValueError, match="feature rows"):
        ts.inverse(z)


# ---------------------------------------------------------------------------------------------
# windows


def _naive_windows(rows: np.ndarray, width: int, stride: int, pad: np.ndarray):
    n = len(rows)
    starts: list[int] = []
    s = 0
    while n:
        starts.append(s)
        if s + width >= n:
            break
        s += stride
    windows = [[rows[s + j] if s + j < n else pad for j in range(width)] for s in starts]
    index = [[s + j if s + j < n else -1 for j in range(width)] for s in starts]
    return (
        starts,
        np.array(windows).reshape(len(starts), width, rows.shape[1]),
        np.array(index).reshape(len(starts), width),
    )


def _naive_aggregate(preds: np.ndarray, starts: list[int], width: int, n: int) -> np.ndarray:
    out = np.zeros((n, preds.shape[2]))
    for row in range(n):
        seen = [preds[w, row - s] for w, s in enumerate(starts) if s <= row < s + width]
        out[row] = np.mean(seen, axis=0)
    return out


WINDOW_CASES = [(1, 1), (3, 1), (3, 2), (3, 3), (5, 4), (10, 5), (12, 3), (20, 7)]
LENGTHS = [0, 1, 2, 4, 5, 11, 12, 13, 37, 100]


@pytest.mark.parametrize(("width", "stride"), WINDOW_CASES)
def test_windows_and_aggregation_equal_a_naive_loop(width: int, stride: int) -> None:
    rng = np.random.default_rng(width * 100 + stride)
    for n in LENGTHS:
        rows = rng.normal(size=(n, 4)).astype(np.float32)
        pad = np.full(4, -9.0, dtype=np.float32)
        windows, index = build_windows(rows, width, stride, pad)
        starts, naive_w, naive_i = _naive_windows(rows, width, stride, pad)
        assert window_starts(n, width, stride).tolist() == starts
        assert np.array_equal(index, naive_i) and np.array_equal(
            index, window_index(n, width, stride)
        )
        assert np.array_equal(windows, naive_w)
        if n == 0:
            assert windows.shape == (0, width, 4)
            continue
        assert set(index[index >= 0].tolist()) == set(range(n))  # every row in some window
        preds = rng.normal(size=(len(starts), width, 2))
        got = aggregate_windows(preds, index, n)
        assert np.allclose(got, _naive_aggregate(preds, starts, width, n))
        # the iteration sum counts each real op once, never padding
        assert got.sum() == pytest.approx(_naive_aggregate(preds, starts, width, n).sum())


def test_window_argument_errors() -> None:
    with pytest.raises(ValueError, match="width"):
        window_starts(5, 0, 1)
    with pytest.raises(ValueError, match="stride"):
        window_starts(5, 3, 4)
    with pytest.raises(ValueError, match="n must"):
        window_starts(-1, 3, 1)
    with pytest.raises(ValueError, match="do not match"):
        aggregate_windows(np.zeros((2, 3, 2)), np.zeros((2, 4), dtype=np.int64), 5)


def test_projecting_onto_a_sub_vocabulary_equals_encoding_with_it() -> None:
    trace = _trace(_captured_iteration())
    full = fit_schema([trace], vocab_size=1000)
    assert len(full.vocabulary) >= 3
    small = replace(full, vocabulary=full.vocabulary[1:3])
    encoded_full = encode_trace(trace, full)[0]
    direct = encode_trace(trace, small)[0]
    projected = project_features(encoded_full.features, full, small)
    np.testing.assert_array_equal(projected, direct.features)
    with pytest.raises(ValueError, match="lacks"):
        project_features(direct.features, small, full)
    with pytest.raises(ValueError, match="measured"):
        project_features(encoded_full.features, full, replace(small, measured_features=True))
