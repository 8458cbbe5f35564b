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
  precision rows are marked, never silently mixed with FP32 ones; ``unrecorded_params_rows``:
  rows whose ``params`` is a shorter list of zeros (``[0, 0]``: the artifact wrote no tensor
  shapes for some ops, e.g. attention and concatenation in its transformer traces), read as the
  30 zeros of a row without tensors, and counted (one warning per file). ``trace.device`` is a CUDA
  device named after the ``device_name`` argument or, by default, the file's folder (``T4/``).
- Files are hostile input. Anything but a regular file (a directory, FIFO, socket, device) is
  refused before a byte is read; a file over ``max_bytes`` is refused before it is read; every
  failure of a file's contents (not UTF-8, a field over the ``csv`` module's field size limit,
  a malformed row, a malformed ``opCodes.dict``) raises ``ETSCSVError`` (a ``TraceFileError``,
  so a ``ValueError``) naming the file and line. Only an ``OSError`` (a missing or unreadable
  path) is not one. Memory stays proportional to the file, time linear in it.
"""

from __future__ import annotations

import ast
import csv
import io
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ETSCSVError, ETSCSVNotARegularFileError, ETSCSVTooLargeError
from .events import DeviceInfo, IterationTrace, OpEvent, Phase, Trace
from .untrusted import read_regular_file

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
#: Largest ETS CSV file read by default, bytes: ~300x the largest artifact file (~200 KB). Memory
#: stays within a small multiple of it (the text, then one OpEvent per ~200-byte row).
CSV_MAX_BYTES = 64 * 1024 * 1024
#: Largest ``opCodes.dict`` read by default, bytes (the artifact's is under 4 KB).
OP_CODES_MAX_BYTES = 1024 * 1024
_INT64_MIN, _INT64_MAX = _INT64 = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
#: Time cells (``rStartTime``, ``rEndTime``, ``kStartTime``, ``kEndTime``, ``space``) must lie
#: within +-2^61 ns (+-73 years) so that the differences and sums the import makes (durations,
#: the iteration's end, times relative to its start in a saved ``.ets`` file) fit in int64.
TIME_LIMIT_NS = 1 << 61
_TIME_COLUMNS = ("rStartTime", "rEndTime", "kStartTime", "kEndTime", "space")


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


_NAME_RE = re.compile(r"^(?P<model>.+?)\.(?P<config>[^.]+)_(?P<step>\d{1,18})$")


def parse_ets_file_name(path: Path | str) -> ETSFileName:
    """Model, config and step from a file name.

    Args:
        path: a path or file name; only its last component is used, a ``.csv`` suffix (any
            case) dropped.

    Returns:
        The parts; the whole name is the model (config "", step 0) when it does not match
        ``<model>.<config>_<step>`` with a step of at most 18 digits (so it fits in int64).
    """
    stem = Path(path).name
    if stem.lower().endswith(".csv"):
        stem = stem[:-4]
    m = _NAME_RE.match(stem)
    if m is None:
        return ETSFileName(model=stem, config="", step=0)
    return ETSFileName(model=m["model"], config=m["config"], step=int(m["step"]))


def _read_text(path: Path, max_bytes: int) -> str:
    """A regular file's UTF-8 text (a BOM dropped), refusing anything else before reading it.

    Raises:
        ETSCSVNotARegularFileError: ``path`` is a directory, FIFO, socket or device.
        ETSCSVTooLargeError: the file exceeds ``max_bytes``.
        ETSCSVError: the file is not UTF-8 (its line names where).
        OSError: the file cannot be opened or read.
    """
    data = read_regular_file(
        path,
        max_bytes,
        not_regular=lambda kind: ETSCSVNotARegularFileError(
            path, 0, f"{kind}, not a regular file: refused without reading it"
        ),
        too_large=lambda size: ETSCSVTooLargeError(
            path, 0, f"{size} bytes exceeds max_bytes={max_bytes}"
        ),
    )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ETSCSVError(
            path, line, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def _plain(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode (lone surrogates, such as the escapes of
    undecodable bytes in a file name) replaced by U+FFFD, so it can be printed and saved."""
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the undecodable bytes of a file name
    except UnicodeEncodeError:  # other lone surrogates
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


class _OpCodesLexer:
    """A hand-written lexer for ``opCodes.dict``: linear time, no regular expressions (the
    ``tokenize`` module's number and string patterns keep ~650 bytes of backtracking state per
    character of a long token), no recursion."""

    _SPACE = frozenset(" \t\r\f\v")
    _WORD = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")

    def __init__(self, text: str, path: Path) -> None:
        self.text, self.path = text, path
        self.position, self.line = 0, 1

    def error(self, problem: str) -> ETSCSVError:
        return ETSCSVError(self.path, self.line, problem)

    def peek(self) -> str:
        """The next character after blanks, comments and line continuations ("" at the end)."""
        text, end = self.text, len(self.text)
        while self.position < end:
            char = text[self.position]
            if char == "\n":
                self.line += 1
            elif char == "#":
                newline = text.find("\n", self.position)
                self.position = end if newline < 0 else newline
                continue
            elif char == "\\" and text.startswith("\n", self.position + 1):
                self.position += 1
                continue
            elif char not in self._SPACE:
                return char
            self.position += 1
        return ""

    def expect(self, wanted: str) -> str:
        found = self.peek()
        if found not in wanted or not found:
            shown = repr(found) if found else "the end of the file"
            raise self.error(f"expected {' or '.join(map(repr, wanted))}, found {shown}")
        self.position += 1
        return found

    def name(self) -> str:
        """One or more adjacent string literals (Python concatenates them)."""
        parts = []
        while True:
            start = self.position if self.peek() else len(self.text)
            quote_at = start
            while (
                quote_at < len(self.text) and self.text[quote_at] in "rRuU" and quote_at < start + 2
            ):
                quote_at += 1
            if quote_at >= len(self.text) or self.text[quote_at] not in "'\"":
                if parts:
                    return "".join(parts)
                found = self.text[start : start + 20] or "the end of the file"
                raise self.error(f"expected an op name (a string literal), found {found!r}")
            parts.append(self._string(start, quote_at))

    def _string(self, start: int, quote_at: int) -> str:
        text = self.text
        quote = (
            text[quote_at] * 3 if text.startswith(text[quote_at] * 3, quote_at) else text[quote_at]
        )
        at = quote_at + len(quote)
        while not text.startswith(quote, at):
            if at >= len(text) or (text[at] == "\n" and len(quote) == 1):
                raise self.error("a string literal does not end")
            at += 2 if text[at] == "\\" else 1
        token = text[start : at + len(quote)]
        try:
            value = ast.literal_eval(token)  # one string literal: no nesting, linear
        except (SyntaxError, ValueError) as exc:
            raise self.error(f"bad string literal {token[:40]!r}: {exc}") from None
        if not isinstance(value, str) or _plain(value) != value:
            raise self.error(f"op name {token[:40]!r} is not a UTF-8 string")
        self.line += token.count("\n")
        self.position = at + len(quote)
        return value

    def code(self) -> int:
        """An int literal with at most one sign, as ``ast.literal_eval`` reads it."""
        sign = -1 if self.peek() == "-" else 1
        if self.peek() in "+-":
            self.position += 1
        start = self.position if self.peek() else len(self.text)
        end = start
        while end < len(self.text) and self.text[end] in self._WORD and end - start <= 80:
            end += 1
        word = self.text[start:end]
        try:
            value = sign * int(word, 0) if 0 < len(word) <= 80 else None  # 0b + 64 bits fits
        except ValueError:
            value = None
        if value is None or not _INT64_MIN <= value <= _INT64_MAX:
            raise self.error(f"op code {self.text[start : start + 40]!r} is not a 64-bit int")
        self.position = end
        return value


def _parse_op_codes(text: str, path: Path) -> dict[str, int]:
    """Parse ``{'name': code, ...}``: a flat dict literal of strings to ints, nothing else.

    A streaming parser: memory stays proportional to the entries, there is no nesting to
    recurse into, and only one string literal at a time goes through ``ast.literal_eval``
    (which, on the whole file, builds a syntax tree many times its size and raises
    ``MemoryError`` on a long chain of unary signs).
    """
    lexer = _OpCodesLexer(text, path)
    table: dict[str, int] = {}
    lexer.expect("{")
    while lexer.peek() != "}":
        name = lexer.name()
        lexer.expect(":")
        table[name] = lexer.code()
        if lexer.expect(",}") == "}":
            break
    else:
        lexer.expect("}")
    if lexer.peek():
        raise lexer.error(f"text after the dict: {lexer.peek()!r}")
    return table


def load_op_codes(path: Path | str, *, max_bytes: int = OP_CODES_MAX_BYTES) -> dict[int, str]:
    """The artifact's ``opCodes.dict`` (a Python dict literal, op name → code) as code → name.

    Only a flat literal ``{'name': code, ...}`` of strings (any Python string literal syntax)
    to ints is accepted; as in Python, a repeated name keeps its last code.

    Args:
        path: the ``opCodes.dict`` file.
        max_bytes: the largest file accepted, bytes.

    Returns:
        Code → op name; when several names share a code, the first one wins.

    Raises:
        ETSCSVNotARegularFileError: ``path`` is a directory, FIFO, socket or device; nothing
            was read.
        ETSCSVTooLargeError: the file exceeds ``max_bytes``.
        ETSCSVError: the file is not UTF-8, not a dict literal, or an entry is not
            ``str: int`` (an int within int64); its line names where.
        OSError: the file cannot be opened or read.
    """
    path = Path(path)
    table = _parse_op_codes(_read_text(path, max_bytes), path)
    codes: dict[int, str] = {}
    for name, code in table.items():
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
    shown = text if len(text) <= 40 else text[:40] + "..."
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise ETSCSVError(path, line, f"column {column!r}: not a number: {shown!r}") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ETSCSVError(path, line, f"column {column!r}: not finite: {shown!r}") from None
        value = round(number)
    low, high = (-TIME_LIMIT_NS, TIME_LIMIT_NS) if column in _TIME_COLUMNS else _INT64
    if not low <= value <= high:
        raise ETSCSVError(path, line, f"column {column!r}: {shown} is out of range [{low}, {high}]")
    return value


def _params_field(path: Path, line: int, text: str | None) -> tuple[tuple[int, ...], bool]:
    """The row's ``params``: ``ETS_PARAM_COUNT`` ints, and whether they were not recorded (a
    shorter list of zeros, e.g. ``[0, 0]``, read as all zeros: the artifact's padding for
    absent tensors)."""
    body = (text or "").strip()
    shown = body if len(body) <= 60 else body[:60] + "..."
    if not (body.startswith("[") and body.endswith("]")):
        raise ETSCSVError(path, line, f"column 'params': expected a list of ints, got {shown!r}")
    parts = [v for v in body[1:-1].split(",") if v.strip()]  # the csv field limit bounds it
    if len(parts) > ETS_PARAM_COUNT:
        raise ETSCSVError(
            path, line, f"column 'params': expected {ETS_PARAM_COUNT} ints, got {len(parts)}"
        )
    try:
        values = tuple(int(v) for v in parts)
    except ValueError:
        raise ETSCSVError(path, line, f"column 'params': not a list of ints: {shown!r}") from None
    if any(not _INT64_MIN <= v <= _INT64_MAX for v in values):
        raise ETSCSVError(path, line, "column 'params': a value does not fit in 64 bits")
    if len(values) < ETS_PARAM_COUNT:
        if not values or any(values):
            raise ETSCSVError(
                path,
                line,
                f"column 'params': expected {ETS_PARAM_COUNT} ints (or a shorter list of zeros: "
                f"not recorded), got {len(values)}: {shown!r}",
            )
        return (0,) * ETS_PARAM_COUNT, True
    return values, False


def _folder_name(path: Path) -> str:
    """The name of the folder holding ``path`` (symlinks resolved when possible)."""
    try:
        return path.resolve().parent.name
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return path.absolute().parent.name


def read_ets_csv(
    path: Path | str,
    *,
    op_codes: Mapping[int, str] | None = None,
    device_name: str | None = None,
    max_bytes: int = CSV_MAX_BYTES,
) -> Trace:
    """Import one artifact CSV file as a ``Trace`` (see the module docstring for the mapping).

    Numeric cells may be written as floats; they are rounded to ints, which must fit in 64
    bits. The file is read whole (at most ``max_bytes``) and decoded as UTF-8 (a BOM dropped).

    Args:
        path: the CSV file.
        op_codes: maps the ``op`` column's codes to names. None: ``opCodes.dict`` is looked up
            next to the file and up to three folders above it (none found: a warning, and
            names ``"ets_op_<code>"``).
        device_name: the GPU name for ``trace.device``. None: the file's folder name.
        max_bytes: the largest file accepted, bytes.

    Returns:
        One trace holding one iteration; ``metadata`` as in the module docstring.

    Raises:
        ETSCSVNotARegularFileError: ``path`` (or the ``opCodes.dict`` found for it) is a
            directory, FIFO, socket or device; nothing was read from it.
        ETSCSVTooLargeError: the file exceeds ``max_bytes`` (or the ``opCodes.dict``
            ``OP_CODES_MAX_BYTES``).
        ETSCSVError: text that is not UTF-8, malformed CSV (such as a field over the ``csv``
            module's field size limit), missing header columns, a row of the wrong length, a
            non-numeric, non-finite or over-64-bit number, ``dir`` not 1-3, ``input_type``
            not 1-2, ``rEndTime`` before ``rStartTime``, a negative ``kduration`` /
            ``kernels`` / ``flops`` / ``bytes``, a ``params`` cell that is neither 30 ints
            nor a shorter list of zeros, a
            file without rows, or a malformed ``opCodes.dict`` found for it.
        OSError: the file cannot be opened or read.
    """
    path = Path(path)
    text = _read_text(path, max_bytes)
    if op_codes is None:
        table = find_op_codes(path)
        if table is None:
            log.warning("no %s found near %s: op names will be ets_op_<code>", OP_CODES_FILE, path)
            op_codes = {}
        else:
            op_codes = load_op_codes(table)
    if device_name is None:
        device_name = _plain(_folder_name(path))
    name_parts = parse_ets_file_name(path)

    ops: list[OpEvent] = []
    batch = h = w = -1
    half_rows = 0
    unrecorded_params_rows = 0
    first_k_start = last_k_end = 0
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
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
            if kernels > _INT32_MAX:  # a count: the .ets format stores it in 32 bits
                raise ETSCSVError(path, line, f"column 'kernels': {kernels} is out of range")
            for column, value in (("flops", flops), ("bytes", moved)):
                if value < 0:
                    raise ETSCSVError(path, line, f"column {column!r}: negative value {value}")
            row_batch = _int_field(path, line, row, "batch")
            row_h = _int_field(path, line, row, "h")
            row_w = _int_field(path, line, row, "w")
            if batch < 0:
                batch, h, w = row_batch, row_h, row_w
            params, unrecorded = _params_field(path, line, row["params"])
            unrecorded_params_rows += unrecorded
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
                    params=params,
                    kernel_duration_ns=k_duration,
                    kernel_count=kernels,
                    gap_ns=max(0, _int_field(path, line, row, "space")),
                )
            )
            if len(ops) == 1:
                first_k_start = _int_field(path, line, row, "kStartTime")
            last_k_end = _int_field(path, line, row, "kEndTime")
    except csv.Error as exc:  # e.g. a field larger than csv.field_size_limit()
        line = max(reader.reader.line_num, 1)  # DictReader.line_num lags behind on errors
        raise ETSCSVError(path, line, f"malformed CSV: {exc}") from None
    if not ops:
        raise ETSCSVError(path, 0, "no rows")
    # The iteration spans the GPU side: first op's kernels to the last op's kernels plus its gap.
    start_ns = first_k_start
    end_ns = max(last_k_end + ops[-1].gap_ns, start_ns)
    precision = "fp32" if half_rows == 0 else "fp16" if half_rows == len(ops) else "mixed"
    if precision == "mixed":
        log.warning("%s: %d of %d rows are FP16 (input_type 2)", path, half_rows, len(ops))
    if unrecorded_params_rows:
        log.warning(
            "%s: %d of %d rows have no params recorded (e.g. [0, 0]): read as zeros",
            path,
            unrecorded_params_rows,
            len(ops),
        )
    iteration = IterationTrace(step=name_parts.step, start_ns=start_ns, end_ns=end_ns, ops=ops)
    return Trace(
        iterations=[iteration],
        device=DeviceInfo(kind="cuda", name=device_name),
        metadata={
            "source": "ets-csv",
            "file": _plain(path.name),
            "model": _plain(name_parts.model),
            "config": _plain(name_parts.config),
            "batch_size": batch,
            "input_h": h,
            "input_w": w,
            "precision": precision,
            "half_rows": half_rows,
            "unrecorded_params_rows": unrecorded_params_rows,
        },
    )
