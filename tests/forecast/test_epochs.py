"""forecast.epochs: an epoch's input start-up is a phase with the epoch's period, not step time."""

from __future__ import annotations

import types

import pytest

from ets_hook.forecast.epochs import (
    EPOCH_START,
    REFERENCE_STEPS,
    SEED_STEPS,
    EpochStarts,
    loader_restarts_workers,
)
from ets_hook.forecast.job import JobModel, PhaseTracker


def test_only_the_first_step_of_each_later_epoch_has_start_up() -> None:
    epochs = EpochStarts(steps_per_epoch=10)
    earlier = [0.010] * 10
    assert epochs.excess_s(10, 0.050, earlier) == pytest.approx(0.040)
    assert epochs.excess_s(11, 0.050, earlier) == 0.0  # not an epoch's first step
    assert epochs.excess_s(0, 0.050, []) == 0.0  # the job's first step: warm-up
    assert epochs.excess_s(10, 0.008, earlier) == 0.0  # faster than usual: nothing to move


def test_the_reference_is_the_median_of_the_steps_just_before() -> None:
    epochs = EpochStarts(steps_per_epoch=20)
    earlier = [1.0] * 10 + [0.010] * (REFERENCE_STEPS - 1) + [0.5]  # old slow steps, one burst
    assert epochs.excess_s(20, 0.030, earlier) == pytest.approx(0.020)
    assert epochs.excess_s(20, 0.030, [0.010]) == 0.0  # one earlier step is too few


def test_resumed_jobs_count_epochs_in_global_steps() -> None:
    epochs = EpochStarts(steps_per_epoch=10, initial_step=25)
    assert [i for i in range(30) if epochs.starts_epoch(i)] == [5, 15, 25]
    assert epochs.seed_s([0.5, 0.01, 0.01, 0.01]) is None  # the job did not start an epoch


def test_the_first_step_seeds_the_phase_only_for_loaders_that_restart() -> None:
    steps = [0.210, 0.010, 0.012, 0.011]
    assert len(steps) == 1 + SEED_STEPS
    assert EpochStarts(10, restarts=True).seed_s(steps) == pytest.approx(0.199)
    assert EpochStarts(10, restarts=False).seed_s(steps) is None
    assert EpochStarts(10, restarts=True).seed_s(steps[:3]) is None  # too early
    assert EpochStarts(10, restarts=True).seed_s([*steps, 0.01]) is None  # taken once


@pytest.mark.parametrize(
    ("workers", "persistent", "restarts"), [(0, False, False), (2, False, True), (2, True, False)]
)
def test_which_loaders_restart_their_workers(workers: int, persistent: bool, restarts: bool):
    loader = types.SimpleNamespace(num_workers=workers, persistent_workers=persistent)
    assert loader_restarts_workers(loader) is restarts
    assert loader_restarts_workers(None) is False


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="steps_per_epoch"):
        EpochStarts(0)
    with pytest.raises(ValueError, match="initial_step"):
        EpochStarts(5, initial_step=-1)


def test_the_job_model_hints_the_epoch_period_and_projects_the_remaining_epochs() -> None:
    job = JobModel.from_args(total_steps=50, steps_per_epoch=10)
    assert job.phase_periods[EPOCH_START] == 10
    assert JobModel.from_args(total_steps=50).phase_periods == {}
    tracker = PhaseTracker(job)
    tracker.record(EPOCH_START, 0.2, step=0)  # the seed, from the first step
    tracker.record(EPOCH_START, 0.1, step=10)
    (phase,) = tracker.project(step=12)
    assert phase.name == EPOCH_START
    assert phase.remaining == 3  # epochs starting at steps 20, 30, 40
    assert phase.mean_s == pytest.approx(0.1)  # later occurrences only: the seed had warm-up
    assert phase.remaining_s == pytest.approx(0.3)
