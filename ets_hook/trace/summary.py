"""The per-step table ``ets-hook info`` prints: op, kernel and phase counts of each iteration."""

from __future__ import annotations

from dataclasses import dataclass

from .events import IterationTrace, Trace


@dataclass(frozen=True)
class IterationSummary:
    """One row of the ``info`` table.

    Attributes:
        step: the iteration's step number.
        duration_ms: step wall time, ms.
        ops: number of ops.
        top_level_ops: number of outermost ops.
        kernels: number of GPU records.
        correlated_kernels: GPU records linked to an op.
        cpu_ms: summed duration of the outermost ops, ms.
        gpu_ms: summed kernel/memcpy/memset time, ms.
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
    return IterationSummary(
        step=iteration.step,
        duration_ms=iteration.duration_ns / 1e6,
        ops=len(iteration.ops),
        top_level_ops=len(top),
        kernels=len(iteration.kernels),
        correlated_kernels=sum(1 for k in iteration.kernels if k.op_index >= 0),
        cpu_ms=sum(op.duration_ns for op in top) / 1e6,
        gpu_ms=sum(k.duration_ns for k in iteration.kernels) / 1e6,
        gaps_ms=sum(op.gap_ns for op in top if op.gap_ns > 0) / 1e6,
    )


def format_info(trace: Trace, source: str) -> str:
    """The text ``ets-hook info`` prints: a header of trace facts, then one line per iteration.

    Args:
        trace: the trace to describe.
        source: what to show as the trace's origin (its path).

    Returns:
        Multi-line text without a trailing newline; the first 12 step times (ms) are appended
        when ``trace.step_times_s`` is non-empty.
    """
    device = trace.device.name or trace.device.kind
    lines = [
        f"trace    {source}",
        f"device   {device} ({trace.device.kind})   host {trace.host.hostname}"
        f"   torch {trace.torch_version}   ets-hook {trace.ets_hook_version}",
        f"capture  steps [{trace.capture.skip_steps}, "
        f"{trace.capture.skip_steps + trace.capture.capture_steps})"
        f"   ops: {trace.capture.op_capture or '-'}"
        f"   shapes: {trace.capture.shapes_recorded or '-'}",
        f"kernels  {trace.capture.kernel_capture or '-'}"
        f"   dropped records: {trace.capture.dropped_records}",
        f"rank     {trace.rank}/{trace.world_size}",
        "",
        f"{'step':>5} {'time ms':>9} {'ops':>7} {'top':>6} {'kernels':>8} {'linked':>7}"
        f" {'cpu ms':>9} {'gpu ms':>9} {'gaps ms':>9}",
    ]
    for iteration in trace.iterations:
        s = summarize_iteration(iteration)
        lines.append(
            f"{s.step:>5} {s.duration_ms:>9.3f} {s.ops:>7} {s.top_level_ops:>6} {s.kernels:>8}"
            f" {s.correlated_kernels:>7} {s.cpu_ms:>9.3f} {s.gpu_ms:>9.3f} {s.gaps_ms:>9.3f}"
        )
    if trace.step_times_s:
        timed = ", ".join(f"{t * 1e3:.2f}" for t in trace.step_times_s[:12])
        more = " ..." if len(trace.step_times_s) > 12 else ""
        lines += ["", f"step times (ms) from step 0: {timed}{more}"]
    return "\n".join(lines)
