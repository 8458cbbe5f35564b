"""Operator capture for the window: our native RecordFunction observer, the profiler as fallback.

Two ways to see every op (ATen ops, autograd nodes, user annotations, on every thread), both
started and stopped on the training thread and read back later, off it, as ``RawOp`` rows:

- ``NativeOpCapture`` (the default): ``ets_hook._ops``, a global RecordFunction callback that
  writes fixed-size start/end records into per-thread buffers (built for the running torch by
  ``capture.native_ops``). No teardown at the window's end (removing the callback costs about
  0.1 µs), no output on stderr, and it coexists with a user's own ``torch.profiler``. Shapes can
  be switched off at any step boundary by swapping the callback.
- ``ProfilerOpCapture`` (fallback when the observer is not built, and the cross-check): PyTorch's
  Kineto CPU profiler (``torch.autograd._enable_profiler`` with CPU activities only, so Kineto
  never touches CUPTI). Its disable materialises every event on the training thread (6-16 µs
  per event), it prints ``USDT`` lines on stderr and it cannot run beside another profiler.
  Never stop and start it again while a ``record_function`` scope that began under the first
  session is still open (e.g. inside ``Optimizer.step#...``, where our step hook runs): its end
  callback would run against the second session and crash. ``stop`` alone is safe anywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.autograd as autograd
import torch.autograd.profiler as autograd_profiler
from torch._C import _profiler

from ..trace.decode import RawOp

#: Per-thread buffer budget of the native observer (events + input shapes). At 48 bytes per
#: record and two records per op that is 2.7 M ops on one thread before anything is dropped.
NATIVE_THREAD_BUDGET_BYTES = 256 << 20


def other_profiler_active() -> str | None:
    """Why the profiler path must stay off (another profiler owns the session), or None.

    Never raises: when torch's private profiler query fails, the failure is the reason
    returned (op capture stays off).
    """
    try:
        if autograd._profiler_enabled():
            return f"another torch profiler is active ({torch._C._autograd._profiler_type()})"
    except Exception as exc:  # private API moved: treat as unknown but safe
        return f"cannot query the torch profiler state ({exc})"
    return None


# ---------------------------------------------------------------------------------------------
# Native observer


class NativeObserverBusyError(RuntimeError):
    """The native observer's one session belongs to another ``NativeOpCapture`` (another
    ``ETSHook``'s window in this process), from its ``start`` until its records are read or
    discarded."""


# The capture whose records the observer holds: the observer has one session per process, and
# its records live until their owner reads or discards them (a second ``start`` would forget
# them). Guarded by _owner_lock.
_owner: NativeOpCapture | None = None
_owner_lock = threading.Lock()


def native_observer_holder() -> NativeOpCapture | None:
    """The ``NativeOpCapture`` holding the observer (its session open, or its records not yet
    read or discarded: another capture's ``start`` would raise ``NativeObserverBusyError``), or
    None."""
    with _owner_lock:
        return _owner


@dataclass(frozen=True, slots=True)
class DecodeCost:
    """What decoding a window costs the training thread: a fixed part plus a part per op
    recorded, each a (low, high) range.

    Attributes:
        fixed_s: seconds any decode costs (the trace model's set-up), (low, high).
        us_per_op: µs each op recorded costs, (low, high).
    """

    fixed_s: tuple[float, float]
    us_per_op: tuple[float, float]

    def range_s(self, ops: float) -> tuple[float, float]:
        """Seconds to decode ``ops`` ops, (low, high)."""
        return (
            self.fixed_s[0] + ops * self.us_per_op[0] * 1e-6,
            self.fixed_s[1] + ops * self.us_per_op[1] * 1e-6,
        )

    def midpoint_s(self, ops: float) -> float:
        """Seconds to decode ``ops`` ops at the midpoints of both ranges."""
        low, high = self.range_s(ops)
        return 0.5 * (low + high)


#: The cost of a decode that does not happen (a window whose ops were dropped).
NO_DECODE = DecodeCost(fixed_s=(0.0, 0.0), us_per_op=(0.0, 0.0))


class NativeOpCapture:
    """One capture session of the native observer (``ets_hook._ops``).

    Args:
        module: the loaded observer module (``capture.native_ops.load()``).
        thread_budget_bytes: per-thread buffer budget; records past it are dropped and counted.

    Attributes:
        name: how ``CaptureInfo.op_capture`` and ``capture_status`` name this path.
        boundaries: step boundaries its window has seen while it held the observer (the
            window counts them): a capture whose count stops moving belongs to a loop that
            stopped (a notebook cell that raised inside the window).
        on_preempt: set by its window: abandons that window (stop, discard, observer given
            back), for a hook that needs the observer from a capture whose loop stopped.
    """

    name = "native RecordFunction observer"
    #: What this capture costs a CPU job (``forecast.stats.StepTimePrior`` fields, whose range
    #: midpoint is the correction and half-width its uncertainty): window steps / the steady
    #: step 1.02-1.45 (10-90%), median 1.13; the two steps after the window (the decode on a
    #: shared GIL) 0.8-43 steady steps (2.5-97.5%), median 5.6; over the 72 jobs of
    #: ``benchmarks/collect.py`` (``benchmarks/capture_priors.py``). That spike read in steps
    #: over-priced long steps before the window was measured: over the accuracy benchmark's 108
    #: runs with the window after three steps (2026-12-06, the excess of steps 4-10 over the
    #: steady step less that of steps 11-17) the window and its decode cost a median 10 / 18 /
    #: 15 / 50 ms on steps of < 5 / 5-15 / 15-40 / 40-200 ms (3.4 / 2.1 / 0.6 / 0.6 steps),
    #: where 0.5-11 steps projected 18 / 66 / 171 / 492 ms (a Lightning CNN's 0.23 s steps:
    #: 1.5 s against ~0.05 s). The spike is now 0-0.6 steps plus 0-30 ms (projected 17 / 22 /
    #: 32 / 64 ms, median |error| 7 / 5 / 16 / 25 ms), until the window measures its own.
    cpu_costs: ClassVar[Mapping[str, tuple[float, float]]] = {
        "capture_ratio": (1.0, 1.3),
        "capture_spike_steps": (0.0, 0.6),
        "capture_spike_excess_s": (0.0, 0.030),
    }
    #: Wall time the observer adds per op, µs, (low, high) without / with input shapes: the
    #: per-round IQRs of ``benchmarks/overhead.py`` on four CPU models (0.49-0.71 µs/op without
    #: shapes, 0.56-0.95 with), widened. With the ops each window step records this gives the
    #: job's own window slowdown (``capture.window.measured_capture_ratio``).
    us_per_op: ClassVar[Mapping[bool, tuple[float, float]]] = {
        False: (0.3, 0.7),
        True: (0.4, 0.9),
    }
    #: Training-thread time the decode after the window costs, with the learned trace model
    #: (True) and without it (False: per-op medians, a user's estimator or none). The decode
    #: and the trace model run on a background thread but hold the GIL for most of their work,
    #: so the training loop, which needs it between its ops, all but stops meanwhile. Measured
    #: (``benchmarks/decode_cost.py --lost-time``, 2026-12-07, four zoo workloads of
    #: 1,000-21,000 ops, three runs each): the steps beside the decode lost 8-19 ms + 11-12.5
    #: µs per op with the model (its set-up is the fixed part: a 1,035-op MLP window lost 20-40
    #: ms where a per-op prior of 4-25 µs said 4-26 ms), 0 ms + 7.4 µs per op without; widened for
    #: machines up to ~4x faster. With the window's op count this gives the job's own
    #: post-window cost (``capture.window.measured_spike_steps``) and the adaptive window's
    #: budget (``capture.window.window_budget``).
    decode_costs: ClassVar[Mapping[bool, DecodeCost]] = {
        True: DecodeCost(fixed_s=(0.002, 0.025), us_per_op=(3.0, 16.0)),
        False: DecodeCost(fixed_s=(0.0, 0.002), us_per_op=(2.0, 10.0)),
    }

    def __init__(self, module: Any, thread_budget_bytes: int = NATIVE_THREAD_BUDGET_BYTES) -> None:
        self._ops = module
        self._budget = thread_budget_bytes
        self._active = False
        self._dtype = np.dtype(
            {
                "names": [f[0] for f in module.record_fields()],
                "formats": [f[1] for f in module.record_fields()],
                "offsets": [f[2] for f in module.record_fields()],
                "itemsize": module.RECORD_ITEMSIZE,
            }
        )
        self.dropped = 0
        self.boundaries = 0
        self.on_preempt: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        """Whether the callback is registered."""
        return self._active

    def start(self, record_shapes: bool, correlation: Any = None) -> None:
        """Take the observer and register the callback; from now on every op on every thread
        is recorded. This capture holds the observer until ``read`` or ``discard``; starting
        again before then (a restart) forgets what it recorded.

        Args:
            record_shapes: record each op's input shapes and dtypes.
            correlation: ``capture.cupti.correlation_api()`` while the CUPTI collector runs
                (each op then pushes its id as external correlation id), else None.

        Raises:
            NativeObserverBusyError: another capture holds the observer.
            RuntimeError: a session is already open (in this process), or torch refused the
                callback.
        """
        global _owner
        with _owner_lock:
            if _owner is not None and _owner is not self:
                raise NativeObserverBusyError(
                    "the native op observer holds another capture's records (another "
                    "ETSHook's window in this process)"
                )
            taken, _owner = _owner is None, self
        try:
            self._ops.start(record_shapes, self._budget, correlation)  # forgets older records
        except BaseException:
            if taken:
                self._release()
            raise
        self._active = True

    def _release(self) -> None:
        global _owner
        with _owner_lock:
            if _owner is self:
                _owner = None

    def _owns(self) -> bool:
        with _owner_lock:
            return _owner is self

    def set_record_shapes(self, record_shapes: bool) -> None:
        """Record shapes (or not) from the next op on; safe at any point of a step.

        Raises:
            RuntimeError: no session is open.
        """
        self._ops.set_inputs(record_shapes)

    def records(self) -> int:
        """Start and end records published so far by every thread (cheap: one lock, a sum)."""
        return int(self._ops.record_count())

    def stop(self) -> None:
        """Remove the callback (ops still open keep their end records coming). Idempotent."""
        if self._active:
            self._active = False
            self._ops.stop()

    def discard(self) -> None:
        """Forget the recorded ops without reading them, free the buffers and give the
        observer back. After ``stop``; idempotent, and a no-op once the observer was given
        back (it may hold another capture's records by then).

        Raises:
            RuntimeError: the callback is still registered (``stop`` first).
        """
        if self._owns():
            try:
                self._ops.reset()
            finally:
                self._release()

    def read(self) -> list[RawOp]:
        """The recorded ops as ``RawOp`` rows (any order); frees the buffers and gives the
        observer back. Off the training thread, after ``stop``.

        Returns:
            One row per op, times on the trace clock (CLOCK_REALTIME ns), ``thread`` the OS
            thread id. An op still open (the window ends inside ``Optimizer.step#...``, whose
            end comes after the callback is removed) lasts until the drain, so the ops inside it
            still nest under it. Empty once the observer was given back (read or discarded).
        """
        if not self._owns():
            return []
        try:
            drained_ns = time.time_ns()
            chunks = self._ops.drain()
            self.dropped = int(self._ops.dropped())
            names = self._ops.names()
            rows = _native_rows(self._ops, self._dtype, chunks, names, drained_ns)
            self._ops.reset()
        finally:
            self._release()
        return rows


def _native_rows(
    module: Any, dtype: np.dtype, chunks: list[Any], names: list[str], drained_ns: int
) -> list[RawOp]:
    if not chunks:
        return []
    events = np.concatenate([np.frombuffer(events, dtype=dtype) for _, events, _ in chunks])
    starts = events[events["kind"] == 1]
    ends = events[events["kind"] == 2]
    ends = ends[np.argsort(ends["handle"], kind="stable")]
    where = np.searchsorted(ends["handle"], starts["handle"])
    paired = where < len(ends)
    paired[paired] = ends["handle"][where[paired]] == starts["handle"][paired]
    end_ns = np.full(len(starts), drained_ns, dtype=np.int64)  # still open: until the drain
    end_ns[paired] = ends["time_ns"][where[paired]]
    inputs = _inputs_by_handle(module, [words for _, _, words in chunks])
    handles = starts["handle"].tolist()
    no_inputs: tuple[tuple[tuple[int, ...], ...], tuple[str, ...]] = ((), ())
    shapes_dtypes = [inputs.get(handle, no_inputs) for handle in handles]
    # Column-wise: one numpy gather per field, then one RawOp per op (no per-op arithmetic).
    return list(
        map(
            RawOp,
            np.asarray(names, dtype=object)[starts["name_id"]].tolist(),
            starts["time_ns"].tolist(),
            np.maximum(end_ns - starts["time_ns"], 0).tolist(),
            starts["os_tid"].tolist(),
            starts["seq_nr"].tolist(),
            starts["scope"].tolist(),
            [shapes for shapes, _ in shapes_dtypes],
            [dtypes for _, dtypes in shapes_dtypes],
            handles,
        )
    )


def _inputs_by_handle(
    module: Any, buffers: list[bytes]
) -> dict[int, tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]]:
    """Parse the side buffers: [handle, n_words, (code, ndim, dims...)...] per op."""
    dtype_names = module.dtype_names()
    special = {
        module.INPUT_SCALAR: "Scalar",
        module.INPUT_TENSOR_LIST: "TensorList",
        module.INPUT_SCALAR_LIST: "ScalarList",
        module.INPUT_OTHER: "",
    }
    pad = -(2**63)
    out: dict[int, tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]] = {}
    seen: dict[tuple[int, ...], tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]] = {}
    for raw in buffers:
        words = np.frombuffer(raw, dtype="<i8").tolist()
        i, n = 0, len(words)
        while i + 1 < n:
            if words[i] == pad:
                i += 1
                continue
            handle, size = words[i], words[i + 1]
            if size < 2 or i + size > n:
                break  # torn tail (a producer still writing): nothing after it is complete
            stop = i + size
            key = tuple(words[i + 2 : stop])  # the same inputs recur every step: parse once
            parsed = seen.get(key)
            if parsed is None:
                shapes: list[tuple[int, ...]] = []
                dtypes: list[str] = []
                j = i + 2
                while j + 1 < stop:
                    code, ndim = words[j], words[j + 1]
                    shapes.append(tuple(words[j + 2 : j + 2 + ndim]))
                    dtypes.append(dtype_names[code] if code >= 0 else special.get(code, ""))
                    j += 2 + ndim
                parsed = seen[key] = (tuple(shapes), tuple(dtypes))
            out[handle] = parsed
            i = stop
    return out


# ---------------------------------------------------------------------------------------------
# Profiler fallback


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


class ProfilerOpCapture:
    """Kineto CPU-only profiling sessions on the calling thread (the fallback path).

    ``results`` holds the opaque ``_ProfilerResult`` of each finished session (shapes session
    first); ``read`` converts them off the training thread.

    Attributes:
        name: how ``CaptureInfo.op_capture`` and ``capture_status`` name this path.
        results: one opaque ``_ProfilerResult`` per finished session, oldest first.
    """

    name = "torch kineto cpu profiler"
    dropped = 0
    #: As ``NativeOpCapture.cpu_costs``: window steps 1.01-1.64x (10-90%), median 1.21x, over
    #: the 72 jobs of benchmarks/collect.py; disable + decode 2.5-42 steady steps (2.5-97.5%),
    #: median 13, over 56 runs of the accuracy benchmark's jobs.
    cpu_costs: ClassVar[Mapping[str, tuple[float, float]]] = {
        "capture_ratio": (1.0, 1.5),
        "capture_spike_steps": (2.0, 26.0),
    }

    def __init__(self) -> None:
        self.results: list[Any] = []
        self._active = False

    @property
    def active(self) -> bool:
        """Whether a session started by ``start`` is still running."""
        return self._active

    def start(self, record_shapes: bool, correlation: Any = None) -> None:
        """Enable a Kineto CPU-only profiling session on the calling thread.

        Args:
            record_shapes: record input shapes and dtypes of every op.
            correlation: ignored (the profiler path links kernels by launch time).

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

    @staticmethod
    def user_session_active() -> bool:
        """Whether a session of torch's Python profiler API (``torch.profiler.profile``,
        ``torch.autograd.profiler.profile``) is open: torch sets this flag for those, never
        for the sessions ``start`` opens. Such a session opened during ours stacks on it, and
        ``stop`` would then end the user's session instead of ours."""
        return bool(getattr(autograd_profiler, "_is_profiler_enabled", False))

    def stop(self) -> None:
        """End the current session and append its result to ``results``; no-op when inactive.

        Only the cheap part runs here (no event conversion). Errors of torch's profiler disable
        pass through (the profiler is marked inactive first).
        """
        if not self._active:
            return
        self._active = False
        self.results.append(autograd._disable_profiler())

    def forget(self) -> None:
        """Mark the session ended without disabling it: a user's session replaced it and
        ended it (``user_session_active``); its events went with it."""
        self._active = False
        self.results = []

    def read(self) -> list[RawOp]:
        """Every finished session's events as ``RawOp`` rows, then forgets the sessions.

        Returns:
            The rows of all sessions, in session order.
        """
        results, self.results = self.results, []
        return [row for result in results for row in read_raw_events(result)]


def read_raw_events(result: Any) -> list[RawOp]:
    """Convert one profiler result to ``RawOp`` rows (slow: call off the training thread).

    ~9 µs per event, nearly all of it in the binding's getters (0.5-0.9 µs each); the getters
    already return Python ints and lists of ints, so no per-value conversion is added.

    Args:
        result: one entry of ``ProfilerOpCapture.results``.

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
