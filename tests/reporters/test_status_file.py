"""reporters.status_file: contents, throttling, validation, atomic writes under SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.status_file import StatusFileReporter


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
