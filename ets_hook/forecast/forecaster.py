"""Predictions and the forecaster the hook drives.

``Forecaster`` turns the hook's events into ``Prediction`` objects and hands them to reporters.

Call contract (the hook must follow it; all calls from the training thread unless noted):

- Time base: ``now_s`` is float seconds of one monotonic clock (the hook uses
  ``time.perf_counter_ns() / 1e9``); ``start_s`` given to the constructor is the same clock at
  hook creation. ``wall_start_s`` is ``time.time()`` at that same moment (the default, read at
  construction) and only dates results (``finish_time``); after construction the forecaster
  reads no clock, so tests drive it deterministically. A prediction is "as of" the last event
  it was told about (step or phase end): ``elapsed_s`` = that event's ``now_s - start_s``.
- ``on_step_end(step_index, duration_s, now_s)`` right after training step ``step_index``
  (0-based, counted from hook creation, consecutive) ends at ``now_s``. ``duration_s`` is the
  step's wall time minus time spent in marked phases inside it; it starts where the previous step
  ended (data loading between steps is step time), and for step 0 at the first training activity
  (time between hook creation and that is setup, in the elapsed time but never projected). Gaps
  the durations do not cover are measured and projected per step anyway (``overhead_per_step_s``).
- ``on_phase_end(name, duration_s, now_s)`` when a marked non-training phase ends at ``now_s``
  (outermost phase only; nested phases are the caller's business).
- ``set_trace_estimate(estimate)`` whenever the trace-based estimator has a (new) estimate; any
  thread.
- ``set_input_supply(worker_clocks)`` when the job's DataLoader workers are timed
  (``capture.batch_clock``; again for each loader added); any thread. The clocks are read only
  when a prediction is built.
- ``prediction`` (property): any thread; cached, rebuilt only when something changed.
- ``close()`` once, at the end: final prediction to every reporter (never raises).

Cost: ``on_step_end`` appends one float and compares two numbers; everything else is lazy
(on ``prediction`` access) or scheduled by the reporters (see ``reporters.base.ReportSchedule``).
Failures inside the forecaster are logged once and never propagate, except
``DeadlineExceededError`` raised on purpose by a deadline guard with ``on_deadline="raise"``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import DeadlineExceededError
from .contention import OUTDATED_RUN_STEPS, outdated_by_recent_steps
from .early_stop import EarlyStoppingRule, EarlyStopTracker, total_range_s
from .input_supply import SupplyEstimate, bound_by_supply, supply_from_loaders
from .job import JobModel, PhaseCostPrior, PhaseTracker, remaining_phase_time
from .prediction import (
    Prediction,
    cut_at_time_limit,
    ended_prediction,
    utc_from_timestamp,
    utc_or_none,
)
from .ranks import JobView
from .stats import (
    DEFAULT_LEVEL,
    Estimate,
    StepTimePrior,
    StepTimeSeries,
    TraceEstimate,
    estimate_measured,
    fuse,
    normal_quantile,
    warmup_step_estimate,
)

logger = logging.getLogger("ets_hook")

# The measured estimate (O(n): ~10 ms at the 65,536-element cap on this 2-core machine, ~6 of
# them the burst / shift split) is recomputed on access while the series is short, afterwards
# only when it grew by REFRESH_GROWTH or REFRESH_INTERVAL_S of job time passed (the callers'
# clock, so tests stay deterministic). O(n) work every 10% of n keeps the amortised per-step cost
# O(1); between refreshes predictions reuse the cached step-time estimate with the current step
# count and elapsed time. A refresh costs 0.1-0.5 ms on the training thread (numpy on short
# arrays), a cached read ~25 µs: dense only for the first 32 steps, where the early answer moves
# most (at 256, a loop reading every prediction paid ~0.45 ms a step for its first 256 steps:
# 4-12% of a 4-11 ms step).
DENSE_REFRESH_STEPS = 32
# Clean steps needed after the capture-perturbed ones before those are dropped as warm-up.
CLEAN_STEPS_NEEDED = 3
REFRESH_GROWTH = 0.10
REFRESH_INTERVAL_S = 10.0
# Pending step times are folded into the series at least this often (bounded list growth).
FLUSH_EVERY_STEPS = 4096


def check_time_limit_s(time_limit_s: Any) -> float | None:
    """Check a wall-clock limit on the job (``ETSHook(time_limit_s=...)``).

    Args:
        time_limit_s: seconds from hook creation, or None for no limit.

    Returns:
        The limit as a float, or None.

    Raises:
        ValueError: naming the value: not None and not a finite number > 0 (bools are not).
    """
    if time_limit_s is None:
        return None
    number = isinstance(time_limit_s, (int, float)) and not isinstance(time_limit_s, bool)
    if not number or not math.isfinite(time_limit_s) or time_limit_s <= 0:
        raise ValueError(
            f"time_limit_s must be a finite number of seconds > 0 or None, got {time_limit_s!r}"
        )
    return float(time_limit_s)


def _check_rank(rank: int, world_size: int) -> None:
    """Raises ValueError unless ``0 <= rank < world_size``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")


#: A loader's batch clock (``capture.batch_clock.BatchClock.read``): each worker's batch finish
#: times and CPU times so far, seconds.
WorkerClock = Callable[[], tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]]


class ReportSink(Protocol):
    """What the forecaster hands predictions to (``reporters.base.ReportDispatcher``).

    Attributes:
        next_count: the earliest local step count (steps since hook creation) at which a
            prediction is due.
        next_s: the earliest time (the forecaster's ``now_s`` clock) at which one is due.

    The forecaster compares against them on its hot path and calls ``dispatch`` only then.
    """

    next_count: int
    next_s: float

    def dispatch(
        self, count: int, step: int, now_s: float, get: Callable[[], Prediction | None]
    ) -> None:
        """Offer the prediction (built by ``get`` only if needed) at step count ``count``.

        Args:
            count: local steps completed (since hook creation).
            step: global steps completed (``count + JobModel.initial_step``).
            now_s: the end time of the step, on the forecaster's clock.
            get: builds the current prediction (None when there is none yet).

        Raises:
            DeadlineExceededError: on purpose, from a deadline guard with
                ``on_deadline="raise"``; the forecaster lets it through.
        """

    def close(
        self, prediction: Prediction | None, outcome: str = "closed", error: str | None = None
    ) -> None:
        """Hand over the final prediction and how the job ended; nothing is dispatched after.

        Args:
            prediction: the final prediction, or None.
            outcome: ``"closed"``, ``"interrupted"`` or ``"failed"``.
            error: the exception's type name for ``"failed"``, else None.
        """


class _NoReports:
    """The sink of a forecaster without reporters: never due."""

    next_count = sys.maxsize
    next_s = math.inf

    def dispatch(
        self, count: int, step: int, now_s: float, get: Callable[[], Prediction | None]
    ) -> None:
        return None

    def close(
        self, prediction: Prediction | None, outcome: str = "closed", error: str | None = None
    ) -> None:
        return None


#: ``Forecaster.set_window_measure``'s costs: ``set_capture_window``'s keyword arguments
#: besides the steps (``capture_ratio``, ``capture_spike_steps``, ``measured``, ``window_step_s``).
WindowMeasure = Mapping[str, Any]


class Forecaster:
    """Turns step and phase events into predictions; drives the reporters. See module docstring.

    Attributes:
        start_s: hook creation time on the caller's monotonic clock, seconds.
        wall_start_s: ``time.time()`` at hook creation.
        prior: the warm-up/noise prior.
        level: confidence level of every interval.
        converge_rel_ci: relative half-width at which a prediction is ``converged``.
        min_warmup_steps: leading steps always treated as warm-up.
    """

    def __init__(
        self,
        job: JobModel | None = None,
        *,
        start_s: float,
        wall_start_s: float | None = None,
        prior: StepTimePrior | None = None,
        level: float = DEFAULT_LEVEL,
        converge_rel_ci: float = 0.02,
        min_warmup_steps: int = 1,
        reports: ReportSink | None = None,
        series_capacity: int = 1 << 16,
        rank: int = 0,
        world_size: int = 1,
        time_limit_s: float | None = None,
    ) -> None:
        """Set up an empty forecaster; reads ``time.time()`` only when ``wall_start_s`` is None.

        Args:
            job: the job's schedule; None for an unknown length and no phase hints.
            start_s: hook creation time on the monotonic clock ``now_s`` uses, seconds; finite.
            wall_start_s: ``time.time()`` at that moment; None reads it now.
            prior: warm-up/noise prior (``StepTimePrior.for_device("cuda")`` on GPUs); None for
                the CPU default.
            level: confidence level of every interval, in (0, 1).
            converge_rel_ci: ``converged`` once the step-time interval's relative half-width is
                at most this, in (0, 1).
            min_warmup_steps: leading steps always treated as warm-up (MSER may drop more), an
                int >= 0.
            reports: where predictions go (``reporters.base.ReportDispatcher`` in the hook); the
                forecaster only asks it when it is due next and hands it predictions. None: no
                reporting.
            series_capacity: most stored elements per step-time series, an even number >= 64
                (longer series are compacted).
            rank: this process's rank (>= 0), carried into predictions.
            world_size: processes in the job (> rank).
            time_limit_s: a wall-clock limit that ends the job, seconds from ``start_s`` (a
                finite number > 0; ``check_time_limit_s``), carried into predictions and
                cutting a total beyond it (``prediction.cut_at_time_limit``); None: none.

        Raises:
            ValueError: an argument is outside the range given above.
        """
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        if not 0.0 < converge_rel_ci < 1.0:
            raise ValueError(f"converge_rel_ci must be in (0, 1), got {converge_rel_ci}")
        if isinstance(min_warmup_steps, bool) or not isinstance(min_warmup_steps, int):
            raise ValueError(f"min_warmup_steps must be an int >= 0, got {min_warmup_steps!r}")
        if min_warmup_steps < 0:
            raise ValueError(f"min_warmup_steps must be >= 0, got {min_warmup_steps}")
        if not math.isfinite(start_s):
            raise ValueError(f"start_s must be finite, got {start_s}")
        _check_rank(rank, world_size)
        self._job = job if job is not None else JobModel()
        self.start_s = start_s
        self.wall_start_s = time.time() if wall_start_s is None else wall_start_s
        self._prior = prior or StepTimePrior()
        # The capture window's measured costs, applied to the prior when it is read.
        self._measure_source: Callable[[], WindowMeasure | None] | None = None
        self._measure_applied: WindowMeasure | None = None
        self._variable_steps = False  # steps differ in length by design (set_variable_steps)
        self._worker_clocks: tuple[WorkerClock, ...] = ()  # set_input_supply
        self._supply_cores: tuple[int | None, int] = (None, 1)
        self._supply_read: Any = None  # the clocks' reading the supply below was made from
        self._supply: SupplyEstimate | None = None
        self.level = level
        self.converge_rel_ci = converge_rel_ci
        self.min_warmup_steps = min_warmup_steps

        self._series = StepTimeSeries(capacity=series_capacity)
        # Device-side step times (CUDA events), when the hook has them: they measure the rate
        # the job settles to even while the host still runs ahead of the GPU.
        self._device_series = StepTimeSeries(capacity=series_capacity)
        # Hot path: bound once; StepTimeSeries never replaces its pending list.
        self._append = self._series.pending.append
        self._steps_done = 0
        self._last_step_end_s = start_s
        self._first_step_end_s = math.nan
        self._own_s = 0.0  # on_step_end's own_s after the first step end
        self._phases = PhaseTracker(self._job)
        self._last_phase_end_s = -math.inf
        # Per phase event: its end time and the cumulative phase seconds up to it (overhead).
        self._phase_ends_s: list[float] = []
        self._phase_cum_s: list[float] = []
        self._trace: TraceEstimate | None = None
        self._version = 0  # bumped by set_trace_estimate / set_perturbed_steps / on_metric
        self._early_stop: EarlyStopTracker | None = None
        # Steps [0, _perturbed_end) include the capture's own cost (see set_perturbed_steps);
        # [_capture[0], _capture[1]) ran inside the capture window.
        self._perturbed_end = 0
        self._capture: tuple[int, int] | None = None
        self.rank, self.world_size = rank, world_size
        self.time_limit_s = check_time_limit_s(time_limit_s)
        self._job_view: JobView | None = None
        self._host_load: tuple[float, float] | None = None  # (foreign CPU, steal) shares
        # Other processes' CPU share around the capture window: the latest sample before it,
        # then the highest sampled from its start to the first sample after its end.
        self._capture_load_before: float | None = None
        self._capture_load: float | None = None
        self._capture_load_open = False
        self._input_wait: tuple[float, float] | None = None  # (median s, share of a step)
        self._warmup_end = 0  # steps [0, _warmup_end) are known warm-up (compiles)
        self._low_precision = False

        self._lock = threading.RLock()
        self._measured: Estimate | None = None
        # (id of the series used, its count, min_warmup used, perturbed end used, variable)
        self._measured_key: tuple[int, int, int, int, bool] = (0, -1, -1, -1, False)
        self._measured_at_s = -math.inf
        self._cached: Prediction | None = None
        self._ended: Prediction | None = None  # the final one, once closed as "closed"
        self._overrun_noted = False  # a step past total_steps was logged
        self._recurring_noted = False  # recurring unmarked work was logged
        self._cached_key: tuple[int, int, int] | None = None

        self._dispatch: ReportSink = reports if reports is not None else _NoReports()
        self._failed = False
        self._closed = False
        # Next step index / time at which the slow path runs (reporters due, flush).
        self._next_index = 0
        self._next_s = -math.inf

    # ------------------------------------------------------------------------------------------
    # Events

    def on_step_end(
        self, step_index: int, duration_s: float, now_s: float, own_s: float = 0.0
    ) -> None:
        """Training step ``step_index`` (0-based) ended at ``now_s``; O(1) except when a report
        is due.

        Args:
            step_index: 0-based local index of the step, consecutive from 0.
            duration_s: the step's duration, seconds (non-finite values are dropped later).
            now_s: the step's end time, seconds on the ``start_s`` clock.
            own_s: ets-hook's own time since the previous step's end that ``duration_s``
                leaves out (its boundary work, prediction reads): neither step time nor the
                loop's per-step overhead. It is dearest in the first steps (prediction
                rebuilds), so projecting it would overstate the remaining time.

        Raises:
            DeadlineExceededError: on purpose, from a deadline guard with
                ``on_deadline="raise"``. Other failures are logged once and disable the
                reporters.
        """
        self._append(duration_s)
        self._last_step_end_s = now_s
        self._steps_done = step_index + 1
        if step_index:
            self._own_s += own_s
        if step_index >= self._next_index or now_s >= self._next_s:
            self._slow_path(step_index, now_s)

    def on_device_step_end(self, step_index: int, duration_s: float) -> None:
        """Device-side duration of step ``step_index`` (from CUDA events), reported late.

        Once two or more exist, the measured step-time estimate uses these instead of the host
        durations; elapsed time and overhead accounting stay on the host clock. Never raises.

        Args:
            step_index: 0-based index of the step; not used: durations are stored in arrival
                order, and warm-up and capture corrections index them by position.
            duration_s: the device-side duration, seconds.
        """
        self._device_series.pending.append(duration_s)

    def on_phase_end(
        self,
        name: str,
        duration_s: float,
        now_s: float,
        at_step: int | None = None,
        first_to_later: tuple[float, float] | None = None,
    ) -> None:
        """A marked non-training phase ``name`` ended at ``now_s`` after ``duration_s``.

        Never raises: failures are logged once and disable the reporters.

        Args:
            name: the phase name (e.g. "eval", "checkpoint").
            duration_s: its duration, seconds (negative counts as 0).
            now_s: its end time, seconds on the ``start_s`` clock; may be earlier than phases
                already recorded (a phase measured late: give the time it really ended).
            at_step: the global step count it belongs after, when known better than now (a
                phase measured later, e.g. the first epoch's start-up); None: the steps done.
            first_to_later: for the phase's first occurrence, what a later one costs over it
                (``PhaseTracker.record``); None: the default.
        """
        try:
            with self._lock:
                step = self._job.initial_step + self._steps_done if at_step is None else at_step
                before_s = self._phases.total_s
                self._phases.record(name, duration_s, step, first_to_later)
                added_s = self._phases.total_s - before_s
                # Kept in end-time order: a phase measured late (the first epoch's start-up,
                # inside the first step) ends before phases already recorded.
                ends, cums = self._phase_ends_s, self._phase_cum_s
                i = bisect_right(ends, now_s)
                ends.insert(i, now_s)
                cums.insert(i, (cums[i - 1] if i else 0.0) + added_s)
                for j in range(i + 1, len(cums)):
                    cums[j] += added_s
                self._last_phase_end_s = max(self._last_phase_end_s, now_s)
        except Exception as exc:
            self._fail(exc)

    def set_phase_prior(self, name: str, prior: PhaseCostPrior | None) -> None:
        """Price phase ``name`` with ``prior`` until its first occurrence is measured
        (``forecast.job.PhaseCostPrior``); None removes it. Any thread.

        Args:
            name: the phase name (e.g. "eval").
            prior: its expected cost per occurrence, or None.
        """
        with self._lock:
            self._phases.set_prior(name, prior)
            self._version += 1

    def set_early_stopping(self, rule: EarlyStoppingRule | None) -> None:
        """Follow an early-stopping rule: ``on_metric`` feeds it, predictions then carry the
        expected stopping step and the total-time range (``forecast.early_stop``). Needs a known
        job length (else ignored, logged). None: stop following.

        Raises:
            ValueError: ``rule`` is neither an ``EarlyStoppingRule`` nor None.
        """
        if rule is not None and not isinstance(rule, EarlyStoppingRule):
            raise ValueError(f"rule must be an EarlyStoppingRule or None, got {rule!r}")
        if rule is not None and self._job.total_steps is None:
            logger.info("early stopping followed only when the job's length is known")
            rule = None
        with self._lock:
            self._early_stop = (
                EarlyStopTracker(rule, self._job.total_steps)
                if rule is not None and self._job.total_steps is not None
                else None
            )
            self._version += 1

    def on_metric(self, value: float) -> None:
        """One evaluation of the monitored metric, at the current global step. The curve fit
        runs here (~2 ms), not at step ends. Never raises: a bad value is logged."""
        tracker = self._early_stop
        if tracker is None:
            return
        try:
            tracker.observe(self._job.initial_step + self._steps_done, float(value))
            tracker.forecast()
            with self._lock:
                self._version += 1
        except Exception as exc:
            logger.info("early-stopping metric ignored: %r", exc)

    def set_input_wait(self, data_wait_s: float, step_wall_s: float) -> None:
        """What the captured steps waited for their input (``WindowSink``): the median wait (a
        step's start to its first model op: the DataLoader's ``__next__`` in this process,
        ``Dataset`` / ``collate_fn`` work with ``num_workers=0``, a slow input pipeline) and the
        median step wall time, seconds; shown in predictions (``data_wait_s``,
        ``data_wait_share``). Any thread.

        Raises:
            ValueError: either is not a finite number >= 0.
        """
        for name, value in (("data_wait_s", data_wait_s), ("step_wall_s", step_wall_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        share = min(data_wait_s / step_wall_s, 1.0) if step_wall_s > 0 else 0.0
        with self._lock:
            self._input_wait = (float(data_wait_s), share)
            self._version += 1

    def set_trace_estimate(self, estimate: TraceEstimate | None) -> None:
        """Install (or, with None, remove) the trace-based estimate. Any thread.

        Raises:
            ValueError: ``estimate`` is neither a ``TraceEstimate`` nor None.
        """
        if estimate is not None and not isinstance(estimate, TraceEstimate):
            raise ValueError(f"estimate must be a TraceEstimate or None, got {estimate!r}")
        with self._lock:
            self._trace = estimate
            self._version += 1

    @property
    def prior(self) -> StepTimePrior:
        """The warm-up/noise prior, with the capture window's latest measured costs applied
        (``set_window_measure``). Any thread."""
        with self._lock:
            self._apply_window_measure()
            return self._prior

    @prior.setter
    def prior(self, prior: StepTimePrior) -> None:
        with self._lock:
            self._prior = prior
            self._measure_applied = None  # the source's costs go onto the new prior too
            self._version += 1

    def set_low_precision(self) -> None:
        """The job's forward runs under low-precision autocast: from now on the prior is
        ``StepTimePrior.for_low_precision()`` (a slower first step). Any thread;
        idempotent."""
        with self._lock:
            if not self._low_precision:
                self._low_precision = True
                self.prior = self.prior.for_low_precision()
                self._version += 1

    def set_variable_steps(self) -> None:
        """The job's steps differ in length by design (its batches change shape): from now on
        the measured estimate is their plain mean (``estimate_measured(variable=True)``), and
        the trace estimate -- a few captured steps of whatever lengths they had -- is left out
        of the prediction. Any thread; idempotent."""
        with self._lock:
            if not self._variable_steps:
                self._variable_steps = True
                self._version += 1

    def set_warmup_steps(self, end_step: int) -> None:
        """Steps before ``end_step`` (0-based index) are known warm-up (they compiled, or ran
        right after a compile): never part of the steady state. Until a later step exists,
        predictions rest on the last step with the prior's wide first-step interval and say
        ``warming_up``. Any thread; only ever raises the bound.

        Raises:
            ValueError: ``end_step`` is not an int >= 0 (bools rejected).
        """
        if isinstance(end_step, bool) or not isinstance(end_step, int) or end_step < 0:
            raise ValueError(f"end_step must be an int >= 0, got {end_step!r}")
        with self._lock:
            if end_step > self._warmup_end:
                self._warmup_end = end_step
                self._version += 1

    def set_rank(self, rank: int, world_size: int, reports: ReportSink | None = None) -> None:
        """This process's place in the job, learned after creation (``torch.distributed``
        initialised after the hook was made): carried into predictions from now on, with
        ``reports`` (built for that rank) replacing the reporters when given. Meant for before
        the first step end, when no reporter has been offered anything. Any thread.

        Args:
            rank: this process's rank (>= 0).
            world_size: processes in the job (> rank).
            reports: the reporters for that rank; None: keep the current ones.

        Raises:
            ValueError: not ``0 <= rank < world_size``.
        """
        _check_rank(rank, world_size)
        with self._lock:
            self.rank, self.world_size = rank, world_size
            if reports is not None:
                self._dispatch = reports
                self._next_index, self._next_s = 0, -math.inf  # ask the new ones when due
            self._version += 1

    def set_job_view(self, view: JobView | None) -> None:
        """Apply the job-level view of the last rank exchange (None: back to this rank's own).

        From now on predictions carry the job's end: this rank's ``total_s``/``eta_s`` moved by
        the gap between the job's predicted end and this rank's own at the exchange (see
        ``Prediction``). Any thread.

        Raises:
            ValueError: ``view`` is neither a ``JobView`` nor None.
        """
        if view is not None and not isinstance(view, JobView):
            raise ValueError(f"view must be a JobView or None, got {view!r}")
        with self._lock:
            self._job_view = view
            self._version += 1

    def set_host_load(self, foreign_cpu: float, steal: float) -> None:
        """The machine's latest load from other work (``capture.host_load``), shares of its
        CPU in 0..1; shown in predictions (``host_foreign_cpu``, ``host_steal``). Samples from
        the capture window's start (``set_capture_window``) up to the first one given once the
        window's last step was reported (which covers the window's end) also make
        ``capture_host_foreign_cpu``, their highest share. Any thread.
        """
        with self._lock:
            self._host_load = (float(foreign_cpu), float(steal))
            if self._capture is not None and self._capture_load_open:
                self._capture_load = max(self._capture_load or 0.0, float(foreign_cpu))
                self._capture_load_open = self._steps_done < self._capture[1]
            self._version += 1

    def set_capture_window(
        self,
        start_step: int,
        end_step: int,
        *,
        capture_ratio: tuple[float, float] | None = None,
        capture_spike_steps: tuple[float, float] | None = None,
        measured: bool = False,
        window_step_s: float | None = None,
        capture_spike_excess_s: tuple[float, float] | None = None,
    ) -> None:
        """Steps ``[start_step, end_step)`` ran inside the capture window: slower by the prior's
        ``capture_ratio``. Steps from ``end_step`` up to ``set_perturbed_steps`` are left out of
        the measured estimate while they are not yet warm-up (profiler disable, decoding).

        Also raises the perturbed-step end to at least ``end_step``, and starts following the
        host's load around the window (``set_host_load``); called again with the same
        ``start_step`` (an adaptive window's end), it only moves the end.

        Args:
            start_step: first local step index inside the window.
            end_step: local step index just after the window.
            capture_ratio: replaces the prior's ``capture_ratio`` (the op capture that runs
                decides it); None: keep it.
            capture_spike_steps: replaces the prior's ``capture_spike_steps``; None: keep it.
            capture_spike_excess_s: replaces the prior's ``capture_spike_excess_s`` (seconds
                on top of the spike's steps); None: keep it. A measured window's costs
                (``measured``) clear it: the job's own decode estimate is in steps.
            measured: ``capture_ratio`` was measured on this job's window (the capture's own
                cost only); where the prior says window steps are early steps
                (``early_in_window``: on the CPU) it is then widened by the prior's early
                range for steps of ``window_step_s`` (``StepTimePrior.early_ratio_at``). A
                prior's range (the profiler path's) already includes warm-up.
            window_step_s: the window's typical step time so far, seconds (None: unknown,
                the early range without its excess).

        Raises:
            ValueError: not ``0 <= start_step <= end_step``, or a range the prior refuses.
        """
        if not 0 <= start_step <= end_step:
            raise ValueError(f"need 0 <= start_step <= end_step, got {start_step}, {end_step}")
        with self._lock:
            self._set_capture_costs(
                capture_ratio, capture_spike_steps, measured, window_step_s, capture_spike_excess_s
            )
            if self._capture is None or self._capture[0] != start_step:  # a new window
                self._capture_load_before = (
                    self._host_load[0] if self._host_load is not None else None
                )
                self._capture_load, self._capture_load_open = None, True
            self._capture = (start_step, end_step)
            self._perturbed_end = max(self._perturbed_end, end_step)
            self._version += 1

    def set_window_measure(self, source: Callable[[], WindowMeasure | None] | None) -> None:
        """Where the capture window's measured costs come from, asked only when a prediction
        (or ``prior``) is built: the window's steps then pay nothing to keep them current.

        Args:
            source: returns the keyword arguments of ``set_capture_window`` besides the steps
                (``capture_ratio``, ``capture_spike_steps``, ``measured``, ``window_step_s``),
                the same object while they have not changed, or None while nothing was
                measured; called under this forecaster's lock, from any thread, so it must
                not call back into it. None: no source (what was applied stays).
        """
        with self._lock:
            self._measure_source = source
            self._measure_applied = None
            self._version += 1

    def _apply_window_measure(self) -> None:
        """Apply the window measure source's latest costs to the prior (under the lock)."""
        source = self._measure_source
        if source is None:
            return
        measure = source()
        if measure is None or measure is self._measure_applied:
            return
        self._measure_applied = measure
        self._set_capture_costs(
            measure.get("capture_ratio"),
            measure.get("capture_spike_steps"),
            bool(measure.get("measured", False)),
            measure.get("window_step_s"),
            measure.get("capture_spike_excess_s"),
        )

    def _set_capture_costs(
        self,
        capture_ratio: tuple[float, float] | None,
        capture_spike_steps: tuple[float, float] | None,
        measured: bool,
        window_step_s: float | None,
        capture_spike_excess_s: tuple[float, float] | None,
    ) -> None:
        """``set_capture_window``'s costs into the prior (under the lock)."""
        prior = self._prior
        if measured and capture_spike_steps is not None:
            capture_spike_excess_s = (0.0, 0.0)  # the job's own decode cost, in its steps
        if capture_ratio is not None and measured and prior.early_in_window:
            # The window's steps are early steps too: they still carry the job's own warm-up
            # on top of the capture's cost.
            early_lo, early_hi = prior.early_ratio_at(
                window_step_s if window_step_s is not None else math.nan
            )
            capture_ratio = (capture_ratio[0] * early_lo, capture_ratio[1] * early_hi)
        if capture_ratio is None and capture_spike_steps is None and capture_spike_excess_s is None:
            return
        self._prior = dataclasses.replace(
            prior,
            capture_ratio=capture_ratio or prior.capture_ratio,
            capture_spike_steps=capture_spike_steps or prior.capture_spike_steps,
            capture_spike_excess_s=capture_spike_excess_s or prior.capture_spike_excess_s,
        )

    def set_perturbed_steps(self, end_step: int) -> None:
        """Steps before ``end_step`` (0-based index) ran with capture cost in them (profiler on,
        decode thread busy). Once ``CLEAN_STEPS_NEEDED`` later steps exist, the measured estimate
        treats them as warm-up — except, when the window started after two or more clean steps
        past the warm-up, those clean steps before it, which stay beside the later ones; until
        then they are all there is (the window's steps corrected for its cost). Any thread.

        Args:
            end_step: local step index; replaces the previous value (also one that
                ``set_capture_window`` set).

        Raises:
            ValueError: ``end_step`` is not an int >= 0 (bools rejected).
        """
        if isinstance(end_step, bool) or not isinstance(end_step, int) or end_step < 0:
            raise ValueError(f"end_step must be an int >= 0, got {end_step!r}")
        with self._lock:
            self._perturbed_end = end_step
            self._version += 1

    @property
    def first_step_end_s(self) -> float:
        """When the first training step ended (``start_s``'s clock); NaN before it."""
        return self._first_step_end_s

    @property
    def job(self) -> JobModel:
        """The job's schedule."""
        return self._job

    @property
    def steps_done(self) -> int:
        """Local training steps reported so far (last ``step_index`` + 1)."""
        return self._steps_done

    # ------------------------------------------------------------------------------------------
    # Predictions

    @property
    def prediction(self) -> Prediction | None:
        """The current prediction (None before the first step and trace estimate). Cached.

        Any thread; never raises: after a failure (logged once) the last good prediction.
        """
        if self._ended is not None:
            return self._ended
        try:
            with self._lock:
                key = (self._steps_done, self._phases.events, self._version)
                if key != self._cached_key:
                    self._cached = self._build()
                    self._cached_key = key
                return self._cached
        except Exception as exc:
            self._fail(exc)
            return self._cached

    def set_input_supply(
        self,
        worker_clocks: WorkerClock | Sequence[WorkerClock] | None,
        *,
        cores: int | None = None,
        main_threads: int = 1,
    ) -> None:
        """Where the DataLoader workers' batch clocks come from (``capture.batch_clock``), read
        only when a prediction is built; their pace is a floor under the step time
        (``forecast.input_supply``). Any thread.

        Args:
            worker_clocks: one per loader (a step takes a batch from each: the slowest sets
                the pace), each returning its workers' batch finish times and CPU times so far
                (seconds, in order), the same object while no worker finished a batch (the
                pace is worked out again only from a new one); None or empty: no input floor.
                A source that raises counts as no floor, never as a failure.
            cores: CPUs the job may use (``supply_from_worker_clocks``); None: unknown.
            main_threads: computing threads of the training process.
        """
        sources = (
            ()
            if worker_clocks is None
            else (worker_clocks,)
            if callable(worker_clocks)
            else tuple(worker_clocks)
        )
        with self._lock:
            self._worker_clocks = sources
            self._supply_cores = (cores, main_threads)
            self._supply_read = self._supply = None
            self._version += 1

    def _input_supply(self) -> SupplyEstimate | None:
        sources = self._worker_clocks
        if not sources:
            return None
        try:
            readings = tuple(source() for source in sources)
            last = self._supply_read
            if last is None or any(a is not b for a, b in zip(readings, last, strict=True)):
                cores, main_threads = self._supply_cores
                self._supply = supply_from_loaders(
                    readings, cores=cores, main_threads=main_threads, level=self.level
                )
                self._supply_read = readings
            return self._supply
        except Exception as exc:
            logger.debug("DataLoader batch times unreadable: %r", exc)
            return None

    def _measured_estimate(self) -> Estimate | None:
        device = self._device_series
        device.flush()
        series = device if device.count >= 2 else self._series
        series.flush()
        count = series.count
        min_warmup = max(self.min_warmup_steps, self._warmup_end)
        clean = series.stride == 1 and count - self._perturbed_end >= CLEAN_STEPS_NEEDED
        # Clean steps before the window (the default window starts after three) stay in the
        # estimate beside the clean ones after it; without them the perturbed steps are warm-up.
        before_window = self._capture[0] if self._capture is not None else 0
        keep_before = clean and before_window > min_warmup + 1
        if clean and not keep_before:
            min_warmup = max(min_warmup, self._perturbed_end)
        key = (id(series), count, min_warmup, self._perturbed_end, self._variable_steps)
        if key != self._measured_key and (
            count <= DENSE_REFRESH_STEPS
            or count - self._measured_key[1] >= REFRESH_GROWTH * count
            or self._last_step_end_s - self._measured_at_s >= REFRESH_INTERVAL_S
            or key[0] != self._measured_key[0]
            or key[2:] != self._measured_key[2:]
        ):
            values, capture = series.values(), None
            warming_up = series.stride == 1 and count <= self._warmup_end
            if warming_up:
                # Every step so far compiled (or followed a compile): no steady step yet. The
                # last one with the prior's wide first-step interval, flagged ``warming_up``;
                # past the first step, its own time (the first-step correction is step 0's).
                values = values[-1:]
            elif keep_before:
                # The clean steps after the capture follow the ones before it: together they
                # are the job's clean steps, the first ones still early (corrected as such).
                values = np.concatenate([values[:before_window], values[self._perturbed_end :]])
            elif series.stride == 1 and not clean and self._capture is not None:
                # Not enough clean steps yet: use the window's steps, corrected for the capture,
                # but not the disturbed ones after it (a profiler disable can take 30 steps' time).
                start, end = self._capture
                values = np.concatenate([values[:end], values[self._perturbed_end :]])
                capture = (start, end)
            if warming_up and count >= 2:
                self._measured = warmup_step_estimate(float(values[-1]), self._prior, self.level)
            else:
                self._measured = estimate_measured(
                    values,
                    self._prior,
                    self.level,
                    min_warmup=min_warmup,
                    stride=series.stride,
                    capture=capture,
                    variable=self._variable_steps,
                )
            self._measured_key = key
            self._measured_at_s = self._last_step_end_s
        return self._measured

    def _recent_clean_steps(self) -> np.ndarray | None:
        """The latest ``OUTDATED_RUN_STEPS`` step times after the capture-perturbed ones (the
        series the measured estimate reads), or None: fewer, or a compacted series."""
        series = self._device_series if self._device_series.count >= 2 else self._series
        if series.stride != 1 or series.count - self._perturbed_end < OUTDATED_RUN_STEPS:
            return None
        return series.values()[-OUTDATED_RUN_STEPS:]

    def _remaining_capture_s(self, iteration_s: float, remaining: int) -> tuple[float, float]:
        """Expected capture cost still to come and its half-width at ``level``: the window's
        steps not yet run, slowed by the prior's ``capture_ratio``, and the one-off disable +
        decode (``capture_spike_steps`` steady steps plus ``capture_spike_excess_s`` seconds)
        that lands in the step after the window (index
        ``end``). Nothing once that step has ended, or if the job ends before it."""
        if self._capture is None:
            return 0.0, 0.0
        start, end = self._capture
        done = self._steps_done
        if done > end or remaining < end - done + 1:
            return 0.0, 0.0
        window_left = max(0, end - max(done, start))
        r_lo, r_hi = self._prior.capture_ratio
        s_lo, s_hi = self._prior.capture_spike_steps
        e_lo, e_hi = self._prior.capture_spike_excess_s
        centre_steps = (0.5 * (r_lo + r_hi) - 1.0) * window_left + 0.5 * (s_lo + s_hi)
        half_steps = 0.5 * (r_hi - r_lo) * window_left + 0.5 * (s_hi - s_lo)
        scale = normal_quantile(0.5 + self.level / 2) / normal_quantile(0.975)
        centre_s = iteration_s * centre_steps + 0.5 * (e_lo + e_hi)
        half_s = iteration_s * half_steps + 0.5 * (e_hi - e_lo)
        return centre_s, half_s * scale

    def _overhead_per_step(self) -> float:
        # Wall time between the first and the last step end that neither step durations,
        # phases nor ets-hook's own work cover, per step. ~0 when the hook follows the contract.
        series = self._series
        n = series.count
        if n < 2 or math.isnan(self._first_step_end_s):
            return 0.0
        span = self._last_step_end_s - self._first_step_end_s
        durations = series.total_s - series.first_s
        phases = self._phase_s_until(self._last_step_end_s) - self._phase_s_until(
            self._first_step_end_s
        )
        per_step_s = (span - durations - phases - self._own_s) / (n - 1)
        # Below the clocks' nanosecond: the float sums' rounding (-2.8e-14 s), not time.
        return 0.0 if abs(per_step_s) < 1e-9 else per_step_s

    def _phase_s_until(self, t_s: float) -> float:
        # Phase seconds that ended at or before t_s.
        i = bisect_right(self._phase_ends_s, t_s)
        return self._phase_cum_s[i - 1] if i else 0.0

    def _build(self) -> Prediction | None:
        self._apply_window_measure()
        measured = self._measured_estimate()
        if measured is not None and measured.recurring_period_steps and not self._recurring_noted:
            self._recurring_noted = True
            logger.info(
                "every %d steps a step runs %.3g ms longer: work the loop does not "
                "mark (an evaluation? a checkpoint?), now counted in the step time; "
                "`with hook.phase(name):` around it has it priced as a phase from its first run",
                measured.recurring_period_steps,
                1e3 * measured.recurring_excess_s,
            )
        trace = (
            self._trace.as_estimate(self.level)
            if self._trace is not None and not self._variable_steps
            else None
        )
        recent = self._recent_clean_steps()
        if (
            trace is not None
            and measured is not None
            and (
                measured.level_shifted
                or (
                    recent is not None
                    and outdated_by_recent_steps(recent, trace.iteration_s, trace.ci_s)
                )
            )
        ):
            # The window's steps no longer describe the job's: the measured estimate alone
            # (fused, the trace's narrow interval held the prediction at the old level until
            # the shift was confirmed, and halfway after).
            trace = None
        job = self._job
        supply = self._input_supply()
        if trace is not None:
            # The trace prices the model's work only: a step fed by slower workers waits.
            trace = bound_by_supply(trace, supply, job.grad_accum_steps)
        est = fuse([measured, trace], level=self.level)
        if est is None:
            return None
        if recent is not None and outdated_by_recent_steps(recent, est.iteration_s, est.ci_s):
            # A run longer than a burst sits off the estimate: a lasting shift may be under way
            # (confirmed MIN_SHIFT_STEPS steps after the change). The point waits for that; the
            # interval reaches the level the latest steps run at.
            reach_s = abs(statistics.median(recent.tolist()) - est.iteration_s)
            est = dataclasses.replace(est, ci_s=max(est.ci_s, reach_s))
        est = bound_by_supply(est, supply, job.grad_accum_steps)
        step = job.initial_step + self._steps_done
        total_steps = job.total_steps
        if total_steps is not None and step > total_steps:
            # The loop ran past the length it was given: that length is wrong, the job's real
            # one unknown. Step time only from here on, never an ETA of 0 for a running job.
            total_steps = None
            if not self._overrun_noted:
                self._overrun_noted = True
                logger.warning(
                    "the loop ran past the job's length (step %d, total_steps=%d from "
                    "the arguments given or the trainer); the total is unknown from here on",
                    step,
                    job.total_steps,
                )
        remaining = job.remaining_steps(step) if total_steps is not None else None
        as_of_s = max(self._last_step_end_s, self._last_phase_end_s)
        elapsed_s = as_of_s - self.start_s
        overhead_s = self._overhead_per_step()
        phases = self._phases.project(step, est.iteration_s)
        phase_s, phase_ci_s = remaining_phase_time(phases)
        total_s = total_ci_s = eta_s = None
        finish_time = None
        capture_s = 0.0
        if remaining is not None:
            capture_s, capture_ci_s = self._remaining_capture_s(est.iteration_s, remaining)
            cadence_s = max(est.iteration_s + overhead_s, 0.0)
            eta_s = remaining * cadence_s + phase_s + capture_s
            total_s = elapsed_s + eta_s
            noise_sd = est.noise_sd_s if math.isfinite(est.noise_sd_s) else 0.0
            z = normal_quantile(0.5 + self.level / 2)
            total_ci_s = math.sqrt(
                (remaining * est.ci_s) ** 2
                + remaining * (z * noise_sd) ** 2
                + phase_ci_s**2
                + capture_ci_s**2
            )
            finish_time = utc_or_none(self.wall_start_s + total_s)
        local_total_s = total_s
        view = self._job_view
        lag_s = self._job_lag_s(view) if total_s is not None else None
        if lag_s is not None and eta_s is not None:
            eta_s = max(eta_s + lag_s, 0.0)
            total_s = elapsed_s + eta_s
            finish_time = utc_or_none(self.wall_start_s + total_s)
        stop = self._early_stop.forecast() if self._early_stop is not None else None
        converged = est.rel_ci <= self.converge_rel_ci
        prediction = Prediction(
            step=step,
            total_steps=total_steps,
            remaining_steps=remaining,
            iteration_s=est.iteration_s,
            iteration_ci_s=est.ci_s,
            total_s=total_s,
            total_ci_s=total_ci_s,
            eta_s=eta_s,
            elapsed_s=elapsed_s,
            finish_time=finish_time,
            converged=converged,
            source=est.source,
            level=self.level,
            iteration_median_s=est.median_s if math.isfinite(est.median_s) else None,
            warmup_steps=measured.warmup_steps if measured else 0,
            measured_steps=measured.samples if measured else 0,
            measured_iteration_s=measured.iteration_s if measured else None,
            measured_ci_s=measured.ci_s if measured else None,
            trace_iteration_s=trace.iteration_s if trace else None,
            trace_ci_s=trace.ci_s if trace else None,
            overhead_per_step_s=overhead_s,
            remaining_phase_s=phase_s,
            remaining_capture_s=capture_s,
            phases=phases,
            expected_stop_step=stop.expected_stop_step if stop is not None else None,
            total_range_s=(
                total_range_s(stop, total_s, cadence_s)
                if stop is not None and total_s is not None
                else None
            ),
            start_time=utc_from_timestamp(self.wall_start_s),
            as_of=utc_from_timestamp(self.wall_start_s + elapsed_s),
            warming_up=self._steps_done <= self._warmup_end,
            rank=self.rank,
            world_size=self.world_size,
            local_total_s=local_total_s,
            slowest_rank=view.slowest_rank if view is not None else None,
            job_view_step=view.step if view is not None else None,
            straggler_rank=view.straggler_rank if view is not None else None,
            host_foreign_cpu=self._host_load[0] if self._host_load is not None else None,
            capture_host_foreign_cpu=(
                self._capture_load if self._capture_load is not None else self._capture_load_before
            ),
            straggler_host_foreign_cpu=(
                view.straggler_host_foreign_cpu if view is not None else None
            ),
            host_steal=self._host_load[1] if self._host_load is not None else None,
            input_period_s=(job.grad_accum_steps * supply.period_s if supply is not None else None),
            time_limit_s=self.time_limit_s,
            data_wait_s=self._input_wait[0] if self._input_wait is not None else None,
            data_wait_share=self._input_wait[1] if self._input_wait is not None else None,
        )
        return cut_at_time_limit(prediction)

    def _job_lag_s(self, view: JobView | None) -> float | None:
        """The job's predicted end minus this rank's own, both as of the view's exchange."""
        if view is None or view.finish_wall_s is None:
            return None
        own = view.forecast_of(self.rank)
        if own is None or own.finish_wall_s is None:
            return None
        return view.finish_wall_s - own.finish_wall_s

    # ------------------------------------------------------------------------------------------
    # Slow path: reporters and housekeeping

    def _slow_path(self, step_index: int, now_s: float) -> None:
        try:
            if step_index == 0:
                self._first_step_end_s = now_s
            if not self._failed:
                step = self._job.initial_step + step_index + 1
                last = step == self._job.total_steps
                self._dispatch.dispatch(
                    step_index + 1, step, now_s, lambda: self.prediction, last_step=last
                )
            if len(self._series.pending) >= FLUSH_EVERY_STEPS:
                with self._lock:
                    self._series.flush()
        except DeadlineExceededError:
            raise
        except Exception as exc:
            self._fail(exc)
        finally:
            # When the slow path runs next: a reporter is due, or pending values need folding.
            self._next_index = step_index + FLUSH_EVERY_STEPS
            self._next_s = math.inf
            if not self._failed:
                self._next_index = min(self._next_index, self._dispatch.next_count - 1)
                self._next_s = self._dispatch.next_s
                total = self._job.total_steps
                last_index = None if total is None else total - self._job.initial_step - 1
                if last_index is not None and step_index < last_index:
                    # The job's last step: reporters that show "done" are offered it.
                    self._next_index = min(self._next_index, last_index)

    def close(self, outcome: str = "closed", error: str | None = None) -> Prediction | None:
        """Final prediction to every reporter, with how the job ended. Idempotent.

        Closed as ``"closed"``, the job is over: the final prediction is the job as it ran
        (``ended_prediction``: total = elapsed, ETA 0, ``total_steps`` the steps run) and
        ``prediction`` returns it from then on; in a multi-process job too (the job view's
        predicted lag behind the slowest rank is dropped). Interrupted or failed jobs keep the
        projection of the whole run (they may be resumed).

        Never raises (a ``DeadlineExceededError`` from the reporters is logged too).

        Args:
            outcome: ``"closed"`` (the status file's state), ``"interrupted"`` or ``"failed"``.
            error: the exception's type name for ``"failed"``, else None.

        Returns:
            The final prediction; None when there is none or closing failed. Later calls return
            the last cached prediction.
        """
        if self._closed:
            return self._cached
        self._closed = True
        try:
            prediction = self.prediction
            if prediction is not None and outcome == "closed":
                # The training it followed is over: what ran, not what was planned (an early
                # stop or a break ends it before total_steps; a final phase has run).
                prediction = ended_prediction(prediction)
                with self._lock:
                    self._cached = self._ended = prediction
            if not self._failed:
                self._dispatch.close(prediction, outcome, error)
            return prediction
        except Exception as exc:
            self._fail(exc)
            return None

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            logger.warning("forecaster error, reporters disabled: %r", exc, exc_info=True)
