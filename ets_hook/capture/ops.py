"""Operator capture: PyTorch's Kineto CPU profiler, enabled once for the capture window.

Why this mechanism (measured on a 2-core CPU, see benchmarks/overhead.py and the README): the C++
RecordFunction observers behind ``torch.autograd._enable_profiler`` see every ATen op and autograd
node on every thread autograd propagates to, with start/end in ns, at about 1.2 µs per op without
shapes and 2 µs with (the disable then costs 6 and 16 µs per event). Shapes are recorded for
every captured step by default (``record_shapes="all"``: no profiler restart inside the
window); ``record_shapes="first"`` records them for the first captured step only and copies them
onto the aligned ops of the others. ``TorchDispatchMode`` misses composite ops and autograd
nodes and costs more; a ``torch.profiler`` context per step costs milliseconds.
Only CPU activities are requested, so Kineto never touches CUPTI: the kernel side is ours.

Contract: ``start``/``stop`` run on the training thread and do only the profiler's own
enable/disable work. Never stop and start again while a ``record_function`` scope that began
under the first session is still open (e.g. inside ``Optimizer.step#...``, where our step hook
runs): its end callback would run against the second session and crash. ``stop`` alone is safe
anywhere; the hook restarts at the next root-module forward. Reading events back
(``read_raw_events``, ~9 µs per event) happens later, off the training thread.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.autograd as autograd
from torch._C import _profiler

from ..trace.decode import RawOp


def other_profiler_active() -> str | None:
    """Why op capture must stay off (another profiler owns the session), or None.

    Never raises: when torch's private profiler query fails, the failure is the reason
    returned (op capture stays off).
    """
    try:
        if autograd._profiler_enabled():
            return f"another torch profiler is active ({torch._C._autograd._profiler_type()})"
    except Exception as exc:  # private API moved: treat as unknown but safe
        return f"cannot query the torch profiler state ({exc})"
    return None


def _config(record_shapes: bool) -> Any:
    return _profiler.ProfilerConfig(
        _profiler.ProfilerState.KINETO,
        record_shapes,  # report_input_shapes
        False,  # profile_memory
        False,  # with_stack
        False,  # with_flops
        False,  # with_modules
        _profiler._ExperimentalConfig(),
        "",
    )


class OpProfiler:
    """Owns one Kineto CPU-only profiling session at a time on the calling thread.

    ``results`` holds the opaque ``_ProfilerResult`` of each finished session (shapes session
    first); they are converted by ``read_raw_events`` off the training thread.

    Attributes:
        results: one opaque ``_ProfilerResult`` per finished session, oldest first.
    """

    def __init__(self) -> None:
        self.results: list[Any] = []
        self._active = False

    @property
    def active(self) -> bool:
        """Whether a session started by ``start`` is still running."""
        return self._active

    def start(self, record_shapes: bool) -> None:
        """Enable a Kineto CPU-only profiling session on the calling thread.

        Args:
            record_shapes: record input shapes and dtypes of every op.

        Raises:
            RuntimeError: this profiler already has an active session. Errors of torch's
                profiler enable (e.g. another profiler session is active) pass through, and the
                profiler then stays inactive.
        """
        if self._active:
            raise RuntimeError("op profiler already started")
        config = _config(record_shapes)
        activities = {_profiler.ProfilerActivity.CPU}
        autograd._prepare_profiler(config, activities)
        autograd._enable_profiler(config, activities)
        self._active = True

    def stop(self) -> None:
        """End the current session and append its result to ``results``; no-op when inactive.

        Only the cheap part runs here (no event conversion). Errors of torch's profiler disable
        pass through (the profiler is marked inactive first).
        """
        if not self._active:
            return
        self._active = False
        self.results.append(autograd._disable_profiler())


def read_raw_events(result: Any) -> list[RawOp]:
    """Convert one profiler result to ``RawOp`` rows (slow: call off the training thread).

    ~9 µs per event, nearly all of it in the binding's getters (0.5-0.9 µs each); the getters
    already return Python ints and lists of ints, so no per-value conversion is added.

    Args:
        result: one entry of ``OpProfiler.results``.

    Returns:
        One ``RawOp`` per CPU event, in the profiler's event order (times in ns); shapes and
        dtypes are empty when the event has none recorded.
    """
    cpu = torch.autograd.DeviceType.CPU
    rows: list[RawOp] = []
    append = rows.append
    for event in result.events():
        if event.device_type() != cpu:
            continue
        shapes = event.shapes()
        append(
            RawOp(
                event.name(),
                event.start_ns(),
                event.duration_ns(),
                event.start_thread_id(),
                event.sequence_nr(),
                event.scope(),
                tuple(map(tuple, shapes)) if shapes else (),
                tuple(event.dtypes()) if shapes else (),
            )
        )
    return rows
