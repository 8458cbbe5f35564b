"""The two clocks a capture joins: steps are timed on ``time.perf_counter_ns()`` (monotonic), op
and kernel events carry Unix time (``CLOCK_REALTIME``: ``time.time_ns()``, the native observer,
Kineto and CUPTI). Step bounds are moved onto the events' clock by an offset read from both.

Two reads are never simultaneous: a thread switch (the GIL's 5 ms interval) or a preemption
between them shifts every bound by as much, and ops that end a step microseconds before its
boundary then fall outside it. A reading is therefore the tightest of several bracketed pairs.
Unix time is also slewed by NTP against the monotonic clock: a window converts its bounds with
the offset read at its start and at its end, interpolated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: Bracketed pairs per reading: the tightest is kept. About 0.1 µs each.
CLOCK_READ_SAMPLES = 7


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One reading of both clocks.

    Attributes:
        perf_ns: ``time.perf_counter_ns()`` at the reading (its bracket's midpoint).
        epoch_offset_ns: ``time.time_ns()`` minus ``perf_ns`` at that instant.
        bracket_ns: the bracket's width: the reading's uncertainty.
    """

    perf_ns: int
    epoch_offset_ns: int
    bracket_ns: int


def read_clocks(samples: int = CLOCK_READ_SAMPLES) -> ClockReading:
    """Read ``time.time_ns()`` between two ``time.perf_counter_ns()`` reads, ``samples``
    times, and keep the tightest bracket.

    Args:
        samples: bracketed pairs to take, >= 1.

    Returns:
        The reading with the narrowest bracket.

    Raises:
        ValueError: ``samples`` < 1.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    best: ClockReading | None = None
    for _ in range(samples):
        before = time.perf_counter_ns()
        epoch = time.time_ns()
        after = time.perf_counter_ns()
        middle = (before + after) // 2
        reading = ClockReading(middle, epoch - middle, after - before)
        if best is None or reading.bracket_ns < best.bracket_ns:
            best = reading
    assert best is not None
    return best


def epoch_ns(perf_ns: int, first: ClockReading, last: ClockReading | None = None) -> int:
    """``perf_ns`` on the Unix-time clock.

    Args:
        perf_ns: a ``time.perf_counter_ns()`` time.
        first: a reading before (or at) ``perf_ns``.
        last: a later reading; the offset is then interpolated linearly between the two (and
            extrapolated beyond them). None, or a reading no later than ``first``: ``first``'s
            offset.

    Returns:
        ``perf_ns`` plus the offset at that time, in ns.
    """
    if last is None or last.perf_ns <= first.perf_ns:
        return perf_ns + first.epoch_offset_ns
    drift_ns = last.epoch_offset_ns - first.epoch_offset_ns
    span_ns = last.perf_ns - first.perf_ns
    return perf_ns + first.epoch_offset_ns + (drift_ns * (perf_ns - first.perf_ns)) // span_ns
