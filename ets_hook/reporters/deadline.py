"""``DeadlineGuard``: fires once when the prediction says the job will not finish before a deadline.

The deadline is explicit or the Slurm job's end time (``slurm_deadline``); the guard warns,
raises ``errors.DeadlineExceededError`` into the training loop, or calls the user's function.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import DeadlineExceededError
from ..forecast.text import format_duration
from .base import EARLY_STEPS, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

#: ``ETSHook(deadline_policy=...)`` (see ``DeadlineGuard``).
DeadlinePolicy = Literal["confident", "likely", "point"]
#: ``ETSHook(on_deadline=...)`` when not a callable.
DeadlineAction = Literal["warn", "raise"]
DEADLINE_POLICIES: tuple[str, ...] = get_args(DeadlinePolicy)
DEADLINE_ACTIONS: tuple[str, ...] = get_args(DeadlineAction)


# --------------------------------------------------------------------------------------------
# Deadline guard
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadlineMiss:
    """Why the guard fired. Times are seconds from hook creation.

    Attributes:
        deadline_s: the deadline.
        margin_s: the guard's safety margin (s before the deadline that count as a miss).
        predicted_total_s: the predicted total job time (``Prediction.total_s``); with the
            job's length unknown, the elapsed time (a lower bound).
        optimistic_total_s: ``total_s - total_ci_s``, the early end of the 95% interval (the
            elapsed time with the length unknown).
        shortfall_s: how far the predicted end lies past ``deadline_s - margin_s``.
        policy: the guard's policy when it fired.
        prediction: the prediction that fired the guard.
        message: the warning text (also the ``DeadlineExceededError`` message).
    """

    deadline_s: float
    margin_s: float
    predicted_total_s: float
    optimistic_total_s: float
    shortfall_s: float
    policy: str
    prediction: Prediction
    message: str


def check_deadline_settings(
    on_deadline: Any,
    policy: Any,
    margin_s: Any,
    *,
    policy_name: str = "policy",
    margin_name: str = "margin_s",
) -> None:
    """Check a deadline guard's settings (also when no deadline is in effect yet).

    Args:
        on_deadline: ``"warn"``, ``"raise"`` or a callable.
        policy: one of ``DEADLINE_POLICIES``.
        margin_s: seconds >= 0 (a finite number; bools refused).
        policy_name, margin_name: the arguments' names in the messages.

    Raises:
        ValueError: a value outside those, naming the argument and the value.
    """
    if not callable(on_deadline) and on_deadline not in DEADLINE_ACTIONS:
        raise ValueError(f"on_deadline must be 'warn', 'raise' or a callable, got {on_deadline!r}")
    if policy not in DEADLINE_POLICIES:
        raise ValueError(f"{policy_name} must be one of {DEADLINE_POLICIES}, got {policy!r}")
    if (
        isinstance(margin_s, bool)
        or not isinstance(margin_s, (int, float))
        or not (math.isfinite(margin_s) and margin_s >= 0)
    ):
        raise ValueError(f"{margin_name} must be >= 0, got {margin_s!r}")


class DeadlineGuard(Reporter):
    """Fires once when the prediction says the job will end after ``deadline - margin_s``.

    Policies (the guard never fires once no steps remain; while the job's length is unknown it
    fires only once the elapsed time passes ``deadline - margin_s``: the job still running then
    has missed it):

    - ``"confident"`` (default): even the optimistic end of the 95% interval of the total,
      ``total_s - total_ci_s``, misses: >= 97.5% sure of a miss. Early intervals are wide, so it
      fires at step 1 only for gross misses, and later as soon as the data are clear; it does not
      cry wolf on a job that lands near the deadline.
    - ``"likely"``: the point estimate misses and the estimate has converged.
    - ``"point"``: the point estimate misses (earliest; may fire on noise).

    Whatever the policy, it fires if the elapsed time already exceeds ``deadline - margin_s``
    with steps left. Firing always logs the miss as a warning first; ``fired`` keeps it.
    """

    def __init__(
        self,
        deadline: float | datetime,
        on_deadline: DeadlineAction | Callable[[DeadlineMiss], Any] = "warn",
        *,
        policy: DeadlinePolicy = "confident",
        margin_s: float = 0.0,
        interval_s: float = 1.0,
        logger: logging.Logger | None = None,
    ) -> None:
        """Validate and store the guard's settings.

        Args:
            deadline: seconds from hook creation (> 0, finite), or a datetime (naive = local
                time; not checked against the clock: one already past fires at the first check).
            on_deadline: ``"warn"`` (only the warning), ``"raise"`` (raise
                ``DeadlineExceededError`` into the training loop; the one exception the hook
                lets through), or a callable taking a ``DeadlineMiss`` (an exception from it
                disables the guard, except ``DeadlineExceededError``, which propagates).
            policy: ``"confident"``, ``"likely"`` or ``"point"`` (see the class docstring).
            margin_s: seconds (>= 0, finite) before the deadline that already count as a miss.
            interval_s: seconds between checks after the early steps (> 0; None: early steps
                only).
            logger: where the warning goes; None: ``logging.getLogger("ets_hook")``.

        Raises:
            ValueError: ``deadline`` not a datetime or a finite number > 0 (bools rejected),
                ``on_deadline`` neither ``"warn"``/``"raise"`` nor callable, ``policy`` unknown,
                ``margin_s`` negative or not finite, or ``interval_s`` <= 0.
        """
        if isinstance(deadline, datetime):
            pass
        elif isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
            raise ValueError(f"deadline must be seconds (> 0) or a datetime, got {deadline!r}")
        elif not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"deadline must be seconds > 0, got {deadline!r}")
        check_deadline_settings(on_deadline, policy, margin_s)
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
        """The deadline in seconds from hook creation.

        Args:
            p: a prediction; for a datetime deadline, its ``start_time`` is time zero (if it is
                None, the Unix epoch is, which makes the deadline unreachably far).

        Returns:
            ``deadline`` itself when given in seconds, else the datetime minus ``p.start_time``.
        """
        if isinstance(self.deadline, datetime):
            start = p.start_time.timestamp() if p.start_time is not None else 0.0
            return self.deadline.timestamp() - start
        return float(self.deadline)

    def _deadline_text(self, deadline_s: float) -> str:
        """The deadline as the warning names it: never a negative duration (a deadline before
        the start passed that long before it)."""
        margin = f" (margin {format_duration(self.margin_s)})" if self.margin_s else ""
        if deadline_s >= 0:
            return f"deadline {format_duration(deadline_s)}{margin} after start"
        return f"deadline passed {format_duration(-deadline_s)} before start{margin}"

    def _passed_with_unknown_length(self, p: Prediction) -> DeadlineMiss | None:
        """With the job's length unknown (no total): a miss once the elapsed time passes
        ``deadline - margin_s`` (the job is still running), else None."""
        deadline_s = self.deadline_s(p)
        limit_s = deadline_s - self.margin_s
        if p.elapsed_s <= limit_s:
            return None
        message = (
            f"ets-hook: the job will miss the deadline: still running at step {p.step} after "
            f"{format_duration(p.elapsed_s)} (its length unknown), past the "
            f"{self._deadline_text(deadline_s)} by {format_duration(p.elapsed_s - limit_s)}"
        )
        return DeadlineMiss(
            deadline_s=deadline_s,
            margin_s=self.margin_s,
            predicted_total_s=p.elapsed_s,
            optimistic_total_s=p.elapsed_s,
            shortfall_s=p.elapsed_s - limit_s,
            policy=self.policy,
            prediction=p,
            message=message,
        )

    def check(self, p: Prediction) -> DeadlineMiss | None:
        """Judge one prediction under ``policy``, without side effects.

        Args:
            p: the prediction to judge.

        Returns:
            The ``DeadlineMiss`` if the guard should fire, else None (also when no steps
            remain, and while the job's length is unknown until the deadline has passed).
        """
        if p.total_s is None:
            return self._passed_with_unknown_length(p)
        if not p.remaining_steps:
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
        when = self._deadline_text(deadline_s)
        message = (
            f"ets-hook: predicted to miss the deadline at step {p.step}/{p.total_steps}: "
            f"total {format_duration(p.total_s)} (optimistic "
            f"{format_duration(max(optimistic, p.elapsed_s))}) > {when}, "
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
        """Check the prediction; on the first miss warn, then raise or call per ``on_deadline``.

        Raises:
            DeadlineExceededError: the first miss, when ``on_deadline="raise"``.
        """
        if self.fired is not None:
            return
        miss = self.check(prediction)
        if miss is None:
            return
        self.fired = miss
        # Stop being scheduled: fired once, never again.
        self.schedule = ReportSchedule(first_steps=0)
        # The message keeps its "ets-hook: " for the exception (on_deadline="raise"); the log
        # record goes without it, as every other: handlers name the logger, ours adds it.
        self.logger.warning("%s", miss.message.removeprefix("ets-hook: "))
        if self.on_deadline == "raise":
            raise DeadlineExceededError(miss)
        if callable(self.on_deadline):
            self.on_deadline(miss)


# --------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------


def parse_slurm_time(text: str) -> float | None:
    """Parse a Slurm time limit.

    Args:
        text: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` or ``D-H:M:S`` (non-negative
            integers; surrounding whitespace ignored).

    Returns:
        The limit in seconds; None for no limit: ``UNLIMITED``, ``INFINITE``, ``NOT_SET`` (any
        case), an empty string, or a total of 0.

    Raises:
        ValueError: ``text`` is malformed (non-integer fields, too many fields, negatives).
    """
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
    """The Slurm job's end time from the environment. Never raises.

    ``SLURM_JOB_END_TIME`` (Unix seconds; set in the job environment by Slurm >= 20.11) if set;
    else ``SLURM_JOB_START_TIME`` + the time limit in ``SBATCH_TIMELIMIT`` or ``SLURM_TIMELIMIT``
    (the submission-side variables, present when the job was submitted with them). Nothing else
    is consulted: no ``squeue``/``scontrol`` subprocess, no network. Malformed values count as
    absent.

    Args:
        environ: the environment to read; None: ``os.environ``.

    Returns:
        The end time as an aware UTC datetime, or None outside Slurm, without a time limit, or
        when the values are missing or malformed.
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
