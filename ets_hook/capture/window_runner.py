"""The capture window's state machine: when op (and kernel) capture starts, how it follows the
steps, when it ends, and the hand-off of its decoding to a background thread.

``ETSHook`` times the steps and hands each boundary to ``WindowRunner``; ``capture.window`` does
the mechanics (which op capture runs, the kernel collector, building the trace). What the window
measures goes to a ``WindowSink`` (the forecaster, which this module does not import)::

    waiting ──► capturing ──► decoding ──► done
       └────────────┴─────────────┴──────► off   (capture_steps=0, backed off, failed, exit)

Threads: the training thread drives the window (``start``, ``on_step``, ``on_forward``,
``finish``); ``close`` may ``finish`` or ``abandon`` it from another thread. The decode runs on
its own daemon thread, which sets ``trace``, ``kernel_status`` and ``state`` and calls the sink.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import threading
import time
from array import array
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..trace.breakdown import RankBreakdown, rank_breakdown
from ..trace.decode import StepBounds
from ..trace.events import Trace
from ..trace.io import save_trace
from . import native_ops
from .clocks import ClockReading, epoch_ns, read_clocks
from .ops import (
    NO_DECODE,
    DecodeCost,
    NativeOpCapture,
    ProfilerOpCapture,
    native_observer_holder,
)
from .sysinfo import device_info, host_info, machine_facts
from .window import (
    CAPTURE_BUDGET_SHARE,
    WindowBudget,
    WindowFacts,
    WindowState,
    build_window_trace,
    choose_op_capture,
    measured_capture_ratio,
    measured_spike_steps,
    start_kernel_collector,
    window_budget,
)

if TYPE_CHECKING:
    from ..forecast.stats import TraceEstimate

logger = logging.getLogger("ets_hook")

#: With ``auto_skip`` (``ETSHook(skip_steps=None)``), the latest step at which the window starts.
MAX_AUTO_SKIP_STEPS = 32
#: Steps a window waits for the native observer while another hook's capture holds it (two
#: hooks in one process: a GAN's two models); then the torch profiler captures instead.
MAX_OBSERVER_WAIT_STEPS = 32
#: A capture holding the observer whose window saw no step boundary in this many of a waiting
#: hook's steps belongs to a loop that stopped (a notebook cell that raised inside its window:
#: its observer would record every op of the process for good): its window is abandoned and
#: the waiting hook takes the observer. A live window lasts at most 5 of its own steps.
STALE_HOLDER_STEPS = 8


class WindowSink(Protocol):
    """Where the window's measurements go; ``Forecaster`` is one. Called from any thread."""

    def set_capture_window(
        self,
        start_step: int,
        end_step: int,
        *,
        capture_ratio: tuple[float, float] | None = ...,
        capture_spike_steps: tuple[float, float] | None = ...,
        measured: bool = ...,
        window_step_s: float | None = ...,
        capture_spike_excess_s: tuple[float, float] | None = ...,
    ) -> None:
        """Steps ``[start_step, end_step)`` ran inside the capture window, at these costs."""

    def set_window_measure(self, source: Callable[[], dict[str, Any] | None] | None) -> None:
        """Where the window's measured costs come from (``WindowRunner.window_measure``):
        read when a prediction is built, not at every window step."""

    def set_perturbed_steps(self, end_step: int) -> None:
        """Steps before ``end_step`` ran with capture cost in them (capture, decode thread)."""

    def set_trace_estimate(self, estimate: TraceEstimate | None) -> None:
        """The step-time estimate made from the decoded trace."""

    def set_input_wait(self, data_wait_s: float, step_wall_s: float) -> None:
        """The captured steps' median wait for input (a step's start to its first model op,
        ``trace.breakdown``) and their median wall time, seconds."""


class WindowRunner:
    """One hook's capture window: steps ``[skip_steps, skip_steps + capture_steps)``.

    Op capture (+ the CUPTI collector on GPU) starts once at the window's start and stops at its
    end; the window's ops are then decoded into a ``Trace`` (on a background thread unless told
    otherwise), saved, and turned into a trace estimate for the sink. Failures inside the decode
    go to ``on_failure``; those of the other methods reach their caller (the hook's guard).

    Attributes:
        state: where the window stands (a ``WindowState`` value).
        skip_steps: steps before the window; with ``auto_skip``, raised while steps compile.
        capture_steps, record_shapes: as given.
        trace: the decoded trace once decoding has finished, else None.
        kernel_status: kernel capture: ``not requested``, ``on: ...`` or ``off: <reason>``; after
            a decode with kernels, the share of kernels linked to an op is appended.
        window_ops: ops recorded in each window step so far (native path on CPU).
    """

    def __init__(
        self,
        sink: WindowSink,
        *,
        capture_steps: int,
        skip_steps: int,
        auto_skip: bool,
        record_shapes: str,
        op_capture: str,
        capture_kernels: bool | None,
        device: torch.device,
        step_times_s: array[float],
        steps_completed: Callable[[], int],
        remove_capture_hooks: Callable[[], None],
        on_failure: Callable[[BaseException], None],
        trace_estimator: Callable[[Trace], TraceEstimate | None] | None,
        trace_path: str | os.PathLike[str] | None,
        decode_in_background: bool,
        decode_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        on_breakdown: Callable[[RankBreakdown | None], None] | None = None,
        model_name: str = "",
        rank: int = 0,
        world_size: int = 1,
        ets_hook_version: str = "",
        off_note: str = "",
        budget_job_steps: int | None = None,
        budget_may_drop: bool = True,
        decode_cost: DecodeCost = NativeOpCapture.decode_costs[False],
    ) -> None:
        """Set the window up; with ``capture_steps > 0``, get the native op observer loading (or
        building) and gather the machine facts the trace records, before training starts.

        Args:
            sink: receives the window's costs, the perturbed steps and the trace estimate.
            capture_steps: steps in the window (>= 0; 0: no window, ``state`` is off).
            skip_steps: steps timed before the window (>= 0).
            auto_skip: postpone the window while steps still compile, by one step at a time, to
                ``MAX_AUTO_SKIP_STEPS`` at most.
            record_shapes: ``"all"``, ``"first"`` or ``"none"`` (``ETSHook(record_shapes=)``).
            op_capture: ``"auto"``, ``"native"`` or ``"profiler"`` (``ETSHook(op_capture=)``).
            capture_kernels: start the CUPTI kernel collector with the op capture; None: when
                ``device`` is CUDA.
            device: the training device.
            step_times_s: the hook's step times (appended to as steps end; read, never written).
            steps_completed: returns the hook's count of completed steps.
            remove_capture_hooks: removes the step detector's capture-only hooks (the forward
                hook that restarts op capture).
            on_failure: called with an exception raised by the decode; never raises.
            trace_estimator: turns the decoded trace into a step-time estimate; None: none.
            trace_path: where to save the decoded trace; None: not saved.
            decode_in_background: decode on a background thread; False: at the window's end,
                on the thread that ends it.
            decode_context: entered around building the trace and its estimate (the hook
                passes ``ets.blas.single_threaded_blas``).
            on_breakdown: receives the trace's ``rank_breakdown`` (distributed jobs); None: not
                computed.
            model_name, rank, world_size, ets_hook_version: recorded in the trace.
            off_note: why capture is off from the start (e.g. disabled by the environment);
                empty: the note of ``capture_steps=0``, if it is 0.
            budget_job_steps: the steps this process runs in all: the window then adapts to
                them (``capture.window.window_budget``: it ends early, or drops its ops, when
                one more step would take the capture's predicted cost past
                ``CAPTURE_BUDGET_SHARE`` of the job's predicted total; native observer on the
                CPU, where the per-op costs are known); ``capture_steps`` is then the most.
                None: a fixed window of ``capture_steps``.
            budget_may_drop: whether the budget may drop the window's ops altogether; False
                (a trace file was asked for): an over-budget first step ends the window there
                and is decoded, so the trace is written.
            decode_cost: what the decode costs the training thread, for the budget and the
                projected cost (native observer): ``NativeOpCapture.decode_costs[True]`` when
                ``trace_estimator`` is the learned trace model, else ``[False]``.
        """
        self._sink = sink
        # The window's settings, and where it stands (``status``).
        self.capture_steps, self.skip_steps = capture_steps, skip_steps
        self._auto_skip = auto_skip
        self.record_shapes = record_shapes
        self.state = WindowState.WAITING if capture_steps > 0 else WindowState.OFF
        self._capture_note = off_note or (
            "" if capture_steps > 0 else "capture disabled (capture_steps=0)"
        )
        # Op capture, chosen at the window's start.
        self._op_capture_mode = op_capture
        self._ops_note = ""  # which op capture path ran (set at the window's start)
        self._ops: NativeOpCapture | ProfilerOpCapture | None = None
        self._observer_waits = 0  # steps the window was postponed for another hook's capture
        # The capture this window waits for, its boundary count, and the wait it last moved at.
        self._awaited: tuple[NativeOpCapture, int, int] | None = None
        if capture_steps > 0 and op_capture != "profiler":
            # Unbuilt: "auto" builds it on a nice'd thread (profiler meanwhile), "native" now.
            if op_capture == "native":
                native_ops.load(build_if_missing=True)
            else:
                native_ops.load_in_background()
        self._capture_thread = 0  # thread ident that started op capture
        # Kernel capture (CUPTI), started with the op capture.
        self._want_kernels = (
            capture_kernels if capture_kernels is not None else device.type == "cuda"
        )
        self._collector: Any = None
        self.kernel_status = "not requested"
        # The window's steps, as the hook times them.
        self._device = device
        # Both clocks read at the window's start and end: the step bounds (perf-counter time)
        # are moved onto the events' Unix time with these (``clocks``).
        self._clocks_at_start: ClockReading | None = None
        self._step_times_s = step_times_s
        self._steps_completed = steps_completed
        self._window_bounds: list[StepBounds] = []  # perf-counter time until ``finish``
        # Steps of the window whose op capture began after the step started (see on_forward).
        self._partial_steps: list[int] = []
        self._restart_pending = False
        self._budget_job_steps = budget_job_steps
        self._budget_may_drop = budget_may_drop
        self._budget_verdict = WindowBudget.CONTINUE  # of the latest window step
        self._dropped = False  # the budget dropped the window's ops (nothing decoded)
        # The window's measured costs (``window_measure``) and what they were computed from.
        self._window_measure: dict[str, Any] | None = None
        self._measure_key: tuple[int, int, bool] = (0, 0, False)
        self.window_ops: list[int] = []  # ops recorded per window step (native path)
        self._window_records = 0
        self._remove_capture_hooks = remove_capture_hooks
        self._on_failure = on_failure
        # The decode, and what the trace records. Machine facts are resolved before training
        # starts: on the decode thread, psutil and NVML would hold the GIL against the loop.
        facts = machine_facts(device) if capture_steps > 0 else (None, None)
        self._device_info, self._host_info = facts
        self._model_name = model_name
        self._ets_hook_version = ets_hook_version
        self._rank, self._world_size = rank, world_size
        self._trace_estimator = trace_estimator
        self._decode_cost = decode_cost
        self._trace_path = trace_path
        self._decode_in_background = decode_in_background
        self._decode_context = decode_context
        self._on_breakdown = on_breakdown
        self.trace: Trace | None = None
        self._decode_thread: threading.Thread | None = None
        self._trace_ready = threading.Event()

    # ------------------------------------------------------------------------------------------
    # What the hook reads

    @property
    def captured_steps(self) -> int:
        """Window steps that have ended so far (with their ops recorded)."""
        return len(self._window_bounds)

    @property
    def status(self) -> str:
        """``ETSHook.capture_status``: the state, then after ``": "`` the notes, if any."""
        notes = "; ".join(note for note in (self._ops_note, self._capture_note) if note)
        return f"{self.state}: {notes}" if notes else self.state

    def wait(self, timeout_s: float | None = None) -> Trace | None:
        """Wait for the decoded trace (``ETSHook.wait_for_trace``).

        Args:
            timeout_s: seconds to wait at most; None: no limit.

        Returns:
            The trace, or None: at once while the window has not ended (waiting, capturing) or
            capture is off; after waiting, when decoding failed or the timeout passed.
        """
        if self.state in (WindowState.WAITING, WindowState.CAPTURING, WindowState.OFF):
            return self.trace
        self._trace_ready.wait(timeout_s)
        return self.trace

    def needs_capture_thread(self) -> bool:
        """Whether stopping the window now needs the thread that started it: the profiler path
        is capturing (only the thread that opened a torch profiler session can end it) and the
        caller is another thread."""
        return (
            self.state == WindowState.CAPTURING
            and isinstance(self._ops, ProfilerOpCapture)
            and threading.get_ident() != self._capture_thread
        )

    def join(self, timeout_s: float | None) -> None:
        """Wait for the decode thread, if one was started.

        Args:
            timeout_s: seconds to wait at most; None: no limit.
        """
        if self._decode_thread is not None:
            self._decode_thread.join(timeout_s)

    def set_rank(
        self,
        rank: int,
        world_size: int,
        trace_path: str | os.PathLike[str] | None,
        on_breakdown: Callable[[RankBreakdown], None] | None,
    ) -> None:
        """This process's place in the job, learned after creation (``torch.distributed``
        initialised after the hook was made): recorded in the trace and used for its path.
        Takes effect for a decode that has not started yet.

        Args:
            rank, world_size: recorded in the trace.
            trace_path: where to save the decoded trace (this rank's); None: not saved.
            on_breakdown: receives the trace's ``rank_breakdown``; None: not computed.
        """
        self._rank, self._world_size = rank, world_size
        self._trace_path = trace_path
        self._on_breakdown = on_breakdown

    # ------------------------------------------------------------------------------------------
    # Driving the window (training thread)

    def on_step(
        self,
        step_index: int,
        start_ns: int,
        end_ns: int,
        last_compile_step: int,
        own_ns: int = 0,
        phase_in_step: bool = False,
    ) -> None:
        """Step ``step_index`` ended: record its bounds in the window, start, advance or end the
        window, or, while the decode runs, mark the step perturbed.

        Args:
            step_index: the step that ended (local, 0-based).
            start_ns, end_ns: its bounds, ``time.perf_counter_ns()``.
            last_compile_step: the latest step that compiled (``torch.compile``), or -1.
            own_ns: ets-hook's own work inside the step after ``start_ns`` (prediction reads:
                ``decode.StepBounds.own_ns``).
            phase_in_step: a marked phase (an evaluation) ran inside the step: a window step
                all the same, but not an iteration of the trace (its ops are the phase's too).

        Raises:
            Exception: whatever starting or stopping the capture raises (the hook's guard
                degrades the hook to a step timer).
        """
        if self.state == WindowState.CAPTURING and isinstance(self._ops, NativeOpCapture):
            self._ops.boundaries += 1  # alive (see NativeOpCapture.boundaries)
        if self.state == WindowState.CAPTURING or self.state == WindowState.WAITING:
            self._advance(step_index, start_ns, end_ns, last_compile_step, own_ns, phase_in_step)
        elif self.state == WindowState.DECODING:
            # The decode still runs on its thread, sharing the cores and the GIL: this step
            # and the next stay out of the measured estimate until it is done (the decode
            # thread then sets the end it saw).
            self._sink.set_perturbed_steps(step_index + 2)

    def on_forward(self) -> None:
        """A training forward started: restart op capture if a stop left it pending.

        Raises:
            Exception: whatever starting the capture raises.
        """
        if self._restart_pending and self.state == WindowState.CAPTURING:
            self._partial_steps.append(self._steps_completed())
            self._restart_ops()

    def start(self) -> None:
        """Start the window now: op capture (and the kernel collector), then tell the sink which
        steps carry the capture's cost. Off instead when another profiler owns the session.
        While another hook's capture holds the native observer (until its records are read),
        the window waits instead, one step at a time (``skip_steps`` grows): until that
        capture's window has seen no step in ``STALE_HOLDER_STEPS`` of these (its loop
        stopped: its window is abandoned and the observer taken), or at most
        ``MAX_OBSERVER_WAIT_STEPS``; then the torch profiler captures it.

        Raises:
            Exception: whatever starting the capture raises.
        """
        holder = native_observer_holder() if self._op_capture_mode != "profiler" else None
        if holder is not None and self._preempt_stopped_capture():
            holder = native_observer_holder()
        if holder is not None and self._observer_waits < MAX_OBSERVER_WAIT_STEPS:
            if self._observer_waits == 0:
                logger.info(
                    "another ETSHook's capture holds the op observer; this hook's "
                    "window waits for it"
                )
            awaited = self._awaited
            if awaited is None or awaited[0] is not holder or awaited[1] != holder.boundaries:
                self._awaited = (holder, holder.boundaries, self._observer_waits)
            self._observer_waits += 1
            self.skip_steps += 1  # WAITING: the next step boundary calls start() again
            return
        choice = choose_op_capture(self._op_capture_mode, observer_busy=holder is not None)
        if choice.ops is None:
            self.state = WindowState.OFF
            self._capture_note = choice.note
            self.kernel_status = "off: another profiler is active"
            return
        self._ops, self._ops_note = choice.ops, choice.note
        if self._want_kernels:
            self._collector, self.kernel_status = start_kernel_collector()
        correlation = None
        if self._collector is not None and isinstance(self._ops, NativeOpCapture):
            from .cupti import correlation_api  # the collector imported _C

            correlation = correlation_api()
        self._ops.start(record_shapes=self.record_shapes != "none", correlation=correlation)
        if isinstance(self._ops, NativeOpCapture):
            self._ops.on_preempt = self._preempted
        self._capture_thread = threading.get_ident()
        self._clocks_at_start = read_clocks()
        self.window_ops = []
        self._window_records = self._ops.records() if isinstance(self._ops, NativeOpCapture) else 0
        self.state = WindowState.CAPTURING
        # The window's steps carry the capture's cost, and the steps after it the decode's.
        window_end = self.skip_steps + self.capture_steps
        costs = self._ops.cpu_costs if self._device.type == "cpu" else {}
        self._sink.set_capture_window(self.skip_steps, window_end, **costs)
        self._sink.set_perturbed_steps(window_end + 1)
        # Step `skip_steps` starts now (its boundary just passed, or the hook was just created).

    def finish(self, *, truncated: bool) -> None:
        """Window end (training thread): stop collectors, drop observers, hand off decoding.

        Args:
            truncated: the window ends before its last step (``close``); noted in the status.

        Raises:
            Exception: whatever stopping the capture raises.
        """
        if self._ops is not None:
            self._ops.stop()
        window_end_event = None
        if self._collector is not None:
            # Disable the activity kinds now (cheap); the blocking flush runs in _decode, after
            # the device has reached this point in the stream.
            self._collector.stop(flush=False)
            if torch.cuda.is_available():
                window_end_event = torch.cuda.Event()
                window_end_event.record()
        self._remove_capture_hooks()
        self.state = WindowState.DECODING
        if truncated:
            steps = len(self._window_bounds)
            self._capture_note = f"window cut short after {steps} step{'s' if steps != 1 else ''}"
        snapshot = (self._ops, self._bounds_on_event_clock(), window_end_event)
        if self._decode_in_background:
            self._decode_thread = threading.Thread(
                target=self._decode, args=snapshot, name="ets-hook-decode", daemon=True
            )
            self._decode_thread.start()
        else:
            self._decode(*snapshot)

    def _preempt_stopped_capture(self) -> bool:
        """Abandon the window of the capture holding the observer if it saw no step boundary
        in the last ``STALE_HOLDER_STEPS`` steps this window waited. Returns whether it was
        abandoned."""
        awaited = self._awaited
        if awaited is None:
            return False
        holder, boundaries, since = awaited
        if (
            self._observer_waits - since < STALE_HOLDER_STEPS
            or holder is not native_observer_holder()
            or not holder.active  # decoding: its records are being read
            or holder.boundaries != boundaries
            or holder.on_preempt is None
        ):
            return False
        self._awaited = None
        holder.on_preempt()
        logger.warning(
            "another ETSHook's capture window saw no step in %d of this hook's steps "
            "(its loop stopped: an exception, a notebook cell run again?): it was abandoned, and "
            "this hook captures with the op observer",
            self._observer_waits - since,
        )
        return True

    def _preempted(self) -> None:
        """``NativeOpCapture.on_preempt``: another hook takes the observer from this window."""
        if self.state == WindowState.CAPTURING:
            self.abandon(
                "window abandoned: its loop made no step while another ETSHook waited for the "
                "op observer"
            )

    def abandon(self, note: str) -> None:
        """Stop capturing without decoding; the hook goes on timing steps. Never raises.

        Args:
            note: why, for ``status``.
        """
        if self._ops is not None and self._ops.active:
            with contextlib.suppress(Exception):
                self._ops.stop()
                if isinstance(self._ops, NativeOpCapture):
                    self._ops.discard()  # nothing will read them: the observer is free again
        if self._collector is not None:
            with contextlib.suppress(Exception):
                self._collector.close()
        with contextlib.suppress(Exception):
            self._remove_capture_hooks()
        self.state = WindowState.OFF
        self._capture_note = note
        self._trace_ready.set()

    def _advance(
        self,
        step_index: int,
        start_ns: int,
        end_ns: int,
        last_compile_step: int,
        own_ns: int,
        phase_in_step: bool,
    ) -> None:
        if self._user_profiler_took_over():
            return
        compiled_now = last_compile_step == step_index
        if (
            self.state == WindowState.CAPTURING
            and self._ops is not None
            and self._ops.active
            and not compiled_now  # its ops are mostly the compiler's: left out of the trace
            and not phase_in_step  # likewise the phase's (a decode drops ops outside steps)
        ):
            self._window_bounds.append(StepBounds(step_index, start_ns, end_ns, own_ns))
            if isinstance(self._ops, NativeOpCapture) and self._device.type == "cpu":
                self._measure_window_step()
        elif compiled_now and isinstance(self._ops, NativeOpCapture) and self._ops.active:
            self._window_records = self._ops.records()  # the compile's ops count for no step
        completed = step_index + 1
        if self.state == WindowState.WAITING and completed == self.skip_steps:
            if (
                self._auto_skip
                and last_compile_step >= max(step_index - 1, 0)  # -1: nothing compiled yet
                and self.skip_steps < MAX_AUTO_SKIP_STEPS
            ):
                self.skip_steps += 1  # still compiling: the window waits for steady steps
            else:
                self.start()
        elif self.state == WindowState.CAPTURING:
            verdict, self._budget_verdict = self._budget_verdict, WindowBudget.CONTINUE
            if verdict == WindowBudget.DROP and not self._budget_may_drop:
                verdict = WindowBudget.FINISH  # the trace asked for keeps its first step
            if verdict == WindowBudget.DROP:
                self._shorten_window(completed)
                self._drop_window()
            elif completed == self.skip_steps + self.capture_steps:
                self.finish(truncated=False)
            elif verdict == WindowBudget.FINISH:
                self._shorten_window(completed)
                self.finish(truncated=False)
            elif self._restart_pending:
                # No forward hook fired in the last step: restart here (a start is safe inside
                # an open scope; only a stop+start pair is not). That step has no ops.
                self._restart_ops()
            elif completed == self.skip_steps + 1 and self.record_shapes == "first":
                if isinstance(self._ops, NativeOpCapture):
                    self._ops.set_record_shapes(False)  # swapping the callback is safe anywhere
                elif self._ops is not None:
                    # The profiler recorded shapes for one step; stop now (safe inside
                    # Optimizer.step) and restart without shapes at the next forward, outside
                    # any scope of this session.
                    self._ops.stop()
                    self._restart_pending = True

    def _measure_window_step(self) -> None:
        """Count the ops this window step recorded: O(1) on the training thread. What the
        counts mean for predictions is worked out when one is built (``window_measure``); only
        the adaptive window's budget is checked at every step."""
        count = self._ops.records()
        self.window_ops.append((count - self._window_records) // 2)
        self._window_records = count
        if self._budget_job_steps is not None:
            self._budget_verdict = window_budget(
                self._step_times_s[-len(self.window_ops) :],
                self.window_ops,
                self._ops.us_per_op[self.record_shapes != "none"],
                self._ops.us_per_op[self.record_shapes == "all"],
                self._decode_cost,
                self._budget_job_steps,
            )
        if len(self.window_ops) == 1:
            self._sink.set_window_measure(self.window_measure)

    def window_measure(self) -> dict[str, Any] | None:
        """The job's own window slowdown and the one-off cost of its decode (none once the ops
        were dropped), from the steps measured so far, as ``WindowSink.set_capture_window``'s
        keyword arguments; the same object while nothing changed. Any thread; never calls the
        sink.

        Returns:
            ``capture_ratio``, ``capture_spike_steps``, ``measured`` (True) and
            ``window_step_s`` (the median window step, seconds); None before a step with a
            positive time was measured (native observer on the CPU only).
        """
        ops, window_ops = self._ops, self.window_ops[:]
        key = (len(window_ops), self.capture_steps, self._dropped)
        if key == self._measure_key or ops is None or not isinstance(ops, NativeOpCapture):
            return self._window_measure
        recent_s = self._step_times_s[-len(window_ops) :] if window_ops else []
        ratio = measured_capture_ratio(
            recent_s, window_ops, ops.us_per_op[self.record_shapes != "none"]
        )
        if ratio is None:
            return self._window_measure
        spike = measured_spike_steps(
            recent_s,
            window_ops,
            self.capture_steps,
            ratio,
            self._decode_cost,
        )
        self._window_measure = {
            "capture_ratio": ratio,
            "capture_spike_steps": spike,
            "measured": True,
            "window_step_s": statistics.median(recent_s),
        }
        self._measure_key = key
        return self._window_measure

    @property
    def predicted_cost_s(self) -> float | None:
        """The capture's predicted cost to the training loop, seconds: the ops its window
        recorded at the midpoint of the observer's in-window per-op cost, and their decode at
        the midpoints of ``decode_cost`` (the budget's own figure, ``window_budget``); without
        the decode once the ops were dropped.
        None until a window step was measured (native observer, CPU)."""
        if not self.window_ops or self._ops is None or not isinstance(self._ops, NativeOpCapture):
            return None
        shapes = self.record_shapes != "none"
        window_us = 0.5 * sum(self._ops.us_per_op[shapes])
        if self.record_shapes == "first" and len(self.window_ops) > 1:
            later_us = 0.5 * sum(self._ops.us_per_op[False])
            window_s = (self.window_ops[0] * window_us + sum(self.window_ops[1:]) * later_us) * 1e-6
        else:
            window_s = sum(self.window_ops) * window_us * 1e-6
        return window_s + self._decode_cost.midpoint_s(sum(self.window_ops))

    def _bounds_on_event_clock(self) -> list[StepBounds]:
        """The window's step bounds moved from perf-counter time onto the events' Unix time,
        with the clocks read at the window's start and now (its end)."""
        first = self._clocks_at_start if self._clocks_at_start is not None else read_clocks()
        last = read_clocks()
        return [
            StepBounds(
                b.step,
                epoch_ns(b.start_ns, first, last),
                epoch_ns(b.end_ns, first, last),
                b.own_ns,
            )
            for b in self._window_bounds
        ]

    def _shorten_window(self, completed: int) -> None:
        """The adaptive window ends after ``completed`` steps: its length, and the sink's."""
        self.capture_steps = completed - self.skip_steps
        self._sink.set_perturbed_steps(completed + 1)
        self._sink.set_capture_window(self.skip_steps, self.skip_steps + self.capture_steps)

    def _drop_window(self) -> None:
        """Even one step's decode would cost more than the budget: stop, decode nothing."""
        self._dropped = True
        self._decode_cost = NO_DECODE  # nothing will be decoded
        share = 100 * CAPTURE_BUDGET_SHARE
        self.abandon(  # which stops and discards the native observer's records
            f"capture dropped: decoding it would cost more than {share:g}% of this job's "
            "predicted total (a short job: its steps are timed only)"
        )
        logger.info("%s", self._capture_note)

    def _restart_ops(self) -> None:
        self._restart_pending = False
        if self._ops is not None and not self._user_profiler_took_over():
            self._ops.start(record_shapes=False)

    # ------------------------------------------------------------------------------------------
    # Sharing the torch profiler with the user's own sessions (profiler path only)

    def _user_profiler_took_over(self) -> bool:
        """On the profiler path, a user's ``torch.profiler`` session opened inside the window
        takes the thread's Kineto session over (torch keeps one), and its end ends ours: never
        disable it (that would end the user's). Back off to timing steps, once."""
        if not (
            self.state == WindowState.CAPTURING
            and isinstance(self._ops, ProfilerOpCapture)
            and ProfilerOpCapture.user_session_active()
        ):
            return False
        self._ops.forget()
        self._restart_pending = False
        self.abandon(
            "op capture backed off: a torch.profiler session was opened inside the capture "
            "window (left alone; ets-hook times steps only)"
        )
        logger.warning("%s", self._capture_note)
        return True

    # ------------------------------------------------------------------------------------------
    # Decoding (background thread)

    def _decode(self, ops: Any, bounds: list[StepBounds], window_end_event: Any = None) -> None:
        # One BLAS thread (the hook's decode_context): numpy's OpenBLAS workers would otherwise
        # spin on the training loop's cores for ~0.1 s after the trace model's products
        # (ets_hook.ets.blas). The interpreter's switch interval is left alone: shortening it
        # (0.2 ms) made the training thread pay a GIL hand-off per op and the decode cost it
        # 1.5-2x more in total.
        started_ns, started_cpu_ns = time.perf_counter_ns(), time.thread_time_ns()
        try:
            facts = WindowFacts(
                skip_steps=self.skip_steps,
                capture_steps=self.capture_steps,
                record_shapes=self.record_shapes,
                device=self._device_info or device_info(self._device),
                host=self._host_info or host_info(),
                torch_version=torch.__version__,
                ets_hook_version=self._ets_hook_version,
                step_times_s=self._step_times_s.tolist(),
                rank=self._rank,
                world_size=self._world_size,
                metadata={
                    "model": self._model_name,
                    "partial_steps": list(self._partial_steps),
                },
            )
            with self._decode_context():
                trace = build_window_trace(
                    ops,
                    bounds,
                    facts,
                    collector=self._collector,
                    kernel_status=self.kernel_status,
                    window_end_event=window_end_event,
                )
                self.kernel_status = trace.capture.kernel_capture
                self.trace = trace
                self._publish_trace_estimate(trace)
                breakdown = self._publish_input_wait(trace)
                if self._on_breakdown is not None:
                    self._on_breakdown(breakdown or rank_breakdown(trace))
            trace.metadata["decode"] = self._decode_timing(started_ns, started_cpu_ns)
            if self._trace_path is not None:
                self._save_trace(trace, self._trace_path)
            self.state = WindowState.DONE
        except Exception as exc:
            self._on_failure(exc)
        finally:
            if isinstance(ops, NativeOpCapture):
                with contextlib.suppress(Exception):
                    ops.discard()  # unread after a failure: the observer is free again
            self._trace_ready.set()
        # Steps that ran while this thread decoded competed with it for the CPU and the GIL.
        self._sink.set_perturbed_steps(
            max(self.skip_steps + self.capture_steps + 1, self._steps_completed() + 1)
        )

    @staticmethod
    def _decode_timing(started_ns: int, started_cpu_ns: int) -> dict[str, float]:
        """What this decode has cost so far (``trace.metadata["decode"]``): its wall seconds
        and this thread's CPU seconds, from the readings at its start."""
        return {
            "wall_s": (time.perf_counter_ns() - started_ns) / 1e9,
            "cpu_s": (time.thread_time_ns() - started_cpu_ns) / 1e9,
        }

    @staticmethod
    def _save_trace(trace: Trace, path: Any) -> None:
        """Write the trace to ``trace_path``: a file that cannot be written (a folder removed
        or made read-only since the hook was made, a full disk) is said with its path, and the
        trace and its estimate stay in use."""
        try:
            save_trace(trace, path)
        except OSError as exc:
            logger.warning(
                "could not write the trace to %s (%s); the capture is used all the same",
                path,
                exc.strerror or exc,
            )

    def _publish_input_wait(self, trace: Trace) -> RankBreakdown | None:
        """The whole captured steps' median wait for input and wall time, to the sink (steps
        whose capture began after their data loading -- the profiler path's restart -- would
        show no wait: left out).

        Returns:
            That breakdown when no step was left out (it is then the whole trace's, for the
            rank exchange), else None.
        """
        partial = set(trace.metadata.get("partial_steps", ()))
        try:
            whole = rank_breakdown(trace, leave_out=partial)
            if whole is not None:
                self._sink.set_input_wait(whole.data_wait_s, whole.wall_s)
        except Exception as exc:  # shown, not needed: never fails the window
            logger.debug("the window's input wait is unavailable: %r", exc)
            return None
        return None if partial else whole

    def _publish_trace_estimate(self, trace: Trace) -> None:
        try:
            estimate = self._trace_estimator(trace) if self._trace_estimator else None
        except Exception as exc:  # the trace estimate is optional: log, keep the measured one
            logger.info("trace-based estimate unavailable: %r", exc)
            return
        if estimate is not None:
            self._sink.set_trace_estimate(estimate)
