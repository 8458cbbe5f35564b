"""Reporters: formatting, log lines and throttling, status file, tqdm, callbacks, deadline guard."""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ets_hook.errors import DeadlineExceededError
from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.reporters.base import ReportDispatcher, Reporter, ReportSchedule
from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.callback import CallbackReporter
from ets_hook.reporters.deadline import (
    DeadlineGuard,
    DeadlineMiss,
    parse_slurm_time,
    slurm_deadline,
)
from ets_hook.reporters.format import (
    format_duration,
    format_prediction,
    format_relative,
    format_step_time,
)
from ets_hook.reporters.log import LogReporter
from ets_hook.reporters.status_file import StatusFileReporter
from ets_hook.reporters.tqdm import TqdmReporter

WALL_START = 1_700_000_000.0
LINE = re.compile(
    r"^step \d+/\d+ · [\d.]+ (s|ms|µs)/step ±[\d.]+% · ETA [\dmshd.]+ · total [\dmshd.]+$"
)


def prediction(**overrides: Any) -> Prediction:
    fields: dict[str, Any] = {
        "step": 30,
        "total_steps": 2000,
        "remaining_steps": 1970,
        "iteration_s": 0.412,
        "iteration_ci_s": 0.011 * 0.412,
        "total_s": 825.0,
        "total_ci_s": 9.0,
        "eta_s": 812.0,
        "elapsed_s": 13.0,
        "finish_time": None,
        "converged": True,
        "source": "measured",
    }
    fields.update(overrides)
    return Prediction(**fields)


def run_job(
    forecaster: Forecaster,
    n: int,
    step_s: float | np.ndarray,
    *,
    cv: float = 0.03,
    seed: int = 0,
    on_step: Any = None,
) -> float:
    """Drive ``forecaster`` through ``n`` steps of (noisy) ``step_s``; returns the end time."""
    rng = np.random.default_rng(seed)
    base = np.broadcast_to(np.asarray(step_s, dtype=float), (n,))
    now = 0.0
    for i in range(n):
        d = float(base[i] * (1.0 + cv * rng.standard_normal()))
        now += d
        forecaster.on_step_end(i, d, now)
        if on_step is not None:
            on_step(i, now)
    return now


class Counting(Reporter):
    def __init__(self, schedule: ReportSchedule) -> None:
        self.schedule = schedule
        self.steps: list[int] = []
        self.closed: list[Prediction | None] = []

    def on_prediction(self, prediction: Prediction) -> None:
        self.steps.append(prediction.step)

    def on_close(self, prediction: Prediction | None) -> None:
        self.closed.append(prediction)


# ---------------------------------------------------------------------------------------------
# Formatting


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.42, "0.4s"),
        (4.24, "4.2s"),
        (42.4, "42s"),
        (59.6, "1m00s"),
        (812.0, "13m32s"),
        (3599.6, "1h00m"),
        (7500.0, "2h05m"),
        (3 * 86400 + 4 * 3600, "3d04h"),
        (-90.0, "-1m30s"),
        (None, "?"),
        (float("nan"), "?"),
        (float("inf"), "∞"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_step_time_and_relative() -> None:
    assert format_step_time(0.412) == "0.412 s/step"
    assert format_step_time(1.234) == "1.23 s/step"
    assert format_step_time(0.0123) == "12.3 ms/step"
    assert format_step_time(0.0008) == "800 µs/step"
    assert format_relative(0.011) == "±1.1%"
    assert format_relative(0.123) == "±12%"


def test_log_line_format() -> None:
    text = format_prediction(prediction())
    assert text == "step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s"
    assert LINE.match(text)
    unknown = prediction(total_steps=None, total_s=None, eta_s=None)
    assert format_prediction(unknown) == "step 30 · 0.412 s/step ±1.1%"


# ---------------------------------------------------------------------------------------------
# Dispatch and isolation


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


# ---------------------------------------------------------------------------------------------
# Log reporter


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ets_hook"]


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
    assert steps == [1, 10, 20, 30, 40]
    assert all(LINE.match(line) for line in lines)
    assert lines[1].startswith("step 10/100 · ")


def test_convergence_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=None, move_threshold=10.0)
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([reporter]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 300, 1.0, cv=0.05)
    converged = [r.ets_prediction.converged for r in caplog.records]
    assert converged == [False, True]


def test_log_lines_are_throttled_for_fast_steps(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=10, move_threshold=10.0, min_interval_s=5.0)
    f = Forecaster(JobModel(total_steps=10_000), start_s=0.0, reports=ReportDispatcher([reporter]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        end = run_job(f, 3000, 0.01)  # 30 s of 10 ms steps: 300 multiples of 10
    lines = log_lines(caplog)
    assert 4 <= len(lines) <= end / 5.0 + 3


def test_log_line_when_the_estimate_moves(caplog: pytest.LogCaptureFixture) -> None:
    reporter = LogReporter(every_n_steps=None, move_threshold=0.05, min_interval_s=0.0)
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([reporter]))
    times = np.where(np.arange(600) < 300, 0.5, 1.0)  # the job slows down at step 300
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 600, times)
    moved = [r.ets_prediction.step for r in caplog.records if r.ets_prediction.step > 300]
    assert moved, "no line after the slowdown"
    assert moved[0] < 400


# ---------------------------------------------------------------------------------------------
# Deadline guard


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


def test_deadline_guard_validation() -> None:
    with pytest.raises(ValueError, match="deadline must be seconds > 0, got -5"):
        DeadlineGuard(-5)
    with pytest.raises(ValueError, match="on_deadline must be"):
        DeadlineGuard(10.0, "explode")
    with pytest.raises(ValueError, match="policy must be one of"):
        DeadlineGuard(10.0, policy="maybe")
    with pytest.raises(ValueError, match="margin_s must be >= 0"):
        DeadlineGuard(10.0, margin_s=-1)


# ---------------------------------------------------------------------------------------------
# Slurm


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


# ---------------------------------------------------------------------------------------------
# Status file


def test_status_file_contents_and_throttling(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    writes: list[str] = []

    class Recording(StatusFileReporter):
        def write(self, state: str, prediction: Prediction | None) -> None:
            writes.append(state)
            super().write(state, prediction)

    reporter = Recording(path, interval_s=5.0, extra={"job": "demo"})
    f = Forecaster(JobModel(total_steps=400), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 200, 0.1)  # 20 s: the first prediction, then every 5 s
    assert 4 <= len(writes) <= 6
    doc = json.loads(path.read_text())
    assert doc["format"] == "ets-hook-status" and doc["state"] == "running"
    assert doc["job"] == "demo"
    assert doc["pid"] == os.getpid()
    f.close()
    doc = json.loads(path.read_text())
    assert doc["state"] == "closed"
    assert doc["prediction"]["step"] == 200
    assert writes[-1] == "closed"


def test_status_file_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="directory does not exist"):
        StatusFileReporter(tmp_path / "missing" / "status.json")
    with pytest.raises(ValueError, match="is a directory"):
        StatusFileReporter(tmp_path)


WRITER = textwrap.dedent(
    """
    import sys
    from ets_hook.forecast.prediction import Prediction
    from ets_hook.reporters.status_file import StatusFileReporter
    reporter = StatusFileReporter(sys.argv[1], extra={"padding": "x" * 200_000})
    step = 0
    while True:
        step += 1
        p = Prediction(step=step, total_steps=10**9, remaining_steps=10**9 - step,
                       iteration_s=0.4, iteration_ci_s=0.01, total_s=4e8, total_ci_s=1e6,
                       eta_s=4e8, elapsed_s=step * 0.4, finish_time=None, converged=True,
                       source="measured")
        reporter.write("running", p)
        if step == 1:
            print("ready", flush=True)
    """
)


def test_status_file_is_always_valid_json_even_when_killed_mid_write(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    rng = random.Random(0)
    last_step = 0
    for _ in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + rng.uniform(0.02, 0.15)
            while time.monotonic() < deadline:  # readers racing the writer see whole files
                doc = json.loads(path.read_text())
                assert doc["prediction"]["step"] >= 1
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        doc = json.loads(path.read_text())
        assert len(doc["padding"]) == 200_000
        last_step = doc["prediction"]["step"]
        assert last_step >= 1


# ---------------------------------------------------------------------------------------------
# tqdm and callbacks


def test_tqdm_on_a_user_bar() -> None:
    tqdm = pytest.importorskip("tqdm")
    bar = tqdm.tqdm(total=100, disable=True)
    f = Forecaster(
        JobModel(total_steps=100), start_s=0.0, reports=ReportDispatcher([TqdmReporter(bar)])
    )
    run_job(f, 10, 0.2)
    assert "s/step" in bar.postfix and "ETA" in bar.postfix
    f.close()
    bar.close()


def test_tqdm_bar_of_our_own(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    reporter = TqdmReporter(file=sys.stderr, mininterval=0)
    f = Forecaster(JobModel(total_steps=50), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 50, 0.2)
    f.close()
    err = capsys.readouterr().err
    assert "50/50" in err and "ETA" in err
    assert reporter._bar is not None and reporter._bar.disable is True  # closed


def test_missing_tqdm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(ImportError, match=r"pip install 'ets-hook\[tqdm\]'"):
        build_reporters(progress=True)
    with pytest.raises(ValueError, match="must be a tqdm instance"):
        TqdmReporter(bar=object())


def test_callbacks_get_predictions_and_the_final_one() -> None:
    seen: list[Prediction] = []
    f = Forecaster(
        JobModel(total_steps=30),
        start_s=0.0,
        reports=ReportDispatcher(build_reporters(on_prediction=seen.append)),
    )
    run_job(f, 30, 0.1)
    f.close()
    steps = [p.step for p in seen]
    # Early checkpoints, then at least once per second of job time (10 steps of 0.1 s).
    assert {1, 2, 3, 5, 10, 20} <= set(steps) and steps == sorted(steps)
    assert max(b - a for a, b in itertools.pairwise(steps)) <= 10
    assert len(steps) < 30, "not every step: predictions are built only when due"
    assert seen[-1].step == 30 and seen[-1].remaining_steps == 0


def test_build_reporters_validates() -> None:
    with pytest.raises(ValueError, match="on_prediction must be callable"):
        build_reporters(on_prediction=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_deadline must be"):
        build_reporters(deadline=False, on_deadline="shout")
    kinds = [type(r) for r in build_reporters(deadline=60.0, environ={})]
    assert kinds == [LogReporter, DeadlineGuard]
