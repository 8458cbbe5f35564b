"""reporters.base: the dispatcher offers predictions only when due and isolates failures."""

from __future__ import annotations

import logging

import pytest
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.reporters.base import ReportDispatcher, Reporter, ReportSchedule
from ets_hook.reporters.callback import CallbackReporter


class Counting(Reporter):
    def __init__(self, schedule: ReportSchedule) -> None:
        self.schedule = schedule
        self.steps: list[int] = []
        self.closed: list[Prediction | None] = []

    def on_prediction(self, prediction: Prediction) -> None:
        self.steps.append(prediction.step)

    def on_close(self, prediction: Prediction | None) -> None:
        self.closed.append(prediction)


def test_reporters_are_offered_predictions_only_when_due() -> None:
    by_step = Counting(ReportSchedule(first_steps=3, every_n_steps=10))
    by_time = Counting(ReportSchedule(first_steps=0, interval_s=2.0))
    f = Forecaster(
        JobModel(total_steps=100), start_s=0.0, reports=ReportDispatcher([by_step, by_time])
    )
    run_job(f, 35, 0.5, cv=0.0)
    assert by_step.steps == [1, 2, 3, 10, 20, 30]
    # Everyone gets the first prediction; then every 2 s of 0.5 s steps = every 4 steps.
    assert by_time.steps == [1, 5, 9, 13, 17, 21, 25, 29, 33]
    f.close()
    assert by_step.closed[0] is not None and by_step.closed[0].step == 35


def test_a_failing_reporter_is_logged_once_and_disabled(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"bad": 0}

    def bad(_: Prediction) -> None:
        calls["bad"] += 1
        raise OSError("disk full")

    good = Counting(ReportSchedule(first_steps=50))
    f = Forecaster(
        JobModel(total_steps=100),
        start_s=0.0,
        reports=ReportDispatcher([CallbackReporter(bad), good]),
    )
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        run_job(f, 50, 0.1)
        f.close()
    assert calls["bad"] == 1
    assert len(good.steps) == 50
    failures = [r for r in caplog.records if "failed and is disabled" in r.getMessage()]
    assert len(failures) == 1
    assert "CallbackReporter" in failures[0].getMessage()
