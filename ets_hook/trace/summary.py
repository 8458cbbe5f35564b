"""The per-step table ``ets-hook info`` prints: op, kernel and phase counts of each iteration.

A trace may come from a hostile file. ``trace.io`` checks every field's type and range when it
loads one, and the text here is printed defensively on top of that: strings from the trace (and
the source path) have control characters, escapes and anything a terminal or UTF-8 cannot show
replaced by ``\\x..``/``\\u....`` escapes and are shortened to ``TEXT_LIMIT`` characters, and
numbers that are not finite print as such instead of raising.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .events import IterationTrace, Trace

#: Longest string from a trace that ``format_info`` shows; longer ones end in "...".
TEXT_LIMIT = 120


@dataclass(frozen=True)
class IterationSummary:
    """One row of the ``info`` table.

    Attributes:
        step: the iteration's step number.
        duration_ms: step wall time, ms.
        ops: number of ops.
        top_level_ops: number of outermost ops.
        kernels: number of GPU records (an imported per-op trace without records: the kernels
            its outermost ops count).
        correlated_kernels: GPU records linked to an op (imported per-op: all of them).
        cpu_ms: summed duration of the outermost ops, ms.
        gpu_ms: summed kernel/memcpy/memset time, ms (imported per-op: the outermost ops'
            kernel time).
        gaps_ms: summed positive ETS gaps of the outermost ops (host or device gaps), ms.
    """

    step: int
    duration_ms: float
    ops: int
    top_level_ops: int
    kernels: int
    correlated_kernels: int
    cpu_ms: float
    gpu_ms: float
    gaps_ms: float


def summarize_iteration(iteration: IterationTrace) -> IterationSummary:
    """Summarise one iteration for the ``info`` table.

    Args:
        iteration: a decoded or imported iteration.

    Returns:
        Its counts and summed times; only positive gaps are summed (-1 means unknown).
    """
    top = list(iteration.top_level_ops())
    if iteration.kernels:
        kernels = len(iteration.kernels)
        linked = sum(1 for k in iteration.kernels if k.op_index >= 0)
        gpu_ns = sum(k.duration_ns for k in iteration.kernels)
    else:  # an imported per-op trace (ETS CSV): each op carries its kernels' count and time
        kernels = linked = sum(max(op.kernel_count, 0) for op in top)
        gpu_ns = sum(op.kernel_duration_ns for op in top if op.kernel_duration_ns > 0)
    return IterationSummary(
        step=iteration.step,
        duration_ms=iteration.duration_ns / 1e6,
        ops=len(iteration.ops),
        top_level_ops=len(top),
        kernels=kernels,
        correlated_kernels=linked,
        cpu_ms=sum(op.duration_ns for op in top) / 1e6,
        gpu_ms=gpu_ns / 1e6,
        gaps_ms=sum(op.gap_ns for op in top if op.gap_ns > 0) / 1e6,
    )


def printable(value: Any, limit: int = TEXT_LIMIT) -> str:
    """``value`` as one line of text that is safe to print to a terminal.

    Args:
        value: normally a string; anything else shows as ``<type name>`` (never its ``repr``,
            which could be deep or huge).
        limit: the most characters kept; a longer text is cut and ends in "...".

    Returns:
        The text with control, format, separator and surrogate characters (ANSI escapes,
        newlines, lone surrogates, ...) written as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``.
    """
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"
    text = value[:limit]
    if not text.isprintable():  # Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs but " "
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    return text + ("..." if len(value) > limit else "")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _number(value: Any) -> str:
    """An int or float for the header lines; "?" for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return "?"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if math.isfinite(seconds) else str(seconds)


def format_info(trace: Trace, source: str) -> str:
    """The text ``ets-hook info`` prints: a header of trace facts, then one line per iteration.

    Args:
        trace: the trace to describe.
        source: what to show as the trace's origin (its path).

    Returns:
        Multi-line text without a trailing newline; the first 12 step times (ms) are appended
        when ``trace.step_times_s`` is non-empty. Steps are counted from 1, as the log counts
        them (``IterationTrace.step`` + 1).
    """
    device, host, capture = trace.device, trace.host, trace.capture
    kind = printable(device.kind)
    skip, steps = capture.skip_steps, capture.capture_steps
    # Steps counted from 1, as the log counts them (the trace stores 0-based indices).
    window = f"{skip + 1}-{skip + steps}" if {type(skip), type(steps)} == {int} and steps else "-"
    lines = [
        f"trace    {printable(source, limit=4 * TEXT_LIMIT)}",
        f"device   {printable(device.name) or kind} ({kind})   host {printable(host.hostname)}"
        f"   torch {printable(trace.torch_version)}"
        f"   ets-hook {printable(trace.ets_hook_version)}",
        f"capture  steps {window}"
        f"   ops: {printable(capture.op_capture) or '-'}"
        f"   shapes: {printable(capture.shapes_recorded) or '-'}",
        f"kernels  {printable(capture.kernel_capture) or '-'}"
        f"   dropped records: {_number(capture.dropped_records)}",
        f"rank     {_number(trace.rank)}/{_number(trace.world_size)}",
        *_import_lines(trace.metadata),
        "",
        f"{'step':>5} {'time ms':>9} {'ops':>7} {'top':>6} {'kernels':>8} {'linked':>7}"
        f" {'cpu ms':>9} {'gpu ms':>9} {'gaps ms':>9}",
    ]
    for iteration in trace.iterations:
        s = summarize_iteration(iteration)
        lines.append(
            f"{s.step + 1:>5} {s.duration_ms:>9.3f} {s.ops:>7} {s.top_level_ops:>6} {s.kernels:>8}"
            f" {s.correlated_kernels:>7} {s.cpu_ms:>9.3f} {s.gpu_ms:>9.3f} {s.gaps_ms:>9.3f}"
        )
    if trace.step_times_s:
        timed = ", ".join(_ms(t) for t in trace.step_times_s[:12])
        more = " ..." if len(trace.step_times_s) > 12 else ""
        lines += ["", f"step times (ms) from step 1: {timed}{more}"]
    return "\n".join(lines)


#: Metadata an importer sets (``trace.importers``), shown on the ``import`` line, in this order.
_IMPORT_FIELDS = (
    ("model", "model"),
    ("config", "config"),
    ("batch_size", "batch"),
    ("precision", "precision"),
    ("half_rows", "fp16 rows"),
    ("unrecorded_params_rows", "rows without params"),
)


def _import_lines(metadata: Any) -> list[str]:
    """The ``import`` header line of a trace read from a foreign format (none otherwise)."""
    if not isinstance(metadata, dict) or "source" not in metadata:
        return []
    facts = []
    for key, label in _IMPORT_FIELDS:
        if key in metadata:
            value = metadata[key]
            shown = printable(value) if isinstance(value, str) else _number(value)
            facts.append(f"{label} {shown}")
        if key == "batch_size" and "input_h" in metadata and "input_w" in metadata:
            facts.append(f"input {_number(metadata['input_h'])}x{_number(metadata['input_w'])}")
    return [f"import   {printable(metadata['source'])}: " + ", ".join(facts)]


def _scalar_metadata(metadata: Any) -> dict[str, Any]:
    """The trace's metadata entries that JSON can hold as they are (finite scalars)."""
    if not isinstance(metadata, dict):
        return {}
    return {
        str(k): v
        for k, v in metadata.items()
        if isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))
    }


def info_document(trace: Trace, source: str) -> dict[str, Any]:
    """What ``ets-hook info --json`` prints: trace facts and one summary per iteration.

    Args:
        trace: the trace to describe.
        source: what to show as the trace's origin (its path).

    Returns:
        A dict that ``json.dumps(..., allow_nan=False)`` accepts: keys ``trace``, ``device``,
        ``host`` (``HostInfo`` fields), ``capture``, ``torch_version``, ``ets_hook_version``
        (None where the trace has none: imported traces), ``rank``, ``world_size`` (what the
        text view's header shows, under the trace's names), ``metadata`` (its entries that are
        finite scalars: an imported trace's model, precision, ...), ``step_times_s`` (a step
        time that is not finite becomes None) and ``iterations`` (``IterationSummary`` fields).
    """
    return {
        "trace": source,
        "device": asdict(trace.device),
        "host": asdict(trace.host),
        "capture": asdict(trace.capture),
        "torch_version": trace.torch_version,
        "ets_hook_version": trace.ets_hook_version or None,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "metadata": _scalar_metadata(trace.metadata),
        "step_times_s": [t if math.isfinite(t) else None for t in trace.step_times_s],
        "iterations": [asdict(summarize_iteration(it)) for it in trace.iterations],
    }
