"""StepClock: a step's training time with phases, compile time and ets-hook's own work taken out.

A fake ``perf_counter_ns`` makes every figure exact; a stand-in compile watcher reports
intervals the way ``CompileWatcher.compile_ns_in`` does (overlap with a time range).
"""

from __future__ import annotations

import threading
import types

import pytest

import ets_hook.capture.step_clock as step_clock_module
from ets_hook.capture.step_clock import StepClock


@pytest.fixture
def now(monkeypatch) -> list[int]:
    clock_ns = [1_000]
    fake = types.SimpleNamespace(perf_counter_ns=lambda: clock_ns[0])
    monkeypatch.setattr(step_clock_module, "time", fake)
    return clock_ns


class FakeCompiles:
    """Compile intervals [start, end) on the fake clock, as ``CompileWatcher`` reports them."""

    def __init__(self) -> None:
        self.intervals: list[tuple[int, int]] = []
        self.in_progress = False
        self.registrations = 0

    @property
    def count(self) -> int:
        return len(self.intervals)

    def ensure_registered(self) -> bool:
        self.registrations += 1
        return True

    def compile_ns_in(self, start_ns: int, end_ns: int) -> int:
        return sum(max(0, min(e, end_ns) - max(s, start_ns)) for s, e in self.intervals)


def test_a_step_is_its_wall_time_less_phases_and_own_work(now) -> None:
    clock = StepClock(now[0], None)
    now[0] += 4_000
    clock.begin_phase("eval")
    now[0] += 1_000
    clock.begin_phase("inner")  # nested: counted once, under the outermost name
    now[0] += 500
    assert clock.end_phase() is None
    assert clock.in_phase
    now[0] += 500
    assert clock.end_phase() == ("eval", 2_000, 0)
    assert not clock.in_phase and clock.end_phase() is None
    started = now[0]
    now[0] += 300
    clock.count_own(started)  # e.g. a read of hook.prediction by the loop
    now[0] += 700
    span = clock.end_step(now[0], register_compiles=False)
    assert span.start_ns == 1_000 and span.end_ns == 8_000
    assert span.duration_ns == 7_000 - 2_000 - 300
    assert span.own_ns == 300 and span.compile_ns == 0
    assert span.work_start_ns == span.start_ns  # no boundary work before the first step


def test_own_work_inside_a_phase_or_on_another_thread_is_not_counted_twice(now) -> None:
    clock = StepClock(now[0], None)
    clock.begin_phase("eval")
    started = now[0]
    now[0] += 1_000
    clock.count_own(started)  # inside a phase: the phase's time already
    clock.end_phase()
    started = now[0]
    done = threading.Event()

    def elsewhere() -> None:
        now[0] += 2_000
        clock.count_own(started)  # a reporter thread's read: not the training loop's time
        done.set()

    threading.Thread(target=elsewhere).start()
    assert done.wait(5)
    span = clock.end_step(now[0], register_compiles=False)
    assert span.own_ns == 0 and span.duration_ns == 2_000


def test_the_boundary_work_starts_the_next_steps_work_and_is_own_time(now) -> None:
    clock = StepClock(now[0], None)
    now[0] += 10_000
    boundary = now[0]
    clock.end_step(boundary, register_compiles=False)
    now[0] += 400  # the hook's reporters at that boundary
    clock.boundary_done(boundary)
    now[0] += 5_000
    span = clock.end_step(now[0], register_compiles=False)
    assert span.own_ns == 400
    assert span.duration_ns == 5_000
    assert span.work_start_ns == boundary + 400


def test_restart_moves_the_steps_start_and_drops_earlier_own_work(now) -> None:
    clock = StepClock(now[0], None)
    started = now[0]
    now[0] += 9_000
    clock.count_own(started)
    clock.restart(now[0])  # the first training forward: step 0 starts here
    now[0] += 2_000
    span = clock.end_step(now[0], register_compiles=False)
    assert (span.start_ns, span.duration_ns, span.own_ns) == (10_000, 2_000, 0)


def test_restart_drops_phases_that_ended_before_the_step_began(now) -> None:
    """An evaluation before the first training step (``eval_on_start``, an RL rollout): its
    time is before step 0's start, so it is not taken out of step 0 (which read 0 s)."""
    clock = StepClock(now[0], None)
    clock.begin_phase("eval")
    now[0] += 50_000
    clock.end_phase()
    now[0] += 1_000
    clock.restart(now[0])  # the first training forward
    now[0] += 6_000
    span = clock.end_step(now[0], register_compiles=False)
    assert span.duration_ns == 6_000


def test_compile_time_leaves_the_step_and_the_phase_it_fell_in_once(now) -> None:
    compiles = FakeCompiles()
    clock = StepClock(now[0], compiles)  # type: ignore[arg-type]
    # Step: 1,000 of compile outside phases, then a phase of 3,000 with 1,000 compile inside.
    compiles.intervals.append((now[0], now[0] + 1_000))
    now[0] += 2_000
    clock.begin_phase("eval")
    compiles.intervals.append((now[0] + 500, now[0] + 1_500))
    now[0] += 3_000
    assert clock.end_phase() == ("eval", 2_000, 1_000)
    now[0] += 1_000
    span = clock.end_step(now[0], register_compiles=True)
    assert compiles.registrations == 1
    assert span.compile_ns == 1_000  # the phase's compile time is not taken out twice
    assert span.duration_ns == 6_000 - 3_000 - 1_000
    # The next step sees no new compile: nothing taken out.
    now[0] += 500
    span = clock.end_step(now[0], register_compiles=False)
    assert (span.compile_ns, span.duration_ns) == (0, 500)
    assert compiles.registrations == 1


def test_a_compile_longer_than_the_step_takes_out_at_most_the_step(now) -> None:
    compiles = FakeCompiles()
    clock = StepClock(now[0], compiles)  # type: ignore[arg-type]
    compiles.intervals.append((0, now[0] + 50_000))  # began before the step, ends after it
    compiles.in_progress = True
    now[0] += 20_000
    span = clock.end_step(now[0], register_compiles=False)
    assert span.compile_ns == 20_000 and span.duration_ns == 0
