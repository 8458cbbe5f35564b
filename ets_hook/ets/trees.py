"""A per-op baseline beside the ETS models: gradient-boosted regression trees, numpy only.

Each op is predicted alone from its own feature row (no neighbours, no window), with the same
features (``ets.features``), target transform (``ets.targets.TargetScaler``) and calibration
(``ets.regressors.sum_factors``) as the learned models, so that comparing the two isolates what the
BiLSTM's context and learned representation add.

Contracts:
- ``BoostedTrees``: least-squares gradient boosting of depth-limited regression trees on
  histogram-binned features (quantile bin edges fitted on the training rows; a split sends
  ``x <= threshold`` left). Deterministic: no row or column sampling.
- ``TreePredictor``: one ``BoostedTrees`` per target (duration, gap) in target space; an
  iteration's time is the sum over its rows of the calibrated per-op predictions. It offers the
  ``predict_many`` / ``calibration`` interface ``ets.regressors.evaluate`` uses.
- Pure numpy; nothing is stored on disk (a benchmark baseline, not a shipped model kind).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .features import EncodedIteration, FeatureSchema
from .regressors import IterationPrediction, sum_factors
from .targets import TargetScaler

__all__ = ["BoostedTrees", "TreeConfig", "TreePredictor", "fit_tree_predictor"]


@dataclass(frozen=True, slots=True)
class TreeConfig:
    """Boosting hyperparameters.

    Attributes:
        n_trees: boosting rounds, >= 0.
        depth: maximum tree depth, >= 1.
        learning_rate: shrinkage of every tree's leaf values, in (0, 1].
        min_leaf: fewest training rows in a leaf, >= 1.
        l2: ridge penalty on leaf values (added to a leaf's row count), >= 0.
        bins: most histogram bins per feature, in [2, 255].
        target_transform: one of ``ets.targets.TARGET_TRANSFORMS`` except ``"measured"``.
        calibrate: scale predictions so their training sums match the measurements.
        ignore_features: names of feature columns the trees never see (read as 0).

    Raises:
        ValueError: a field outside the ranges above.
    """

    n_trees: int = 300
    depth: int = 6
    learning_rate: float = 0.1
    min_leaf: int = 5
    l2: float = 1.0
    bins: int = 64
    target_transform: str = "roofline"
    calibrate: bool = True
    ignore_features: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_trees < 0 or self.depth < 1 or self.min_leaf < 1:
            raise ValueError(
                f"n_trees must be >= 0, depth and min_leaf >= 1, got "
                f"{self.n_trees}, {self.depth}, {self.min_leaf}"
            )
        if not 0.0 < self.learning_rate <= 1.0:
            raise ValueError(f"learning_rate must be in (0, 1], got {self.learning_rate}")
        if self.l2 < 0:
            raise ValueError(f"l2 must be >= 0, got {self.l2}")
        if not 2 <= self.bins <= 255:
            raise ValueError(f"bins must be in [2, 255], got {self.bins}")


@dataclass(frozen=True, slots=True)
class BoostedTrees:
    """A fitted sum of regression trees, stored as complete binary trees in arrays.

    Node ``k``'s children are ``2k + 1`` (``x <= threshold``) and ``2k + 2``; a node whose
    ``feature`` is -1 is a leaf and holds its (shrunk) value.

    Attributes:
        base: the constant the trees add to (the training targets' mean).
        feature: [n_trees, n_nodes] int64 split feature, -1 at leaves.
        threshold: [n_trees, n_nodes] float64 split threshold.
        value: [n_trees, n_nodes] float64 leaf value (0 at internal nodes).
        depth: the trees' maximum depth.
    """

    base: float
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    depth: int

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, config: TreeConfig = TreeConfig()) -> BoostedTrees:
        """Fit on rows ``x`` [n, F] and targets ``y`` [n] (least squares).

        Args:
            x: [n, F] feature rows; non-finite values are treated as 0.
            y: [n] finite targets.
            config: the hyperparameters.

        Returns:
            The fitted ensemble (only ``base`` when n = 0 or ``n_trees`` = 0).

        Raises:
            ValueError: ``x`` is not [n, F] with n = len(y), or ``y`` has a non-finite value.
        """
        x = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        y = np.asarray(y, dtype=np.float64)
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise ValueError(f"x must be [n, F] and y [n], got {x.shape} and {y.shape}")
        if not np.isfinite(y).all():
            raise ValueError("targets must be finite")
        n_nodes = 2 ** (config.depth + 1) - 1
        base = float(y.mean()) if y.size else 0.0
        rounds = config.n_trees if y.size else 0
        feature = np.full((rounds, n_nodes), -1, dtype=np.int64)
        threshold = np.zeros((rounds, n_nodes))
        value = np.zeros((rounds, n_nodes))
        if rounds == 0:
            return cls(base, feature, threshold, value, config.depth)
        binned, edges = _bin(x, config.bins)
        residual = y - base
        for t in range(rounds):
            leaf_of_row = _grow(binned, edges, residual, config, feature[t], threshold[t], value[t])
            residual -= value[t][leaf_of_row]
        return cls(base, feature, threshold, value, config.depth)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predictions for rows ``x`` [n, F] → float64 [n] (non-finite features as 0)."""
        x = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        out = np.full(x.shape[0], self.base)
        rows = np.arange(x.shape[0])
        for t in range(self.feature.shape[0]):
            node = np.zeros(x.shape[0], dtype=np.int64)
            for _ in range(self.depth):
                f = self.feature[t, node]
                inner = f >= 0
                right = x[rows, np.where(inner, f, 0)] > self.threshold[t, node]
                node = np.where(inner, 2 * node + 1 + right, node)
            out += self.value[t, node]
        return out


def _bin(x: np.ndarray, bins: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Quantile bin index per value (uint8 [n, F]) and per feature the upper bin edges."""
    binned = np.zeros(x.shape, dtype=np.uint8)
    edges: list[np.ndarray] = []
    for j in range(x.shape[1]):
        distinct = np.unique(x[:, j])
        if distinct.size <= bins:
            cut = (distinct[:-1] + distinct[1:]) / 2.0
        else:
            cut = np.unique(np.quantile(x[:, j], np.linspace(0, 1, bins + 1)[1:-1]))
        # bin b holds values in (cut[b-1], cut[b]]; a split after bin b uses threshold cut[b]
        binned[:, j] = np.searchsorted(cut, x[:, j], side="left")
        edges.append(cut)
    return binned, edges


def _grow(
    binned: np.ndarray,
    edges: list[np.ndarray],
    residual: np.ndarray,
    config: TreeConfig,
    feature: np.ndarray,
    threshold: np.ndarray,
    value: np.ndarray,
) -> np.ndarray:
    """Grow one tree level by level into the given node arrays; returns each row's leaf."""
    n, n_features = binned.shape
    n_bins = max((len(e) + 1 for e in edges), default=1)
    node = np.zeros(n, dtype=np.int64)
    lam, min_leaf = config.l2, config.min_leaf
    offsets = np.arange(n_features, dtype=np.int64) * n_bins
    flat_bins = binned.astype(np.int64) + offsets  # [n, F] column-offset bin ids
    active = np.ones(n, dtype=bool)  # rows whose node may still split
    for level in range(config.depth):
        first = 2**level - 1
        rows = np.flatnonzero(active)
        if rows.size == 0:
            break
        local = node[rows] - first  # node index within the level
        n_level = 2**level
        keys = (local[:, None] * (n_features * n_bins) + flat_bins[rows]).ravel()
        size = n_level * n_features * n_bins
        grad = np.bincount(keys, weights=np.repeat(residual[rows], n_features), minlength=size)
        count = np.bincount(keys, minlength=size).astype(np.float64)
        grad = grad.reshape(n_level, n_features, n_bins).cumsum(axis=2)
        count = count.reshape(n_level, n_features, n_bins).cumsum(axis=2)
        g_all, c_all = grad[:, :1, -1:], count[:, :1, -1:]
        g_right, c_right = g_all - grad, c_all - count
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = grad**2 / (count + lam) + g_right**2 / (c_right + lam) - g_all**2 / (c_all + lam)
        ok = (count >= min_leaf) & (c_right >= min_leaf)
        for j, e in enumerate(edges):
            ok[:, j, len(e) :] = False  # no split after a feature's last bin
        gain = np.where(ok, gain, -np.inf)
        best = gain.reshape(n_level, -1).argmax(axis=1)
        best_gain = gain.reshape(n_level, -1)[np.arange(n_level), best]
        split = np.isfinite(best_gain) & (best_gain > 1e-12)
        best_feature, best_bin = np.divmod(best, n_bins)
        for k in np.flatnonzero(split):
            feature[first + k] = best_feature[k]
            threshold[first + k] = edges[best_feature[k]][best_bin[k]]
        row_split = split[local]
        moved = rows[row_split]
        go_right = binned[moved, best_feature[local[row_split]]] > best_bin[local[row_split]]
        node[moved] = 2 * node[moved] + 1 + go_right
        active[rows[~row_split]] = False
    leaf = node
    sums = np.bincount(leaf, weights=residual, minlength=feature.size)
    counts = np.bincount(leaf, minlength=feature.size)
    values = config.learning_rate * sums / np.maximum(counts + lam, 1e-12)
    value[:] = np.where((counts > 0) & (feature < 0), values, 0.0)
    return leaf


@dataclass(slots=True)
class TreePredictor:
    """Per-op boosted trees for (duration, gap), used like ``ets.regressors.Predictor``.

    Attributes:
        schema: the feature layout the trees read.
        target_scaler: maps tree outputs back to ns.
        trees: (duration trees, gap trees), in target space.
        calibration: positive multipliers of the predicted (duration, gap).
        ignored: feature columns the trees read as 0.
        training: facts about the fit (config, rows, seconds).
    """

    schema: FeatureSchema
    target_scaler: TargetScaler
    trees: tuple[BoostedTrees, BoostedTrees]
    calibration: tuple[float, float] = (1.0, 1.0)
    ignored: tuple[int, ...] = ()
    training: dict[str, Any] = field(default_factory=dict)

    def tree_inputs(self, features: np.ndarray) -> np.ndarray:
        """The rows the trees read: ``features`` with the ignored columns set to 0."""
        return _zeroed(features, self.ignored) if self.ignored else features

    def predict_ops(self, features: np.ndarray) -> np.ndarray:
        """Calibrated per-op (duration, gap) ns for unscaled rows [n, F] → float64 [n, 2]."""
        if not len(features):
            return np.zeros((0, 2))
        x = self.tree_inputs(features)
        z = np.stack([t.predict(x) for t in self.trees], axis=1)
        # the target scaler reads the unscaled FLOPs / bytes columns (never ignored)
        return self.target_scaler.inverse(z, features) * np.asarray(self.calibration)

    def predict_many(self, encoded: Sequence[EncodedIteration]) -> list[IterationPrediction]:
        """One prediction per encoded iteration (``Predictor.predict_many``'s contract).

        Args:
            encoded: iterations encoded with this predictor's schema.

        Returns:
            Per iteration, the per-op predictions (ns); empty for no iterations.
        """
        if not encoded:
            return []
        y = self.predict_ops(np.concatenate([e.features for e in encoded]))
        out: list[IterationPrediction] = []
        offset = 0
        for e in encoded:
            part = y[offset : offset + e.n_ops]
            offset += e.n_ops
            out.append(IterationPrediction(part[:, 0], part[:, 1], e.op_indices))
        return out


def _zeroed(features: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """A float64 copy of ``features`` with ``columns`` set to 0."""
    out = np.array(features, dtype=np.float64)
    out[:, list(columns)] = 0.0
    return out


def fit_tree_predictor(
    encoded: Sequence[EncodedIteration], schema: FeatureSchema, config: TreeConfig = TreeConfig()
) -> TreePredictor:
    """Fit the per-op tree baseline on encoded training iterations.

    Args:
        encoded: the training iterations (rows with an unknown target are left out).
        schema: their feature schema.
        config: the hyperparameters.

    Returns:
        The predictor, calibrated on ``encoded`` when ``config.calibrate``.

    Raises:
        ValueError: no iterations, a feature count that differs from the schema's, an
            unknown target transform, or an ignored feature the schema lacks.
    """
    if not encoded:
        raise ValueError("no training iterations")
    ignored = schema.column_indices(config.ignore_features, "ignore_features")
    for e in encoded:
        if e.features.shape[1] != schema.n_features:
            raise ValueError(
                f"{e.label}: {e.features.shape[1]} features, schema has {schema.n_features}"
            )
    started = time.perf_counter()
    rows = np.concatenate([e.features for e in encoded])
    targets = np.concatenate([e.targets_ns for e in encoded])
    scaler = schema.fit_target_scaler(targets, config.target_transform, rows)
    known = np.isfinite(targets).all(axis=1)
    z = scaler.transform(targets[known], rows[known]).astype(np.float64)
    x = _zeroed(rows[known], ignored)
    trees = (BoostedTrees.fit(x, z[:, 0], config), BoostedTrees.fit(x, z[:, 1], config))
    predictor = TreePredictor(schema, scaler, trees, ignored=ignored)
    if config.calibrate:
        predictor.calibration = sum_factors(predictor.predict_ops(rows), targets)
    predictor.training = {
        "config": dataclasses.asdict(config),
        "train_rows": int(known.sum()),
        "seconds": time.perf_counter() - started,
    }
    return predictor
