"""``RankCoordinator``: when a hook in a multi-process job exchanges forecasts, and what it does
with the job view it gets back.

Exchanges happen at agreed local step counts, the same on every rank (ranks of a data-parallel
job complete the same steps): the second step after the capture window (its decode is usually
done by then: the first straggler report), then at doubling step counts (2x, 4x, ...): about
``log2(total steps)`` exchanges in a job, never one per step. The training thread only builds a
small ``RankForecast`` and queues it (``RankExchange.publish``).

Rank 0 (``log_here``) warns once of a straggler the views name, with the straggler's host load
around its capture window where that host was busy with other processes (the rank may then be
slow through no fault of its own); a warning whose host load is not known yet waits for a view
that has it, at most ``HOST_LOAD_WAIT_S`` from the hook's creation or until ``close``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from ..forecast.prediction import Prediction
from ..forecast.ranks import JobView, RankForecast
from ..forecast.text import format_straggler_host
from ..trace.breakdown import RankBreakdown
from .exchange import RankExchange, StoreFactory

logger = logging.getLogger("ets_hook")

#: Default seconds rank 0 waits for every rank's forecast at an exchange.
DEFAULT_EXCHANGE_TIMEOUT_S = 30.0
#: Seconds from the hook's creation during which the straggler warning waits for the
#: straggler's host load around its capture window: the first host-load sample comes a second
#: or more after creation, so a job of millisecond steps names its straggler before one exists.
#: Past this, or at close, the warning goes out without it.
HOST_LOAD_WAIT_S = 10.0

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
        self._held: JobView | None = None  # a straggler warning waiting for its host load
        self._warn_lock = threading.Lock()
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
            host_foreign_cpu=prediction.capture_host_foreign_cpu,
        )
        self._exchange.publish(number, forecast)

    def close(self) -> None:
        """Stop exchanging (an exchange in progress is abandoned); a straggler warning still
        waiting for its host load goes out now, without it. Never raises."""
        self._exchange.close()
        with self._warn_lock:
            held, self._held = self._held, None
            if held is not None:
                self._warned_straggler = held.straggler_rank
        if held is not None:
            with contextlib.suppress(Exception):
                self._warn_straggler(held)

    # ------------------------------------------------------------------------------------------
    # Exchange thread

    def _on_view(self, view: JobView) -> None:
        self.view = view
        self._apply(view)
        if not self._log_here:
            return
        straggler = view.straggler_rank
        with self._warn_lock:
            if straggler is None or straggler == self._warned_straggler:
                self._held = None
                return
            slow = view.forecast_of(straggler)
            unknown = slow is None or slow.host_foreign_cpu is None
            if unknown and time.time() - self._start_wall_s < HOST_LOAD_WAIT_S:
                self._held = view  # warned once a view has its host load, or at close
                return
            self._held = None
            self._warned_straggler = straggler
        self._warn_straggler(view)

    @staticmethod
    def _warn_straggler(view: JobView) -> None:
        """The straggler warning for ``view``'s straggler, with its host's load where that
        was busy during its capture (``JobView.straggler_host_foreign_cpu``)."""
        straggler = view.straggler_rank
        fastest = min((f.busy_s for f in view.ranks if f.busy_s is not None), default=float("nan"))
        slow = view.forecast_of(straggler) if straggler is not None else None
        slow_ms = slow.busy_s * 1e3 if slow is not None and slow.busy_s is not None else 0.0
        busy = view.straggler_host_foreign_cpu
        logger.warning(
            "rank %d is a straggler: compute + data wait %.2f ms per step, %.2fx "
            "the fastest rank's (%.2f ms); the other ranks wait for it in collectives%s",
            straggler,
            slow_ms,
            view.straggler_ratio or float("nan"),
            fastest * 1e3,
            f" ({format_straggler_host(busy)})" if busy is not None else "",
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
