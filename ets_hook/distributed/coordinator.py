"""``RankCoordinator``: when a hook in a multi-process job exchanges forecasts, and what it does
with the job view it gets back.

Exchanges happen at agreed local step counts, the same on every rank (ranks of a data-parallel
job complete the same steps): the second step after the capture window (its decode is usually
done by then: the first straggler report), then at doubling step counts (2x, 4x, ...): about
``log2(total steps)`` exchanges in a job, never one per step. The training thread only builds a
small ``RankForecast`` and queues it (``RankExchange.publish``).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from ..forecast.prediction import Prediction
from ..forecast.ranks import JobView, RankForecast
from ..trace.breakdown import RankBreakdown
from .exchange import RankExchange, StoreFactory

logger = logging.getLogger("ets_hook")

#: Default seconds rank 0 waits for every rank's forecast at an exchange.
DEFAULT_EXCHANGE_TIMEOUT_S = 30.0

# Hooks created in this process: every rank creates its hooks in the same order, so the count
# tells the ranks' hooks apart in the job's store.
_hooks_created = 0
_count_lock = threading.Lock()


def check_exchange_timeout(timeout_s: float | None) -> float | None:
    """Check ``ETSHook``'s ``rank_exchange_timeout_s``.

    Returns:
        The timeout in seconds, or None when the exchange is off (None or 0).

    Raises:
        ValueError: not None, 0 or a finite number > 0 (bools refused).
    """
    if timeout_s is None or (timeout_s == 0 and not isinstance(timeout_s, bool)):
        return None
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not 0 < timeout_s < float("inf")
    ):
        raise ValueError(
            f"rank_exchange_timeout_s must be None, 0 or a number of seconds > 0, got {timeout_s!r}"
        )
    return float(timeout_s)


def next_hook_number() -> int:
    """A number for a new hook, counted per process from 0 (the same on every rank for the
    same hook of the job)."""
    global _hooks_created
    with _count_lock:
        number = _hooks_created
        _hooks_created += 1
    return number


class RankCoordinator:
    """Schedules the rank exchanges of one hook and applies their job views.

    Attributes:
        rank, world_size: this process's place in the job.
        view: the last job view received, or None.
        next_exchange_step: the local step count at which this rank sends its next forecast.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        namespace: str,
        timeout_s: float,
        first_step: int,
        current: Callable[[], Prediction | None],
        apply: Callable[[JobView | None], None],
        log_here: bool,
        start_wall_s: float,
        store_factory: StoreFactory | None = None,
    ) -> None:
        """Set up the schedule; nothing is sent before ``on_step`` reaches ``first_step``.

        Args:
            rank: this process's rank.
            world_size: processes in the job (>= 2).
            namespace: the store namespace of this hook (same on every rank, unique in the job).
            timeout_s: seconds rank 0 waits for all forecasts (> 0).
            first_step: local step count of the first exchange (>= 1).
            current: returns this rank's current prediction (the forecaster's).
            apply: installs a job view (None: back to this rank's own prediction); called on
                the exchange thread.
            log_here: this rank writes the straggler warning and the exchange log lines.
            start_wall_s: Unix time of the hook's creation.
            store_factory: passed to ``RankExchange`` (tests); None: the job's default store.

        Raises:
            ValueError: ``first_step`` < 1, or what ``RankExchange`` refuses.
        """
        if first_step < 1:
            raise ValueError(f"first_step must be >= 1, got {first_step}")
        self.rank, self.world_size = rank, world_size
        self.next_exchange_step = first_step
        self.view: JobView | None = None
        self._exchange_count = 0
        self._current, self._apply = current, apply
        self._log_here = log_here
        self._start_wall_s = start_wall_s
        self._breakdown: RankBreakdown | None = None
        self._host = socket.gethostname()
        self._warned_straggler: int | None = None
        self._logged_skip = False
        self._exchange = RankExchange(
            rank,
            world_size,
            namespace=namespace,
            timeout_s=timeout_s,
            on_view=self._on_view,
            on_skip=self._on_skip,
            store_factory=store_factory,
        )

    @property
    def exchange(self) -> RankExchange:
        """The exchange (its counters and last cost)."""
        return self._exchange

    def set_breakdown(self, breakdown: RankBreakdown | None) -> None:
        """This rank's captured-step breakdown, sent with its next forecasts. Any thread."""
        self._breakdown = breakdown

    def on_step(self, completed: int) -> None:
        """Called after each step with the local count of completed steps; sends this rank's
        forecast when an exchange is due. O(1) otherwise.

        Args:
            completed: local steps completed so far.
        """
        if completed != self.next_exchange_step:
            return
        self.next_exchange_step = 2 * completed
        number = self._exchange_count
        self._exchange_count += 1  # counted alike on every rank, sent or not
        prediction = self._current()
        if prediction is None:
            return
        local_total = prediction.local_total_s
        breakdown = self._breakdown
        forecast = RankForecast(
            rank=self.rank,
            step=prediction.step,
            start_wall_s=self._start_wall_s,
            finish_wall_s=self._start_wall_s + local_total if local_total is not None else None,
            finish_ci_s=prediction.total_ci_s,
            iteration_s=prediction.iteration_s,
            compute_s=breakdown.compute_s if breakdown is not None else None,
            data_wait_s=breakdown.data_wait_s if breakdown is not None else None,
            busy_s=breakdown.busy_s if breakdown is not None else None,
            busy_se_s=breakdown.busy_se_s if breakdown is not None else None,
            host=self._host[:256],
        )
        self._exchange.publish(number, forecast)

    def close(self) -> None:
        """Stop exchanging (an exchange in progress is abandoned). Never raises."""
        self._exchange.close()

    # ------------------------------------------------------------------------------------------
    # Exchange thread

    def _on_view(self, view: JobView) -> None:
        self.view = view
        self._apply(view)
        straggler = view.straggler_rank
        if self._log_here and straggler is not None and straggler != self._warned_straggler:
            self._warned_straggler = straggler
            fastest = min(
                (f.busy_s for f in view.ranks if f.busy_s is not None), default=float("nan")
            )
            slow = view.forecast_of(straggler)
            slow_ms = slow.busy_s * 1e3 if slow is not None and slow.busy_s is not None else 0.0
            logger.warning(
                "rank %d is a straggler: compute + data wait %.2f ms per step, %.2fx "
                "the fastest rank's (%.2f ms); the other ranks wait for it in collectives",
                straggler,
                slow_ms,
                view.straggler_ratio or float("nan"),
                fastest * 1e3,
            )

    def _on_skip(self, exchange: int, reason: str) -> None:
        self.view = None
        self._apply(None)
        if not self._logged_skip:
            self._logged_skip = True
            logger.info(
                "rank exchange %d skipped on rank %d: %s; predictions are this rank's "
                "own until an exchange succeeds",
                exchange,
                self.rank,
                reason,
            )
