"""The per-op boosted-trees baseline: tree semantics, fitting, prediction and calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import write_ets_tree

from ets_hook.ets.features import encode_trace, fit_schema
from ets_hook.ets.regressors import evaluate
from ets_hook.ets.trees import BoostedTrees, TreeConfig, fit_tree_predictor
from ets_hook.trace.discovery import load_traces


def test_one_split_learns_a_step_exactly() -> None:
    x = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]])
    y = np.array([1.0, 1.0, 1.0, 5.0, 5.0, 5.0])
    config = TreeConfig(n_trees=1, depth=1, learning_rate=1.0, min_leaf=1, l2=0)
    trees = BoostedTrees.fit(x, y, config)
    assert trees.feature[0, 0] == 0 and trees.threshold[0, 0] == pytest.approx(2.5)
    assert trees.predict(x) == pytest.approx(y)
    # x <= threshold goes left
    assert trees.predict(np.array([[2.5], [2.6], [-10.0], [99.0]])) == pytest.approx([1, 5, 1, 5])


def test_boosting_fits_an_interaction_and_is_deterministic() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(2000, 4))
    y = np.where(x[:, 0] > 0, 2.0, -1.0) * (1 + (x[:, 1] > 0.5)) + 0.05 * rng.normal(size=2000)
    config = TreeConfig(n_trees=60, depth=3)
    a = BoostedTrees.fit(x, y, config)
    b = BoostedTrees.fit(x, y, config)
    assert np.array_equal(a.predict(x), b.predict(x))
    test = rng.uniform(-1, 1, size=(500, 4))
    truth = np.where(test[:, 0] > 0, 2.0, -1.0) * (1 + (test[:, 1] > 0.5))
    error = np.abs(a.predict(test) - truth)  # exact but near the bin straddling a step
    assert np.median(error) < 0.05 and np.mean(error < 0.2) > 0.9
    constant = BoostedTrees.fit(x, y, TreeConfig(n_trees=0))
    assert constant.predict(test) == pytest.approx(np.full(500, y.mean()))


def test_min_leaf_and_input_checks() -> None:
    x = np.arange(10.0)[:, None]
    y = np.r_[np.zeros(9), 100.0]
    trees = BoostedTrees.fit(x, y, TreeConfig(n_trees=1, depth=3, learning_rate=1.0, min_leaf=3))
    leaves = trees.feature[0] < 0
    assert np.all(np.bincount(_leaf_of(trees, x), minlength=leaves.size)[leaves] != 1)
    with pytest.raises(ValueError, match="finite"):
        BoostedTrees.fit(x, np.r_[y[:-1], np.nan])
    with pytest.raises(ValueError, match=r"\[n, F\]"):
        BoostedTrees.fit(x, y[:5])
    for bad in ({"depth": 0}, {"learning_rate": 0.0}, {"bins": 1}, {"l2": -1.0}):
        with pytest.raises(ValueError):
            TreeConfig(**bad)


def _leaf_of(trees: BoostedTrees, x: np.ndarray) -> np.ndarray:
    node = np.zeros(len(x), dtype=np.int64)
    for _ in range(trees.depth):
        f = trees.feature[0, node]
        inner = f >= 0
        right = x[np.arange(len(x)), np.where(inner, f, 0)] > trees.threshold[0, node]
        node = np.where(inner, 2 * node + 1 + right, node)
    return node


def test_tree_predictor_on_held_out_model(tmp_path: Path) -> None:
    traces = load_traces([write_ets_tree(tmp_path / "traces") / "T4"])
    train = [t for t in traces if t.metadata["model"] != "net_b"]
    test = [t for t in traces if t.metadata["model"] == "net_b"]
    schema = fit_schema(train)
    enc_train = [e for t in train for e in encode_trace(t, schema)]
    enc_test = [e for t in test for e in encode_trace(t, schema)]
    untrained = fit_tree_predictor(enc_train, schema, TreeConfig(n_trees=0, calibrate=False))
    predictor = fit_tree_predictor(enc_train, schema, TreeConfig(n_trees=50, depth=3, min_leaf=2))
    before, after = evaluate(untrained, enc_test).mre, evaluate(predictor, enc_test).mre
    assert after < 0.5 * before and after < 0.05, (before, after)
    # calibrated: the training sums match (factors inside their limits)
    preds = predictor.predict_many(enc_train)
    for k, name in enumerate(("duration_ns", "gap_ns")):
        if 0.25 < predictor.calibration[k] < 4.0:
            assert sum(getattr(p, name).sum() for p in preds) == pytest.approx(
                sum(e.targets_ns[:, k].sum() for e in enc_train), rel=1e-9
            )
    assert predictor.predict_many([]) == []
    # ignored features: the trees never read them
    blind = fit_tree_predictor(
        enc_train, schema, TreeConfig(n_trees=20, depth=3, ignore_features=("log_batch",))
    )
    col = schema.feature_names.index("log_batch")
    changed = [e.features.copy() for e in enc_test]
    for f in changed:
        f[:, col] += 5.0
    assert np.array_equal(
        blind.predict_ops(np.concatenate(changed)),
        blind.predict_ops(np.concatenate([e.features for e in enc_test])),
    )
    with pytest.raises(ValueError, match="no such feature columns"):
        fit_tree_predictor(enc_train, schema, TreeConfig(ignore_features=("nope",)))
    with pytest.raises(ValueError, match="no training"):
        fit_tree_predictor([], schema)
