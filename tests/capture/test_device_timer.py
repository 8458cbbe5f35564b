"""CudaStepTimer's bookkeeping, with fake events standing in for CUDA events."""

from __future__ import annotations

import pytest

from ets_hook.capture.device_timer import CudaStepTimer


class FakeDevice:
    """A device clock: events complete when `now_ms` passes their scheduled time."""

    def __init__(self):
        self.now_ms = 0.0
        self.created = 0

    def event(self):
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device):
        self.device = device
        self.at_ms = None

    def record(self):
        self.at_ms = self.device.schedule.pop(0)

    def query(self):
        return self.at_ms <= self.device.now_ms

    def elapsed_time(self, end):
        return end.at_ms - self.at_ms


def test_durations_come_from_device_times_once_events_complete():
    device = FakeDevice()
    device.schedule = [0.0, 10.0, 30.0, 45.0]
    timer = CudaStepTimer(device.event)
    for step in range(4):
        timer.record(step)
    assert timer.poll() == []  # device has not reached any event yet
    device.now_ms = 31.0
    assert timer.poll() == [(0, 0.010), (1, 0.020)]
    device.now_ms = 100.0
    assert timer.poll() == [(2, 0.015)]
    assert timer.poll() == []


def test_events_are_reused_from_a_pool():
    device = FakeDevice()
    device.schedule = [float(i) for i in range(100)]
    timer = CudaStepTimer(device.event)
    for step in range(50):
        timer.record(step)
        device.now_ms = float(step)
        timer.poll()
    assert device.created <= 3


def test_pending_events_are_bounded_and_gaps_skip_steps():
    device = FakeDevice()
    device.schedule = [float(i) for i in range(10)]
    timer = CudaStepTimer(device.event, max_pending=3)
    for step in range(6):
        timer.record(step)
    assert timer.dropped == 3
    device.now_ms = 100.0
    assert timer.poll() == [(3, 0.001), (4, 0.001)]


def test_bad_capacity_is_rejected():
    with pytest.raises(ValueError, match="max_pending"):
        CudaStepTimer(lambda: None, max_pending=1)
