"""Device-side step times from CUDA events, without adding any synchronisation.

On a GPU the host can run ahead of the device: early host-side step times then measure how fast
kernels are queued, not how fast they run. An event recorded on the current stream at each step
boundary is reached by the device when the step's work is done (or, when the device is starved,
as soon as the host enqueues it), so the time between consecutive events is the step time the
job will settle to. ``record`` costs one ``cudaEventRecord``; ``poll`` only calls the
non-blocking ``query``; completed events go back to a pool. Results arrive a few steps late.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol


class _Event(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds


def _cuda_event() -> _Event:
    import torch

    return torch.cuda.Event(enable_timing=True)


class CudaStepTimer:
    """Records one event per step boundary; ``poll`` returns finished (step_index, seconds).

    ``max_pending`` bounds memory when the device falls far behind or events never complete:
    the oldest pending events are dropped (their steps simply get no device time).

    Attributes:
        dropped: pending events discarded so far because more than ``max_pending`` waited.
    """

    def __init__(
        self, event_factory: Callable[[], _Event] = _cuda_event, max_pending: int = 256
    ) -> None:
        """Create an empty timer; events are created lazily by ``record``.

        Args:
            event_factory: makes a new timing event; the default makes a CUDA event with
                timing enabled (torch is imported on its first call).
            max_pending: most events waiting for the device, >= 2.

        Raises:
            ValueError: ``max_pending`` < 2.
        """
        if max_pending < 2:
            raise ValueError(f"max_pending must be >= 2, got {max_pending}")
        self._new_event = event_factory
        self._max_pending = max_pending
        self._pool: list[_Event] = []
        self._pending: deque[tuple[int, _Event]] = deque()
        self._last_done: tuple[int, _Event] | None = None
        self.dropped = 0

    def record(self, starting_step: int) -> None:
        """Mark a step boundary: step ``starting_step`` starts (and the one before it ends).

        Records an event on the current stream (no synchronisation). Errors of the event
        factory or of ``Event.record`` (e.g. no CUDA) pass through.

        Args:
            starting_step: 0-based index of the step that starts here; consecutive calls
                should pass consecutive indices.
        """
        event = self._pool.pop() if self._pool else self._new_event()
        event.record()
        self._pending.append((starting_step, event))
        while len(self._pending) > self._max_pending:
            self._pending.popleft()
            self.dropped += 1

    def poll(self) -> list[tuple[int, float]]:
        """Device durations of the steps whose closing events have completed, oldest first.

        Non-blocking (``Event.query`` only). A step is reported only when both its opening and
        closing events were recorded with consecutive indices and neither was dropped.

        Returns:
            ``(step_index, seconds)`` pairs not reported before.
        """
        finished: list[tuple[int, float]] = []
        while self._pending and self._pending[0][1].query():
            index, event = self._pending.popleft()
            if self._last_done is not None:
                last_index, last_event = self._last_done
                if index == last_index + 1:
                    finished.append((last_index, last_event.elapsed_time(event) / 1e3))
                self._pool.append(last_event)
            self._last_done = (index, event)
        return finished
