"""reporters.log: log lines every N steps, throttled for fast steps, on convergence and moves."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from support import PREDICTION_LINE, log_lines, run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.log import LogReporter


def test_log_every_n_steps_with_slow_steps(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=10, move_threshold=10.0, min_interval_s=5.0)
    # converge_rel_ci=0.5: converged from the first prediction, so no separate convergence line.
    f = Forecaster(
        JobModel(total_steps=100),
        start_s=0.0,
        converge_rel_ci=0.5,
        reports=ReportDispatcher([reporter]),
    )
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 45, 1.0, cv=0.0)
    lines = log_lines(caplog)
    steps = [r.ets_prediction.step for r in caplog.records]
    assert steps == [1, 3, 5, 10, 20, 30, 40]  # the early answer, then every 10
    assert all(PREDICTION_LINE.match(line) for line in lines)
    assert lines[3].startswith("step 10/100 · ")


def test_convergence_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=None, move_threshold=10.0)
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([reporter]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 300, 1.0, cv=0.05)
    records = [r.ets_prediction for r in caplog.records]
    assert [p.step for p in records[:3]] == [1, 3, 5]
    assert [p.converged for p in records[3:]] == [True]


def test_log_lines_are_throttled_for_fast_steps(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=10, move_threshold=10.0, min_interval_s=5.0)
    f = Forecaster(JobModel(total_steps=10_000), start_s=0.0, reports=ReportDispatcher([reporter]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        end = run_job(f, 3000, 0.01)  # 30 s of 10 ms steps: 300 multiples of 10
    lines = log_lines(caplog)
    assert 4 <= len(lines) <= end / 5.0 + 3 + 2  # + the early lines at steps 3 and 5


def test_log_line_when_the_estimate_moves(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=None, move_threshold=0.05, min_interval_s=0.0)
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([reporter]))
    times = np.where(np.arange(600) < 300, 0.5, 1.0)  # the job slows down at step 300
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 600, times)
    moved = [r.ets_prediction.step for r in caplog.records if r.ets_prediction.step > 300]
    assert moved, "no line after the slowdown"
    assert moved[0] < 400


def test_early_lines_count_local_steps_of_a_resumed_job(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=None, move_threshold=10.0)
    job = JobModel(total_steps=1000, initial_step=400)
    f = Forecaster(job, start_s=0.0, converge_rel_ci=1e-9, reports=ReportDispatcher([reporter]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 20, 1.0)
    assert [r.ets_prediction.step for r in caplog.records] == [401, 403, 405]


@pytest.mark.parametrize(
    ("outcome", "error", "expected"),
    [
        ("closed", None, r"finished at step 30 after 30s"),
        ("failed", "RuntimeError", r"failed at step 30 after 30s \(RuntimeError\)"),
        ("interrupted", None, r"interrupted at step 30 after 30s"),
    ],
)
def test_the_last_line_says_how_the_job_ended(
    outcome: str, error: str | None, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = LogReporter(every_n_steps=None, move_threshold=10.0)
    f = Forecaster(JobModel(total_steps=100), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 30, 1.0, cv=0.0)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        f.close(outcome, error)
    assert len(log_lines(caplog)) == 1
    assert re.fullmatch(expected, log_lines(caplog)[0])
