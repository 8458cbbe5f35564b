"""Joining the steps' perf-counter clock to the events' Unix time: tightest bracket, drift."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.capture import clocks
from ets_hook.capture.clocks import ClockReading, epoch_ns, read_clocks


class ScriptedTime:
    """A ``time`` stand-in replaying perf-counter and Unix readings in order."""

    def __init__(self, perf_ns: list[int], epoch_ns: list[int]):
        self._perf = iter(perf_ns)
        self._epoch = iter(epoch_ns)

    def perf_counter_ns(self) -> int:
        return next(self._perf)

    def time_ns(self) -> int:
        return next(self._epoch)


def test_read_clocks_keeps_the_tightest_bracket(monkeypatch):
    # Pair 1: 3 ms between the Unix read and the second perf read (a thread switch);
    # pair 2: 100 ns wide. True offset: 1_000_000_000.
    script = ScriptedTime(
        perf_ns=[10_000, 3_010_000, 5_000_000, 5_000_100],
        epoch_ns=[1_000_010_000, 1_005_000_050],
    )
    monkeypatch.setattr(clocks, "time", script)
    reading = read_clocks(samples=2)
    assert reading == ClockReading(perf_ns=5_000_050, epoch_offset_ns=1_000_000_000, bracket_ns=100)


def test_read_clocks_rejects_no_samples():
    with pytest.raises(ValueError, match="samples must be >= 1, got 0"):
        read_clocks(samples=0)


def test_real_reading_agrees_with_both_clocks():
    reading = read_clocks()
    assert reading.bracket_ns >= 0
    # Unix time now, from the reading, is within a second of the real one (the reading is fresh).
    assert abs(time.perf_counter_ns() + reading.epoch_offset_ns - time.time_ns()) < 1_000_000_000


def test_epoch_ns_interpolates_the_drift_between_two_readings():
    first = ClockReading(perf_ns=1_000, epoch_offset_ns=500_000, bracket_ns=50)
    last = ClockReading(perf_ns=1_001_000, epoch_offset_ns=500_400, bracket_ns=50)  # +400 ns/ms
    assert epoch_ns(1_000, first, last) == 501_000
    assert epoch_ns(501_000, first, last) == 501_000 + 500_200
    assert epoch_ns(1_001_000, first, last) == 1_001_000 + 500_400
    assert epoch_ns(2_001_000, first, last) == 2_001_000 + 500_800  # extrapolated
    # One reading, or a second that is not later: the first's offset.
    assert epoch_ns(501_000, first) == 501_000 + 500_000
    assert epoch_ns(501_000, first, first) == 501_000 + 500_000


class SwitchedTime:
    """Real clocks, but every other Unix read is followed by a 3 ms stall before the caller can
    read again: a thread switch between two clock reads."""

    def __init__(self):
        self.unix_reads = 0

    def perf_counter_ns(self) -> int:
        return time.perf_counter_ns()

    def time_ns(self) -> int:
        now = time.time_ns()
        self.unix_reads += 1
        if self.unix_reads % 2 == 1:
            time.sleep(0.003)
        return now


def _window_ops_outside_their_steps(tmp_path) -> list[str]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(50, 16), nn.Flatten(), nn.Linear(96, 32), nn.ReLU(), nn.Linear(32, 4)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    hook = ETSHook(model, total_steps=7, capture_steps=3, skip_steps=2, trace_path=tmp_path / "t")
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(7):
        opt.zero_grad()
        x, y = torch.randint(0, 50, (4, 6)), torch.randint(0, 4, (4,))
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    assert hook.trace is not None, hook.capture_status
    assert len(hook.trace.iterations) == 3
    # The last op of an Adam step ends ~10 µs before the step's boundary: a bound moved by a
    # misread offset puts it into no step (the decode drops it) or the wrong one.
    outside = []
    for iteration in hook.trace.iterations:
        top = list(iteration.top_level_ops())
        assert top and top[-1].name == "aten::addcdiv_"
        outside += [
            op.name
            for op in top
            if not iteration.start_ns <= op.start_ns < op.end_ns <= iteration.end_ns
        ]
    return outside


def test_window_bounds_survive_a_thread_switch_between_clock_reads(monkeypatch, tmp_path):
    switched = SwitchedTime()
    monkeypatch.setattr(clocks, "time", switched)
    assert _window_ops_outside_their_steps(tmp_path) == []
    assert switched.unix_reads >= 3 * clocks.CLOCK_READ_SAMPLES  # creation, window start, end


def test_window_bounds_do_not_use_the_creation_reading(monkeypatch, tmp_path):
    # The hook's creation-time reading is 5 ms off; the window reads the clocks itself.
    real = read_clocks()
    skewed = ClockReading(real.perf_ns, real.epoch_offset_ns - 5_000_000, real.bracket_ns)
    monkeypatch.setattr("ets_hook.hook.read_clocks", lambda: skewed)
    assert _window_ops_outside_their_steps(tmp_path) == []
