"""``LogReporter``: a line on ``logging.getLogger("ets_hook")`` every N steps and whenever the
estimate moves materially: ``step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s``."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from ..forecast.text import format_duration, format_prediction
from .base import EARLY_STEPS, MILESTONE_STEPS, Milestones, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction


# --------------------------------------------------------------------------------------------
# Reporters
# --------------------------------------------------------------------------------------------


class LogReporter(Reporter):
    """Logs ``format_prediction`` lines on ``logging.getLogger("ets_hook")``.

    A line is written at each milestone (``base.Milestones``: the first prediction, after each
    of the job's first local steps in ``early_lines`` (1, 3, 5: the early answer as it firms
    up), when the estimate first converges), at global steps that are multiples of
    ``every_n_steps``, and whenever the predicted total (the step time if the total is unknown)
    moved by ``move_threshold`` (relative) since the last line; the last two kinds at most once
    per ``min_interval_s`` of job time. At close, one more line saying how the job ended:
    ``finished at step N after T``, ``failed at step N after T (RuntimeError)`` or
    ``interrupted at step N after T``. The prediction rides along on the log record as
    ``record.ets_prediction`` for structured handlers.
    """

    def __init__(
        self,
        every_n_steps: int | None = 100,
        *,
        move_threshold: float = 0.05,
        min_interval_s: float = 5.0,
        check_interval_s: float = 1.0,
        first_steps: int = 0,
        early_lines: tuple[int, ...] = MILESTONE_STEPS,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
        rank: int | None = None,
    ) -> None:
        """Validate and store the settings.

        Args:
            every_n_steps: period of the regular line, in global steps (>= 1); None: no regular
                line (first, convergence and movement lines only).
            move_threshold: relative change (> 0) of the predicted total that earns a line.
            min_interval_s: seconds of job time (>= 0) between regular/movement lines.
            check_interval_s: seconds (> 0) between looks at the prediction, besides the early
                steps and the ``every_n_steps`` multiples; None: no time-based looks.
            first_steps: leading steps after each of which the prediction is looked at (>= 0).
            early_lines: local step counts (ints >= 1) after which a line is always written.
            logger: the logger; None: ``logging.getLogger("ets_hook")``.
            level: the level of every line.
            rank: this process's rank, put first on every line (``rank 1 · step 3/120 ·
                ...``) where several ranks log; None: no prefix.

        Raises:
            ValueError: ``move_threshold`` not > 0, ``min_interval_s`` < 0, ``every_n_steps`` < 1,
                ``check_interval_s`` not > 0, or ``first_steps`` < 0.
        """
        if not move_threshold > 0.0:
            raise ValueError(f"move_threshold must be > 0, got {move_threshold}")
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {min_interval_s}")
        self.schedule = ReportSchedule(
            first_steps=first_steps,
            every_n_steps=every_n_steps,
            interval_s=check_interval_s,
            early_steps=tuple(sorted(set(EARLY_STEPS) | set(early_lines))),
        )
        self._milestones = Milestones(early_lines)
        self.early_lines = self._milestones.steps
        self.every_n_steps = every_n_steps
        self.move_threshold = move_threshold
        self.min_interval_s = min_interval_s
        self.logger = logger or logging.getLogger("ets_hook")
        self.level = level
        self.prefix = f"rank {rank} · " if rank is not None else ""
        self._last_value: float | None = None
        self._last_elapsed_s = -math.inf

    @staticmethod
    def _value(p: Prediction) -> float:
        return p.total_s if p.total_s is not None else p.iteration_s

    def on_prediction(self, prediction: Prediction) -> None:
        """Log a line if the prediction earns one (see the class docstring)."""
        p = prediction
        value = self._value(p)
        if self._milestones.reached(p):
            self._emit(p, value)
            return
        if p.elapsed_s - self._last_elapsed_s < self.min_interval_s:
            return
        periodic = bool(self.every_n_steps) and p.step % self.every_n_steps == 0
        moved = abs(value - self._last_value) >= self.move_threshold * abs(self._last_value)
        if periodic or moved:
            self._emit(p, value)

    def on_close(self, prediction: Prediction | None) -> None:
        """Log ``finished at step N after T`` (nothing if ``prediction`` is None)."""
        self.on_end(prediction, "closed", None)

    def on_end(self, prediction: Prediction | None, outcome: str, error: str | None) -> None:
        """Log how the job ended: ``finished at step N after T`` (closed), ``failed at step N
        after T (ErrorType)`` or ``interrupted at step N after T``; nothing if ``prediction``
        is None.

        Args:
            prediction: the final prediction, or None.
            outcome: ``"closed"``, ``"interrupted"`` or ``"failed"`` (``base.JOB_OUTCOMES``).
            error: the exception's type name for ``"failed"``, else None.
        """
        if prediction is None or not self.logger.isEnabledFor(self.level):
            return
        verb = {"closed": "finished", "failed": "failed"}.get(outcome, outcome)
        cause = f" ({error})" if outcome == "failed" and error else ""
        self.logger.log(
            self.level,
            "%s%s at step %d after %s%s",
            self.prefix,
            verb,
            prediction.step,
            format_duration(prediction.elapsed_s),
            cause,
            extra={"ets_prediction": prediction},
        )

    def _emit(self, p: Prediction, value: float) -> None:
        self._last_value = value
        self._last_elapsed_s = p.elapsed_s
        if self.logger.isEnabledFor(self.level):
            self.logger.log(
                self.level, "%s%s", self.prefix, format_prediction(p), extra={"ets_prediction": p}
            )
