"""ETS per-op features: a trace's ETS rows -> feature vectors (``EncodedIteration``, unscaled),
and their standardisation (``Standardizer``).

Contracts:
- Pure functions over the trace model; no global state. Arrays are numpy, features ``float32``,
  targets ``float64`` nanoseconds.
- Rows are ``ets.rows.ets_rows`` of each iteration; their (duration, gap) targets come from
  ``ets.targets.iteration_targets``; ``ets.windows`` cuts the rows into sliding windows.
- Features (``FeatureSchema``, versioned by ``FEATURE_SCHEMA_VERSION``): op-type one-hot over a
  vocabulary fitted on training data plus "other"; direction one-hot; dtype one-hot; log1p batch
  size and input height/width; log1p FLOPs and bytes; 30 log1p shape/parameter ints (an
  importer's ``params`` when given, else derived from input shapes: 3 tensors × [ndim, 9 dims]);
  optional device features; a padding flag (1 only on padding rows of windows).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import SchemaVersionError
from ..trace.events import DeviceInfo, IterationTrace, OpEvent, Phase, Trace
from ..trace.names import canonical_op_name, is_backward_name
from .flops import OpCost, is_tensor_dtype, op_cost
from .rows import ets_rows, op_direction
from .targets import TargetScaler, iteration_targets

FEATURE_SCHEMA_VERSION = 1
DEFAULT_VOCAB_SIZE = 25
N_PARAMS = 30
OTHER_OP = "<other>"
DIRECTIONS = ("forward", "backward", "optimizer")
DTYPE_CLASSES = ("float32", "float16", "bfloat16", "other")
DEVICE_FEATURES = ("dev_log_fp32_tflops", "dev_log_mem_bw_gbs", "dev_log_sms", "dev_is_cuda")
# The op's own measured (duration, gap) in early captured steps, log1p(µs): the inputs of the
# early → steady-state model (``forecast.trace_estimators``), whose targets are ratios to them.
MEASURED_FEATURES = ("log_early_duration_us", "log_early_gap_us")

# Published peak FP32 TFLOPS, memory bandwidth (GB/s) and SM count of common GPUs, keyed by a
# normalised name fragment (lower case, no spaces). Used only for the optional device features.
_GPU_SPECS: dict[str, tuple[float, float, int]] = {
    "k80": (4.1, 240.0, 13),
    "p4": (5.5, 192.0, 20),
    "p40": (11.8, 346.0, 30),
    "p100": (9.3, 732.0, 56),
    "v100": (15.7, 900.0, 80),
    "t4": (8.1, 320.0, 40),
    "1080ti": (11.3, 484.0, 28),
    "2080ti": (13.4, 616.0, 68),
    "titanrtx": (16.3, 672.0, 72),
    "3080ti": (34.1, 912.0, 80),
    "3090": (35.6, 936.0, 82),
    "4090": (82.6, 1008.0, 128),
    "a10": (31.2, 600.0, 72),
    "a40": (37.4, 696.0, 84),
    "a100": (19.5, 1555.0, 108),
    "a6000": (38.7, 768.0, 84),
    "l4": (30.3, 300.0, 58),
    "l40": (90.5, 864.0, 142),
    "l40s": (91.6, 864.0, 142),
    "h100": (66.9, 3350.0, 132),
    "h200": (66.9, 4800.0, 132),
}


def device_spec(device: DeviceInfo) -> tuple[float, float, int] | None:
    """Published specs of a known GPU, matched by name.

    Args:
        device: only ``name`` is read; vendor words, spaces, ``-`` and ``_`` are ignored and
            the longest table key contained in what is left wins.

    Returns:
        (peak FP32 TFLOPS, memory bandwidth GB/s, SMs), or None for an unknown name.
    """
    key = "".join(device.name.lower().split())
    for noise in ("nvidia", "geforce", "tesla", "quadro", "rtx", "-", "_"):
        key = key.replace(noise, "")
    for name in sorted(_GPU_SPECS, key=len, reverse=True):
        if name in key:
            return _GPU_SPECS[name]
    return None


# ---------------------------------------------------------------------------------------------
# schema


@dataclass(frozen=True, slots=True)
class FeatureSchema:
    """What each feature column means. Stored in weights files; compared by ``version``.

    Attributes:
        vocabulary: the op types with their own one-hot column (``"<other>"`` is implicit).
        device_features: whether the ``DEVICE_FEATURES`` columns are present.
        measured_features: whether the ``MEASURED_FEATURES`` columns are present.
        version: the feature-schema version; must be ``FEATURE_SCHEMA_VERSION``.

    Raises:
        SchemaVersionError: ``version`` is not ``FEATURE_SCHEMA_VERSION``.
        ValueError: ``vocabulary`` has duplicates or contains ``"<other>"``.
    """

    vocabulary: tuple[str, ...]
    device_features: bool = False
    measured_features: bool = False
    version: int = FEATURE_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.version != FEATURE_SCHEMA_VERSION:
            raise SchemaVersionError(self.version, FEATURE_SCHEMA_VERSION)
        if len(set(self.vocabulary)) != len(self.vocabulary) or OTHER_OP in self.vocabulary:
            raise ValueError(f"vocabulary must hold distinct op types, got {self.vocabulary!r}")

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The name of every column, in order; the padding flag is last."""
        names = [f"op={v}" for v in (*self.vocabulary, OTHER_OP)]
        names += [f"dir={d}" for d in DIRECTIONS]
        names += [f"dtype={d}" for d in DTYPE_CLASSES]
        names += ["log_batch", "log_input_h", "log_input_w", "log_flops", "log_bytes"]
        names += [f"log_param_{i}" for i in range(N_PARAMS)]
        if self.device_features:
            names += list(DEVICE_FEATURES)
        if self.measured_features:
            names += list(MEASURED_FEATURES)
        names.append("padding")
        return tuple(names)

    @property
    def n_features(self) -> int:
        """Number of feature columns (F)."""
        return len(self.feature_names)

    @property
    def continuous(self) -> np.ndarray:
        """Boolean mask of the columns that scalers standardise (not one-hot / flags)."""
        return np.array(
            [
                not (n.startswith(("op=", "dir=", "dtype=")) or n in ("padding", "dev_is_cuda"))
                for n in self.feature_names
            ]
        )

    @property
    def padding_column(self) -> int:
        """Index of the padding-flag column (the last one)."""
        return self.n_features - 1

    @property
    def measured_columns(self) -> tuple[int, int]:
        """Columns of the early (duration, gap) features; ``ValueError`` if the schema has none."""
        if not self.measured_features:
            raise ValueError("this feature schema has no measured early-time features")
        names = self.feature_names
        return (names.index(MEASURED_FEATURES[0]), names.index(MEASURED_FEATURES[1]))

    def column_indices(self, names: Sequence[str], argument: str) -> tuple[int, ...]:
        """Indices of the feature columns ``names``, in their order.

        Args:
            names: column names.
            argument: the setting that named them, for the error message.

        Returns:
            One index per name.

        Raises:
            ValueError: naming ``argument`` and the names this schema lacks.
        """
        unknown = sorted(set(names) - set(self.feature_names))
        if unknown:
            raise ValueError(f"{argument}: no such feature columns {unknown}")
        return tuple(self.feature_names.index(n) for n in names)

    def fit_target_scaler(
        self, targets_ns: np.ndarray, kind: str, rows: np.ndarray
    ) -> TargetScaler:
        """``TargetScaler.fit`` on training rows of this schema, with the FLOPs, bytes and
        (if present) measured early-time columns the transforms read.

        Args:
            targets_ns: [n, 2] (duration, gap) ns.
            kind: one of ``ets.targets.TARGET_TRANSFORMS``.
            rows: [n, F] unscaled feature rows aligned with ``targets_ns``.

        Returns:
            The fitted scaler.

        Raises:
            ValueError: from ``TargetScaler.fit`` (an unknown ``kind``, or ``"measured"``
                without measured columns).
        """
        return TargetScaler.fit(
            targets_ns,
            kind,
            rows,
            flops_col=self.feature_names.index("log_flops"),
            bytes_col=self.feature_names.index("log_bytes"),
            measured_cols=self.measured_columns if self.measured_features else (-1, -1),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, with ``feature_names`` for checking on load."""
        return {
            "version": self.version,
            "vocabulary": list(self.vocabulary),
            "device_features": self.device_features,
            "measured_features": self.measured_features,
            "feature_names": list(self.feature_names),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> FeatureSchema:
        """Rebuild a schema from ``to_dict`` output.

        Args:
            data: ``version``, ``vocabulary`` and ``device_features`` are required;
                ``feature_names``, when present, must match the rebuilt schema's.
            source: where ``data`` was read (a path), for error messages.

        Returns:
            The schema.

        Raises:
            SchemaVersionError: ``version`` is missing or not ``FEATURE_SCHEMA_VERSION``.
            KeyError: ``vocabulary`` or ``device_features`` is missing.
            ValueError: ``feature_names`` differ, or the vocabulary is invalid.
        """
        version = data.get("version")
        if version != FEATURE_SCHEMA_VERSION:
            raise SchemaVersionError(version, FEATURE_SCHEMA_VERSION, source=source)
        schema = cls(
            vocabulary=tuple(data["vocabulary"]),
            device_features=bool(data["device_features"]),
            measured_features=bool(data.get("measured_features", False)),
        )
        names = data.get("feature_names")
        if names is not None and tuple(names) != schema.feature_names:
            raise ValueError(f"{source}: feature names do not match schema version {version}")
        return schema


@dataclass(frozen=True, slots=True)
class EncodeContext:
    """Per-trace facts every row of it shares: input dims and the device.

    Attributes:
        batch_size: batch size; 0 when unknown.
        input_h: input height; 0 when unknown.
        input_w: input width; 0 when unknown.
        device: the trace's device (for the device features).
    """

    batch_size: int = 0
    input_h: int = 0
    input_w: int = 0
    device: DeviceInfo = field(default_factory=DeviceInfo)

    @classmethod
    def from_trace(cls, trace: Trace) -> EncodeContext:
        """The context of ``trace``: its device and input dims.

        Dims come from metadata (``batch_size`` or ``batch``, ``input_h``, ``input_w``, as the
        importer and hook record them; 0 or negative counts as absent). Each absent one is
        inferred from the first depth-0 forward op of the first iteration with a tensor input
        of ≥ 2 dims: batch = dim 0; 4-D: h, w = the last two; 3-D: h, w = dims 1, 2;
        2-D: h = dim 1, w = 1; ≥ 5-D: h = dim 1, w = the last dim. Still unknown: 0.

        Args:
            trace: the trace.

        Returns:
            The context.

        Raises:
            ValueError, TypeError: a dim in ``trace.metadata`` is not a number.
        """
        md = trace.metadata
        batch = int(md.get("batch_size", md.get("batch", -1)) or -1)
        h = int(md.get("input_h", -1) or -1)
        w = int(md.get("input_w", -1) or -1)
        if min(batch, h, w) < 0 and trace.iterations:
            b2, h2, w2 = _infer_dims(trace.iterations[0])
            batch = b2 if batch < 0 else batch
            h = h2 if h < 0 else h
            w = w2 if w < 0 else w
        return cls(max(batch, 0), max(h, 0), max(w, 0), trace.device)


def _infer_dims(iteration: IterationTrace) -> tuple[int, int, int]:
    for op in iteration.ops:
        if op.depth != 0 or op_direction(op) != "forward":
            continue
        for shape, dtype in zip(op.input_shapes, _padded_dtypes(op), strict=True):
            if len(shape) >= 2 and (not dtype or is_tensor_dtype(dtype)):
                if len(shape) == 4:
                    return shape[0], shape[2], shape[3]
                if len(shape) == 3:
                    return shape[0], shape[1], shape[2]
                return shape[0], shape[1], 1 if len(shape) == 2 else shape[-1]
    return 0, 0, 0


def _padded_dtypes(op: OpEvent) -> tuple[str, ...]:
    if len(op.input_dtypes) == len(op.input_shapes):
        return op.input_dtypes
    return ("",) * len(op.input_shapes)


# ---------------------------------------------------------------------------------------------
# per-op featurisation


def _dtype_class(dtypes: Sequence[str]) -> str:
    for d in dtypes:
        key = d.strip().lower().removeprefix("torch.")
        if key in ("float", "float32"):
            return "float32"
        if key in ("c10::half", "half", "float16"):
            return "float16"
        if key in ("c10::bfloat16", "bfloat16"):
            return "bfloat16"
        if is_tensor_dtype(d):
            return "other"
    return "other"


def _shape_params(shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> list[int]:
    """30 ints from input shapes: 3 tensor blocks of [ndim, d0 .. d8] (dims past 9 folded)."""
    out: list[int] = []
    tensors = [
        s for s, d in zip(shapes, dtypes, strict=True) if (is_tensor_dtype(d) if d else len(s) > 0)
    ]
    for shape in tensors[:3]:
        dims = list(shape)
        if len(dims) > 9:
            dims = [*dims[:8], math.prod(dims[8:])]
        out += [len(shape), *dims, *([0] * (9 - len(dims)))]
    return out + [0] * (N_PARAMS - len(out))


class _IterationIndex:
    """Lookups over an iteration's ops that featurising a row needs (built incrementally)."""

    def __init__(self) -> None:
        self.ops: list[OpEvent] = []
        self.children: dict[int, list[int]] = {}
        self.forward_by_seq: dict[int, list[int]] = {}

    def add(self, op: OpEvent) -> None:
        i = len(self.ops)
        self.ops.append(op)
        if op.parent >= 0:
            self.children.setdefault(op.parent, []).append(i)
        if op.sequence_nr >= 0 and op.phase is Phase.FORWARD:
            self.forward_by_seq.setdefault(op.sequence_nr, []).append(i)

    def descendants(self, i: int) -> Iterable[int]:
        stack = list(reversed(self.children.get(i, [])))
        while stack:
            j = stack.pop()
            yield j
            stack.extend(reversed(self.children.get(j, [])))


def _concrete(op: OpEvent) -> Sequence[str]:
    # Forward compatible: OpEvent may gain profiler "Concrete Inputs" (``ets.flops``).
    return getattr(op, "concrete_inputs", ()) or ()


def _row_cost(index: _IterationIndex, i: int, direction: str | None) -> tuple[OpCost, OpEvent]:
    """Cost of row op ``i`` and the op whose shapes describe it (itself or its forward op)."""
    op = index.ops[i]
    if op.flops >= 0 and op.bytes_moved >= 0:
        return OpCost(op.flops, op.bytes_moved), op
    if direction == "backward":
        base = canonical_op_name(op.name)
        # 1) the forward op that created this autograd node (same sequence number)
        candidates = [j for j in index.forward_by_seq.get(op.sequence_nr, []) if j < i]
        if candidates:
            named = [j for j in candidates if canonical_op_name(index.ops[j].name) == base]
            fwd = index.ops[(named or candidates)[0]]
            if fwd.input_shapes:
                cost = op_cost(
                    fwd.name if named else base,
                    fwd.input_shapes,
                    fwd.input_dtypes,
                    concrete_inputs=_concrete(fwd),
                    backward=True,
                )
                return cost, fwd
        # 2) the ATen kernels below the node (convolution_backward, mm, ...), outermost only
        total_flops = total_bytes = 0
        described: OpEvent | None = None
        covered: set[int] = set()
        for j in index.descendants(i):  # preorder: a parent is visited before its children
            child = index.ops[j]
            if child.parent in covered:
                covered.add(j)
                continue
            if not child.input_shapes or is_backward_name(child.name):
                continue
            c = op_cost(
                child.name, child.input_shapes, child.input_dtypes, concrete_inputs=_concrete(child)
            )
            if c.known and (c.flops or c.bytes_moved):
                total_flops += c.flops
                total_bytes += c.bytes_moved
                covered.add(j)
                described = described or child
        if described is not None:
            return OpCost(total_flops, total_bytes), described
        # 3) the autograd node's own inputs (its grad outputs)
        for j in index.children.get(i, []):
            child = index.ops[j]
            if child.input_shapes:
                return op_cost(child.name, child.input_shapes, child.input_dtypes), child
    return (
        op_cost(op.name, op.input_shapes, op.input_dtypes, concrete_inputs=_concrete(op)),
        op,
    )


def _featurize_row(
    index: _IterationIndex, i: int, schema: FeatureSchema, context: EncodeContext, out: np.ndarray
) -> None:
    """Write the unscaled features of row op ``i`` into ``out`` (a zeroed row)."""
    op = index.ops[i]
    vocab = schema.vocabulary
    col = 0
    op_type = canonical_op_name(op.name)
    try:
        out[col + vocab.index(op_type)] = 1.0
    except ValueError:
        out[col + len(vocab)] = 1.0
    col += len(vocab) + 1
    direction = op_direction(op)
    if direction is not None:
        out[col + DIRECTIONS.index(direction)] = 1.0
    col += len(DIRECTIONS)
    cost, described = _row_cost(index, i, direction)
    dtypes = op.input_dtypes or described.input_dtypes
    out[col + DTYPE_CLASSES.index(_dtype_class(dtypes))] = 1.0
    col += len(DTYPE_CLASSES)
    out[col : col + 5] = np.log1p(
        [
            context.batch_size,
            context.input_h,
            context.input_w,
            max(cost.flops, 0),
            max(cost.bytes_moved, 0),
        ]
    )
    col += 5
    if op.params:
        params = list(op.params[:N_PARAMS]) + [0] * max(0, N_PARAMS - len(op.params))
    else:
        params = _shape_params(described.input_shapes, _padded_dtypes(described))
    out[col : col + N_PARAMS] = np.log1p(np.maximum(np.asarray(params, dtype=np.float64), 0.0))
    col += N_PARAMS
    if schema.device_features:
        out[col : col + len(DEVICE_FEATURES)] = _device_features(context.device)


def _device_features(device: DeviceInfo) -> np.ndarray:
    spec = device_spec(device) if device.kind == "cuda" else None
    if spec is None:
        return np.array([0.0, 0.0, 0.0, float(device.kind == "cuda")])
    tflops, bandwidth, sms = spec
    return np.array([math.log1p(tflops), math.log1p(bandwidth), math.log1p(sms), 1.0])


# ---------------------------------------------------------------------------------------------
# encoded iterations


@dataclass(frozen=True, slots=True)
class EncodedIteration:
    """One iteration as the model sees it: unscaled features and targets of its ETS rows.

    Attributes:
        features: [n, F] float32 unscaled features; the padding column is 0.
        targets_ns: [n, 2] float64 (duration, gap) ns; NaN where unknown.
        op_indices: [n] int64 indices into ``IterationTrace.ops``.
        label: names the iteration, e.g. ``"T4/resnet18.40_7.csv#7"``.
        group: the model name: the unit of held-out splits.
        device: the device name.
    """

    features: np.ndarray
    targets_ns: np.ndarray
    op_indices: np.ndarray
    label: str = ""
    group: str = ""
    device: str = ""

    @property
    def n_ops(self) -> int:
        """Number of rows (n)."""
        return int(self.features.shape[0])

    @property
    def measured_ns(self) -> float:
        """Sum of duration + gap over rows, ns (NaN when a target is unknown or n = 0)."""
        return float(self.targets_ns.sum()) if self.n_ops else float("nan")


def encode_iteration(
    trace: Trace,
    iteration: IterationTrace,
    schema: FeatureSchema,
    context: EncodeContext | None = None,
) -> EncodedIteration:
    """Features and targets of one iteration's ETS rows.

    Args:
        trace: the iteration's trace (device, metadata for the label and group).
        iteration: the step to encode.
        schema: the feature layout; measured-feature columns are left 0 (``with_measured``).
        context: shared per-trace facts; None: ``EncodeContext.from_trace(trace)``.

    Returns:
        The encoded rows (possibly none).

    Raises:
        ValueError, TypeError: as ``EncodeContext.from_trace`` when ``context`` is None.
    """
    if context is None:
        context = EncodeContext.from_trace(trace)
    rows = ets_rows(iteration)
    index = _IterationIndex()
    for op in iteration.ops:
        index.add(op)
    features = np.zeros((len(rows), schema.n_features), dtype=np.float32)
    scratch = np.zeros(schema.n_features, dtype=np.float64)
    for k, i in enumerate(rows):
        scratch[:] = 0.0
        _featurize_row(index, i, schema, context, scratch)
        features[k] = scratch
    md = trace.metadata
    label = f"{trace.device.name}/{md.get('file', md.get('model', ''))}#{iteration.step}"
    return EncodedIteration(
        features=features,
        targets_ns=iteration_targets(trace, iteration, rows),
        op_indices=np.asarray(rows, dtype=np.int64),
        label=label,
        group=str(md.get("model", md.get("file", ""))),
        device=trace.device.name,
    )


def with_measured(
    encoded: EncodedIteration, schema: FeatureSchema, early_ns: np.ndarray
) -> EncodedIteration:
    """A copy of ``encoded`` whose measured-feature columns hold early measured times.

    Args:
        encoded: the encoded iteration.
        schema: its schema, with measured features.
        early_ns: [n, 2] each row's early (duration, gap), ns; NaN and negatives count as 0.

    Returns:
        The copy, with log1p(µs) in the measured columns.

    Raises:
        ValueError: ``early_ns`` is not [n, 2], or ``schema`` has no measured features.
    """
    if early_ns.shape != (encoded.n_ops, 2):
        raise ValueError(f"early times must be [{encoded.n_ops}, 2], got {early_ns.shape}")
    features = encoded.features.copy()
    cols = list(schema.measured_columns)
    features[:, cols] = np.log1p(np.maximum(np.nan_to_num(early_ns), 0.0) / 1e3)
    return replace(encoded, features=features)


def project_features(
    features: np.ndarray, source: FeatureSchema, target: FeatureSchema
) -> np.ndarray:
    """Re-express unscaled feature rows of one schema in another.

    Op types outside the target vocabulary become "other". Lets one encoding serve many
    vocabularies (cross-validation folds).

    Args:
        features: [n, source.n_features] unscaled rows.
        source: the schema ``features`` follow.
        target: a schema with the same flags whose vocabulary is a subset of the source's.

    Returns:
        [n, target.n_features] rows, in ``features``' dtype.

    Raises:
        ValueError: the schemas differ in device or measured features, or ``target`` has op
            types ``source`` lacks.
    """
    if (source.device_features, source.measured_features) != (
        target.device_features,
        target.measured_features,
    ):
        raise ValueError("schemas differ in device or measured features")
    missing = set(target.vocabulary) - set(source.vocabulary)
    if missing:
        raise ValueError(f"target vocabulary has op types the source lacks: {sorted(missing)}")
    n_src = len(source.vocabulary) + 1  # one-hot columns including "other"
    n_dst = len(target.vocabulary) + 1
    out = np.zeros((features.shape[0], target.n_features), dtype=features.dtype)
    picked = [source.vocabulary.index(v) for v in target.vocabulary]
    out[:, : n_dst - 1] = features[:, picked]
    out[:, n_dst - 1] = 1.0 - out[:, : n_dst - 1].sum(axis=1)
    out[:, n_dst:] = features[:, n_src:]
    return out


def encode_trace(
    trace: Trace, schema: FeatureSchema, *, steps: Iterable[int] | None = None
) -> list[EncodedIteration]:
    """Encode iterations of ``trace`` (``encode_iteration``) with one shared context.

    Args:
        trace: the trace.
        schema: the feature layout.
        steps: positions in ``trace.iterations`` (not step numbers); None: all.

    Returns:
        One encoded iteration per position, in the order given.

    Raises:
        IndexError: a position is out of range.
        ValueError, TypeError: as ``EncodeContext.from_trace``.
    """
    context = EncodeContext.from_trace(trace)
    picked = range(len(trace.iterations)) if steps is None else steps
    return [encode_iteration(trace, trace.iterations[k], schema, context) for k in picked]


def fit_schema(
    traces: Iterable[Trace], vocab_size: int = DEFAULT_VOCAB_SIZE, *, device_features: bool = False
) -> FeatureSchema:
    """A schema whose vocabulary is the most frequent row op types of ``traces``.

    Args:
        traces: the training traces.
        vocab_size: how many op types get their own column (fewer when fewer occur).
        device_features: whether the schema has the device feature columns.

    Returns:
        The schema (canonical op names by count, ties by name; no measured features).

    Raises:
        ValueError: ``vocab_size`` < 0.
    """
    if vocab_size < 0:
        raise ValueError(f"vocab_size must be >= 0, got {vocab_size}")
    counts: Counter[str] = Counter()
    for trace in traces:
        for iteration in trace.iterations:
            counts.update(canonical_op_name(iteration.ops[i].name) for i in ets_rows(iteration))
    counts.pop(OTHER_OP, None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return FeatureSchema(
        vocabulary=tuple(k for k, _ in ranked[:vocab_size]), device_features=device_features
    )


# ---------------------------------------------------------------------------------------------
# scalers


@dataclass(frozen=True, slots=True)
class Standardizer:
    """Feature standardisation ``(x - mean) / std``; identity on one-hot and flag columns.

    Columns fitted as ignored have ``lo = hi = 0``: the model always reads 0 there.

    With ``lo`` / ``hi`` (fitted with ``clamp_margin``), standardised values are clamped to the
    training rows' range widened by the margin (in standard deviations): an op far larger than
    any seen in training then looks like the largest one seen, instead of driving the network
    into a region it never learned (its size still reaches the prediction through the
    ``"roofline"`` target prior, which uses the unscaled features).

    Attributes:
        mean: [F] float32 per-column mean (0 on one-hot and flag columns).
        std: [F] float32 per-column std (1 on one-hot and flag columns and where it is ~0).
        lo: [F] float32 lower clamp of standardised values, or None (no clamping).
        hi: [F] float32 upper clamp, or None.
    """

    mean: np.ndarray
    std: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None

    @classmethod
    def fit(
        cls,
        rows: np.ndarray,
        continuous: np.ndarray,
        *,
        clamp_margin: float | None = None,
        ignore: np.ndarray | None = None,
    ) -> Standardizer:
        """Fit on training rows.

        Args:
            rows: [n, F] unscaled feature rows; n = 0 gives the identity.
            continuous: [F] bool mask of the columns to standardise
                (``FeatureSchema.continuous``).
            clamp_margin: clamp margin in standard deviations, >= 0; None: no clamping.
            ignore: [F] bool mask of columns the model must not see: clamped to [0, 0], so
                they read 0 (the padding value) at training and inference. None: none.

        Returns:
            The fitted standardiser.

        Raises:
            ValueError: ``rows`` is not [n, F] with F = ``len(continuous)``, ``ignore`` is not
                [F], or ``clamp_margin`` < 0.
        """
        if rows.ndim != 2 or rows.shape[1] != continuous.shape[0]:
            raise ValueError(f"rows must be [n, {continuous.shape[0]}], got {rows.shape}")
        if ignore is not None and ignore.shape != continuous.shape:
            raise ValueError(f"ignore must be [{continuous.shape[0]}], got {ignore.shape}")
        if clamp_margin is not None and clamp_margin < 0:
            raise ValueError(f"clamp_margin must be >= 0, got {clamp_margin}")
        mean = np.zeros(rows.shape[1])
        std = np.ones(rows.shape[1])
        if rows.shape[0]:
            mean[continuous] = rows[:, continuous].mean(axis=0)
            s = rows[:, continuous].std(axis=0)
            std[continuous] = np.where(s > 1e-12, s, 1.0)
        lo = hi = None
        if clamp_margin is not None and rows.shape[0]:
            z = (rows - mean) / std
            lo = np.where(continuous, z.min(axis=0) - clamp_margin, -np.inf).astype(np.float32)
            hi = np.where(continuous, z.max(axis=0) + clamp_margin, np.inf).astype(np.float32)
        if ignore is not None and ignore.any():
            lo = np.full(rows.shape[1], -np.inf, np.float32) if lo is None else lo
            hi = np.full(rows.shape[1], np.inf, np.float32) if hi is None else hi
            lo[ignore] = 0.0
            hi[ignore] = 0.0
        return cls(mean.astype(np.float32), std.astype(np.float32), lo, hi)

    def transform(self, rows: np.ndarray) -> np.ndarray:
        """Standardise (and clamp, when fitted with a margin) rows [n, F]; returns float32."""
        z = ((rows - self.mean) / self.std).astype(np.float32)
        if self.lo is not None and self.hi is not None:
            np.clip(z, self.lo, self.hi, out=z)
        return z

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (infinite clamp bounds as None), read back by ``from_dict``."""
        out: dict[str, Any] = {"mean": self.mean.tolist(), "std": self.std.tolist()}
        if self.lo is not None and self.hi is not None:
            out["lo"] = [None if not math.isfinite(v) else v for v in self.lo.tolist()]
            out["hi"] = [None if not math.isfinite(v) else v for v in self.hi.tolist()]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Standardizer:
        """Rebuild a standardiser from ``to_dict`` output.

        Raises:
            KeyError: ``mean`` or ``std`` is missing.
        """

        def bound(key: str, default: float) -> np.ndarray | None:
            values = data.get(key)
            if values is None:
                return None
            return np.array([default if v is None else v for v in values], dtype=np.float32)

        return cls(
            np.asarray(data["mean"], np.float32),
            np.asarray(data["std"], np.float32),
            bound("lo", -np.inf),
            bound("hi", np.inf),
        )


def padding_row(schema: FeatureSchema) -> np.ndarray:
    """The scaled feature row of a padding slot: zeros (the training mean), padding flag 1."""
    row = np.zeros(schema.n_features, dtype=np.float32)
    row[schema.padding_column] = 1.0
    return row
