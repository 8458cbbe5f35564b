"""Numpy predictor: agreement with torch, aggregation, weights files, streaming, metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ets_hook.errors import ModelFileError, SchemaVersionError
from ets_hook.ets.features import (
    FEATURE_SCHEMA_VERSION,
    EncodedIteration,
    FeatureSchema,
    Standardizer,
)
from ets_hook.ets.regressors import Evaluation, Predictor, evaluate, mre, rmse_ms
from ets_hook.ets.targets import TargetScaler
from ets_hook.ets.training import build_net, export_member
from ets_hook.trace.events import IterationTrace, OpEvent, Phase, Trace

SCHEMA = FeatureSchema(vocabulary=("conv2d", "relu", "add_"))
NF = SCHEMA.n_features
# variant -> (model kind, width, stride, layers, hidden)
KINDS = {
    "lstm": ("lstm", 12, 3, 4, NF),
    "lstm-small": ("lstm", 6, 2, 2, 16),
    "mlp": ("mlp", 1, 1, 3, 32),
    "grouping": ("grouping", 12, 12, 3, 24),
}


def _predictor(variant: str, *, seed: int = 0, members: int = 1, transform: str = "standard"):
    kind, width, stride, layers, hidden = KINDS[variant]
    rng = np.random.default_rng(seed)
    nets, params = [], []
    for m in range(members):
        torch.manual_seed(seed * 10 + m)
        net = build_net(kind, NF, hidden, layers, pad_col=SCHEMA.padding_column).eval()
        nets.append(net)
        params.append(export_member(net))
    fscale = Standardizer(
        rng.normal(size=NF).astype(np.float32), rng.uniform(0.5, 2, size=NF).astype(np.float32)
    )
    tscale = TargetScaler(transform, np.array([3.0, 2.0]), np.array([1.5, 0.5]))
    predictor = Predictor(kind, SCHEMA, fscale, tscale, width, stride, layers, hidden, params)
    return predictor, nets


def _windows(predictor: Predictor, m: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(size=(m, predictor.width, NF)).astype(np.float32)
    x[:, :, SCHEMA.padding_column] = 0.0
    if predictor.width > 1:  # the last slots of some windows are padding
        x[::2, -3:, :] = 0.0
        x[::2, -3:, SCHEMA.padding_column] = 1.0
    return x


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_numpy_forward_agrees_with_torch(kind: str) -> None:
    predictor, nets = _predictor(kind, members=2)
    x = _windows(predictor, 37, np.random.default_rng(1))
    with torch.no_grad():
        expected = sum(net(torch.from_numpy(x)) for net in nets).numpy() / len(nets)
    got = predictor.forward_windows(x)
    assert got.shape == (37, predictor.width, 2)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def _encoded(n: int, seed: int) -> EncodedIteration:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, NF)).astype(np.float32)
    features[:, SCHEMA.padding_column] = 0.0
    targets = rng.uniform(1e3, 1e5, size=(n, 2))
    return EncodedIteration(
        features, targets, np.arange(n), label=f"it{seed}", group=f"g{seed % 2}"
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_prediction_is_the_overlap_mean_summed_over_real_ops(kind: str) -> None:
    predictor, nets = _predictor(kind, transform="log")
    for n in (1, 5, 12, 13, 40):
        enc = _encoded(n, n)
        got = predictor.predict_encoded(enc)
        # naive: torch per window, python loop for the mean, scaler inverse, sum of real ops
        scaled = predictor.feature_scaler.transform(enc.features)
        w, s = predictor.width, predictor.stride
        starts = [0]
        while starts[-1] + w < n:
            starts.append(starts[-1] + s)
        per_op = [[] for _ in range(n)]
        for start in starts:
            window = np.zeros((w, NF), dtype=np.float32)
            window[:, SCHEMA.padding_column] = 1.0
            real = scaled[start : start + w]
            window[: len(real)] = real
            with torch.no_grad():
                out = nets[0](torch.from_numpy(window[None]))[0].numpy()
            for j in range(len(real)):
                per_op[start + j].append(out[j])
        z = np.array([np.mean(v, axis=0) for v in per_op])
        y = predictor.target_scaler.inverse(z)
        np.testing.assert_allclose(got.duration_ns, y[:, 0], rtol=1e-4)
        np.testing.assert_allclose(got.gap_ns, y[:, 1], rtol=1e-4)
        assert got.iteration_ns == pytest.approx(y.sum(), rel=1e-4)
        assert got.iteration_s == pytest.approx(got.iteration_ns / 1e9)
    batch = predictor.predict_many([_encoded(7, 1), _encoded(30, 2)])
    assert batch[1].iteration_ns == pytest.approx(
        predictor.predict_encoded(_encoded(30, 2)).iteration_ns
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_weights_file_round_trip(tmp_path: Path, kind: str) -> None:
    predictor, _ = _predictor(kind, members=2)
    predictor.training["note"] = "unit test"
    predictor.calibration = (1.25, 0.75)
    path = predictor.save(tmp_path / "model")  # suffix added
    assert path.suffix == ".npz"
    loaded = Predictor.load(path)
    assert loaded.kind == KINDS[kind][0] and loaded.schema == SCHEMA
    assert (loaded.width, loaded.stride, loaded.layers, loaded.hidden) == (
        predictor.width,
        predictor.stride,
        predictor.layers,
        predictor.hidden,
    )
    assert loaded.training["note"] == "unit test"
    assert loaded.calibration == (1.25, 0.75)
    x = _windows(predictor, 5, np.random.default_rng(3))
    assert np.array_equal(loaded.forward_windows(x), predictor.forward_windows(x))
    enc = _encoded(25, 4)
    assert loaded.predict_encoded(enc).iteration_ns == predictor.predict_encoded(enc).iteration_ns


def _rewrite_metadata(path: Path, edit) -> None:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["__metadata__"]))
    edit(meta)
    arrays["__metadata__"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


def test_save_replaces_the_file_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    predictor, _ = _predictor("mlp", members=1)
    path = predictor.save(tmp_path / "model.npz")
    before = path.read_bytes()
    old_umask = os.umask(0o027)
    try:
        path.unlink()
        predictor.save(path)
    finally:
        os.umask(old_umask)
    assert path.stat().st_mode & 0o777 == 0o640  # the process umask, as open() would give

    def disk_full(file: Any, **arrays: Any) -> None:
        file.write(b"PK\x03\x04 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", disk_full)
    with pytest.raises(OSError, match="No space"):
        predictor.save(path)
    assert path.read_bytes() == before  # the failed save left the old file as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]  # no temp file left


def test_schema_version_mismatch_is_a_typed_error(tmp_path: Path) -> None:
    predictor, _ = _predictor("mlp")
    path = predictor.save(tmp_path / "old.npz")
    _rewrite_metadata(path, lambda m: m["schema"].update(version=FEATURE_SCHEMA_VERSION + 41))
    with pytest.raises(SchemaVersionError) as info:
        Predictor.load(path)
    assert info.value.found == FEATURE_SCHEMA_VERSION + 41
    assert info.value.expected == FEATURE_SCHEMA_VERSION
    message = str(info.value)
    assert str(path) in message
    assert f"version {FEATURE_SCHEMA_VERSION + 41}" in message
    assert f"version {FEATURE_SCHEMA_VERSION}" in message


def test_not_a_model_file(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", a=np.zeros(3))
    with pytest.raises(ModelFileError, match="not an ets-hook model"):
        Predictor.load(tmp_path / "x.npz")
    (tmp_path / "y.npz").write_text("garbage")
    with pytest.raises(ModelFileError):
        Predictor.load(tmp_path / "y.npz")
    predictor, _ = _predictor("mlp")
    path = predictor.save(tmp_path / "z.npz")
    _rewrite_metadata(path, lambda m: m.update(format="something-else"))
    with pytest.raises(ModelFileError, match="format"):
        Predictor.load(path)


def test_constructor_validates() -> None:
    predictor, _ = _predictor("mlp")
    with pytest.raises(ValueError, match="kind"):
        Predictor(
            "gru",
            SCHEMA,
            predictor.feature_scaler,
            predictor.target_scaler,
            1,
            1,
            1,
            1,
            predictor.members,
        )
    with pytest.raises(ValueError, match="width/stride"):
        Predictor(
            "mlp",
            SCHEMA,
            predictor.feature_scaler,
            predictor.target_scaler,
            4,
            2,
            1,
            1,
            predictor.members,
        )
    with pytest.raises(ValueError, match="windows must be"):
        predictor.forward_windows(np.zeros((2, 3, NF)))


def _cpu_trace(n_ops: int) -> Trace:
    names = ["aten::conv2d", "aten::relu", "aten::add_"]
    phases = [Phase.FORWARD, Phase.FORWARD, Phase.OPTIMIZER]
    ops, t = [], 0
    for k in range(n_ops):
        ops.append(
            OpEvent(
                names[k % 3],
                t,
                100 + k,
                phase=phases[k % 3],
                input_shapes=((4, 8, 8, 8),),
                input_dtypes=("float",),
            )
        )
        t += 400 + k
    return Trace(iterations=[IterationTrace(0, 0, t, ops)], metadata={"model": "toy"})


def test_metrics() -> None:
    assert mre([100.0, 200.0], [110.0, 150.0]) == pytest.approx((0.1 + 0.25) / 2)
    assert rmse_ms([1e6, 3e6], [2e6, 3e6]) == pytest.approx(np.sqrt(0.5))
    with pytest.raises(ValueError, match="> 0"):
        mre([0.0], [1.0])
    with pytest.raises(ValueError, match="shape"):
        rmse_ms([1.0], [1.0, 2.0])
    ev = Evaluation(
        ("a", "b", "c"), ("m1", "m1", "m2"), np.array([1e6, 2e6, 4e6]), np.array([1.1e6, 2e6, 2e6])
    )
    table = ev.by_group()
    assert table["m1"]["iterations"] == 2
    assert table["m1"]["mre"] == pytest.approx(0.05)
    assert table["m2"]["mre"] == pytest.approx(0.5)
    assert ev.to_dict()["per_iteration"][2]["predicted_ms"] == pytest.approx(2.0)


def test_evaluate_skips_iterations_without_a_measurement() -> None:
    predictor, _ = _predictor("mlp")
    good = _encoded(10, 1)
    bad = EncodedIteration(good.features, np.full((10, 2), np.nan), good.op_indices, label="bad")
    ev = evaluate(predictor, [good, bad])
    assert ev.labels == ("it1",) and ev.skipped == ("bad",)
    assert ev.measured_ns[0] == pytest.approx(good.targets_ns.sum())
