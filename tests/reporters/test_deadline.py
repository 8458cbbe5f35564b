"""reporters.deadline: the deadline guard (policies, modes, margin) and Slurm time limits."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from support import log_lines, run_job

from ets_hook.errors import DeadlineExceededError
from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.deadline import (
    DeadlineGuard,
    DeadlineMiss,
    parse_slurm_time,
    slurm_deadline,
)

WALL_START = 1_700_000_000.0


def deadline_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "miss the deadline" in r.getMessage()]


def test_deadline_guard_warns_early_and_exactly_once(caplog: pytest.LogCaptureFixture) -> None:
    # 1000 steps of 0.4 s = 400 s; the deadline is 300 s after start.
    guard = DeadlineGuard(300.0, "warn")
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([guard]))
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        run_job(f, 1000, 0.4, cv=0.08)
    assert len(deadline_warnings(caplog)) == 1
    assert guard.fired is not None
    # Fired long before the deadline actually passed, when the miss was already clear.
    assert guard.fired.prediction.elapsed_s < 30.0
    assert guard.fired.optimistic_total_s > 300.0
    assert guard.fired.shortfall_s == pytest.approx(guard.fired.predicted_total_s - 300.0)


def test_deadline_raise_mode_raises_once_into_the_loop() -> None:
    guard = DeadlineGuard(300.0, "raise")
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([guard]))
    raised: list[DeadlineExceededError] = []
    now = 0.0
    for i in range(200):
        now += 0.4
        try:
            f.on_step_end(i, 0.4, now)
        except DeadlineExceededError as exc:
            raised.append(exc)
    assert len(raised) == 1
    assert raised[0].miss.prediction.step < 50
    assert "miss the deadline" in str(raised[0])
    f.close()


def test_deadline_callable_is_called_once_and_its_failure_is_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[DeadlineMiss] = []
    f = Forecaster(
        JobModel(total_steps=1000),
        start_s=0.0,
        reports=ReportDispatcher([DeadlineGuard(300.0, seen.append)]),
    )
    run_job(f, 300, 0.4)
    assert len(seen) == 1 and seen[0].policy == "confident"

    def explode(_: DeadlineMiss) -> None:
        raise KeyError("user bug")

    g = Forecaster(
        JobModel(total_steps=1000),
        start_s=0.0,
        reports=ReportDispatcher([DeadlineGuard(300.0, explode)]),
    )
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        run_job(g, 300, 0.4)  # must not raise
    assert any("DeadlineGuard failed" in m for m in log_lines(caplog))


def test_deadline_guard_quiet_for_a_job_that_fits(caplog: pytest.LogCaptureFixture) -> None:
    # 400 s of work against a 440 s deadline.
    for policy in ("confident", "likely"):
        guard = DeadlineGuard(440.0, "warn", policy=policy)
        f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([guard]))
        run_job(f, 1000, 0.4, cv=0.08, seed=11)
        assert guard.fired is None, policy


def test_deadline_policies_trade_earliness_for_certainty() -> None:
    fired = {}
    for policy in ("point", "likely", "confident"):
        guard = DeadlineGuard(380.0, "warn", policy=policy)  # 400 s job, 5% over
        f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([guard]))
        run_job(f, 1000, 0.4, cv=0.08, seed=12)
        assert guard.fired is not None, policy
        fired[policy] = guard.fired.prediction.step
    assert fired["point"] <= fired["likely"]
    assert fired["point"] <= fired["confident"]
    assert fired["confident"] < 500  # still well before the deadline passes (step ~950)


def test_deadline_margin_and_datetime_deadline() -> None:
    start = datetime.fromtimestamp(WALL_START, tz=timezone.utc)
    guard = DeadlineGuard(start + timedelta(seconds=500), "warn", margin_s=150.0)
    f = Forecaster(
        JobModel(total_steps=1000),
        start_s=0.0,
        wall_start_s=WALL_START,
        reports=ReportDispatcher([guard]),
    )
    run_job(f, 1000, 0.4)
    assert guard.fired is not None  # 400 s of work does not fit in 500 s - 150 s
    assert guard.fired.deadline_s == pytest.approx(500.0)
    assert guard.fired.margin_s == 150.0


def test_deadline_already_passed_fires_whatever_the_policy() -> None:
    guard = DeadlineGuard(5.0, "warn", policy="likely")
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([guard]))
    run_job(f, 20, 1.0, cv=0.5, seed=3)
    assert guard.fired is not None
    assert guard.fired.prediction.elapsed_s <= 7.0


def test_a_job_of_unknown_length_misses_once_it_runs_past_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No total, no prediction of a miss; but a job still stepping after its deadline has
    missed it (before: never checked, so an IterableDataset job under Slurm went unguarded)."""
    guard = DeadlineGuard(5.0, "warn")
    f = Forecaster(JobModel(), start_s=0.0, reports=ReportDispatcher([guard]))
    fired_at: list[float] = []

    def watch(step: int, now_s: float) -> None:
        _ = f.prediction  # reporters are offered the prediction when it is read
        if guard.fired is not None and not fired_at:
            fired_at.append(now_s)

    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        run_job(f, 12, 1.0, cv=0.0, on_step=watch)
    assert guard.fired is not None and guard.fired.prediction.total_s is None
    assert fired_at == [pytest.approx(6.0)]  # at the first step that ended past 5 s
    assert guard.fired.shortfall_s == pytest.approx(guard.fired.prediction.elapsed_s - 5.0)
    (message,) = deadline_warnings(caplog)
    assert "its length unknown" in message and "deadline 5.0s after start" in message


def test_a_deadline_before_the_start_is_never_shown_as_a_negative_duration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = datetime.fromtimestamp(WALL_START, tz=timezone.utc)
    guard = DeadlineGuard(start - timedelta(seconds=100), "warn")
    f = Forecaster(
        JobModel(total_steps=1000),
        start_s=0.0,
        wall_start_s=WALL_START,
        reports=ReportDispatcher([guard]),
    )
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        run_job(f, 5, 1.0)
    assert guard.fired is not None and guard.fired.prediction.step == 1  # at the first check
    (message,) = deadline_warnings(caplog)
    assert "deadline passed 1m40s before start" in message
    assert " -" not in message and "(-" not in message  # no negative duration anywhere


def test_deadline_guard_validation() -> None:
    with pytest.raises(ValueError, match="deadline must be seconds > 0, got -5"):
        DeadlineGuard(-5)
    with pytest.raises(ValueError, match="on_deadline must be"):
        DeadlineGuard(10.0, "explode")
    with pytest.raises(ValueError, match="policy must be one of"):
        DeadlineGuard(10.0, policy="maybe")
    with pytest.raises(ValueError, match="margin_s must be >= 0"):
        DeadlineGuard(10.0, margin_s=-1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400.0),
        ("10:30", 630.0),
        ("1:00:00", 3600.0),
        ("2-0", 172800.0),
        ("1-02:03", 93780.0),
        ("1-02:03:04", 93784.0),
        ("UNLIMITED", None),
        ("0", None),
    ],
)
def test_parse_slurm_time(text: str, seconds: float | None) -> None:
    assert parse_slurm_time(text) == seconds


def test_slurm_deadline_from_environment() -> None:
    end = slurm_deadline({"SLURM_JOB_END_TIME": "1700003600"})
    assert end == datetime.fromtimestamp(1_700_003_600, tz=timezone.utc)
    derived = slurm_deadline({"SLURM_JOB_START_TIME": "1700000000", "SBATCH_TIMELIMIT": "0:30:00"})
    assert derived == datetime.fromtimestamp(1_700_001_800, tz=timezone.utc)
    assert slurm_deadline({}) is None
    assert slurm_deadline({"SLURM_JOB_END_TIME": "soon"}) is None
    assert slurm_deadline({"SLURM_JOB_START_TIME": "1700000000", "SLURM_TIMELIMIT": "x:y"}) is None
    reporters = build_reporters(
        log_every_n_steps=None, environ={"SLURM_JOB_END_TIME": "1700003600"}
    )
    assert [type(r) for r in reporters] == [DeadlineGuard]
    assert build_reporters(deadline=False, environ={"SLURM_JOB_END_TIME": "1700003600"}) != []
    assert not any(
        isinstance(r, DeadlineGuard)
        for r in build_reporters(deadline=False, environ={"SLURM_JOB_END_TIME": "1700003600"})
    )
