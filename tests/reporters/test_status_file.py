"""reporters.status_file: contents, throttling, validation, atomic writes under SIGKILL."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.status_file import (
    STATUS_STATES,
    STATUS_VERSION,
    StatusFileReporter,
    status_schema_path,
)
from ets_hook.trace.atomic import _temp_prefix, atomic_write_bytes, remove_orphan_temp_files


def test_status_file_contents_and_throttling(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    writes: list[str] = []

    class Recording(StatusFileReporter):
        def write(
            self, state: str, prediction: Prediction | None, error: str | None = None
        ) -> None:
            writes.append(state)
            super().write(state, prediction, error)

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
    with pytest.raises(ValueError, match=r"standard keys \['pid', 'state'\]"):
        StatusFileReporter(tmp_path / "s.json", extra={"state": "x", "pid": 1, "job": "ok"})
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        StatusFileReporter(tmp_path / "s.json", extra={"loss": float("nan")})
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        StatusFileReporter(tmp_path / "s.json", extra={"obj": object()})
    with pytest.raises(ValueError, match="state must be one of"):
        StatusFileReporter(tmp_path / "s.json").document("finished", None)


def _schema_validator() -> Any:
    import jsonschema  # the test extra installs it

    schema = json.loads(status_schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(
    ("outcome", "error"), [("closed", None), ("interrupted", None), ("failed", "RuntimeError")]
)
def test_every_outcome_is_written_and_matches_the_schema(
    tmp_path: Path, outcome: str, error: str | None
) -> None:
    validator = _schema_validator()
    path = tmp_path / "status.json"
    reporter = StatusFileReporter(path, extra={"job": "demo"})
    f = Forecaster(JobModel(total_steps=50), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 20, 0.1)
    running = json.loads(path.read_text())
    validator.validate(running)
    assert running["state"] == "running" and running["error"] is None
    assert running["version"] == STATUS_VERSION
    f.close(outcome, error)
    final = json.loads(path.read_text())
    validator.validate(final)
    assert (final["state"], final["error"]) == (outcome, error)
    assert final["prediction"]["step"] == 20
    assert set(validator.schema["properties"]["state"]["enum"]) == set(STATUS_STATES)
    # A document the schema must refuse: the validator is not vacuous.
    assert not validator.is_valid({**final, "state": "finished"})


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_get_the_process_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        target = tmp_path / f"status-{umask:o}.json"
        atomic_write_bytes(target, b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_is_retried_with_back_off_and_names_the_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    path = folder / "status.json"
    reporter = StatusFileReporter(path, interval_s=0.01)
    dispatcher = ReportDispatcher([reporter])
    f = Forecaster(JobModel(total_steps=10_000), start_s=0.0, reports=dispatcher)
    clock = iter(range(1, 10_000))

    def steps(n: int) -> None:
        for _ in range(n):
            now = float(next(clock))  # 1 s per step on the forecaster's clock: always due
            f.on_step_end(int(now) - 1, 1.0, now)

    steps(3)
    assert path.exists()
    path.unlink()
    folder.rmdir()  # writes now fail
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        steps(50)
    failures = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert failures and str(path) in failures[0]
    assert len(failures) <= 2  # backing off: 50 due predictions, one or two attempts
    assert reporter in dispatcher.reporters  # never disabled
    folder.mkdir()
    time.sleep(1.1)  # past the first back-off
    steps(2)
    assert json.loads(path.read_text())["prediction"]["step"] == 55


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
    # Killed writers may leave temp files; the next writer's first write removes them.
    leftovers = sorted(p.name for p in tmp_path.glob(".status.json.*.tmp"))
    atomic_write_bytes(path, b"{}")
    assert not list(tmp_path.glob(".status.json.*.tmp")), leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_orphan_sweep_spares_live_writers_and_other_files(tmp_path: Path) -> None:
    target = tmp_path / "eta.json"
    prefix = _temp_prefix(target)
    live = tmp_path / f"{prefix}{os.getpid()}.abc.tmp"
    dead_pid = _dead_pid()
    dead = tmp_path / f"{prefix}{dead_pid}.abc.tmp"
    other_host = tmp_path / f".eta.json.elsewhere.{dead_pid}.abc.tmp"
    unrelated = tmp_path / f".other.json.{dead_pid}.tmp"
    for p in (live, dead, other_host, unrelated):
        p.write_bytes(b"x")
    assert remove_orphan_temp_files(target) == [dead]
    assert all(p.exists() for p in (live, other_host, unrelated))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
