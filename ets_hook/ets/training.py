"""Training ETS models and baselines with torch; the result is a numpy ``Predictor``.

Contracts:
- Loss: L1 on standardised targets (duration, gap), over real ops only (padding slots and
  unknown targets are masked out). Adam, mini-batches of windows, seeded (``torch`` and
  ``numpy`` generators local to the run; global RNG state is not touched).
- Validation: a held-out part of the training data, by model (``EncodedIteration.group``,
  ``val_split="group"``, when there are at least 3 models) or by iteration (``"iteration"``:
  steadier when there are only a few models). Early stopping watches the validation
  iteration-time MRE of the predictions as the saved predictor makes them: with ``calibrate``,
  scaled by the calibration factors fitted on the training iterations at that same epoch (the
  factors the predictor gets if that epoch is kept). It keeps the best epoch's weights and stops
  after ``patience`` epochs without improvement. (Uncalibrated, the L1 loss's per-op medians sum
  to iteration times that fall further below the measurement as training proceeds, so an
  uncalibrated validation MRE rose from the first epochs on and stopped training near its start;
  the history keeps it as ``val_mre_raw``.)
- Feature clamping (``clamp_features=True``, off by default; on the grown paper sample it
  helps held-out families, README): standardised features are clamped to the training range
  ± ``clamp_margin`` standard deviations (``Standardizer``), at training and inference.
- Ignored features (``ignore_features``): named columns are fixed at 0 after scaling, at
  training and inference (``Standardizer``'s clamp bounds), without changing the schema.
- Calibration (``calibrate=True``): after training, the predicted durations and gaps are scaled
  so that their sums over the training iterations equal the measured sums
  (``calibration_factors``; a smearing correction of the L1 / log-space median bias).
- The torch modules here mirror the numpy forward passes of ``ets.regressors`` exactly;
  ``export_member`` turns their weights into a predictor member (numpy and torch agree to 1e-5).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ..trace.events import Trace
from .features import (
    DEFAULT_VOCAB_SIZE,
    EncodedIteration,
    FeatureSchema,
    Standardizer,
    encode_trace,
    fit_schema,
    padding_row,
)
from .regressors import MODEL_KINDS, Predictor, sum_factors
from .targets import TargetScaler
from .windows import DEFAULT_STRIDE, DEFAULT_WIDTH, aggregate_windows, build_windows

log = logging.getLogger(__name__)

_DEFAULT_LAYERS = {"lstm": 4, "mlp": 3, "grouping": 3}


# ---------------------------------------------------------------------------------------------
# torch modules (mirrors of the numpy forward passes in ets.regressors)


class LSTMNet(nn.Module):
    """Bidirectional LSTM over a window and a per-step linear head with 2 outputs."""

    def __init__(self, n_features: int, hidden: int, layers: int, dropout: float = 0.0) -> None:
        """Create the layers (weights freshly initialised).

        Args:
            n_features: F, the feature count.
            hidden: hidden units per direction.
            layers: stacked LSTM layers.
            dropout: dropout between LSTM layers (ignored for one layer).
        """
        super().__init__()
        self.lstm = nn.LSTM(
            n_features,
            hidden,
            num_layers=layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.head = nn.Linear(2 * hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Windows [B, T, F] → outputs [B, T, 2] in target space."""
        out, _ = self.lstm(x)
        return self.head(out)


class MLPNet(nn.Module):
    """Per-op MLP: ``layers`` ReLU layers of ``hidden`` units and a 2-output head."""

    def __init__(self, n_features: int, hidden: int, layers: int, dropout: float = 0.0) -> None:
        """Create the layers (weights freshly initialised).

        Args:
            n_features: F, the feature count.
            hidden: units per hidden layer.
            layers: hidden layers.
            dropout: dropout after each hidden layer (training only).
        """
        super().__init__()
        dims = [n_features] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dims[-1], 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rows [..., F] → outputs [..., 2] in target space."""
        for layer in self.layers:
            x = self.dropout(torch.relu(layer(x)))
        return self.head(x)


class GroupingNet(nn.Module):
    """Chain-graph convolution inside non-overlapping groups (``ets.regressors``)."""

    def __init__(
        self, n_features: int, hidden: int, layers: int, pad_col: int, dropout: float = 0.0
    ) -> None:
        """Create the layers (weights freshly initialised).

        Args:
            n_features: F, the feature count.
            hidden: units of the embedding and every graph-convolution layer.
            layers: graph-convolution rounds.
            pad_col: index of the padding-flag column (> 0.5 marks a padding node).
            dropout: dropout after each graph-convolution layer (training only).
        """
        super().__init__()
        self.pad_col = pad_col
        self.embed = nn.Linear(n_features, hidden)
        self.w_self = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.w_nbr = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Groups [B, T, F] → outputs [B, T, 2] in target space."""
        real = (x[..., self.pad_col] < 0.5).to(x.dtype)
        h = torch.relu(self.embed(x))
        count = torch.zeros_like(real)
        count[:, 1:] += real[:, :-1]
        count[:, :-1] += real[:, 1:]
        denom = count.clamp(min=1.0).unsqueeze(-1)
        for w_self, w_nbr in zip(self.w_self, self.w_nbr):
            hr = h * real.unsqueeze(-1)
            total = torch.zeros_like(h)
            total[:, 1:] += hr[:, :-1]
            total[:, :-1] += hr[:, 1:]
            h = self.dropout(torch.relu(w_self(h) + w_nbr(total / denom)))
        return self.head(h)


def build_net(
    kind: str, n_features: int, hidden: int, layers: int, *, pad_col: int = -1, dropout: float = 0.0
) -> nn.Module:
    """A freshly initialised torch module of model ``kind``.

    Args:
        kind: one of ``MODEL_KINDS``.
        n_features: F, the feature count.
        hidden: hidden units (per direction for the LSTM).
        layers: LSTM / MLP hidden / graph-convolution layers.
        pad_col: padding-flag column, for ``"grouping"`` only; taken modulo ``n_features``
            (-1: the last column).
        dropout: dropout probability.

    Returns:
        An ``LSTMNet``, ``MLPNet`` or ``GroupingNet``.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind == "lstm":
        return LSTMNet(n_features, hidden, layers, dropout)
    if kind == "mlp":
        return MLPNet(n_features, hidden, layers, dropout)
    if kind == "grouping":
        return GroupingNet(n_features, hidden, layers, pad_col % n_features, dropout)
    raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def export_member(net: nn.Module) -> dict[str, np.ndarray]:
    """Parameters of a torch module as the numpy predictor names them.

    Args:
        net: an ``LSTMNet``, ``MLPNet`` or ``GroupingNet``.

    Returns:
        One ``Predictor`` member: parameter name → float32 array (LSTM biases summed).

    Raises:
        ValueError: ``net`` is of another type.
    """
    p: dict[str, np.ndarray] = {}
    if isinstance(net, LSTMNet):
        for layer in range(net.lstm.num_layers):
            for d, suffix in (("fwd", ""), ("bwd", "_reverse")):
                w_ih = getattr(net.lstm, f"weight_ih_l{layer}{suffix}")
                w_hh = getattr(net.lstm, f"weight_hh_l{layer}{suffix}")
                b = getattr(net.lstm, f"bias_ih_l{layer}{suffix}") + getattr(
                    net.lstm, f"bias_hh_l{layer}{suffix}"
                )
                p[f"lstm.{layer}.{d}.w_ih"] = _np(w_ih)
                p[f"lstm.{layer}.{d}.w_hh"] = _np(w_hh)
                p[f"lstm.{layer}.{d}.b"] = _np(b)
    elif isinstance(net, MLPNet):
        for layer, lin in enumerate(net.layers):
            p[f"mlp.{layer}.w"] = _np(lin.weight)
            p[f"mlp.{layer}.b"] = _np(lin.bias)
    elif isinstance(net, GroupingNet):
        p["embed.w"] = _np(net.embed.weight)
        p["embed.b"] = _np(net.embed.bias)
        for layer, (w_self, w_nbr) in enumerate(zip(net.w_self, net.w_nbr)):
            p[f"gcn.{layer}.w_self"] = _np(w_self.weight)
            p[f"gcn.{layer}.b"] = _np(w_self.bias)
            p[f"gcn.{layer}.w_nbr"] = _np(w_nbr.weight)
    else:
        raise ValueError(f"cannot export a {type(net).__name__}")
    p["head.w"] = _np(net.head.weight)
    p["head.b"] = _np(net.head.bias)
    return p


# ---------------------------------------------------------------------------------------------
# configuration and results


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Hyperparameters. ``None`` picks the kind's default (layers: lstm 4, mlp 3, grouping 3;
    hidden: lstm = feature count as in the paper, mlp 256, grouping 128). An ``mlp`` always sees
    ops alone (width = stride = 1); a ``grouping`` model uses stride = width.

    Attributes:
        kind: one of ``MODEL_KINDS``.
        width: ops per window, >= 1.
        stride: ops between window starts, in [1, width].
        layers: model layers, >= 1; None: the kind's default.
        hidden: hidden units, >= 1; None: the kind's default.
        epochs: maximum epochs, >= 0 (0: untrained weights, no calibration).
        batch_size: windows per mini-batch, >= 1.
        lr: Adam learning rate, > 0.
        weight_decay: Adam weight decay.
        dropout: dropout probability.
        grad_clip: maximum gradient norm; <= 0: no clipping.
        val_fraction: share of groups or iterations held out for validation, in [0, 1);
            0 (or fewer than 2 iterations): no validation, the last epoch's weights are kept.
        val_split: ``"group"`` (falls back to ``"iteration"`` with fewer than 3 groups) or
            ``"iteration"``.
        patience: epochs without validation improvement before stopping, >= 1.
        seed: seed of the split and of member j (``seed + j``).
        ensemble: ensemble members, >= 1.
        target_transform: one of ``ets.targets.TARGET_TRANSFORMS`` (checked when training).
        calibrate: fit the calibration factors after training.
        clamp_features: clamp standardised features to the training range.
        clamp_margin: the clamp margin, in standard deviations.
        ignore_features: names of feature columns the model never sees (fixed at 0 after
            scaling, at training and inference; stored in the weights file), e.g. the per-file
            ``log_batch``, ``log_input_h``, ``log_input_w``; checked against the schema when
            training.
        vocab_size: op-type vocabulary size (``fit`` only).
        device_features: add the device feature columns (``fit`` only).
        progress: show a tqdm bar when tqdm is installed, else log every 20 epochs.

    Raises:
        ValueError: any field outside the ranges above, or an unknown ``kind`` / ``val_split``.
    """

    kind: str = "lstm"
    width: int = DEFAULT_WIDTH
    stride: int = DEFAULT_STRIDE
    layers: int | None = None
    hidden: int | None = None
    epochs: int = 200
    batch_size: int = 128
    lr: float = 1e-4
    weight_decay: float = 0.0
    dropout: float = 0.0
    grad_clip: float = 1.0
    val_fraction: float = 0.2
    val_split: str = "group"
    patience: int = 30
    seed: int = 0
    ensemble: int = 1
    target_transform: str = "standard"
    calibrate: bool = True
    clamp_features: bool = False
    clamp_margin: float = 0.5
    ignore_features: tuple[str, ...] = ()
    vocab_size: int = DEFAULT_VOCAB_SIZE
    device_features: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        for name in ("width", "stride", "batch_size", "ensemble"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.stride > self.width:
            raise ValueError(f"stride must be <= width ({self.width}), got {self.stride}")
        if self.epochs < 0 or self.patience < 1:
            raise ValueError(
                f"epochs must be >= 0 and patience >= 1, got {self.epochs}, {self.patience}"
            )
        if self.val_split not in ("group", "iteration"):
            raise ValueError(f"val_split must be 'group' or 'iteration', got {self.val_split!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if self.hidden is not None and self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")

    def window(self) -> tuple[int, int]:
        """(width, stride) actually used by this kind."""
        if self.kind == "mlp":
            return 1, 1
        if self.kind == "grouping":
            return self.width, self.width
        return self.width, self.stride

    def n_layers(self) -> int:
        """``layers``, or the kind's default."""
        return self.layers if self.layers is not None else _DEFAULT_LAYERS[self.kind]

    def n_hidden(self, n_features: int) -> int:
        """``hidden``, or the kind's default (``"lstm"``: ``n_features``)."""
        if self.hidden is not None:
            return self.hidden
        return {"lstm": n_features, "mlp": 256, "grouping": 128}[self.kind]


@dataclass(slots=True)
class TrainResult:
    """What training produced.

    Attributes:
        predictor: the trained model.
        history: per member, per epoch: ``epoch``, ``train_l1``; with validation also
            ``val_mre`` (calibrated as the saved predictor would be: what early stopping
            watches) and ``val_mre_raw`` (uncalibrated); the last record also holds
            ``best_epoch``.
        seconds: wall time of the training, s.
    """

    predictor: Predictor
    history: list[list[dict[str, float]]] = field(default_factory=list)
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------
# data preparation


@dataclass(slots=True)
class _WindowData:
    x: torch.Tensor  # [N, W, F] scaled features
    y: torch.Tensor  # [N, W, 2] scaled targets (0 where masked)
    mask: torch.Tensor  # [N, W] 1 for real ops with known targets
    row: np.ndarray  # [N, W] global row id (into the concatenated rows), -1 padding
    features: np.ndarray  # [n_rows, F] unscaled features of the concatenated rows
    targets_ns: np.ndarray  # [n_rows, 2] (duration, gap) ns of the concatenated rows, NaN unknown
    row_iter: np.ndarray  # [n_rows] iteration id of each row
    measured_ns: np.ndarray  # [n_iterations]


def _windows(
    encoded: Sequence[EncodedIteration],
    fscale: Standardizer,
    tscale: TargetScaler,
    schema: FeatureSchema,
    width: int,
    stride: int,
) -> _WindowData:
    pad = padding_row(schema)
    f = schema.n_features
    xs = [np.zeros((0, width, f), np.float32)]
    ys = [np.zeros((0, width, 2), np.float32)]
    ms = [np.zeros((0, width), np.float32)]
    rows = [np.zeros((0, width), np.int64)]
    row_iter = [np.zeros(0, np.int64)]
    offset = 0
    for k, e in enumerate(encoded):
        w, index = build_windows(fscale.transform(e.features), width, stride, pad)
        t = e.targets_ns
        known = np.isfinite(t).all(axis=1)
        z = tscale.transform(np.where(np.isfinite(t), t, 0.0), e.features)
        z = np.where(known[:, None], z, 0.0)
        valid = index >= 0
        safe = np.where(valid, index, 0)
        xs.append(w)
        ys.append(np.where(valid[..., None], z[safe], 0.0).astype(np.float32))
        ms.append((valid & known[safe]).astype(np.float32))
        rows.append(np.where(valid, index + offset, -1))
        row_iter.append(np.full(e.n_ops, k))
        offset += e.n_ops
    return _WindowData(
        x=torch.from_numpy(np.concatenate(xs)),
        y=torch.from_numpy(np.concatenate(ys)),
        mask=torch.from_numpy(np.concatenate(ms)),
        row=np.concatenate(rows),
        features=np.concatenate([np.zeros((0, f), np.float32), *(e.features for e in encoded)]),
        targets_ns=np.concatenate([np.zeros((0, 2)), *(e.targets_ns for e in encoded)]),
        row_iter=np.concatenate(row_iter),
        measured_ns=np.array([e.measured_ns for e in encoded], dtype=np.float64),
    )


def _split(
    encoded: Sequence[EncodedIteration], fraction: float, how: str, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """Train / validation positions: by group ("group", when there are >= 3 groups) or by
    iteration.
    """
    n = len(encoded)
    if fraction <= 0 or n < 2:
        return list(range(n)), []
    groups = sorted({e.group for e in encoded})
    if how == "group" and len(groups) >= 3:
        n_val = max(1, round(fraction * len(groups)))
        val_groups = set(rng.choice(groups, size=n_val, replace=False).tolist())
        val = [i for i, e in enumerate(encoded) if e.group in val_groups]
    else:
        n_val = max(1, round(fraction * n))
        val = sorted(rng.choice(n, size=n_val, replace=False).tolist())
    val_set = set(val)
    return [i for i in range(n) if i not in val_set], val


def _per_op_ns(net: nn.Module, data: _WindowData, tscale: TargetScaler) -> np.ndarray:
    """Uncalibrated per-op (duration, gap) predictions, ns, [n_rows, 2] (overlap mean per op)."""
    with torch.no_grad():
        out = torch.cat(
            [net(data.x[i : i + 1024]) for i in range(0, len(data.x), 1024)]
            or [torch.zeros((0, data.x.shape[1], 2))]
        )
    z = aggregate_windows(out.numpy().astype(np.float64), data.row, len(data.features))
    return tscale.inverse(z, data.features)


def _iteration_mre(
    per_op_ns: np.ndarray, data: _WindowData, factors: tuple[float, float] = (1.0, 1.0)
) -> float:
    """MRE of iteration times: per-op predictions times ``factors``, summed per iteration,
    against the measurement, as ``ets.regressors.evaluate`` computes it for a predictor with
    that calibration.
    """
    per_op = (per_op_ns * np.asarray(factors)).sum(axis=1)
    per_iter = np.bincount(data.row_iter, weights=per_op, minlength=len(data.measured_ns))
    y = data.measured_ns
    ok = np.isfinite(y) & (y > 0)
    if not ok.any():
        return float("nan")
    return float(np.mean(np.abs(per_iter[ok] - y[ok]) / y[ok]))


# ---------------------------------------------------------------------------------------------
# training


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="epoch", leave=False)


def _train_member(
    config: TrainConfig,
    schema: FeatureSchema,
    train: _WindowData,
    val: _WindowData | None,
    tscale: TargetScaler,
    seed: int,
    desc: str,
) -> tuple[nn.Module, list[dict[str, float]]]:
    gen = torch.Generator().manual_seed(seed)
    net = build_net(
        config.kind,
        schema.n_features,
        config.n_hidden(schema.n_features),
        config.n_layers(),
        pad_col=schema.padding_column,
        dropout=config.dropout,
    )
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    history: list[dict[str, float]] = []
    best_state = copy.deepcopy(net.state_dict())
    best_score = math.inf
    best_epoch = 0
    bar = _progress(config.epochs, config.progress, desc)
    n = len(train.x)
    for epoch in range(1, config.epochs + 1):
        net.train()
        perm = torch.randperm(n, generator=gen)
        total_loss = total_weight = 0.0
        for start in range(0, n, config.batch_size):
            idx = perm[start : start + config.batch_size]
            mask = train.mask[idx]
            weight = float(mask.sum())
            if weight == 0:
                continue
            out = net(train.x[idx])
            loss = ((out - train.y[idx]).abs() * mask.unsqueeze(-1)).sum() / (2.0 * weight)
            opt.zero_grad()
            loss.backward()
            if config.grad_clip > 0:
                nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
            opt.step()
            total_loss += loss.item() * weight
            total_weight += weight
        net.eval()
        record = {"epoch": float(epoch), "train_l1": total_loss / max(total_weight, 1.0)}
        history.append(record)
        if val is not None:
            val_ns = _per_op_ns(net, val, tscale)
            factors = (
                sum_factors(_per_op_ns(net, train, tscale), train.targets_ns)
                if config.calibrate
                else (1.0, 1.0)
            )
            record["val_mre"] = _iteration_mre(val_ns, val, factors)
            record["val_mre_raw"] = _iteration_mre(val_ns, val)
            if record["val_mre"] < best_score:
                best_score, best_epoch = record["val_mre"], epoch
                best_state = copy.deepcopy(net.state_dict())
        else:  # no validation: the last epoch is the result
            best_epoch = epoch
        if bar is not None:
            bar.update(1)
            bar.set_postfix({k: f"{v:.4f}" for k, v in record.items() if k != "epoch"})
        elif config.progress and (epoch % 20 == 0 or epoch == config.epochs):
            log.info("%s epoch %d: %s", desc, epoch, record)
        if val is not None and epoch - best_epoch >= config.patience:
            break
    if bar is not None:
        bar.close()
    if val is not None:
        net.load_state_dict(best_state)
    net.eval()
    if history:
        history[-1]["best_epoch"] = float(best_epoch)
    return net, history


def fit_encoded(
    encoded: Sequence[EncodedIteration],
    schema: FeatureSchema,
    config: TrainConfig = TrainConfig(),
    *,
    extra_info: dict[str, Any] | None = None,
) -> TrainResult:
    """Train a predictor on already encoded iterations.

    Args:
        encoded: the iterations; their features must follow ``schema``. A validation part is
            held out as ``config`` says.
        schema: their feature schema.
        config: hyperparameters.
        extra_info: added to (and overriding) the training facts stored in the predictor.

    Returns:
        The predictor, per-member histories and the wall time.

    Raises:
        ValueError: ``encoded`` is empty, an iteration's feature count differs from the
            schema's, the target transform is unknown or needs measured features the schema
            lacks, ``config.ignore_features`` names a column the schema lacks, or the validation
            split leaves no training iteration.
    """
    if not encoded:
        raise ValueError("no training iterations")
    for e in encoded:
        if e.features.shape[1] != schema.n_features:
            raise ValueError(
                f"{e.label}: {e.features.shape[1]} features, schema has {schema.n_features}"
            )
    started = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    train_pos, val_pos = _split(encoded, config.val_fraction, config.val_split, rng)
    train_set = [encoded[i] for i in train_pos]
    val_set = [encoded[i] for i in val_pos]
    rows = np.concatenate([e.features for e in train_set])
    targets = np.concatenate([e.targets_ns for e in train_set])
    ignore = np.zeros(schema.n_features, dtype=bool)
    ignore[list(schema.column_indices(config.ignore_features, "ignore_features"))] = True
    fscale = Standardizer.fit(
        rows,
        schema.continuous,
        clamp_margin=config.clamp_margin if config.clamp_features else None,
        ignore=ignore,
    )
    tscale = schema.fit_target_scaler(targets, config.target_transform, rows)
    width, stride = config.window()
    train_data = _windows(train_set, fscale, tscale, schema, width, stride)
    val_data = _windows(val_set, fscale, tscale, schema, width, stride) if val_set else None
    members: list[dict[str, np.ndarray]] = []
    histories: list[list[dict[str, float]]] = []
    for j in range(config.ensemble):
        desc = f"{config.kind}" + (f" {j + 1}/{config.ensemble}" if config.ensemble > 1 else "")
        # The global torch RNG (init, dropout) is seeded per member and restored afterwards.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + j)
            net, history = _train_member(
                config, schema, train_data, val_data, tscale, config.seed + j, desc
            )
        members.append(export_member(net))
        histories.append(history)
    seconds = time.perf_counter() - started
    info: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "train_iterations": len(train_set),
        "val_iterations": len(val_set),
        "train_ops": int(rows.shape[0]),
        "train_windows": len(train_data.x),
        "groups": sorted({e.group for e in encoded}),
        "val_groups": sorted({e.group for e in val_set}),
        "devices": sorted({e.device for e in encoded}),
        "epochs_run": [len(h) for h in histories],
        "best_epoch": [int(h[-1].get("best_epoch", len(h))) if h else 0 for h in histories],
        "val_mre": [
            min((r["val_mre"] for r in h if "val_mre" in r), default=None) for h in histories
        ],
        "seconds": seconds,
        "torch_version": torch.__version__,
    }
    info.update(extra_info or {})
    predictor = Predictor(
        kind=config.kind,
        schema=schema,
        feature_scaler=fscale,
        target_scaler=tscale,
        width=width,
        stride=stride,
        layers=config.n_layers(),
        hidden=config.n_hidden(schema.n_features),
        members=members,
        training=info,
    )
    if config.calibrate and config.epochs > 0:
        predictor.calibration = calibration_factors(predictor, train_set)
    info["calibration"] = list(predictor.calibration)
    info["seconds"] = time.perf_counter() - started
    return TrainResult(predictor, histories, info["seconds"])


def calibration_factors(
    predictor: Predictor,
    encoded: Sequence[EncodedIteration],
    limits: tuple[float, float] = (0.25, 4.0),
) -> tuple[float, float]:
    """Per-target factors that make summed predictions equal summed measurements.

    The factors are Σ y / Σ ŷ over the ops of ``encoded`` with known targets, clipped to
    ``limits``; 1.0 for a target whose sums are not both positive.

    A smearing correction: a model fitted with an L1 loss predicts per-op medians (in log space
    for the "log" and "roofline" transforms), whose sum underestimates an iteration's time when
    per-op times are skewed; the factors restore unbiased sums on the training data.

    Args:
        predictor: the model; its own calibration is ignored.
        encoded: the iterations (the training set).
        limits: (lowest, highest) factor.

    Returns:
        (duration factor, gap factor).
    """
    raw = replace(predictor, calibration=(1.0, 1.0))
    predicted = [np.stack([p.duration_ns, p.gap_ns], axis=1) for p in raw.predict_many(encoded)]
    return sum_factors(
        np.concatenate([np.zeros((0, 2)), *predicted]),
        np.concatenate([np.zeros((0, 2)), *(e.targets_ns for e in encoded)]),
        limits,
    )


def fit(
    traces: Sequence[Trace],
    config: TrainConfig = TrainConfig(),
    *,
    on_encoded: Callable[[list[EncodedIteration]], None] | None = None,
) -> TrainResult:
    """Fit a schema (vocabulary) on ``traces``, encode them and train a predictor.

    Args:
        traces: the training traces (all of them also feed the vocabulary).
        config: hyperparameters.
        on_encoded: called with the encoded iterations before training.

    Returns:
        As ``fit_encoded``.

    Raises:
        ValueError: ``traces`` is empty, or as ``fit_schema`` and ``fit_encoded``.
    """
    if not traces:
        raise ValueError("no training traces")
    schema = fit_schema(traces, config.vocab_size, device_features=config.device_features)
    encoded = [e for t in traces for e in encode_trace(t, schema)]
    if on_encoded is not None:
        on_encoded(encoded)
    return fit_encoded(encoded, schema, config)
