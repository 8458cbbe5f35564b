"""Export a ``Trace`` as Chrome trace-event JSON (loads in Perfetto and chrome://tracing).

Layout: one process for the host (ops on their profiler threads, plus a "steps" track), one
process per GPU (kernels on their streams), and one flow arrow op → kernel per correlated kernel.
Timestamps are microseconds from the first iteration's start; events are sorted by timestamp.
Steps are counted from 1, as ``ets-hook info`` and the log count them: the trace's 0-based
``IterationTrace.step`` 3 is the slice "step 4" (and its ops' ``step`` argument 4).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .atomic import atomic_write_bytes
from .events import Trace

HOST_PID = 0
STEPS_TID = -1
GPU_PID_BASE = 1000


def _name(kind: str, pid: int, tid: int | None, label: str) -> dict[str, Any]:
    event: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": {"name": label}}
    if tid is not None:
        event["tid"] = tid
    return event


def chrome_events(trace: Trace) -> list[dict[str, Any]]:
    """The ``traceEvents`` list for ``trace``: metadata events first, then by timestamp.

    Args:
        trace: the trace; kernels' ``op_index`` must index their iteration's ``ops`` (or be -1).

    Returns:
        Chrome trace events (JSON-serialisable dicts); times in µs from the earliest iteration
        start. Empty (no metadata events either) when ``trace`` has no iterations.
    """
    if not trace.iterations:
        return []
    base_ns = min(it.start_ns for it in trace.iterations)

    def us(ns: int) -> float:
        return (ns - base_ns) / 1000.0

    timed: list[dict[str, Any]] = []
    threads: set[int] = set()
    devices: dict[int, set[int]] = {}
    flow_id = 0
    for iteration in trace.iterations:
        shown_step = iteration.step + 1  # counted from 1, as info and the log count steps
        timed.append(
            {
                "name": f"step {shown_step}",
                "ph": "X",
                "cat": "step",
                "ts": us(iteration.start_ns),
                "dur": iteration.duration_ns / 1000.0,
                "pid": HOST_PID,
                "tid": STEPS_TID,
            }
        )
        for op in iteration.ops:
            threads.add(op.thread)
            args: dict[str, Any] = {"phase": op.phase.value, "step": shown_step}
            if op.input_shapes:
                args["input_shapes"] = [list(shape) for shape in op.input_shapes]
                args["input_dtypes"] = list(op.input_dtypes)
            timed.append(
                {
                    "name": op.name,
                    "ph": "X",
                    "cat": "op",
                    "ts": us(op.start_ns),
                    "dur": op.duration_ns / 1000.0,
                    "pid": HOST_PID,
                    "tid": op.thread,
                    "args": args,
                }
            )
        for kernel in iteration.kernels:
            pid = GPU_PID_BASE + kernel.device
            devices.setdefault(kernel.device, set()).add(kernel.stream)
            timed.append(
                {
                    "name": kernel.name,
                    "ph": "X",
                    "cat": kernel.kind.value,
                    "ts": us(kernel.start_ns),
                    "dur": kernel.duration_ns / 1000.0,
                    "pid": pid,
                    "tid": kernel.stream,
                    "args": {
                        "correlation_id": kernel.correlation_id,
                        "grid": list(kernel.grid),
                        "block": list(kernel.block),
                        "bytes": kernel.bytes,
                        "communication": kernel.communication,
                    },
                }
            )
            if kernel.op_index < 0:
                continue
            op = iteration.ops[kernel.op_index]
            flow_id += 1
            common = {"name": "launch", "cat": "launch", "id": flow_id}
            timed.append(
                {**common, "ph": "s", "ts": us(op.start_ns), "pid": HOST_PID, "tid": op.thread}
            )
            timed.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "ts": us(kernel.start_ns),
                    "pid": pid,
                    "tid": kernel.stream,
                }
            )
    timed.sort(key=lambda event: event["ts"])

    meta = [
        _name("process_name", HOST_PID, None, "host"),
        _name("thread_name", HOST_PID, STEPS_TID, "steps"),
    ]
    meta += [_name("thread_name", HOST_PID, t, f"thread {t}") for t in sorted(threads)]
    for device, streams in sorted(devices.items()):
        pid = GPU_PID_BASE + device
        label = f"GPU {device}" + (f" ({trace.device.name})" if trace.device.name else "")
        meta.append(_name("process_name", pid, None, label))
        meta += [_name("thread_name", pid, s, f"stream {s}") for s in sorted(streams)]
    return meta + timed


def chrome_document(trace: Trace) -> dict[str, Any]:
    """The Chrome trace JSON document for ``trace``: ``chrome_events`` and what it came from.

    Args:
        trace: the trace to export.

    Returns:
        A JSON-serialisable dict: ``traceEvents`` (every event the file holds),
        ``displayTimeUnit`` and ``otherData`` (device, versions, rank).
    """
    return {
        "traceEvents": chrome_events(trace),
        "displayTimeUnit": "ms",
        "otherData": {
            "device": trace.device.name or trace.device.kind,
            "torch_version": trace.torch_version,
            "ets_hook_version": trace.ets_hook_version,
            "rank": trace.rank,
        },
    }


def write_chrome(document: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a ``chrome_document`` to ``path`` (atomically).

    Args:
        document: what ``chrome_document`` returned.
        path: the target ``.json`` file; its folder must exist.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OSError: the file cannot be written.
    """
    target = Path(path)
    atomic_write_bytes(target, json.dumps(document).encode("utf-8"))
    return target


def export_chrome(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as Chrome trace JSON to ``path`` (atomically).

    Args:
        trace: the trace to export.
        path: the target ``.json`` file; its folder must exist.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OSError: the file cannot be written.
    """
    return write_chrome(chrome_document(trace), path)
