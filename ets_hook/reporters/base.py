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

Failure isolation: an exception in a reporter is logged once (where the log line can be
written) and disables that reporter only.
``DeadlineExceededError`` is the one exception that propagates, on purpose.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DeadlineExceededError

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction


logger = logging.getLogger("ets_hook")

_NEVER = sys.maxsize

#: How a job can end, as ``Reporter.on_end`` and the status file's ``state`` say it.
JOB_OUTCOMES = ("closed", "interrupted", "failed")


# --------------------------------------------------------------------------------------------
# Base class and dispatch
# --------------------------------------------------------------------------------------------


# Early checkpoints (local step counts) at which the default reporters look at the prediction:
# dense enough to show the early answer, sparse enough that building predictions (tens to
# hundreds of µs each) never weighs on millisecond steps.
EARLY_STEPS = (1, 2, 3, 5, 10, 20, 50)

#: Local step counts whose prediction is a milestone: the log writes a line and the status
#: file is rewritten after each (the early answer as it firms up).
MILESTONE_STEPS = (1, 3, 5)


@dataclass(frozen=True, slots=True)
class ReportSchedule:
    """When a reporter wants a prediction, checked at step ends only.

    A reporter is due after each of its ``first_steps`` first steps, after each local step count
    in ``early_steps``, at global steps that are multiples of ``every_n_steps``, and at the first
    step end at least ``interval_s`` seconds (the forecaster's clock) after it was last offered
    one; with ``at_last_step``, also after the job's last step (a progress bar then shows
    ``done`` before its loop closes it). Independently of all this, every reporter is offered
    the first prediction.

    Attributes:
        first_steps: number of leading steps (local count) after each of which it is due; >= 0.
        every_n_steps: period in global steps (``initial_step`` included), >= 1; None: off.
        interval_s: seconds between offers, > 0; None: off.
        early_steps: extra local step counts (ints >= 1) after which it is due.
        at_last_step: also due after the job's last step (``total_steps``, when known).

    Raises:
        ValueError: ``first_steps`` < 0 or a bool, an ``early_steps`` item not an int >= 1,
            ``every_n_steps`` < 1, or ``interval_s`` not > 0 (NaN included).
    """

    first_steps: int = 1
    every_n_steps: int | None = None
    interval_s: float | None = None
    early_steps: tuple[int, ...] = ()
    at_last_step: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.first_steps, bool) or self.first_steps < 0:
            raise ValueError(f"first_steps must be >= 0, got {self.first_steps!r}")
        if any(not isinstance(k, int) or k < 1 for k in self.early_steps):
            raise ValueError(f"early_steps must be ints >= 1, got {self.early_steps!r}")
        if self.every_n_steps is not None and self.every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {self.every_n_steps}")
        if self.interval_s is not None and not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0 or None, got {self.interval_s}")


class Milestones:
    """Which offered predictions are milestones of the forecast: the first one offered, the
    ones after the local step counts in ``steps``, and the first converged one. The log writes
    a line at each and the status file is rewritten (``LogReporter``, ``StatusFileReporter``).

    Feed it every prediction a reporter is offered (``reached``): convergence is noticed at the
    first offer that has it.

    Attributes:
        steps: the local step counts (ints >= 1).
    """

    def __init__(self, steps: tuple[int, ...] = MILESTONE_STEPS) -> None:
        """Take the step counts.

        Args:
            steps: local step counts (ints >= 1, bools refused) whose predictions are
                milestones.

        Raises:
            ValueError: an item of ``steps`` is not an int >= 1.
        """
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in steps):
            raise ValueError(f"milestone steps must be ints >= 1, got {steps!r}")
        self.steps = frozenset(steps)
        self._first_step: int | None = None
        self._converged = False

    def local_step(self, prediction: Prediction) -> int:
        """The local step count of ``prediction``: the first one offered comes after local
        step 1 (``Prediction.step`` counts ``initial_step`` too)."""
        if self._first_step is None:
            self._first_step = prediction.step - 1
        return prediction.step - self._first_step

    def reached(self, prediction: Prediction) -> bool:
        """Whether ``prediction`` is a milestone (see the class docstring).

        Args:
            prediction: the prediction offered now (predictions in step order).

        Returns:
            True for the first prediction, one after a local step count in ``steps``, and the
            first converged one.
        """
        first = self._first_step is None
        local_step = self.local_step(prediction)
        newly_converged = prediction.converged and not self._converged
        self._converged = self._converged or prediction.converged
        return first or newly_converged or local_step in self.steps


class Reporter:
    """Base class of reporters: no-op hooks; override what you need.

    Hooks run on the thread that ends the step or closes the hook (normally the training
    thread). An exception from a hook is logged once by ``ReportDispatcher`` and disables this
    reporter; ``DeadlineExceededError`` alone propagates to the training loop. Set ``schedule``
    (class or instance attribute) to say when ``on_prediction`` is due.
    """

    schedule: ReportSchedule = ReportSchedule()

    def on_prediction(self, prediction: Prediction) -> None:
        """Receive a prediction that is due by ``schedule``.

        Args:
            prediction: the forecaster's current prediction (never None here).
        """

    def on_close(self, prediction: Prediction | None) -> None:
        """The job ended (the hook closed); called once, and no hook is called after it.

        Args:
            prediction: the final prediction, or None if there never was one.
        """

    def on_end(self, prediction: Prediction | None, outcome: str, error: str | None) -> None:
        """The job ended, and how: what the dispatcher calls at close (instead of ``on_close``).

        The default calls ``on_close(prediction)``; override it to record the outcome.

        Args:
            prediction: the final prediction, or None if there never was one.
            outcome: ``"closed"`` (``close()``, end of the script, ``sys.exit``),
                ``"interrupted"`` (Ctrl-C, SIGTERM) or ``"failed"`` (an uncaught exception).
            error: the exception's type name when ``outcome`` is ``"failed"``, else None.
        """
        self.on_close(prediction)


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
        """Take the reporters, offered predictions in this order.

        Args:
            reporters: ``Reporter`` instances; empty means never due.

        Raises:
            ValueError: an item of ``reporters`` is not a ``Reporter``.
        """
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
        self,
        count: int,
        step: int,
        now_s: float,
        get: Callable[[], Prediction | None],
        last_step: bool = False,
    ) -> None:
        """Offer the prediction to every reporter that is due, then reschedule.

        Args:
            count: local step count (steps completed by this process, >= 1).
            step: global step count (``count`` plus the job's ``initial_step``).
            now_s: the forecaster's clock at this step end, in seconds.
            get: builds the prediction; called at most once, only if a reporter is due. If it
                returns None, due reporters are rescheduled but not called.
            last_step: this is the job's last step: reporters whose schedule asks for it
                (``at_last_step``) are due too.

        Raises:
            DeadlineExceededError: from a reporter (the reporters after it are skipped this
                time; ``next_count`` / ``next_s`` are still updated). An exception from ``get``
                also propagates; any other reporter exception is logged and disables it.
        """
        prediction: Prediction | None = None
        fetched = False
        try:
            for slot in self._slots:
                due = count >= slot.next_count or now_s >= slot.next_s
                if not slot.active or not (
                    due or (last_step and slot.reporter.schedule.at_last_step)
                ):
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

    def close(
        self, prediction: Prediction | None, outcome: str = "closed", error: str | None = None
    ) -> None:
        """Call ``on_end`` of every active reporter once and deactivate it.

        Args:
            prediction: the final prediction, or None.
            outcome: how the job ended (``JOB_OUTCOMES``).
            error: the exception's type name for ``"failed"``, else None.

        Raises:
            ValueError: ``outcome`` is not one of ``JOB_OUTCOMES``.
            DeadlineExceededError: from a reporter's ``on_end``, raised once every reporter
                has been closed. Other exceptions are logged.
        """
        if outcome not in JOB_OUTCOMES:
            raise ValueError(f"outcome must be one of {JOB_OUTCOMES}, got {outcome!r}")
        deadline: DeadlineExceededError | None = None
        for slot in self._slots:
            if slot.active:
                try:
                    self._call(
                        slot,
                        lambda p, r=slot.reporter: r.on_end(p, outcome, error),
                        prediction,
                    )
                except DeadlineExceededError as exc:
                    deadline = deadline or exc
                slot.active = False
        if deadline is not None:
            raise deadline

    @staticmethod
    def _call(slot: _Slot, method: Callable[[Any], None], prediction: Prediction | None) -> None:
        try:
            method(prediction)
        except DeadlineExceededError:
            raise
        except Exception as exc:
            slot.active = False
            # A handler that cannot write (a closed stderr: often the very reason this reporter
            # failed) must not turn one reporter's failure into all of theirs.
            with contextlib.suppress(Exception):
                logger.warning(
                    "reporter %s failed and is disabled: %r",
                    type(slot.reporter).__name__,
                    exc,
                    exc_info=True,
                )
