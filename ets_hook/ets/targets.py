"""ETS per-row targets (duration, gap) and their scaling for the regressors.

On CUDA traces a row's duration is its summed kernel time ``kernel_duration_ns`` and its gap the
time to the next op's first kernel ``gap_ns`` (unknown: NaN; an op that launched no kernel has
duration 0 and, unless its own gap is known, gap 0); on CPU traces the op's own host times
(``host_targets``). The measured iteration time is the sum over rows of duration + gap.
``TargetScaler`` maps targets to and from the space the regressors are trained in
(``TARGET_TRANSFORMS``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trace.events import IterationTrace, Trace

# ---------------------------------------------------------------------------------------------
# targets


def iteration_targets(trace: Trace, iteration: IterationTrace, rows: Sequence[int]) -> np.ndarray:
    """The (duration, gap) targets of the given rows (module docs).

    Args:
        trace: the iteration's trace; ``trace.device.kind == "cuda"`` selects the GPU targets
            (kernel times), anything else the host ones (``host_targets``).
        iteration: the step whose ops ``rows`` index.
        rows: indices into ``iteration.ops`` (``ets.rows.ets_rows``).

    Returns:
        float64 [len(rows), 2] (duration_ns, gap_ns); NaN where unknown (on a CUDA trace
        without kernel times: every row).
    """
    ops = iteration.ops
    out = np.full((len(rows), 2), np.nan)
    if trace.device.kind == "cuda":
        for k, i in enumerate(rows):
            op = ops[i]
            if op.kernel_duration_ns >= 0:
                out[k, 0] = op.kernel_duration_ns
                # an op that launched nothing adds no device time: its host time lies inside
                # the previous launching op's gap
                if op.gap_ns >= 0 or op.kernel_count == 0:
                    out[k, 1] = max(op.gap_ns, 0)
        return out
    return host_targets(iteration, rows)


def host_targets(iteration: IterationTrace, rows: Sequence[int]) -> np.ndarray:
    """[len(rows), 2] float64 (duration_ns, gap_ns) of each row op on the host clock.

    Args:
        iteration: the step whose ops ``rows`` index.
        rows: indices into ``iteration.ops`` (``ets.rows.ets_rows``), in start order.

    Returns:
        The op's own ``duration_ns`` and ``gap_ns``; where the gap is unknown (-1), the time to
        the next row op on the same thread (the last one on a thread: to the iteration's end),
        clipped at 0; NaN when neither is known.
    """
    ops = iteration.ops
    out = np.full((len(rows), 2), np.nan)
    next_start: dict[int, int] = {}  # thread → start of the next row op on it (walking back)
    for k in range(len(rows) - 1, -1, -1):
        op = ops[rows[k]]
        out[k, 0] = op.duration_ns
        if op.gap_ns >= 0:
            out[k, 1] = op.gap_ns
        else:
            following = next_start.get(op.thread)
            if following is not None:
                out[k, 1] = max(0, following - op.end_ns)
            elif iteration.end_ns > 0:
                out[k, 1] = max(0, iteration.end_ns - op.end_ns)
        next_start[op.thread] = op.start_ns
    return out


TARGET_TRANSFORMS = ("standard", "log", "roofline", "measured")
Z_MARGIN = 1.0  # model outputs are clamped to the training targets' range ± this many stds


@dataclass(frozen=True, slots=True)
class TargetScaler:
    """(duration, gap) ns ↔ model space, standardised with statistics of the training targets.

    - ``"standard"`` (the paper): ``(y - mean) / std``.
    - ``"log"``: ``log1p(y / 1 µs)``, then standardised.
    - ``"roofline"``: the gap as in ``"log"``; the duration as the log ratio to an analytic prior
      ``prior = max(flops / flops_per_ns, bytes / bytes_per_ns) + floor_ns`` computed from the
      row's own FLOPs and bytes features: ``log((y + floor_ns) / prior)``, then standardised. The
      throughputs are high percentiles of the training ops' FLOPs and bytes per ns, ``floor_ns``
      a low percentile of their durations. The model then learns a bounded efficiency factor,
      so an op far larger than any seen in training still scales with its work (an LSTM's
      output is bounded; a raw-time target cannot extrapolate).
    - ``"measured"``: both targets as log ratios to the op's own early measured time (the
      schema's measured features): ``log((y + floor_ns) / (early + floor_ns))``, standardised.
      The model learns how an op's time changes from the early steps to the steady state.

    ``transform`` / ``inverse`` take the row's unscaled features (needed by ``"roofline"``).
    ``inverse`` first clamps model outputs to the training targets' range widened by
    ``Z_MARGIN`` standard deviations (a model far outside its training data must not predict
    e^50), then clips at 0 ns.

    Attributes:
        transform_kind: one of ``TARGET_TRANSFORMS``.
        mean: [2] mean of the pre-standardisation targets (duration, gap).
        std: [2] their standard deviation (1 where it is ~0).
        flops_per_ns: ``"roofline"`` FLOPs throughput (inf: unused).
        bytes_per_ns: ``"roofline"`` bytes throughput (inf: unused).
        floor_ns: additive floor of the ratio transforms, ns.
        flops_col: column of ``log_flops`` in the feature rows (``"roofline"``); -1: none.
        bytes_col: column of ``log_bytes`` (``"roofline"``); -1: none.
        measured_cols: columns of the early (duration, gap) features (``"measured"``).
        z_min: per-target lower clamp of model outputs in ``inverse``.
        z_max: per-target upper clamp.

    Raises:
        ValueError: an unknown ``transform_kind``, or a ``"roofline"`` / ``"measured"`` scaler
            without its columns.
    """

    transform_kind: str
    mean: np.ndarray
    std: np.ndarray
    flops_per_ns: float = math.inf
    bytes_per_ns: float = math.inf
    floor_ns: float = 1000.0
    flops_col: int = -1
    bytes_col: int = -1
    measured_cols: tuple[int, int] = (-1, -1)
    z_min: tuple[float, float] = (-math.inf, -math.inf)
    z_max: tuple[float, float] = (math.inf, math.inf)

    def __post_init__(self) -> None:
        if self.transform_kind not in TARGET_TRANSFORMS:
            raise ValueError(
                f"target transform must be one of {TARGET_TRANSFORMS}, got {self.transform_kind!r}"
            )
        if self.transform_kind == "roofline" and min(self.flops_col, self.bytes_col) < 0:
            raise ValueError("a roofline target transform needs the FLOPs and bytes columns")
        if self.transform_kind == "measured" and min(self.measured_cols) < 0:
            raise ValueError("a measured target transform needs the measured-feature columns")

    def prior_ns(self, features: np.ndarray) -> np.ndarray:
        """The analytic duration prior of each row (``"roofline"`` only).

        Args:
            features: [n, F] unscaled feature rows (log1p FLOPs and bytes columns).

        Returns:
            float64 [n] prior durations, ns.
        """
        flops = np.expm1(features[:, self.flops_col].astype(np.float64))
        moved = np.expm1(features[:, self.bytes_col].astype(np.float64))
        return np.maximum(flops / self.flops_per_ns, moved / self.bytes_per_ns) + self.floor_ns

    def early_ns(self, features: np.ndarray) -> np.ndarray:
        """The early measured (duration, gap) of each row (``"measured"`` only).

        Args:
            features: [n, F] unscaled feature rows (measured columns hold log1p(µs)).

        Returns:
            float64 [n, 2] early times, ns.
        """
        cols = list(self.measured_cols)
        return np.expm1(features[:, cols].astype(np.float64)) * 1e3

    def _pre(self, y_ns: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        if self.transform_kind == "standard":
            return y_ns
        if self.transform_kind == "measured":
            if features is None:
                raise ValueError("the measured target transform needs the feature rows")
            base = self.early_ns(features) + self.floor_ns
            return np.log((np.maximum(y_ns, 0.0) + self.floor_ns) / base)
        u = np.log1p(np.maximum(y_ns, 0.0) / 1e3)
        if self.transform_kind == "roofline":
            if features is None:
                raise ValueError("the roofline target transform needs the feature rows")
            u = u.copy()
            u[:, 0] = np.log(
                (np.maximum(y_ns[:, 0], 0.0) + self.floor_ns) / self.prior_ns(features)
            )
        return u

    @classmethod
    def fit(
        cls,
        targets_ns: np.ndarray,
        kind: str = "standard",
        features: np.ndarray | None = None,
        *,
        flops_col: int = -1,
        bytes_col: int = -1,
        measured_cols: tuple[int, int] = (-1, -1),
    ) -> TargetScaler:
        """Fit a scaler on training rows; rows with a non-finite target are ignored.

        Args:
            targets_ns: [n, 2] (duration, gap) ns.
            kind: one of ``TARGET_TRANSFORMS``.
            features: [n, F] unscaled feature rows aligned with ``targets_ns``; needed by
                ``"roofline"`` and ``"measured"``.
            flops_col: column of ``log_flops`` (``"roofline"``).
            bytes_col: column of ``log_bytes`` (``"roofline"``).
            measured_cols: columns of the early (duration, gap) features (``"measured"``).

        Returns:
            The fitted scaler. Without known rows: mean 0, std 1 and no output clamping.

        Raises:
            ValueError: an unknown ``kind``, or ``"roofline"`` / ``"measured"`` without
                ``features`` or their columns.
        """
        if kind not in TARGET_TRANSFORMS:
            raise ValueError(f"target transform must be one of {TARGET_TRANSFORMS}, got {kind!r}")
        known = np.isfinite(targets_ns).all(axis=1)
        extra: dict[str, Any] = {}
        if kind == "measured":
            if features is None or min(measured_cols) < 0:
                raise ValueError("a measured target transform needs features and their columns")
            extra = {"measured_cols": (int(measured_cols[0]), int(measured_cols[1]))}
        if kind == "roofline":
            if features is None or min(flops_col, bytes_col) < 0:
                raise ValueError("a roofline target transform needs features and their columns")
            y = targets_ns[known, 0]
            flops = np.expm1(features[known, flops_col].astype(np.float64))
            moved = np.expm1(features[known, bytes_col].astype(np.float64))

            def rate(work: np.ndarray) -> float:
                ok = (work > 0) & (y > 0)
                return float(np.quantile(work[ok] / y[ok], 0.9)) if ok.any() else math.inf

            positive = y[y > 0]
            extra = {
                "flops_per_ns": rate(flops),
                "bytes_per_ns": rate(moved),
                "floor_ns": float(max(np.quantile(positive, 0.1), 1.0)) if positive.size else 1e3,
                "flops_col": flops_col,
                "bytes_col": bytes_col,
            }
        probe = cls(kind, np.zeros(2), np.ones(2), **extra)
        z = probe._pre(targets_ns[known], None if features is None else features[known])
        mean = z.mean(axis=0) if len(z) else np.zeros(2)
        std = np.where(z.std(axis=0) > 1e-12, z.std(axis=0), 1.0) if len(z) else np.ones(2)
        if len(z):
            lo = (z.min(axis=0) - mean) / std - Z_MARGIN
            hi = (z.max(axis=0) - mean) / std + Z_MARGIN
            extra["z_min"] = (float(lo[0]), float(lo[1]))
            extra["z_max"] = (float(hi[0]), float(hi[1]))
        return cls(kind, mean, std, **extra)

    def transform(self, targets_ns: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """Map targets to model space.

        Args:
            targets_ns: [n, 2] (duration, gap) ns; negative values count as 0 in all but
                ``"standard"``.
            features: [n, F] unscaled feature rows; needed by ``"roofline"`` and ``"measured"``.

        Returns:
            float32 [n, 2]; NaN where the target is NaN.

        Raises:
            ValueError: ``features`` is None for a ``"roofline"`` or ``"measured"`` scaler.
        """
        return ((self._pre(targets_ns, features) - self.mean) / self.std).astype(np.float32)

    def inverse(self, z: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """Map model outputs back to ns, clamped to ``[z_min, z_max]`` first.

        Args:
            z: [n, 2] model outputs.
            features: as ``transform``.

        Returns:
            float64 [n, 2] (duration, gap) ns, >= 0.

        Raises:
            ValueError: as ``transform``.
        """
        z = np.clip(np.asarray(z, dtype=np.float64), self.z_min, self.z_max)
        u = z * self.std + self.mean
        if self.transform_kind == "standard":
            return np.maximum(u, 0.0)
        if self.transform_kind == "measured":
            if features is None:
                raise ValueError("the measured target transform needs the feature rows")
            base = self.early_ns(features) + self.floor_ns
            return np.maximum(np.exp(np.minimum(u, 50.0)) * base - self.floor_ns, 0.0)
        y = np.expm1(np.minimum(u, 50.0)) * 1e3
        if self.transform_kind == "roofline":
            if features is None:
                raise ValueError("the roofline target transform needs the feature rows")
            y[:, 0] = np.exp(np.minimum(u[:, 0], 50.0)) * self.prior_ns(features) - self.floor_ns
        return np.maximum(y, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (infinite values as None), read back by ``from_dict``."""
        return {
            "transform": self.transform_kind,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "flops_per_ns": self.flops_per_ns if math.isfinite(self.flops_per_ns) else None,
            "bytes_per_ns": self.bytes_per_ns if math.isfinite(self.bytes_per_ns) else None,
            "floor_ns": self.floor_ns,
            "flops_col": self.flops_col,
            "bytes_col": self.bytes_col,
            "measured_cols": list(self.measured_cols),
            "z_min": [v if math.isfinite(v) else None for v in self.z_min],
            "z_max": [v if math.isfinite(v) else None for v in self.z_max],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetScaler:
        """Rebuild a scaler from ``to_dict`` output.

        Args:
            data: ``transform``, ``mean`` and ``std`` are required; the rest default.

        Returns:
            The scaler.

        Raises:
            KeyError: ``transform``, ``mean`` or ``std`` is missing.
            ValueError: invalid values (as the class, or unconvertible numbers).
        """

        def rate(key: str) -> float:
            value = data.get(key)
            return math.inf if value is None else float(value)

        return cls(
            str(data["transform"]),
            np.asarray(data["mean"], dtype=np.float64),
            np.asarray(data["std"], dtype=np.float64),
            flops_per_ns=rate("flops_per_ns"),
            bytes_per_ns=rate("bytes_per_ns"),
            floor_ns=float(data.get("floor_ns", 1000.0)),
            flops_col=int(data.get("flops_col", -1)),
            bytes_col=int(data.get("bytes_col", -1)),
            measured_cols=_column_pair(data.get("measured_cols")),
            z_min=_bounds(data.get("z_min"), -math.inf),
            z_max=_bounds(data.get("z_max"), math.inf),
        )


def _column_pair(values: Sequence[int] | None) -> tuple[int, int]:
    return (-1, -1) if not values else (int(values[0]), int(values[1]))


def _bounds(values: Sequence[float | None] | None, default: float) -> tuple[float, float]:
    if values is None:
        return (default, default)
    lo, hi = (default if v is None else float(v) for v in values)
    return (lo, hi)
