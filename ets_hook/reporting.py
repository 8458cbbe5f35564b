"""Reporters: what happens with a prediction once the forecaster has one.

- ``LogReporter``: a line on ``logging.getLogger("ets_hook")`` every N steps and whenever the
  estimate moves materially: ``step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s``.
- ``TqdmReporter``: our ETA on a user's tqdm bar (postfix) or on a bar of our own (tqdm is an
  optional extra, imported when this reporter is created).
- ``StatusFileReporter``: a JSON status file for schedulers, rewritten atomically, throttled.
- ``CallbackReporter``: the user's ``on_prediction`` callable.
- ``DeadlineGuard``: fires once when the prediction says the job will not finish before a
  deadline (explicit, or the Slurm job's end time): warn, raise ``DeadlineExceededError`` into the
  training loop, or call the user's function.

Scheduling: each reporter has a ``ReportSchedule``; ``ReportDispatcher`` offers it a prediction
only when due, so the per-step cost of all reporters together is one comparison on the hot path
(the forecaster's). Every reporter is offered the first prediction.

Failure isolation: an exception in a reporter is logged once and disables that reporter only.
``DeadlineExceededError`` is the one exception that propagates, on purpose.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .atomic import atomic_write_bytes

if TYPE_CHECKING:
    from .prediction import Prediction

logger = logging.getLogger("ets_hook")

_NEVER = sys.maxsize

DeadlinePolicy = Literal["confident", "likely", "point"]
DEADLINE_POLICIES: tuple[str, ...] = ("confident", "likely", "point")
DEADLINE_ACTIONS: tuple[str, ...] = ("warn", "raise")


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """Compact duration: ``4.2s``, ``42s``, ``13m32s``, ``2h05m``, ``3d04h``; ``?`` if unknown."""
    if seconds is None or math.isnan(seconds):
        return "?"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if math.isinf(seconds):
        return "∞"
    if seconds < 9.95:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        minutes, secs = divmod(whole, 60)
        return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    total_minutes = round(seconds / 60)
    if total_minutes < 24 * 60:
        hours, minutes = divmod(total_minutes, 60)
        return f"{hours}h{minutes:02d}m"
    total_hours = round(seconds / 3600)
    days, hours = divmod(total_hours, 24)
    return f"{days}d{hours:02d}h"


def format_step_time(seconds: float) -> str:
    """Step time with 3 significant digits: ``0.412 s/step``, ``12.3 ms/step``, ``812 µs/step``."""
    if not math.isfinite(seconds):
        return "? s/step"
    if seconds >= 0.0995:
        return f"{_sig3(seconds)} s/step"
    if seconds >= 0.0009995:
        return f"{_sig3(seconds * 1e3)} ms/step"
    return f"{_sig3(seconds * 1e6)} µs/step"


def _sig3(value: float) -> str:
    if value >= 99.95:
        return f"{value:.0f}"
    if value >= 9.995:
        return f"{value:.1f}"
    if value >= 0.9995:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_relative(rel: float) -> str:
    """Relative half-width: ``±1.1%``, ``±12%``."""
    if not math.isfinite(rel):
        return "±?"
    pct = 100.0 * rel
    return f"±{pct:.1f}%" if pct < 9.95 else f"±{pct:.0f}%"


def format_prediction(p: Prediction) -> str:
    """``step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s`` (ETA parts only when the
    total step count is known)."""
    steps = f"step {p.step}/{p.total_steps}" if p.total_steps is not None else f"step {p.step}"
    text = f"{steps} · {format_step_time(p.iteration_s)} {format_relative(p.iteration_rel_ci)}"
    if p.eta_s is not None:
        text += f" · ETA {format_duration(p.eta_s)} · total {format_duration(p.total_s)}"
    return text


# --------------------------------------------------------------------------------------------
# Base class and dispatch
# --------------------------------------------------------------------------------------------


# Early checkpoints (local step counts) at which the default reporters look at the prediction:
# dense enough to show the early answer, sparse enough that building predictions (tens to
# hundreds of µs each) never weighs on millisecond steps.
EARLY_STEPS = (1, 2, 3, 5, 10, 20, 50)


@dataclass(frozen=True, slots=True)
class ReportSchedule:
    """When a reporter wants a prediction: after each of the ``first_steps`` first steps, after
    each step count in ``early_steps``, at global steps that are multiples of ``every_n_steps``,
    and whenever ``interval_s`` seconds (the forecaster's clock) have passed since it was last
    offered one. Checked at step ends only."""

    first_steps: int = 1
    every_n_steps: int | None = None
    interval_s: float | None = None
    early_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.first_steps, bool) or self.first_steps < 0:
            raise ValueError(f"first_steps must be >= 0, got {self.first_steps!r}")
        if any(not isinstance(k, int) or k < 1 for k in self.early_steps):
            raise ValueError(f"early_steps must be ints >= 1, got {self.early_steps!r}")
        if self.every_n_steps is not None and self.every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {self.every_n_steps}")
        if self.interval_s is not None and not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0 or None, got {self.interval_s}")


class Reporter:
    """Base class of reporters: no-op hooks; override what you need."""

    schedule: ReportSchedule = ReportSchedule()

    def on_prediction(self, prediction: Prediction) -> None:
        """A prediction is due by ``schedule``."""

    def on_close(self, prediction: Prediction | None) -> None:
        """The job ended (the hook closed); ``prediction`` is the final one."""


class DeadlineExceededError(RuntimeError):
    """The job is predicted to miss its deadline (``on_deadline="raise"``).

    Raised into the training loop on purpose, once; ``miss`` holds the details.
    """

    def __init__(self, miss: DeadlineMiss) -> None:
        super().__init__(miss.message)
        self.miss = miss


@dataclass(slots=True)
class _Slot:
    reporter: Reporter
    next_count: int = 1
    next_s: float = -math.inf
    active: bool = True

    def reschedule(self, count: int, step: int, now_s: float) -> None:
        schedule = self.reporter.schedule
        nxt = count + 1 if count < schedule.first_steps else _NEVER
        nxt = min(nxt, min((k for k in schedule.early_steps if k > count), default=_NEVER))
        if schedule.every_n_steps:
            n = schedule.every_n_steps
            nxt = min(nxt, count + (step // n + 1) * n - step)
        self.next_count = nxt
        self.next_s = now_s + schedule.interval_s if schedule.interval_s else math.inf


class ReportDispatcher:
    """Offers predictions to reporters when due; isolates their failures.

    ``next_count`` / ``next_s``: the earliest local step count / time at which any reporter is
    due (the forecaster compares against them on its hot path).
    """

    def __init__(self, reporters: Sequence[Reporter]) -> None:
        for r in reporters:
            if not isinstance(r, Reporter):
                raise ValueError(f"reporters must be Reporter instances, got {r!r}")
        self._slots = [_Slot(r) for r in reporters]
        self.next_count = 1 if self._slots else _NEVER
        self.next_s = -math.inf if self._slots else math.inf

    @property
    def reporters(self) -> list[Reporter]:
        """The reporters still active (a failing one is dropped)."""
        return [s.reporter for s in self._slots if s.active]

    def dispatch(
        self, count: int, step: int, now_s: float, get: Callable[[], Prediction | None]
    ) -> None:
        """Offer the prediction (built once, by ``get``, only if someone is due) at local step
        count ``count`` (global ``step``). Re-raises ``DeadlineExceededError`` after
        rescheduling."""
        prediction: Prediction | None = None
        fetched = False
        try:
            for slot in self._slots:
                if not slot.active or (count < slot.next_count and now_s < slot.next_s):
                    continue
                slot.reschedule(count, step, now_s)
                if not fetched:
                    prediction, fetched = get(), True
                if prediction is not None:
                    self._call(slot, slot.reporter.on_prediction, prediction)
        finally:
            active = [s for s in self._slots if s.active]
            self.next_count = min((s.next_count for s in active), default=_NEVER)
            self.next_s = min((s.next_s for s in active), default=math.inf)

    def close(self, prediction: Prediction | None) -> None:
        for slot in self._slots:
            if slot.active:
                self._call(slot, slot.reporter.on_close, prediction)
                slot.active = False

    @staticmethod
    def _call(slot: _Slot, method: Callable[[Any], None], prediction: Prediction | None) -> None:
        try:
            method(prediction)
        except DeadlineExceededError:
            raise
        except Exception as exc:
            slot.active = False
            logger.warning(
                "ets-hook: reporter %s failed and is disabled: %r",
                type(slot.reporter).__name__,
                exc,
                exc_info=True,
            )


# --------------------------------------------------------------------------------------------
# Reporters
# --------------------------------------------------------------------------------------------


class LogReporter(Reporter):
    """Logs ``format_prediction`` lines on ``logging.getLogger("ets_hook")``.

    A line is written for the first prediction, when the estimate first converges, at global steps
    that are multiples of ``every_n_steps``, and whenever the predicted total (the step time if the
    total is unknown) moved by ``move_threshold`` (relative) since the last line; the last two
    kinds at most once per ``min_interval_s`` of job time. The prediction rides along on the log
    record as ``record.ets_prediction`` for structured handlers.
    """

    def __init__(
        self,
        every_n_steps: int | None = 100,
        *,
        move_threshold: float = 0.05,
        min_interval_s: float = 5.0,
        check_interval_s: float = 1.0,
        first_steps: int = 0,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
    ) -> None:
        if not move_threshold > 0.0:
            raise ValueError(f"move_threshold must be > 0, got {move_threshold}")
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {min_interval_s}")
        self.schedule = ReportSchedule(
            first_steps=first_steps,
            every_n_steps=every_n_steps,
            interval_s=check_interval_s,
            early_steps=EARLY_STEPS,
        )
        self.every_n_steps = every_n_steps
        self.move_threshold = move_threshold
        self.min_interval_s = min_interval_s
        self.logger = logger or logging.getLogger("ets_hook")
        self.level = level
        self._last_value: float | None = None
        self._last_elapsed_s = -math.inf
        self._converged = False

    @staticmethod
    def _value(p: Prediction) -> float:
        return p.total_s if p.total_s is not None else p.iteration_s

    def on_prediction(self, prediction: Prediction) -> None:
        p = prediction
        value = self._value(p)
        newly_converged = p.converged and not self._converged
        self._converged = self._converged or p.converged
        if self._last_value is None or newly_converged:
            self._emit(p, value)
            return
        if p.elapsed_s - self._last_elapsed_s < self.min_interval_s:
            return
        periodic = bool(self.every_n_steps) and p.step % self.every_n_steps == 0
        moved = abs(value - self._last_value) >= self.move_threshold * abs(self._last_value)
        if periodic or moved:
            self._emit(p, value)

    def on_close(self, prediction: Prediction | None) -> None:
        if prediction is not None and self.logger.isEnabledFor(self.level):
            self.logger.log(
                self.level,
                "finished at step %d after %s",
                prediction.step,
                format_duration(prediction.elapsed_s),
                extra={"ets_prediction": prediction},
            )

    def _emit(self, p: Prediction, value: float) -> None:
        self._last_value = value
        self._last_elapsed_s = p.elapsed_s
        if self.logger.isEnabledFor(self.level):
            self.logger.log(self.level, "%s", format_prediction(p), extra={"ets_prediction": p})


class TqdmReporter(Reporter):
    """Shows our prediction on a tqdm bar.

    ``bar=None``: a bar of our own (total = the job's steps), advanced to the current step and
    closed at the end; its right side shows our ETA instead of tqdm's. A user's bar: only its
    postfix is set (``refresh=False``: it redraws on its own schedule). Needs the ``tqdm`` extra
    for a bar of our own: ``pip install 'ets-hook[tqdm]'``.
    """

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(
        self, bar: Any = None, *, interval_s: float = 0.5, desc: str = "train", **tqdm_kwargs: Any
    ) -> None:
        self.schedule = ReportSchedule(
            first_steps=0, interval_s=interval_s, early_steps=EARLY_STEPS
        )
        self._own = bar is None
        self._bar = bar
        self._desc = desc
        self._kwargs = tqdm_kwargs
        if self._own:
            try:
                from tqdm import tqdm
            except ImportError as exc:
                raise ImportError(
                    "ets-hook's progress bar needs tqdm: pip install 'ets-hook[tqdm]'"
                ) from exc
            self._factory: Any = tqdm
        elif not callable(getattr(bar, "set_postfix_str", None)):
            raise ValueError(f"progress bar must be a tqdm instance, got {type(bar).__name__}")

    @staticmethod
    def postfix(p: Prediction) -> str:
        text = f"{format_step_time(p.iteration_s)} {format_relative(p.iteration_rel_ci)}"
        if p.eta_s is not None:
            text += f" · ETA {format_duration(p.eta_s)}"
        return text

    def on_prediction(self, prediction: Prediction) -> None:
        text = self.postfix(prediction)
        if not self._own:
            self._bar.set_postfix_str(text, refresh=False)
            return
        if self._bar is None:
            self._bar = self._factory(
                total=prediction.total_steps,
                initial=prediction.step,
                desc=self._desc,
                unit="step",
                bar_format=self.BAR_FORMAT,
                **self._kwargs,
            )
        self._bar.set_postfix_str(text, refresh=False)
        self._bar.update(prediction.step - self._bar.n)

    def on_close(self, prediction: Prediction | None) -> None:
        if self._own and self._bar is not None:
            if prediction is not None:
                self._bar.update(prediction.step - self._bar.n)
            self._bar.close()


STATUS_FORMAT = "ets-hook-status"
STATUS_VERSION = 1


class StatusFileReporter(Reporter):
    """Rewrites a JSON status file atomically (temp file in the same directory, fsync,
    ``os.replace``): a reader always sees a complete, valid document, even if the process is
    killed mid-write. Written for the first prediction, then at most every ``interval_s``, and at
    close (``"state": "closed"``). Document::

        {"format": "ets-hook-status", "version": 1, "state": "running" | "closed",
         "pid": ..., "host": ..., "updated_at": ISO 8601, "prediction": Prediction.to_dict()}
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval_s: float = 5.0,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ValueError(f"status_path's directory does not exist: {self.path.parent}")
        if self.path.is_dir():
            raise ValueError(f"status_path is a directory: {self.path}")
        self.schedule = ReportSchedule(first_steps=1, interval_s=interval_s)
        self.extra = dict(extra or {})
        json.dumps(self.extra)  # fail early on non-JSON extras
        self._host = socket.gethostname()

    def document(self, state: str, prediction: Prediction | None) -> dict[str, Any]:
        return {
            "format": STATUS_FORMAT,
            "version": STATUS_VERSION,
            "state": state,
            "pid": os.getpid(),
            "host": self._host,
            "updated_at": datetime.now(timezone.utc).isoformat(),
            **self.extra,
            "prediction": prediction.to_dict() if prediction is not None else None,
        }

    def write(self, state: str, prediction: Prediction | None) -> None:
        data = json.dumps(self.document(state, prediction), allow_nan=False, indent=1)
        atomic_write_bytes(self.path, data.encode())

    def on_prediction(self, prediction: Prediction) -> None:
        self.write("running", prediction)

    def on_close(self, prediction: Prediction | None) -> None:
        self.write("closed", prediction)


class CallbackReporter(Reporter):
    """Calls ``fn(prediction)`` when due (default: each of the first 20 steps, then every second)
    and once more at close with the final prediction."""

    def __init__(
        self, fn: Callable[[Prediction], Any], schedule: ReportSchedule | None = None
    ) -> None:
        if not callable(fn):
            raise ValueError(f"on_prediction must be callable, got {fn!r}")
        self.fn = fn
        self.schedule = schedule or ReportSchedule(
            first_steps=0, interval_s=1.0, early_steps=EARLY_STEPS
        )

    def on_prediction(self, prediction: Prediction) -> None:
        self.fn(prediction)

    def on_close(self, prediction: Prediction | None) -> None:
        if prediction is not None:
            self.fn(prediction)


# --------------------------------------------------------------------------------------------
# Deadline guard
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadlineMiss:
    """Why the guard fired. Times are seconds from hook creation."""

    deadline_s: float
    margin_s: float
    predicted_total_s: float
    optimistic_total_s: float
    # How far the predicted end lies past (deadline - margin).
    shortfall_s: float
    policy: str
    prediction: Prediction
    message: str


class DeadlineGuard(Reporter):
    """Fires once when the prediction says the job will end after ``deadline - margin_s``.

    ``deadline``: seconds from hook creation, or a datetime (naive = local time).
    ``on_deadline``: ``"warn"`` (log a warning), ``"raise"`` (raise ``DeadlineExceededError`` into
    the training loop; the one exception the hook lets through), or a callable taking a
    ``DeadlineMiss`` (an exception from it disables the guard, except ``DeadlineExceededError``,
    which propagates).
    ``policy`` (the job must have a known ``total_steps``):
    - ``"confident"`` (default): even the optimistic end of the 95% interval of the total,
      ``total_s - total_ci_s``, misses: >= 97.5% sure of a miss. Early intervals are wide, so it
      fires at step 1 only for gross misses, and later as soon as the data are clear; it does not
      cry wolf on a job that lands near the deadline.
    - ``"likely"``: the point estimate misses and the estimate has converged.
    - ``"point"``: the point estimate misses (earliest; may fire on noise).
    Whatever the policy, it fires if the deadline has already passed with steps left.
    """

    def __init__(
        self,
        deadline: float | datetime,
        on_deadline: str | Callable[[DeadlineMiss], Any] = "warn",
        *,
        policy: str = "confident",
        margin_s: float = 0.0,
        interval_s: float = 1.0,
        logger: logging.Logger | None = None,
    ) -> None:
        if isinstance(deadline, datetime):
            pass
        elif isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
            raise ValueError(f"deadline must be seconds (> 0) or a datetime, got {deadline!r}")
        elif not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"deadline must be seconds > 0, got {deadline!r}")
        if not callable(on_deadline) and on_deadline not in DEADLINE_ACTIONS:
            raise ValueError(
                f"on_deadline must be 'warn', 'raise' or a callable, got {on_deadline!r}"
            )
        if policy not in DEADLINE_POLICIES:
            raise ValueError(f"policy must be one of {DEADLINE_POLICIES}, got {policy!r}")
        if not (math.isfinite(margin_s) and margin_s >= 0):
            raise ValueError(f"margin_s must be >= 0, got {margin_s!r}")
        self.deadline = deadline
        self.on_deadline = on_deadline
        self.policy = policy
        self.margin_s = margin_s
        self.schedule = ReportSchedule(
            first_steps=0, interval_s=interval_s, early_steps=EARLY_STEPS
        )
        self.logger = logger or logging.getLogger("ets_hook")
        self.fired: DeadlineMiss | None = None

    def deadline_s(self, p: Prediction) -> float:
        """The deadline in seconds from hook creation."""
        if isinstance(self.deadline, datetime):
            start = p.start_time.timestamp() if p.start_time is not None else 0.0
            return self.deadline.timestamp() - start
        return float(self.deadline)

    def check(self, p: Prediction) -> DeadlineMiss | None:
        """The miss this prediction shows under ``policy``, or None. Pure."""
        if p.total_s is None or not p.remaining_steps:
            return None
        deadline_s = self.deadline_s(p)
        limit_s = deadline_s - self.margin_s
        ci = p.total_ci_s or 0.0
        optimistic = p.total_s - ci
        if p.elapsed_s > limit_s:
            fire = True
        elif self.policy == "confident":
            fire = optimistic > limit_s
        elif self.policy == "likely":
            fire = p.converged and p.total_s > limit_s
        else:
            fire = p.total_s > limit_s
        if not fire:
            return None
        margin = f" (margin {format_duration(self.margin_s)})" if self.margin_s else ""
        message = (
            f"ets-hook: predicted to miss the deadline at step {p.step}/{p.total_steps}: "
            f"total {format_duration(p.total_s)} (optimistic {format_duration(optimistic)}) > "
            f"deadline {format_duration(deadline_s)}{margin} after start, "
            f"short by {format_duration(p.total_s - limit_s)}"
        )
        return DeadlineMiss(
            deadline_s=deadline_s,
            margin_s=self.margin_s,
            predicted_total_s=p.total_s,
            optimistic_total_s=optimistic,
            shortfall_s=p.total_s - limit_s,
            policy=self.policy,
            prediction=p,
            message=message,
        )

    def on_prediction(self, prediction: Prediction) -> None:
        if self.fired is not None:
            return
        miss = self.check(prediction)
        if miss is None:
            return
        self.fired = miss
        # Stop being scheduled: fired once, never again.
        self.schedule = ReportSchedule(first_steps=0)
        self.logger.warning("%s", miss.message)
        if self.on_deadline == "raise":
            raise DeadlineExceededError(miss)
        if callable(self.on_deadline):
            self.on_deadline(miss)


# --------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------


def parse_slurm_time(text: str) -> float | None:
    """Seconds in a Slurm time limit (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``);
    None for ``UNLIMITED`` / ``INFINITE`` / ``0`` (no limit). ValueError if malformed."""
    s = text.strip()
    if s.upper() in ("UNLIMITED", "INFINITE", "NOT_SET", ""):
        return None
    days = 0
    if "-" in s:
        day_text, s = s.split("-", 1)
        days = int(day_text)
        parts = [int(p) for p in s.split(":")]
        if len(parts) > 3:
            raise ValueError(f"bad Slurm time {text!r}")
        h, m, sec = [*parts, 0, 0][:3]
    else:
        parts = [int(p) for p in s.split(":")]
        if len(parts) == 1:
            h, m, sec = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, sec = 0, parts[0], parts[1]
        elif len(parts) == 3:
            h, m, sec = parts
        else:
            raise ValueError(f"bad Slurm time {text!r}")
    if min(days, h, m, sec) < 0:
        raise ValueError(f"bad Slurm time {text!r}")
    total = ((days * 24 + h) * 60 + m) * 60 + sec
    return float(total) if total > 0 else None


def slurm_deadline(environ: Mapping[str, str] | None = None) -> datetime | None:
    """The Slurm job's end time from the environment, or None outside Slurm / without a limit.

    ``SLURM_JOB_END_TIME`` (Unix seconds; set in the job environment by Slurm >= 20.11) if set;
    else ``SLURM_JOB_START_TIME`` + the time limit in ``SBATCH_TIMELIMIT`` or ``SLURM_TIMELIMIT``
    (the submission-side variables, present when the job was submitted with them). Nothing else
    is consulted: no ``squeue``/``scontrol`` subprocess, no network. Malformed values count as
    absent.
    """
    env = os.environ if environ is None else environ
    end = env.get("SLURM_JOB_END_TIME", "").strip()
    try:
        end_ts = float(end) if end else 0.0
    except ValueError:
        end_ts = 0.0
    if end_ts > 0:
        return datetime.fromtimestamp(end_ts, tz=timezone.utc)
    start = env.get("SLURM_JOB_START_TIME", "").strip()
    limit = env.get("SBATCH_TIMELIMIT") or env.get("SLURM_TIMELIMIT")
    if not start or not limit:
        return None
    try:
        start_ts = float(start)
        limit_s = parse_slurm_time(limit)
    except ValueError:
        return None
    if start_ts <= 0 or limit_s is None:
        return None
    return datetime.fromtimestamp(start_ts + limit_s, tz=timezone.utc)


# --------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------


def build_reporters(
    *,
    log_every_n_steps: int | None = 100,
    progress: Any = False,
    status_path: str | os.PathLike[str] | None = None,
    status_interval_s: float = 5.0,
    on_prediction: Callable[[Prediction], Any] | None = None,
    deadline: float | datetime | Literal[False] | None = None,
    on_deadline: str | Callable[[DeadlineMiss], Any] = "warn",
    deadline_policy: str = "confident",
    deadline_margin_s: float = 0.0,
    environ: Mapping[str, str] | None = None,
) -> list[Reporter]:
    """The reporters for the hook's keyword arguments, validated now (bad values: ValueError;
    ``progress=True`` without tqdm: ImportError).

    ``log_every_n_steps``: None or 0 turns logging off. ``progress``: False, True (our own bar)
    or a user's tqdm bar. ``deadline``: seconds from hook creation or a datetime; None means the
    Slurm job's end time when running under Slurm (``slurm_deadline``), False means no guard.
    The deadline guard comes last, so the log line and status file are written before it can
    raise.
    """
    reporters: list[Reporter] = []
    if log_every_n_steps:
        reporters.append(LogReporter(every_n_steps=log_every_n_steps))
    if progress is True:
        reporters.append(TqdmReporter())
    elif progress is not False and progress is not None:
        reporters.append(TqdmReporter(progress))
    if status_path is not None:
        reporters.append(StatusFileReporter(status_path, interval_s=status_interval_s))
    if on_prediction is not None:
        reporters.append(CallbackReporter(on_prediction))
    if deadline is None:
        resolved: float | datetime | None = slurm_deadline(environ)
    elif deadline is False:
        resolved = None
    else:
        resolved = deadline
    if resolved is not None:
        reporters.append(
            DeadlineGuard(resolved, on_deadline, policy=deadline_policy, margin_s=deadline_margin_s)
        )
    elif not callable(on_deadline) and on_deadline not in DEADLINE_ACTIONS:
        raise ValueError(f"on_deadline must be 'warn', 'raise' or a callable, got {on_deadline!r}")
    return reporters
