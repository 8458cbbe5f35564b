"""reporters.status_file: contents, throttling, validation, atomic writes under SIGKILL."""

from __future__ import annotations

import itertools
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
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.forecast.ranks import RankForecast, aggregate_ranks
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.log import LogReporter
from ets_hook.reporters.status_file import (
    STATUS_SCOPES,
    STATUS_STATES,
    STATUS_VERSION,
    StatusFileReporter,
    status_paths,
    status_schema_path,
)
from ets_hook.trace.atomic import _temp_prefix, atomic_write_bytes, remove_orphan_temp_files


def test_status_file_contents_and_throttling(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    writes: list[str] = []
    written: list[Prediction] = []

    class Recording(StatusFileReporter):
        def write(
            self, state: str, prediction: Prediction | None, error: str | None = None
        ) -> None:
            writes.append(state)
            if prediction is not None and state == "running":
                written.append(prediction)
            super().write(state, prediction, error)

    reporter = Recording(path, interval_s=5.0, extra={"job": "demo"})
    # converge_rel_ci=0.5: converged from the first prediction (no separate convergence write).
    f = Forecaster(
        JobModel(total_steps=400),
        start_s=0.0,
        converge_rel_ci=0.5,
        reports=ReportDispatcher([reporter]),
    )
    run_job(f, 200, 0.1)  # 20 s: steps 1, 3 and 5 (the log's early lines), then every 5 s
    steps = [p.step for p in written]
    assert steps[:3] == [1, 3, 5]
    periodic = [p.elapsed_s for p in written[2:]]
    assert len(periodic) >= 4  # step 5, then at 5, 10, 15 s of the 20 s
    assert all(b - a >= 5.0 - 1e-9 for a, b in itertools.pairwise(periodic))
    doc = json.loads(path.read_text())
    assert doc["format"] == "ets-hook-status" and doc["state"] == "running"
    assert doc["job"] == "demo"
    assert doc["pid"] == os.getpid()
    f.close()
    doc = json.loads(path.read_text())
    assert doc["state"] == "closed"
    assert doc["prediction"]["step"] == 200
    assert writes[-1] == "closed"


def test_status_file_is_rewritten_where_the_log_writes_its_early_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Steps 1, 3, 5 and the first converged prediction: the log's milestone lines and the
    status file's rewrites are the same predictions (the periodic writes aside)."""
    written: list[int] = []

    class Recording(StatusFileReporter):
        def write(
            self, state: str, prediction: Prediction | None, error: str | None = None
        ) -> None:
            if prediction is not None and state == "running":
                written.append(prediction.step)
            super().write(state, prediction, error)

    status = Recording(tmp_path / "status.json", interval_s=1e9)  # no periodic writes
    log = LogReporter(every_n_steps=None, move_threshold=10.0)  # milestone lines only
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0, reports=ReportDispatcher([log, status]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 300, 1.0, cv=0.05)
    logged = [r.ets_prediction for r in caplog.records if hasattr(r, "ets_prediction")]
    assert [p.step for p in logged][:3] == [1, 3, 5]
    assert [p.converged for p in logged[3:]] == [True]  # the convergence line
    assert written == [p.step for p in logged]


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
    with pytest.raises(ValueError, match="interval_s must be > 0 or None, got 0"):
        StatusFileReporter(tmp_path / "s.json", interval_s=0)
    with pytest.raises(ValueError, match="milestone steps must be ints >= 1"):
        StatusFileReporter(tmp_path / "s.json", milestone_steps=(0,))


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


# ---------------------------------------------------------------------------------------------
# Multi-process jobs: which files a rank writes, and scope/rank/world_size in the document


@pytest.mark.parametrize("rank", [0, 1, 7])
def test_status_paths_multi_process_without_a_rank_placeholder(tmp_path: Path, rank: int) -> None:
    given = tmp_path / "eta.json"
    own = (tmp_path / f"eta.rank{rank}.json", "rank")
    expected = [(given, "job"), own] if rank == 0 else [own]
    assert status_paths(given, rank, 8) == expected
    assert status_paths(str(given), rank, 8) == expected  # a str works alike


def test_status_paths_single_process(tmp_path: Path) -> None:
    assert status_paths(tmp_path / "eta.json", 0, 1) == [(tmp_path / "eta.json", "job")]
    assert status_paths("eta.{rank}.json", 0, 1) == [(Path("eta.0.json"), "job")]


@pytest.mark.parametrize("rank", [0, 3])
def test_status_paths_with_a_rank_placeholder_give_one_rank_file(rank: int) -> None:
    assert status_paths("out/{rank}/eta-{rank}.json", rank, 4) == [
        (Path(f"out/{rank}/eta-{rank}.json"), "rank")
    ]


def test_status_paths_rank_suffix_without_an_extension(tmp_path: Path) -> None:
    assert status_paths(tmp_path / "status", 2, 3) == [(tmp_path / "status.rank2", "rank")]
    [(job, _), (own, _)] = status_paths(tmp_path / "a.b.json", 0, 2)
    assert (job.name, own.name) == ("a.b.json", "a.b.rank0.json")
    scopes = {
        scope
        for path in ("x.json", "x.{rank}.json")
        for world_size in (1, 2)
        for _, scope in status_paths(path, 0, world_size)
    }
    assert scopes == set(STATUS_SCOPES)


def _two_rank_forecaster(
    reporter: StatusFileReporter, rank: int, straggler_host_foreign_cpu: float | None = None
) -> Forecaster:
    f = Forecaster(
        JobModel(total_steps=100),
        start_s=0.0,
        wall_start_s=1_700_000_000.0,
        reports=ReportDispatcher([reporter]),
        rank=rank,
        world_size=2,
    )
    run_job(f, 20, 0.1)
    own = f.prediction
    assert own is not None and own.total_s is not None
    end = f.wall_start_s + own.total_s
    forecasts = [
        RankForecast(
            r,
            20,
            f.wall_start_s,
            end + 30.0 * (r != rank),
            0.5,
            0.1,
            busy_s=0.1 + r,
            busy_se_s=0.0,
            host_foreign_cpu=straggler_host_foreign_cpu if r == 1 else None,
        )
        for r in (0, 1)
    ]
    f.set_job_view(aggregate_ranks(forecasts, exchange=0, world_size=2))
    return f


@pytest.mark.parametrize(("rank", "scope"), [(1, "rank"), (0, "job"), (0, "rank")])
def test_rank_documents_carry_scope_rank_and_world_size(
    tmp_path: Path, rank: int, scope: str
) -> None:
    validator = _schema_validator()
    path = tmp_path / f"eta.{scope}{rank}.json"
    reporter = StatusFileReporter(path, interval_s=0.001, scope=scope, rank=rank, world_size=2)
    f = _two_rank_forecaster(reporter, rank)
    run_job(f, 1, 0.1, seed=1)  # one more step: a document with the job view
    f.close()
    doc = json.loads(path.read_text())
    validator.validate(doc)
    assert doc["version"] == STATUS_VERSION == 6
    assert (doc["scope"], doc["rank"], doc["world_size"]) == (scope, rank, 2)
    p = doc["prediction"]
    assert (p["rank"], p["world_size"]) == (rank, 2)
    assert p["slowest_rank"] == 1 - rank and p["straggler_rank"] == 1
    assert p["job_view_step"] == 20
    # Closed: the job as it ran, the view's predicted lag (30 s on rank 0) dropped.
    assert p["total_s"] == p["local_total_s"] == p["elapsed_s"] and p["eta_s"] == 0.0
    for bad in ({"scope": "node"}, {"rank": -1}, {"world_size": 0}, {"rank": "1"}):
        assert not validator.is_valid({**doc, **bad}), bad
    assert not validator.is_valid({**doc, "prediction": {**p, "slowest_rank": -1}})


def test_a_straggler_on_a_busy_host_is_in_the_document(tmp_path: Path) -> None:
    validator = _schema_validator()
    path = tmp_path / "eta.json"
    reporter = StatusFileReporter(path, interval_s=0.001, scope="job", rank=0, world_size=2)
    _two_rank_forecaster(reporter, 0, straggler_host_foreign_cpu=0.7).close()
    doc = json.loads(path.read_text())
    validator.validate(doc)
    p = doc["prediction"]
    assert p["straggler_rank"] == 1 and p["straggler_host_foreign_cpu"] == 0.7
    assert "capture_host_foreign_cpu" in p  # this rank's own: none sampled in this test
    for bad in (1.5, -0.1, "0.7"):
        bad_doc = {**doc, "prediction": {**p, "straggler_host_foreign_cpu": bad}}
        assert not validator.is_valid(bad_doc), bad


def test_single_process_document_is_the_jobs(tmp_path: Path) -> None:
    path = tmp_path / "eta.json"
    reporter = StatusFileReporter(path)
    reporter.write("running", None)
    doc = json.loads(path.read_text())
    _schema_validator().validate(doc)
    assert (doc["scope"], doc["rank"], doc["world_size"]) == ("job", 0, 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scope": "node"},
        {"scope": "Job"},
        {"rank": 2, "world_size": 2},
        {"rank": -1, "world_size": 2},
        {"rank": 0, "world_size": 0},
    ],
)
def test_scope_and_rank_are_checked(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"scope|rank"):
        StatusFileReporter(tmp_path / "s.json", **kwargs)


@pytest.mark.parametrize("key", ["scope", "rank", "world_size"])
def test_extra_may_not_replace_the_rank_keys(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="standard key"):
        StatusFileReporter(tmp_path / "s.json", extra={key: 1})


def _limited_run(
    tmp_path: Path, total_steps: int | None, time_limit_s: float | None, steps: int
) -> tuple[Forecaster, Path]:
    """A forecaster writing a status file (every step), run ``steps`` steps of ~0.1 s."""
    path = tmp_path / "status.json"
    reporter = StatusFileReporter(path, interval_s=0.001)
    job = JobModel(total_steps=total_steps) if total_steps is not None else None
    f = Forecaster(
        job, start_s=0.0, time_limit_s=time_limit_s, reports=ReportDispatcher([reporter])
    )
    run_job(f, steps, 0.1)
    return f, path


def test_unknown_length_without_a_limit_has_no_total_and_no_bound(tmp_path: Path) -> None:
    validator = _schema_validator()
    _, path = _limited_run(tmp_path, None, None, 20)
    doc = json.loads(path.read_text())
    validator.validate(doc)
    p = doc["prediction"]
    assert (p["total_steps"], p["total_s"], p["eta_s"], p["finish_time"]) == (None,) * 4
    assert p["time_limit_s"] is None and p["stopped_by_time_limit"] is False
    assert p["iteration_s"] == pytest.approx(0.1, rel=0.1)


def test_unknown_length_with_a_limit_carries_the_bound_not_a_total(tmp_path: Path) -> None:
    validator = _schema_validator()
    _, path = _limited_run(tmp_path, None, 60.0, 20)
    doc = json.loads(path.read_text())
    validator.validate(doc)
    p = doc["prediction"]
    assert p["time_limit_s"] == 60.0
    assert (p["total_s"], p["eta_s"], p["total_steps"]) == (None, None, None)  # none made up
    assert p["stopped_by_time_limit"] is False
    assert not validator.is_valid({**doc, "prediction": {**p, "time_limit_s": 0}})
    assert not validator.is_valid({**doc, "prediction": {**p, "stopped_by_time_limit": 1}})


def test_a_total_past_the_limit_is_cut_to_it(tmp_path: Path) -> None:
    validator = _schema_validator()
    _, path = _limited_run(tmp_path, 400, 30.0, 100)  # ~10 s in, ~40 s predicted
    doc = json.loads(path.read_text())
    validator.validate(doc)
    p = doc["prediction"]
    elapsed = p["elapsed_s"]
    assert elapsed < 30.0
    assert p["stopped_by_time_limit"] is True
    assert p["total_s"] == 30.0 and p["eta_s"] == pytest.approx(30.0 - elapsed)
    assert p["total_steps"] == 400 and p["remaining_steps"] == 300  # the planned length
    finish = datetime.fromisoformat(p["finish_time"])
    start = datetime.fromisoformat(p["start_time"])
    assert (finish - start).total_seconds() == pytest.approx(30.0, abs=1e-3)
    # Without the limit the same run predicts past it: the cut is the limit's doing.
    (tmp_path / "free").mkdir()
    free = _limited_run(tmp_path / "free", 400, None, 100)[0].prediction
    assert free is not None and free.total_s is not None and free.total_s > 35.0
    assert not free.stopped_by_time_limit


def test_a_job_that_ran_to_its_limit_ends_stopped_by_it(tmp_path: Path) -> None:
    f, path = _limited_run(tmp_path, 400, 30.0, 301)  # the step that ends past 30 s is the last
    running = json.loads(path.read_text())["prediction"]
    assert running["elapsed_s"] >= 30.0
    assert running["eta_s"] == 0.0 and running["total_s"] == running["elapsed_s"]
    assert running["stopped_by_time_limit"] is True
    f.close()
    final = json.loads(path.read_text())
    _schema_validator().validate(final)
    p = final["prediction"]
    assert final["state"] == "closed" and p["total_steps"] == 301
    assert p["stopped_by_time_limit"] is True and p["time_limit_s"] == 30.0


def test_a_job_that_ended_before_its_limit_was_not_stopped_by_it(tmp_path: Path) -> None:
    f, path = _limited_run(tmp_path, 100, 30.0, 100)  # ~10 s: done long before 30 s
    f.close()
    p = json.loads(path.read_text())["prediction"]
    assert p["total_s"] < 30.0 and p["stopped_by_time_limit"] is False


def test_the_final_write_that_fails_says_which_attempt_and_promises_no_retry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The folder removed before the job's end: the three final attempts each say so, none
    says "retrying in N s" (nothing retries after close)."""
    folder = tmp_path / "status"
    folder.mkdir()
    reporter = StatusFileReporter(folder / "status.json")
    folder.rmdir()
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        reporter.on_close(None)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert [m.rsplit(": ", 1)[1] for m in messages] == [
        "attempt 1 of 3", "attempt 2 of 3", "attempt 3 of 3"
    ]  # fmt: skip
    assert all(str(folder / "status.json") in m for m in messages)
    assert not [m for m in messages if "retrying" in m]
