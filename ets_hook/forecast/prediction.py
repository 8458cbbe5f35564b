"""``Prediction``: one frozen, JSON-serialisable forecast of a job (what reporters receive)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from .job import PhaseForecast
from .stats import (
    DEFAULT_LEVEL,
)
from .text import format_prediction


def utc_from_timestamp(ts: float) -> datetime:
    """An aware UTC datetime from a POSIX timestamp ``ts`` (float seconds, ``time.time()``).

    Raises:
        ValueError: ``ts`` is NaN.
        OverflowError: ``ts`` is infinite or out of the platform's ``time_t`` range.
    """
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def utc_or_none(ts: float) -> datetime | None:
    """``utc_from_timestamp(ts)``, or None where no date exists for it (a total of years past
    the calendar's end: ``total_steps=10**15``). Never raises."""
    try:
        return utc_from_timestamp(ts)
    except (ValueError, OverflowError, OSError):
        return None


#: ``Prediction.source`` of a step time set by the DataLoader workers' pace
#: (``forecast.input_supply``).
SOURCE_INPUT = "input"
#: ``Prediction.waits_for_input`` from this share of a captured step spent waiting for input.
INPUT_WAIT_SHARE = 0.25
#: ``Prediction.host_busy`` from this share of the machine's CPU used by other processes...
BUSY_FOREIGN_CPU = 0.25
#: ... or this share taken as steal time.
BUSY_STEAL = 0.05


@dataclass(frozen=True, slots=True)
class Prediction:
    """What ets-hook predicts, as of the last step (or phase) the forecaster was told about.

    Times are seconds; ``*_ci_s`` are half-widths of ``level`` (95%) intervals. Fields that need
    the job length (``total_steps``) are None while it is unknown.

    Attributes:
        step: completed training steps (global, including ``JobModel.initial_step``).
        total_steps: training steps in the whole job; None when unknown (also once the loop
            has run past the length it was given: that length was wrong).
        remaining_steps: steps still to run; None when ``total_steps`` is unknown.
        iteration_s: steady-state mean time of one training step (marked phases excluded).
        iteration_ci_s: half-width of ``iteration_s``'s interval.
        total_s: predicted wall time of the whole job, from hook creation to the end of the last
            step (a phase after the last step is not included).
        total_ci_s: half-width of ``total_s``'s interval.
        eta_s: predicted wall time still to come (``total_s - elapsed_s``).
        elapsed_s: wall time from hook creation to the last step or phase end reported.
        finish_time: predicted UTC end of the last step; None where the total is unknown or
            ends past the last date the platform can hold.
        converged: the step-time interval is narrow enough (``Forecaster`` ``converge_rel_ci``).
        source: "prior", "measured", "trace" (or the trace estimator's own label) or "fused".
        level: confidence level of the intervals.
        iteration_median_s: median step time beside the mean; None when unknown.
        warmup_steps: leading steps the measured estimate dropped as warm-up.
        measured_steps: steps the measured estimate rests on (after warm-up).
        measured_iteration_s: the measured estimate alone; None before any step.
        measured_ci_s: its half-width.
        trace_iteration_s: the trace-based estimate alone; None without one.
        trace_ci_s: its half-width.
        overhead_per_step_s: per-step wall time the step durations and phases do not cover
            (should be ~0), projected per remaining step.
        remaining_phase_s: projected time of the remaining non-training phases.
        remaining_capture_s: cost still to come from ets-hook's own capture (window steps not
            yet run, the one-off profiler disable and decode after it); 0 once the step after
            the window has ended.
        phases: each known phase, measured and projected.
        expected_stop_step: the global step at which the early-stopping rule is expected to
            fire (<= ``total_steps``); None without a rule or before enough evaluations.
        total_range_s: (total if the job stops there, total to ``total_steps``); ``total_s``
            and ``eta_s`` stay those of the full run. None alike.
        start_time: UTC time of hook creation.
        as_of: UTC time of the last step or phase end reported.
        warming_up: every step so far is known warm-up (``torch.compile`` compiled in it or
            in the step before): ``iteration_s`` is the last step's time, compile excluded,
            with the prior's wide first-step interval, not a steady-state estimate.
        rank: this process's rank in a multi-process job (0 otherwise).
        world_size: processes in the job (1: a single process).
        local_total_s: this rank's own ``total_s``, before the job-level view is applied (the
            same as ``total_s`` in a single process or before the first exchange).
        slowest_rank: the rank the job's end waits for, from the last rank exchange
            (``forecast.ranks.JobView``); None before one, or in a single process.
        job_view_step: the global step of that exchange; None alike. While it is set,
            ``total_s``, ``eta_s`` and ``finish_time`` are the job's: this rank's own values
            moved by the gap between the job's predicted end and this rank's at that exchange.
        straggler_rank: the rank whose compute + data wait per step is 10% or more above the
            fastest rank's, from that exchange; None when there is none or it is unknown.
        host_foreign_cpu: share of the machine's CPU (0..1) other processes used over the
            latest sample (``capture.host_load``, about a second); None before one, or where
            psutil cannot read it.
        host_steal: share of the machine's CPU the hypervisor took (steal) over that sample;
            None alike.
        input_period_s: the DataLoader workers' measured time per optimizer step's batches
            (``forecast.input_supply``): ``iteration_s`` is the expected slower of it and the
            loop's own pace (source ``"input"`` where the workers' is the slower); None
            without a timed loader or before enough batches.
        time_limit_s: the wall-clock limit that ends the job, seconds from hook creation
            (``ETSHook(time_limit_s=...)``, Lightning's ``max_time``); None without one. While
            the job length is unknown it is the only bound (``total_s`` stays None); a
            predicted total beyond it is cut to it (``stopped_by_time_limit``,
            ``cut_at_time_limit``).
        data_wait_s: the median time a captured step waited for its input, seconds: its
            start (the previous step's end) to its first model op — the DataLoader's
            ``__next__`` in the training process, ``Dataset`` / ``collate_fn`` work with
            ``num_workers=0``, a slow input pipeline (``trace.breakdown``); part of
            ``iteration_s``, not added to it. None before the window's trace.
        data_wait_share: ``data_wait_s`` over the captured steps' median wall time, 0..1:
            the share of a step spent waiting for input. None before the window's trace.
        capture_host_foreign_cpu: share of the machine's CPU (0..1) other processes used
            around the capture window: the highest share sampled from its start to the first
            sample after its end (until that one, the latest sample before the window). What
            this rank sends at a rank exchange: a straggler named on a busy host may be the
            host's doing, not the rank's. None before the window or where not sampled.
        straggler_host_foreign_cpu: for ``straggler_rank``, its ``capture_host_foreign_cpu``
            (from that exchange) where it is ``BUSY_FOREIGN_CPU`` or more: the straggler's
            host was busy with other processes while its steps were captured, so its slower
            compute may be the host's; None otherwise (no straggler, a host not that busy, or
            unknown).
    """

    step: int
    total_steps: int | None
    remaining_steps: int | None
    iteration_s: float
    iteration_ci_s: float
    total_s: float | None
    total_ci_s: float | None
    eta_s: float | None
    elapsed_s: float
    finish_time: datetime | None
    converged: bool
    source: str
    level: float = DEFAULT_LEVEL
    iteration_median_s: float | None = None
    warmup_steps: int = 0
    measured_steps: int = 0
    measured_iteration_s: float | None = None
    measured_ci_s: float | None = None
    trace_iteration_s: float | None = None
    trace_ci_s: float | None = None
    overhead_per_step_s: float = 0.0
    remaining_phase_s: float = 0.0
    remaining_capture_s: float = 0.0
    phases: tuple[PhaseForecast, ...] = ()
    expected_stop_step: int | None = None
    total_range_s: tuple[float, float] | None = None
    start_time: datetime | None = None
    as_of: datetime | None = None
    warming_up: bool = False
    rank: int = 0
    world_size: int = 1
    local_total_s: float | None = None
    slowest_rank: int | None = None
    job_view_step: int | None = None
    straggler_rank: int | None = None
    host_foreign_cpu: float | None = None
    host_steal: float | None = None
    input_period_s: float | None = None
    time_limit_s: float | None = None
    data_wait_s: float | None = None
    data_wait_share: float | None = None
    capture_host_foreign_cpu: float | None = None
    straggler_host_foreign_cpu: float | None = None

    def __str__(self) -> str:
        """The one line the log prints (``forecast.text.format_prediction``), e.g.
        ``step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s``; ``repr`` keeps
        every field."""
        return format_prediction(self)

    @property
    def host_busy(self) -> bool:
        """Other work loads the machine enough to move step times: ``host_foreign_cpu`` >=
        ``BUSY_FOREIGN_CPU`` (a quarter of the machine) or ``host_steal`` >= ``BUSY_STEAL``."""
        return self.host_busy_shares != (None, None)

    @property
    def host_busy_shares(self) -> tuple[float | None, float | None]:
        """``(host_foreign_cpu, host_steal)``, each only where it reaches its threshold
        (``BUSY_FOREIGN_CPU``, ``BUSY_STEAL``), else None."""
        foreign, steal = self.host_foreign_cpu or 0.0, self.host_steal or 0.0
        return (
            foreign if foreign >= BUSY_FOREIGN_CPU else None,
            steal if steal >= BUSY_STEAL else None,
        )

    @property
    def input_bound(self) -> bool:
        """The step time is the DataLoader workers' pace (source ``SOURCE_INPUT``): the loop
        will wait for its batches."""
        return self.source == SOURCE_INPUT

    @property
    def waits_for_input(self) -> bool:
        """A large share of each step waits for its input: ``data_wait_share`` >=
        ``INPUT_WAIT_SHARE`` (a quarter of the step)."""
        return (self.data_wait_share or 0.0) >= INPUT_WAIT_SHARE

    @property
    def stopped_by_time_limit(self) -> bool:
        """The time limit ends the job before its last step: ``total_s`` is at or past
        ``time_limit_s`` (the limit, or the elapsed time once the job ran to it)."""
        return (
            self.time_limit_s is not None
            and self.total_s is not None
            and self.total_s >= self.time_limit_s
        )

    @property
    def iteration_rel_ci(self) -> float:
        """Relative half-width of the step-time interval (0.011 = ±1.1%); inf if not > 0."""
        return self.iteration_ci_s / self.iteration_s if self.iteration_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """Every field plus ``iteration_rel_ci`` and ``stopped_by_time_limit`` as a JSON-safe
        dict.

        Datetimes become ISO 8601 strings with offset, non-finite floats None, phases dicts and
        tuples lists.
        """
        out: dict[str, Any] = {f.name: _json_safe(getattr(self, f.name)) for f in fields(self)}
        out["iteration_rel_ci"] = _json_safe(self.iteration_rel_ci)
        out["stopped_by_time_limit"] = self.stopped_by_time_limit
        return out

    def to_json(self, **kwargs: Any) -> str:
        """``to_dict()`` as strict JSON (no NaN/Infinity).

        Args:
            **kwargs: passed to ``json.dumps`` (e.g. ``indent``); not ``allow_nan``.

        Returns:
            The JSON text.
        """
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)


def ended_prediction(prediction: Prediction) -> Prediction:
    """``prediction`` as the job ran, for a job that has ended at ``prediction.step``.

    The total is the elapsed time (nothing remains: steps, phases, capture cost, ETA all 0);
    ``total_steps`` becomes the steps run (fewer than planned after early stopping or a
    ``break``; the first known count where the length was unknown); the step-time estimate
    and its sources are kept, its interval narrowed to the measured steps' where that is
    narrower (the widening for the steps to come has nothing left to cover). An
    early-stopping forecast collapses to the step it stopped at.
    In a multi-process job the job view's lag (the gap between the job's predicted end and
    this rank's at the last exchange) is dropped as well: it was a prediction, and the ranks
    of a data-parallel job end within a step of each other; ``slowest_rank`` and
    ``straggler_rank`` stay as they were.

    Args:
        prediction: the last prediction of the job, as of its last step or phase end.

    Returns:
        A new ``Prediction``; ``prediction`` is not changed.
    """
    elapsed_s = prediction.elapsed_s
    phases = tuple(
        replace(phase, remaining=0, remaining_s=0.0, remaining_ci_s=0.0)
        for phase in prediction.phases
    )
    stopped = prediction.expected_stop_step is not None
    # Nothing is left to forecast: the step time's interval is that of the steps measured, not
    # one widened to reach the latest steps' level or the trace's disagreement (devices for
    # the steps to come), where the measured one is narrower.
    iteration_ci_s = prediction.iteration_ci_s
    if prediction.measured_ci_s is not None and math.isfinite(prediction.measured_ci_s):
        iteration_ci_s = min(iteration_ci_s, prediction.measured_ci_s)
    return replace(
        prediction,
        iteration_ci_s=iteration_ci_s,
        total_steps=prediction.step,
        remaining_steps=0,
        total_s=elapsed_s,
        total_ci_s=0.0,
        eta_s=0.0,
        finish_time=prediction.as_of,
        remaining_phase_s=0.0,
        remaining_capture_s=0.0,
        phases=phases,
        expected_stop_step=prediction.step if stopped else None,
        total_range_s=(elapsed_s, elapsed_s) if stopped else None,
        local_total_s=elapsed_s,
    )


def cut_at_time_limit(prediction: Prediction) -> Prediction:
    """``prediction`` with its total cut to its time limit, where the limit ends the job first.

    The job ends at the earlier of its last step and ``time_limit_s`` (or at the step end that
    reaches the limit: once the elapsed time is past it, at the elapsed time). A total beyond
    that end becomes it: ``total_s``, ``eta_s``, ``finish_time``, ``local_total_s`` and both
    ends of ``total_range_s`` move back by the excess, and ``total_ci_s`` shrinks by it (the
    interval's early end stays where it was); ``total_steps`` and ``remaining_steps`` stay the
    planned ones. Unchanged without a limit, without a total, or with a total within the limit.

    Args:
        prediction: a prediction of a running job (its ``total_s`` is ``elapsed_s + eta_s``).

    Returns:
        The prediction, or a new one; ``prediction`` is not changed.
    """
    limit_s, total_s = prediction.time_limit_s, prediction.total_s
    if limit_s is None or total_s is None:
        return prediction
    end_s = max(limit_s, prediction.elapsed_s)
    excess_s = total_s - end_s
    if not excess_s > 0.0:
        return prediction
    finish_time = prediction.finish_time
    if finish_time is not None:  # from the start where known: no sub-microsecond drift
        start = prediction.start_time
        finish_time = (
            start + timedelta(seconds=end_s)
            if start is not None
            else finish_time - timedelta(seconds=excess_s)
        )
    low_high = prediction.total_range_s
    return replace(
        prediction,
        total_s=end_s,
        total_ci_s=(
            max(prediction.total_ci_s - excess_s, 0.0)
            if prediction.total_ci_s is not None
            else None
        ),
        eta_s=end_s - prediction.elapsed_s,
        finish_time=finish_time,
        local_total_s=(
            min(prediction.local_total_s, end_s) if prediction.local_total_s is not None else None
        ),
        total_range_s=(
            (min(low_high[0], end_s), min(low_high[1], end_s)) if low_high is not None else None
        ),
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, PhaseForecast):
        return {f.name: _json_safe(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (tuple, list)):
        return [_json_safe(v) for v in value]
    return value
