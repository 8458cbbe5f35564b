"""Importers: foreign trace formats → the trace model (``ets_hook.trace``).

The ETS paper artifact's raw per-op CSV holds one profiled steady-state iteration
per file, one row per autograd op (forward, then backward, then optimizer rows), header::

    op,dir,params,grid,block,flops,bytes,rStartTime,rEndTime,kStartTime,kEndTime,
    staticSharedMemory,space,space1,seq,kernels,rduration,kduration,batch,h,w,input_type

Contracts of ``read_ets_csv``:
- One file → one ``Trace`` with one ``IterationTrace`` (step = the ``_<n>`` file-name suffix, 0
  without one) spanning the GPU side: the first row's ``kStartTime`` to the last row's
  ``kEndTime`` plus its gap.
- Per row one depth-0 ``OpEvent``: name from ``opCodes.dict`` (``"ets_op_<code>"`` when the code is
  not in the table), phase from ``dir`` (1 forward, 2 backward, 3 optimizer), ``start_ns`` /
  ``duration_ns`` = the CPU launch side (``rStartTime``, ``rEndTime``), ``sequence_nr`` = ``seq``,
  ``flops`` / ``bytes_moved`` / ``params`` verbatim, ``kernel_duration_ns`` = ``kduration``,
  ``kernel_count`` = ``kernels``, ``gap_ns`` = ``space`` clipped at 0, ``input_dtypes`` =
  ``("float",)`` or ``("half",)`` from ``input_type``.
- Trace metadata: ``source="ets-csv"``, ``model``, ``config``, ``file``, ``batch_size``,
  ``input_h``, ``input_w``, ``precision`` ("fp32", "fp16" or "mixed") and ``half_rows``: half
  precision rows are marked, never silently mixed with FP32 ones. ``trace.device`` is a CUDA
  device named after the ``device_name`` argument or, by default, the file's folder (``T4/``).
- A malformed row raises ``ETSCSVError`` (a ``ValueError``) naming the file and line.
"""

from __future__ import annotations

import ast
import csv
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ETSCSVError
from .events import DeviceInfo, IterationTrace, OpEvent, Phase, Trace

log = logging.getLogger(__name__)

ETS_CSV_COLUMNS: tuple[str, ...] = (
    "op",
    "dir",
    "params",
    "grid",
    "block",
    "flops",
    "bytes",
    "rStartTime",
    "rEndTime",
    "kStartTime",
    "kEndTime",
    "staticSharedMemory",
    "space",
    "space1",
    "seq",
    "kernels",
    "rduration",
    "kduration",
    "batch",
    "h",
    "w",
    "input_type",
)
ETS_PARAM_COUNT = 30
_DIR_PHASE = {1: Phase.FORWARD, 2: Phase.BACKWARD, 3: Phase.OPTIMIZER}
_INPUT_TYPE_DTYPE = {1: "float", 2: "half"}
OP_CODES_FILE = "opCodes.dict"


@dataclass(frozen=True, slots=True)
class ETSFileName:
    """The parts of an artifact file name ``<model>.<config>_<step>.csv``.

    Attributes:
        model: the model name (``"resnet18"``).
        config: the configuration part (``"40"``); "" when the name has no parts.
        step: the step suffix; 0 when the name has no parts.
    """

    model: str
    config: str
    step: int


_NAME_RE = re.compile(r"^(?P<model>.+?)\.(?P<config>[^.]+)_(?P<step>\d+)$")


def parse_ets_file_name(path: Path | str) -> ETSFileName:
    """Model, config and step from a file name.

    Args:
        path: a path or file name; only its last component is used, a ``.csv`` suffix (any
            case) dropped.

    Returns:
        The parts; the whole name is the model (config "", step 0) when it does not match
        ``<model>.<config>_<step>``.
    """
    stem = Path(path).name
    if stem.lower().endswith(".csv"):
        stem = stem[:-4]
    m = _NAME_RE.match(stem)
    if m is None:
        return ETSFileName(model=stem, config="", step=0)
    return ETSFileName(model=m["model"], config=m["config"], step=int(m["step"]))


def load_op_codes(path: Path | str) -> dict[int, str]:
    """The artifact's ``opCodes.dict`` (a Python dict literal, op name → code) as code → name.

    Args:
        path: the ``opCodes.dict`` file.

    Returns:
        Code → op name; when several names share a code, the first one wins.

    Raises:
        ETSCSVError: (line 0) the file is not UTF-8 text holding a Python literal, the literal
            is not a dict, or an entry is not ``str: int``.
        OSError: the file cannot be read.
    """
    path = Path(path)
    try:
        table = ast.literal_eval(path.read_text())
    except (SyntaxError, ValueError) as exc:
        raise ETSCSVError(path, 0, f"not a Python dict literal: {exc}") from exc
    if not isinstance(table, dict):
        raise ETSCSVError(path, 0, "expected a dict of op name -> code")
    codes: dict[int, str] = {}
    for name, code in table.items():
        if not isinstance(name, str) or not isinstance(code, int):
            raise ETSCSVError(path, 0, f"bad entry {name!r}: {code!r}")
        codes.setdefault(code, name)
    return codes


def find_op_codes(start: Path | str, levels: int = 3) -> Path | None:
    """Find ``opCodes.dict`` in ``start``'s folder or up to ``levels`` folders above it.

    Args:
        start: a file (its folder is searched) or a folder.
        levels: how many parent folders to search after the first one.

    Returns:
        The nearest ``opCodes.dict``, or None when there is none.
    """
    here = Path(start)
    if here.is_file():
        here = here.parent
    for folder in [here, *list(here.parents)[:levels]]:
        candidate = folder / OP_CODES_FILE
        if candidate.is_file():
            return candidate
    return None


def _int_field(path: Path, line: int, row: Mapping[str, str], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise ETSCSVError(path, line, f"column {column!r}: not a number: {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ETSCSVError(path, line, f"column {column!r}: not finite: {text!r}") from None
        return round(value)


def _params_field(path: Path, line: int, text: str | None) -> tuple[int, ...]:
    body = (text or "").strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ETSCSVError(path, line, f"column 'params': expected a list of ints, got {body!r}")
    try:
        values = tuple(int(v) for v in body[1:-1].split(",") if v.strip())
    except ValueError:
        raise ETSCSVError(path, line, f"column 'params': not a list of ints: {body!r}") from None
    if len(values) != ETS_PARAM_COUNT:
        raise ETSCSVError(
            path, line, f"column 'params': expected {ETS_PARAM_COUNT} ints, got {len(values)}"
        )
    return values


def read_ets_csv(
    path: Path | str,
    *,
    op_codes: Mapping[int, str] | None = None,
    device_name: str | None = None,
) -> Trace:
    """Import one artifact CSV file as a ``Trace`` (see the module docstring for the mapping).

    Numeric cells may be written as floats; they are rounded to ints.

    Args:
        path: the CSV file.
        op_codes: maps the ``op`` column's codes to names. None: ``opCodes.dict`` is looked up
            next to the file and up to three folders above it (none found: a warning, and
            names ``"ets_op_<code>"``).
        device_name: the GPU name for ``trace.device``. None: the file's folder name.

    Returns:
        One trace holding one iteration; ``metadata`` as in the module docstring.

    Raises:
        ETSCSVError: missing header columns, a row of the wrong length, a non-numeric or
            non-finite number, ``dir`` not 1-3, ``input_type`` not 1-2, ``rEndTime`` before
            ``rStartTime``, a negative ``kduration`` / ``kernels`` / ``flops`` / ``bytes``, a
            ``params`` cell that is not 30 ints, a file without rows, or a malformed
            ``opCodes.dict`` found for it.
        OSError: the file cannot be read.
    """
    path = Path(path)
    if op_codes is None:
        table = find_op_codes(path)
        if table is None:
            log.warning("no %s found near %s: op names will be ets_op_<code>", OP_CODES_FILE, path)
            op_codes = {}
        else:
            op_codes = load_op_codes(table)
    if device_name is None:
        device_name = path.resolve().parent.name
    name_parts = parse_ets_file_name(path)

    ops: list[OpEvent] = []
    batch = h = w = -1
    half_rows = 0
    first_k_start = last_k_end = 0
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in ETS_CSV_COLUMNS if c not in header]
        if missing:
            raise ETSCSVError(path, 1, f"missing columns: {', '.join(missing)}")
        for row in reader:
            line = reader.line_num
            if None in row or any(row.get(c) is None for c in ETS_CSV_COLUMNS):
                raise ETSCSVError(
                    path, line, f"expected {len(header)} fields, got a row of another length"
                )
            code = _int_field(path, line, row, "op")
            direction = _int_field(path, line, row, "dir")
            if direction not in _DIR_PHASE:
                raise ETSCSVError(path, line, f"column 'dir': expected 1, 2 or 3, got {direction}")
            input_type = _int_field(path, line, row, "input_type")
            if input_type not in _INPUT_TYPE_DTYPE:
                raise ETSCSVError(
                    path,
                    line,
                    f"column 'input_type': expected 1 (FP32) or 2 (FP16), got {input_type}",
                )
            half_rows += input_type == 2
            r_start = _int_field(path, line, row, "rStartTime")
            r_end = _int_field(path, line, row, "rEndTime")
            k_duration = _int_field(path, line, row, "kduration")
            kernels = _int_field(path, line, row, "kernels")
            flops = _int_field(path, line, row, "flops")
            moved = _int_field(path, line, row, "bytes")
            if r_end < r_start:
                raise ETSCSVError(path, line, f"rEndTime {r_end} precedes rStartTime {r_start}")
            for column, value in (("kduration", k_duration), ("kernels", kernels)):
                if value < 0:
                    raise ETSCSVError(path, line, f"column {column!r}: negative value {value}")
            for column, value in (("flops", flops), ("bytes", moved)):
                if value < 0:
                    raise ETSCSVError(path, line, f"column {column!r}: negative value {value}")
            row_batch = _int_field(path, line, row, "batch")
            row_h = _int_field(path, line, row, "h")
            row_w = _int_field(path, line, row, "w")
            if batch < 0:
                batch, h, w = row_batch, row_h, row_w
            ops.append(
                OpEvent(
                    name=op_codes.get(code, f"ets_op_{code}"),
                    start_ns=r_start,
                    duration_ns=r_end - r_start,
                    phase=_DIR_PHASE[direction],
                    sequence_nr=_int_field(path, line, row, "seq"),
                    input_dtypes=(_INPUT_TYPE_DTYPE[input_type],),
                    flops=flops,
                    bytes_moved=moved,
                    params=_params_field(path, line, row["params"]),
                    kernel_duration_ns=k_duration,
                    kernel_count=kernels,
                    gap_ns=max(0, _int_field(path, line, row, "space")),
                )
            )
            if len(ops) == 1:
                first_k_start = _int_field(path, line, row, "kStartTime")
            last_k_end = _int_field(path, line, row, "kEndTime")
    if not ops:
        raise ETSCSVError(path, 0, "no rows")
    # The iteration spans the GPU side: first op's kernels to the last op's kernels plus its gap.
    start_ns = first_k_start
    end_ns = max(last_k_end + ops[-1].gap_ns, start_ns)
    precision = "fp32" if half_rows == 0 else "fp16" if half_rows == len(ops) else "mixed"
    if precision == "mixed":
        log.warning("%s: %d of %d rows are FP16 (input_type 2)", path, half_rows, len(ops))
    iteration = IterationTrace(step=name_parts.step, start_ns=start_ns, end_ns=end_ns, ops=ops)
    return Trace(
        iterations=[iteration],
        device=DeviceInfo(kind="cuda", name=device_name),
        metadata={
            "source": "ets-csv",
            "file": path.name,
            "model": name_parts.model,
            "config": name_parts.config,
            "batch_size": batch,
            "input_h": h,
            "input_w": w,
            "precision": precision,
            "half_rows": half_rows,
        },
    )
