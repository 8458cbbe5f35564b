"""Training: held-out error drops, determinism, export agreement, argument checks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from ets_hook.ets.features import EncodedIteration, FeatureSchema, encode_trace, fit_schema
from ets_hook.ets.regressors import evaluate, sum_factors
from ets_hook.ets.training import TrainConfig, fit, fit_encoded
from ets_hook.trace.events import DeviceInfo, IterationTrace, OpEvent, Phase, Trace

# Per op type: (kernel ns per MFLOP, launch overhead ns)
_COST = {
    "conv2d": (40.0, 4000.0),
    "relu": (8.0, 3000.0),
    "linear": (25.0, 5000.0),
    "add_": (5.0, 2500.0),
}


def _synthetic_trace(model: str, layers: list[str], batch: int, seed: int) -> Trace:
    """A GPU-style trace whose targets follow a known rule, including a context effect: the gap
    after an op shrinks when the op's kernel is long (the CPU ran ahead while it executed)."""
    rng = np.random.default_rng(seed)
    ops: list[OpEvent] = []
    t = 0
    sequence = [(n, Phase.FORWARD) for n in layers] + [
        (n, Phase.BACKWARD) for n in reversed(layers)
    ]
    sequence += [("add_", Phase.OPTIMIZER)] * len(layers)
    for k, (name, phase) in enumerate(sequence):
        mflops = batch * (4.0 if name in ("conv2d", "linear") else 0.5) * (1 + (k % 5))
        if phase is Phase.BACKWARD:
            mflops *= 2
        per_mflop, overhead = _COST[name]
        kernel = per_mflop * mflops * (1 + 0.02 * rng.standard_normal())
        gap = max(0.0, overhead - 0.5 * kernel)
        params = (batch, 16 * (1 + k % 5), 8, 8) + (0,) * 26
        ops.append(
            OpEvent(
                name,
                t,
                500,
                phase=phase,
                flops=int(mflops * 1e6),
                bytes_moved=int(mflops * 4e5),
                params=params,
                input_dtypes=("float",),
                kernel_duration_ns=int(kernel),
                kernel_count=1,
                gap_ns=int(gap),
            )
        )
        t += int(kernel + gap)
    return Trace(
        iterations=[IterationTrace(0, 0, t, ops)],
        device=DeviceInfo(kind="cuda", name="T4"),
        metadata={"model": model, "batch_size": batch, "input_h": 32, "input_w": 32},
    )


def _dataset() -> tuple[list[Trace], list[Trace]]:
    archs = {
        "a": ["conv2d", "relu"] * 6,
        "b": ["conv2d", "relu", "conv2d", "relu", "linear"] * 3,
        "c": ["linear", "relu"] * 5,
        "d": ["conv2d", "relu", "linear", "relu"] * 4,
    }
    train = [
        _synthetic_trace(m, archs[m], b, 10 * i + b)
        for i, m in enumerate("abc")
        for b in (1, 2, 4, 8)
    ]
    test = [_synthetic_trace("d", archs["d"], b, 99 + b) for b in (2, 3, 6)]
    return train, test


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("mlp", {"hidden": 32}),
        ("mlp", {"hidden": 32, "target_transform": "roofline"}),
        ("lstm", {"hidden": 16, "layers": 1, "width": 6, "stride": 2}),
        ("grouping", {"hidden": 16, "width": 6}),
    ],
)
def test_training_lowers_held_out_error(kind: str, extra: dict) -> None:
    train, test = _dataset()
    base = dict(
        kind=kind, lr=3e-3, batch_size=32, seed=1, progress=False, val_fraction=0.0, **extra
    )
    untrained = fit(train, TrainConfig(epochs=0, **base)).predictor
    trained = fit(train, TrainConfig(epochs=60, **base)).predictor
    test_enc = [e for t in test for e in encode_trace(t, trained.schema)]
    before = evaluate(untrained, test_enc).mre
    after = evaluate(trained, test_enc).mre
    assert after < 0.6 * before, (before, after)
    assert after < 0.25


def test_calibration_makes_training_sums_match() -> None:
    train, _ = _dataset()
    base = dict(
        kind="mlp",
        hidden=8,
        epochs=3,
        lr=1e-3,
        progress=False,
        val_fraction=0.0,
        target_transform="log",
    )
    raw = fit(train, TrainConfig(calibrate=False, **base)).predictor
    assert raw.calibration == (1.0, 1.0)
    calibrated = fit(train, TrainConfig(**base)).predictor
    assert calibrated.training["calibration"] == list(calibrated.calibration)
    encoded = [e for t in train for e in encode_trace(t, calibrated.schema)]
    preds = calibrated.predict_many(encoded)
    for k, name in enumerate(("duration_ns", "gap_ns")):
        predicted = sum(getattr(p, name).sum() for p in preds)
        measured = sum(e.targets_ns[:, k].sum() for e in encoded)
        factor = calibrated.calibration[k]
        if 0.25 < factor < 4.0:  # not clipped
            assert predicted == pytest.approx(measured, rel=1e-6)
    # calibration only rescales: the raw model's predictions times the factors
    assert raw.predict_many(encoded[:1])[0].duration_ns * calibrated.calibration[0] == (
        pytest.approx(calibrated.predict_many(encoded[:1])[0].duration_ns, rel=1e-5)
    )


def test_training_is_seeded_and_leaves_global_rng_alone() -> None:
    train, _ = _dataset()
    config = TrainConfig(kind="mlp", hidden=16, epochs=3, lr=1e-3, seed=5, progress=False)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = fit(train, config).predictor
    assert torch.rand(1) == expected_next  # global RNG state untouched
    b = fit(train, config).predictor
    for key, value in a.members[0].items():
        assert np.array_equal(value, b.members[0][key])
    c = fit(train, TrainConfig(kind="mlp", hidden=16, epochs=3, lr=1e-3, seed=6, progress=False))
    assert not np.array_equal(a.members[0]["head.w"], c.predictor.members[0]["head.w"])


def _encoded_training_set() -> tuple[list[EncodedIteration], FeatureSchema]:
    train, _ = _dataset()
    schema = fit_schema(train)
    return [e for t in train for e in encode_trace(t, schema)], schema


def test_validation_split_early_stopping_and_training_info() -> None:
    encoded, schema = _encoded_training_set()
    config = TrainConfig(
        kind="mlp",
        hidden=16,
        epochs=40,
        lr=1e-3,
        patience=2,
        val_fraction=0.34,
        ensemble=2,
        progress=False,
    )
    result = fit_encoded(encoded, schema, config)
    info = result.predictor.training
    assert len(info["val_groups"]) == 1  # 3 models: one held out for validation
    assert info["val_iterations"] == 4 and info["train_iterations"] == 8
    assert len(result.predictor.members) == 2 and len(result.history) == 2
    assert all(n <= 40 for n in info["epochs_run"])
    assert all(v is not None for v in info["val_mre"])
    assert info["config"]["kind"] == "mlp"


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="kind"):
        TrainConfig(kind="transformer")
    with pytest.raises(ValueError, match="stride"):
        TrainConfig(width=4, stride=5)
    with pytest.raises(ValueError, match="val_fraction"):
        TrainConfig(val_fraction=1.0)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=0.0)
    assert TrainConfig(kind="mlp").window() == (1, 1)
    assert TrainConfig(kind="grouping", width=8).window() == (8, 8)
    with pytest.raises(ValueError, match="no training"):
        fit([], TrainConfig())


def test_early_stopping_watches_the_calibrated_validation_error() -> None:
    """The validation MRE early stopping keeps is the saved predictor's own MRE on the validation
    iterations (calibration included); the uncalibrated one is kept beside it."""
    encoded, schema = _encoded_training_set()
    config = TrainConfig(
        kind="mlp",
        hidden=16,
        epochs=12,
        lr=3e-3,
        patience=100,
        val_fraction=0.34,
        seed=2,
        progress=False,
        target_transform="log",
    )
    result = fit_encoded(encoded, schema, config)
    info = result.predictor.training
    history = result.history[0]
    assert len(history) == 12 and all("val_mre_raw" in r for r in history)
    best = int(history[-1]["best_epoch"])
    assert history[best - 1]["val_mre"] == min(r["val_mre"] for r in history)
    val = [e for e in encoded if e.group in info["val_groups"]]
    assert evaluate(result.predictor, val).mre == pytest.approx(info["val_mre"][0], rel=1e-4)
    assert result.predictor.calibration != (1.0, 1.0)

    raw = fit_encoded(encoded, schema, replace(config, calibrate=False))
    assert all(r["val_mre"] == r["val_mre_raw"] for r in raw.history[0])
    assert raw.predictor.calibration == (1.0, 1.0)
    assert evaluate(raw.predictor, val).mre == pytest.approx(
        raw.predictor.training["val_mre"][0], rel=1e-4
    )


def test_sum_factors() -> None:
    predicted = np.array([[1.0, 2.0], [3.0, 2.0], [5.0, 5.0]])
    measured = np.array([[2.0, 1.0], [6.0, 1.0], [np.nan, 1.0]])
    assert sum_factors(predicted, measured) == (2.0, 0.5)  # the NaN row is left out
    assert sum_factors(predicted, 100 * measured) == (4.0, 4.0)  # clipped
    assert sum_factors(predicted, measured, limits=(0.1, 100.0)) == (2.0, 0.5)
    assert sum_factors(np.zeros((2, 2)), np.ones((2, 2))) == (1.0, 1.0)
    assert sum_factors(np.zeros((0, 2)), np.zeros((0, 2))) == (1.0, 1.0)
    with pytest.raises(ValueError, match="shapes"):
        sum_factors(np.zeros((2, 2)), np.zeros((3, 2)))


def test_ignored_features_do_not_reach_the_model() -> None:
    train, test = _dataset()
    config = TrainConfig(
        kind="lstm",
        hidden=8,
        layers=1,
        width=4,
        stride=2,
        epochs=2,
        lr=1e-3,
        val_fraction=0.0,
        progress=False,
        ignore_features=("log_batch", "log_input_h"),
    )
    predictor = fit(train, config).predictor
    enc = [e for t in test for e in encode_trace(t, predictor.schema)]
    cols = [predictor.schema.feature_names.index(n) for n in config.ignore_features]
    shuffled = []
    for k, e in enumerate(enc):
        features = e.features.copy()
        features[:, cols] = 10.0 * (k + 1)  # far outside anything seen in training
        shuffled.append(replace(e, features=features))
    a = [p.iteration_ns for p in predictor.predict_many(enc)]
    b = [p.iteration_ns for p in predictor.predict_many(shuffled)]
    assert a == pytest.approx(b, rel=1e-6)
    seen = fit(train, replace(config, ignore_features=())).predictor
    assert [p.iteration_ns for p in seen.predict_many(shuffled)] != pytest.approx(
        [p.iteration_ns for p in seen.predict_many(enc)], rel=1e-6
    )
    with pytest.raises(ValueError, match="no such feature columns"):
        fit(train, replace(config, ignore_features=("log_nothing",)))
