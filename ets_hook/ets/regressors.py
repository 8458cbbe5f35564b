"""Numpy inference for ETS models and the two baselines, from a self-describing weights file.

Model kinds (all predict per-op (duration, gap) in target space; an iteration is the sum over its
real ops, padding never counted):
- ``"lstm"``: ETS (HPDC'24). Windows of ``width`` ops every ``stride`` ops; a bidirectional
  LSTM (``layers`` layers, ``hidden`` units per direction) and a per-step linear head with 2
  outputs; an op's prediction is the mean over the windows containing it.
- ``"mlp"``: the op-based baseline ("PerfNet"): each op alone (windows of width 1) through an MLP
  (ReLU hidden layers), summed.
- ``"grouping"``: a DNNPerf-like grouping baseline: the sequence is cut into non-overlapping
  groups of ``width`` ops (stride = width); inside a group the ops form a chain graph, and
  ``layers`` rounds of graph convolution (``h ← relu(h·Wself + mean(h_prev, h_next)·Wnbr + b)``,
  padding nodes neither send nor receive) after a linear embedding feed a per-op head. DNNPerf
  itself runs a GNN with node and edge (tensor) features over the model's dataflow graph; a trace
  holds no edges, so the op order stands in for them. Compared with ETS it has no overlapping
  windows (no context across group boundaries) and only ``layers``-hop local context instead of
  a bidirectional recurrence over the whole window.

Weights file: one ``.npz`` holding every parameter array (``m<member>/<name>``, float32) and a
JSON document under ``__metadata__``: format, feature schema (version, vocabulary), feature and
target scalers, model kind and hyperparameters, window parameters, training facts. Loading a file
written for another feature-schema version raises ``SchemaVersionError`` naming both versions.
Several members (an ensemble over seeds) are averaged in target space. Predicted durations and
gaps are multiplied by the model's ``calibration`` factors (fitted at training time).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError, SchemaVersionError
from ..trace.atomic import atomic_write_bytes
from ..trace.events import Trace
from ..trace.io import MAGIC as TRACE_MAGIC
from .features import (
    EncodedIteration,
    FeatureSchema,
    Standardizer,
    encode_trace,
    padding_row,
)
from .targets import TargetScaler
from .windows import aggregate_windows, build_windows

MODEL_FILE_FORMAT = "ets-hook-model"
MODEL_FILE_FORMAT_VERSION = 1
MODEL_KINDS = ("lstm", "mlp", "grouping")
_METADATA_KEY = "__metadata__"


# ---------------------------------------------------------------------------------------------
# numpy forward passes


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


# The LSTM is evaluated time-major with both directions fused: one GEMM per layer projects every
# step's input for both directions; each step does one stacked matmul for the two recurrences and
# one tanh over all gates, using sigmoid(x) = (1 + tanh(x / 2)) / 2 with the i, f, o rows of the
# weights pre-scaled by 1/2 (_prepare_lstm). The hidden state is carried doubled, H = 2h =
# (1 + tanh(o')) tanh(c), which saves a multiply per step: the weights that read it (w_hh, the
# next layer's w_ih, the head) are halved instead. Same function as torch's LSTM (gate order
# i, f, g, o; bias = bias_ih + bias_hh), in float32.


@dataclass(frozen=True, slots=True)
class _LSTMLayer:
    w_in: np.ndarray  # [In, 8H]: columns (direction, gate, unit); i/f/o columns halved
    b_in: np.ndarray  # [2, 4, 1, H]: the same order, broadcastable over the batch
    w_hh: np.ndarray  # [2, 4, H, H]: per direction and gate, H_in x H_out; i/f/o halved


def _prepare_lstm(p: Mapping[str, np.ndarray], layers: int) -> list[_LSTMLayer]:
    out: list[_LSTMLayer] = []
    for layer in range(layers):
        hidden = p[f"lstm.{layer}.fwd.w_hh"].shape[1]
        scale = np.full(4 * hidden, 0.5, dtype=np.float32)
        scale[2 * hidden : 3 * hidden] = 1.0  # the g gate keeps tanh
        w_in, b_in, w_hh = [], [], []
        input_scale = 1.0 if layer == 0 else 0.5  # layers above read the doubled state
        for d in ("fwd", "bwd"):
            w_in.append(p[f"lstm.{layer}.{d}.w_ih"] * scale[:, None] * input_scale)
            b_in.append(p[f"lstm.{layer}.{d}.b"] * scale)
            # [4H, H_in] -> [4, H_out, H_in] -> [4, H_in, H_out]
            w = p[f"lstm.{layer}.{d}.w_hh"] * scale[:, None] * 0.5
            w_hh.append(w.reshape(4, hidden, hidden).transpose(0, 2, 1))
        out.append(
            _LSTMLayer(
                np.ascontiguousarray(np.concatenate(w_in).T, dtype=np.float32),
                np.concatenate(b_in).astype(np.float32).reshape(2, 4, 1, hidden),
                np.ascontiguousarray(np.stack(w_hh), dtype=np.float32),
            )
        )
    return out


def _forward_lstm(
    layers: Sequence[_LSTMLayer], head_w: np.ndarray, head_b: np.ndarray, x: np.ndarray
) -> np.ndarray:
    """Bidirectional multi-layer LSTM + head over windows x [B, T, F] → [B, T, 2]."""
    batch, steps, _ = x.shape
    seq = np.ascontiguousarray(x.transpose(1, 0, 2))  # [T, B, In], time-major
    for layer in layers:
        hidden = layer.w_hh.shape[-1]
        xp = seq.reshape(steps * batch, -1) @ layer.w_in
        # gate-major [T, 2, 4, B, H] (one copy, bias added on the way): every gate's block of
        # the per-step arithmetic below is then contiguous
        xp = np.add(
            xp.reshape(steps, batch, 2, 4, hidden).transpose(0, 2, 3, 1, 4), layer.b_in[None]
        )
        h = np.zeros((2, 1, batch, hidden), dtype=np.float32)  # doubled hidden state 2h
        c = np.zeros((2, batch, hidden), dtype=np.float32)
        gates = np.empty((2, 4, batch, hidden), dtype=np.float32)
        out = np.empty((steps, batch, 2 * hidden), dtype=np.float32)
        ti, tf, tg, to = gates[:, 0], gates[:, 1], gates[:, 2], gates[:, 3]
        hv = h[:, 0]
        for s in range(steps):
            sb = steps - 1 - s  # the backward direction walks the window in reverse
            np.matmul(h, layer.w_hh, out=gates)
            gates[0] += xp[s, 0]
            gates[1] += xp[sb, 1]
            np.tanh(gates, out=gates)
            # c = f*c + i*g = ((1 + tf) * c + (1 + ti) * tg) / 2
            tf += 1.0
            c *= tf
            ti += 1.0
            ti *= tg
            c += ti
            c *= 0.5
            # 2h = 2 o tanh(c) = (1 + to) * tanh(c)
            np.tanh(c, out=hv)
            to += 1.0
            hv *= to
            out[s, :, :hidden] = hv[0]
            out[sb, :, hidden:] = hv[1]
        seq = out
    y = seq.reshape(steps * batch, -1) @ (0.5 * head_w.T) + head_b
    return np.ascontiguousarray(y.reshape(steps, batch, -1).transpose(1, 0, 2))


def _forward_mlp(p: Mapping[str, np.ndarray], x: np.ndarray, layers: int) -> np.ndarray:
    for layer in range(layers):
        x = np.maximum(x @ p[f"mlp.{layer}.w"].T + p[f"mlp.{layer}.b"], 0.0)
    return x @ p["head.w"].T + p["head.b"]


def _chain_neighbour_mean(h: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Mean of the previous and next real nodes' states in each window (zeros if none)."""
    hr = h * real[..., None]
    total = np.zeros_like(h)
    total[:, 1:] += hr[:, :-1]
    total[:, :-1] += hr[:, 1:]
    count = np.zeros(real.shape, dtype=h.dtype)
    count[:, 1:] += real[:, :-1]
    count[:, :-1] += real[:, 1:]
    return total / np.maximum(count, 1.0)[..., None]


def _forward_grouping(
    p: Mapping[str, np.ndarray], x: np.ndarray, layers: int, pad_col: int
) -> np.ndarray:
    real = (x[..., pad_col] < 0.5).astype(x.dtype)
    h = np.maximum(x @ p["embed.w"].T + p["embed.b"], 0.0)
    for layer in range(layers):
        nbr = _chain_neighbour_mean(h, real)
        h = np.maximum(
            h @ p[f"gcn.{layer}.w_self"].T + nbr @ p[f"gcn.{layer}.w_nbr"].T + p[f"gcn.{layer}.b"],
            0.0,
        )
    return h @ p["head.w"].T + p["head.b"]


# ---------------------------------------------------------------------------------------------
# predictions


@dataclass(frozen=True, slots=True)
class IterationPrediction:
    """Per-op and per-iteration predictions (nanoseconds) for one iteration.

    Attributes:
        duration_ns: [n] float64 predicted duration of each row op, ns.
        gap_ns: [n] float64 predicted gap after each row op, ns.
        op_indices: [n] int64 indices into ``IterationTrace.ops`` (empty when unknown).
    """

    duration_ns: np.ndarray
    gap_ns: np.ndarray
    op_indices: np.ndarray

    @property
    def iteration_ns(self) -> float:
        """Predicted iteration time: sum of durations and gaps, ns (0.0 without rows)."""
        return float(self.duration_ns.sum() + self.gap_ns.sum())

    @property
    def iteration_s(self) -> float:
        """``iteration_ns`` in seconds."""
        return self.iteration_ns / 1e9


@dataclass(slots=True)
class Predictor:
    """A trained model with everything needed to encode a trace and predict it, numpy only.

    Attributes:
        kind: one of ``MODEL_KINDS``.
        schema: the feature layout the model reads.
        feature_scaler: standardises the unscaled features.
        target_scaler: maps model outputs back to ns.
        width: ops per window (``"mlp"``: 1).
        stride: ops between window starts (``"mlp"``: 1; ``"grouping"``: ``width``).
        layers: LSTM / MLP hidden / graph-convolution layers.
        hidden: hidden units (per direction for the LSTM).
        members: one parameter dict per ensemble member (module docstring); converted in place
            to contiguous float32.
        training: training facts stored in the weights file (JSON-serialisable).
        calibration: positive multipliers of the predicted (duration, gap), fitted at training.

    Raises:
        ValueError: an unknown ``kind``, no ``members``, an ``"mlp"`` whose width/stride is not
            1/1, a ``"grouping"`` model with stride != width, or ``calibration`` not two
            finite positive factors.
    """

    kind: str
    schema: FeatureSchema
    feature_scaler: Standardizer
    target_scaler: TargetScaler
    width: int
    stride: int
    layers: int
    hidden: int
    members: list[dict[str, np.ndarray]]
    training: dict[str, Any] = field(default_factory=dict)
    calibration: tuple[float, float] = (1.0, 1.0)
    _lstm_cache: list[list[_LSTMLayer]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        if not self.members:
            raise ValueError("a predictor needs at least one member's parameters")
        if self.kind == "mlp" and (self.width, self.stride) != (1, 1):
            raise ValueError(
                f"an mlp model sees ops alone: width/stride must be 1/1, got "
                f"{self.width}/{self.stride}"
            )
        if len(self.calibration) != 2 or not all(
            math.isfinite(c) and c > 0 for c in self.calibration
        ):
            raise ValueError(f"calibration must be two positive factors, got {self.calibration}")
        self.calibration = (float(self.calibration[0]), float(self.calibration[1]))
        if self.kind == "grouping" and self.stride != self.width:
            raise ValueError(
                f"a grouping model needs stride == width, got {self.stride}/{self.width}"
            )
        for m in self.members:
            for k, v in m.items():
                m[k] = np.ascontiguousarray(v, dtype=np.float32)

    # -- raw model ------------------------------------------------------------------------------
    def forward_windows(self, windows: np.ndarray) -> np.ndarray:
        """Run the model on scaled windows, averaging the ensemble members.

        Args:
            windows: [m, width, F] scaled windows (``windows_for``); m may be 0.

        Returns:
            float32 [m, width, 2] outputs in target space.

        Raises:
            ValueError: ``windows`` is not [m, width, F].
            KeyError: a member lacks a parameter the model kind needs.
        """
        x = np.asarray(windows, dtype=np.float32)
        if x.ndim != 3 or x.shape[1:] != (self.width, self.schema.n_features):
            raise ValueError(
                f"windows must be [m, {self.width}, {self.schema.n_features}], got {x.shape}"
            )
        if x.shape[0] == 0:
            return np.zeros((0, self.width, 2), dtype=np.float32)
        total = np.zeros((x.shape[0], self.width, 2), dtype=np.float32)
        if self.kind == "lstm" and self._lstm_cache is None:
            self._lstm_cache = [_prepare_lstm(p, self.layers) for p in self.members]
        for j, p in enumerate(self.members):
            if self.kind == "lstm":
                assert self._lstm_cache is not None
                total += _forward_lstm(self._lstm_cache[j], p["head.w"], p["head.b"], x)
            elif self.kind == "mlp":
                total += _forward_mlp(p, x, self.layers)
            else:
                total += _forward_grouping(p, x, self.layers, self.schema.padding_column)
        return total / len(self.members)

    # -- encoded data ---------------------------------------------------------------------------
    def windows_for(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scaled windows and their index for one iteration's unscaled feature rows.

        Args:
            features: [n, F] unscaled feature rows.

        Returns:
            ``(windows, index)`` as ``ets.windows.build_windows``: float32 [n_windows, width, F]
            and int64 [n_windows, width].

        Raises:
            ValueError: the predictor's width/stride are invalid (``ets.windows``).
        """
        scaled = self.feature_scaler.transform(features)
        return build_windows(scaled, self.width, self.stride, padding_row(self.schema))

    def predict_encoded(self, encoded: EncodedIteration) -> IterationPrediction:
        """Predict one encoded iteration (calibrated, ns); raises as ``forward_windows``."""
        windows, index = self.windows_for(encoded.features)
        z = aggregate_windows(self.forward_windows(windows), index, encoded.n_ops)
        y = self.to_ns(z, encoded.features)
        return IterationPrediction(y[:, 0], y[:, 1], encoded.op_indices)

    def to_ns(self, z: np.ndarray, features: np.ndarray) -> np.ndarray:
        """Map per-op model outputs to calibrated (duration, gap) ns.

        Args:
            z: [n, 2] outputs in target space.
            features: [n, F] the rows' unscaled features (for the target scaler).

        Returns:
            float64 [n, 2] ns, >= 0.
        """
        if not len(z):
            return np.zeros((0, 2))
        return self.target_scaler.inverse(z, features) * np.asarray(self.calibration)

    def predict_many(self, encoded: Sequence[EncodedIteration]) -> list[IterationPrediction]:
        """Like ``predict_encoded`` per iteration, with one batched forward pass for all.

        Args:
            encoded: iterations encoded with this predictor's schema.

        Returns:
            One prediction per iteration, in order; empty for no iterations.
        """
        parts = [self.windows_for(e.features) for e in encoded]
        if not parts:
            return []
        z_all = self.forward_windows(np.concatenate([w for w, _ in parts]))
        out: list[IterationPrediction] = []
        offset = 0
        for e, (w, index) in zip(encoded, parts, strict=True):
            z = aggregate_windows(z_all[offset : offset + len(w)], index, e.n_ops)
            offset += len(w)
            y = self.to_ns(z, e.features)
            out.append(IterationPrediction(y[:, 0], y[:, 1], e.op_indices))
        return out

    def encode(self, trace: Trace) -> list[EncodedIteration]:
        """Every iteration of ``trace`` encoded with this model's schema (``encode_trace``)."""
        return encode_trace(trace, self.schema)

    # -- persistence ----------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """The JSON document stored under ``__metadata__`` in the weights file."""
        return {
            "format": MODEL_FILE_FORMAT,
            "format_version": MODEL_FILE_FORMAT_VERSION,
            "schema": self.schema.to_dict(),
            "feature_scaler": self.feature_scaler.to_dict(),
            "target_scaler": self.target_scaler.to_dict(),
            "model": {
                "kind": self.kind,
                "width": self.width,
                "stride": self.stride,
                "layers": self.layers,
                "hidden": self.hidden,
                "members": len(self.members),
                "calibration": list(self.calibration),
            },
            "training": self.training,
        }

    def save(self, path: Path | str) -> Path:
        """Write the weights file atomically (a temp file renamed onto it: a reader never sees
        a partial file, an existing one is replaced whole), creating its folder.

        Args:
            path: the target; ``.npz`` is appended when its suffix is not exactly ``.npz``.

        Returns:
            The path written.

        Raises:
            TypeError: ``training`` is not JSON-serialisable.
            OSError: the file cannot be written.
        """
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        arrays = {f"m{j}/{k}": v for j, m in enumerate(self.members) for k, v in m.items()}
        arrays[_METADATA_KEY] = np.array(json.dumps(self.metadata(), sort_keys=True))
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue())
        return path

    @classmethod
    def load(cls, path: Path | str) -> Predictor:
        """Read a weights file written by ``save``.

        Args:
            path: the ``.npz`` file.

        Returns:
            The predictor.

        Raises:
            ModelFileError: the file is missing, is not a ``.npz`` archive (another file: an
                ``.ets`` trace, a ``.npy`` array, a pickle, ... named as such) or not a readable
                one, has no metadata, has another ``format``, or holds an entry not named
                ``m.../<name>``.
            SchemaVersionError: its feature schema version differs from this code's.
            ValueError: invalid metadata (malformed JSON, schema, scalers or model fields) or
                a member entry whose number is not an int.
            KeyError: a required metadata entry is missing.
            IndexError: a member number beyond the declared member count.
        """
        path = Path(path)
        _check_weights_file_start(path)
        try:
            with np.load(path, allow_pickle=False) as npz:
                files = {k: npz[k] for k in npz.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ModelFileError(f"{path}: not a readable .npz weights file ({exc})") from exc
        if _METADATA_KEY not in files:
            raise ModelFileError(f"{path}: no {_METADATA_KEY} entry: not an ets-hook model")
        meta = json.loads(str(files.pop(_METADATA_KEY)))
        if meta.get("format") != MODEL_FILE_FORMAT:
            raise ModelFileError(
                f"{path}: format {meta.get('format')!r} is not {MODEL_FILE_FORMAT}"
            )
        schema_meta = meta.get("schema", {})
        found = schema_meta.get("version")
        from .features import FEATURE_SCHEMA_VERSION

        if found != FEATURE_SCHEMA_VERSION:
            raise SchemaVersionError(found, FEATURE_SCHEMA_VERSION, source=str(path))
        model = meta["model"]
        members: list[dict[str, np.ndarray]] = [{} for _ in range(int(model["members"]))]
        for key, value in files.items():
            prefix, _, name = key.partition("/")
            if not prefix.startswith("m") or not name:
                raise ModelFileError(f"{path}: unexpected entry {key!r}")
            members[int(prefix[1:])][name] = value
        return cls(
            kind=model["kind"],
            schema=FeatureSchema.from_dict(schema_meta, source=str(path)),
            feature_scaler=Standardizer.from_dict(meta["feature_scaler"]),
            target_scaler=TargetScaler.from_dict(meta["target_scaler"]),
            width=int(model["width"]),
            stride=int(model["stride"]),
            layers=int(model["layers"]),
            hidden=int(model["hidden"]),
            members=members,
            training=dict(meta.get("training", {})),
            calibration=tuple(model.get("calibration", (1.0, 1.0))),
        )


#: How a ``.npz`` archive starts: a zip file's local file header.
_ZIP_MAGIC = b"PK\x03\x04"
#: What a file that is not a ``.npz`` archive is, by how it starts (said in the error).
_OTHER_FILES = (
    (TRACE_MAGIC, "an ets-hook trace (.ets)"),
    (b"\x93NUMPY", "a single numpy array (.npy)"),
    (b"\x80", "a Python pickle (a torch checkpoint?)"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"{", "JSON text"),
)


def _check_weights_file_start(path: Path) -> None:
    """Refuse a file that is not a ``.npz`` archive before ``np.load`` reads it: numpy would
    take it for a pickle and suggest ``allow_pickle=``, which is no help here.

    Raises:
        ModelFileError: naming the file, saying it is not an ets-hook weights file and, where
            its first bytes tell, what it is. (A missing or unreadable file is left to
            ``np.load``.)
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_ZIP_MAGIC))
    except OSError:
        return
    if head == _ZIP_MAGIC:
        return
    if not head:
        what = "the file is empty"
    else:
        kind = next((kind for magic, kind in _OTHER_FILES if head.startswith(magic[:4])), "")
        what = f"it is {kind}" if kind else "not a .npz archive"
    raise ModelFileError(
        f"{path}: not an ets-hook weights file: {what}; pass the .npz that ets-hook train writes"
    )


# ---------------------------------------------------------------------------------------------
# evaluation


def mre(measured: Sequence[float] | np.ndarray, predicted: Sequence[float] | np.ndarray) -> float:
    """Mean relative error mean(|y - ŷ| / y), the measurement in the denominator.

    Args:
        measured: y, > 0.
        predicted: ŷ, the same shape.

    Returns:
        The MRE (a fraction, not %); NaN for empty input.

    Raises:
        ValueError: the shapes differ, or a measurement is <= 0.
    """
    y = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if y.shape != p.shape:
        raise ValueError(f"measured {y.shape} and predicted {p.shape} differ in shape")
    if (y <= 0).any():
        raise ValueError("measurements must be > 0 for a relative error")
    return float(np.mean(np.abs(y - p) / y)) if y.size else float("nan")


def sum_factors(
    predicted_ns: np.ndarray,
    targets_ns: np.ndarray,
    limits: tuple[float, float] = (0.25, 4.0),
) -> tuple[float, float]:
    """Per-target factors Σ y / Σ ŷ over the rows whose targets are both known, clipped.

    Args:
        predicted_ns: [n, 2] predicted (duration, gap), ns.
        targets_ns: [n, 2] measured (duration, gap), ns; rows with a NaN are left out.
        limits: (lowest, highest) factor.

    Returns:
        (duration factor, gap factor); 1.0 for a target whose sums are not both positive.

    Raises:
        ValueError: the shapes differ or are not [n, 2].
    """
    if predicted_ns.shape != targets_ns.shape or predicted_ns.shape[-1:] != (2,):
        raise ValueError(
            f"shapes must be equal [n, 2], got {predicted_ns.shape} and {targets_ns.shape}"
        )
    known = np.isfinite(targets_ns).all(axis=1)
    predicted = predicted_ns[known].sum(axis=0)
    measured = targets_ns[known].sum(axis=0)
    factors = [
        float(np.clip(m / q, *limits)) if q > 0 and m > 0 else 1.0
        for m, q in zip(measured, predicted, strict=True)
    ]
    return (factors[0], factors[1])


def rmse_ms(
    measured_ns: Sequence[float] | np.ndarray, predicted_ns: Sequence[float] | np.ndarray
) -> float:
    """Root mean square error in milliseconds of nanosecond inputs.

    Args:
        measured_ns: measured times, ns.
        predicted_ns: predicted times, ns, the same shape.

    Returns:
        The RMSE, ms; NaN for empty input.

    Raises:
        ValueError: the shapes differ.
    """
    y = np.asarray(measured_ns, dtype=np.float64)
    p = np.asarray(predicted_ns, dtype=np.float64)
    if y.shape != p.shape:
        raise ValueError(f"measured {y.shape} and predicted {p.shape} differ in shape")
    return float(np.sqrt(np.mean((y - p) ** 2)) / 1e6) if y.size else float("nan")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Per-iteration measured and predicted times, with summary metrics.

    Attributes:
        labels: the evaluated iterations' labels.
        groups: their groups (model names), aligned with ``labels``.
        measured_ns: [n] float64 measured iteration times, ns.
        predicted_ns: [n] float64 predicted iteration times, ns.
        skipped: labels of iterations without a complete, positive measurement.
    """

    labels: tuple[str, ...]
    groups: tuple[str, ...]
    measured_ns: np.ndarray
    predicted_ns: np.ndarray
    skipped: tuple[str, ...] = ()

    @property
    def mre(self) -> float:
        """Mean relative error over the iterations (``mre``); NaN without iterations."""
        return mre(self.measured_ns, self.predicted_ns)

    @property
    def rmse_ms(self) -> float:
        """RMSE over the iterations, ms (``rmse_ms``); NaN without iterations."""
        return rmse_ms(self.measured_ns, self.predicted_ns)

    def by_group(self) -> dict[str, dict[str, float]]:
        """Per model (group): iterations, MRE, RMSE (ms), mean measured and predicted (ms)."""
        table: dict[str, dict[str, float]] = {}
        groups = np.asarray(self.groups)
        for g in sorted(set(self.groups)):
            sel = groups == g
            y, p = self.measured_ns[sel], self.predicted_ns[sel]
            table[g] = {
                "iterations": int(sel.sum()),
                "mre": mre(y, p),
                "rmse_ms": rmse_ms(y, p),
                "measured_ms": float(y.mean() / 1e6),
                "predicted_ms": float(p.mean() / 1e6),
            }
        return table

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable report: metrics, per-model table and per-iteration times (ms)."""
        return {
            "mre": self.mre,
            "rmse_ms": self.rmse_ms,
            "iterations": len(self.labels),
            "skipped": list(self.skipped),
            "by_model": self.by_group(),
            "per_iteration": [
                {"label": lab, "model": g, "measured_ms": y / 1e6, "predicted_ms": p / 1e6}
                for lab, g, y, p in zip(
                    self.labels,
                    self.groups,
                    self.measured_ns.tolist(),
                    self.predicted_ns.tolist(),
                    strict=True,
                )
            ],
        }


def evaluate(predictor: Predictor, encoded: Sequence[EncodedIteration]) -> Evaluation:
    """Predict every iteration with a complete, positive measurement and compare.

    Args:
        predictor: the model.
        encoded: iterations encoded with the predictor's schema.

    Returns:
        The evaluation; iterations without rows or with an unknown or non-positive measured
        time are listed in ``skipped``.
    """
    ok = [e.n_ops > 0 and math.isfinite(e.measured_ns) and e.measured_ns > 0 for e in encoded]
    usable = [e for e, good in zip(encoded, ok, strict=True) if good]
    skipped = tuple(e.label for e, good in zip(encoded, ok, strict=True) if not good)
    preds = predictor.predict_many(usable)
    return Evaluation(
        labels=tuple(e.label for e in usable),
        groups=tuple(e.group for e in usable),
        measured_ns=np.array([e.measured_ns for e in usable], dtype=np.float64),
        predicted_ns=np.array([p.iteration_ns for p in preds], dtype=np.float64),
        skipped=skipped,
    )
