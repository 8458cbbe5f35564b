"""``ets-hook watch`` through the installed console script, on files the real reporter writes.

Snapshots (stdout not a terminal, or ``--once``) for running, ended, prediction-less and stale
files; the live view in a pseudo-terminal (redrawn in place, exits when the state leaves
running, 130 on Ctrl-C); bad inputs exit 2 with one line naming the file, no traceback.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from support import status_prediction as prediction

from ets_hook.forecast.prediction import Prediction, cut_at_time_limit
from ets_hook.reporters.status_file import StatusFileReporter
from ets_hook.trace.atomic import atomic_write_bytes

#: The console script installed beside this interpreter (the venv's ``bin``).
ETS_HOOK = shutil.which("ets-hook", path=str(Path(sys.executable).parent))


def watch(*args: str | Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """Run ``ets-hook watch ARGS`` with stdout a pipe (not a terminal)."""
    assert ETS_HOOK, "the console script is not installed next to python"
    return subprocess.run(
        [ETS_HOOK, "watch", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def assert_clean_error(run: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, one line on stderr naming ``needles``, nothing on stdout, no traceback."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ets-hook watch: error: "), run.stderr
    for needle in needles:
        assert needle in run.stderr, (needle, run.stderr)


def write_aged(path: Path, reporter: StatusFileReporter, age_s: float, **fields: object) -> None:
    """The reporter's running document, as if written ``age_s`` ago (fields replaced)."""
    doc = reporter.document("running", prediction(**fields))  # type: ignore[arg-type]
    doc["updated_at"] = (datetime.now(timezone.utc) - timedelta(seconds=age_s)).isoformat()
    atomic_write_bytes(path, json.dumps(doc).encode())


# ---------------------------------------------------------------------------------------------
# snapshots


def test_running_snapshot_shows_every_figure(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    p = prediction()
    StatusFileReporter(path).write("running", p)
    assert p.finish_time is not None
    finish = p.finish_time.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    for args in ((path, "--once"), (path,)):  # stdout is a pipe: one snapshot either way
        run = watch(*args)
        assert run.returncode == 0, run.stderr
        assert run.stderr == ""
        out = run.stdout
        assert f"pid {os.getpid()}  running" in out
        assert "[####-" in out and "300/2000 15.0%" in out
        assert "0.412 s/step ±1.1% (95%)  measured, converged" in out
        assert "ETA       11m40s" in out
        assert f"finish    {finish}" in out
        assert "total     13m50s ± 20s (95%)" in out
        assert "s ago" in out
        assert "STALE" not in out and "job ended" not in out and "not running" not in out
        assert "\x1b" not in out  # no terminal codes in a pipe


@pytest.mark.parametrize(
    ("state", "error", "note"),
    [
        ("closed", None, "job ended: closed"),
        ("interrupted", None, "job ended: interrupted"),
        ("failed", "RuntimeError", "job FAILED: RuntimeError"),
    ],
)
def test_ended_job_snapshot(tmp_path: Path, state: str, error: str | None, note: str) -> None:
    path = tmp_path / "status.json"
    StatusFileReporter(path).write(state, prediction(step=2000), error)
    run = watch(path)  # not --once, not a terminal: the snapshot, exit 0
    assert run.returncode == 0, run.stderr
    assert f"  {state}" in run.stdout and "2000/2000 100.0%" in run.stdout
    assert note in run.stdout and "last prediction" in run.stdout
    assert (f"failed ({error})" in run.stdout) == (state == "failed")


def test_snapshot_without_a_prediction(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusFileReporter(path).write("closed", None)
    run = watch(path, "--once")
    assert run.returncode == 0, run.stderr
    assert "no prediction yet" in run.stdout and "job ended: closed" in run.stdout
    assert "ETA" not in run.stdout


def test_stale_file_and_a_process_that_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    reporter = StatusFileReporter(path)
    write_aged(path, reporter, 60)
    out = watch(path, "--once").stdout
    # 1m00s, or a few seconds more where the command is slow to start on a loaded machine
    assert re.search(r"STALE: not updated for 1m0\ds", out) and "not running" not in out
    write_aged(path, reporter, 20, iteration_s=10.0)  # under 3 steps of 10 s: not stale yet
    assert "STALE" not in watch(path, "--once").stdout
    write_aged(path, reporter, 10, iteration_s=1.0)
    assert "STALE" not in watch(path, "--once").stdout
    assert "STALE: not updated for" in watch(path, "--once", "--stale-after", "5").stdout
    dead = subprocess.Popen(["true"])
    dead.wait()
    doc = json.loads(path.read_text())
    doc["pid"] = dead.pid
    atomic_write_bytes(path, json.dumps(doc).encode())
    out = watch(path, "--once").stdout
    assert f"process {dead.pid} is not running on this host" in out


def _rank_prediction(rank: int, eta_s: float, **fields: object) -> Prediction:
    """A prediction of rank ``rank`` of a 2-rank job whose end waits for rank 1, a straggler."""
    given: dict[str, object] = {"slowest_rank": 1, "straggler_rank": 1, **fields}
    return replace(
        prediction(step=2000),
        rank=rank,
        world_size=2,
        eta_s=eta_s,
        job_view_step=8,
        **given,  # type: ignore[arg-type]
    )


def test_the_header_says_which_file_of_a_multi_process_job_it_shows(tmp_path: Path) -> None:
    """A job file (scope job, rank 0) and a rank's own file rendered the same header: now
    one line says which it is and whom the job's end waits for."""
    job, own = tmp_path / "eta.json", tmp_path / "eta.rank1.json"
    StatusFileReporter(job, scope="job", rank=0, world_size=2).write(
        "running", _rank_prediction(0, 12.0)
    )
    StatusFileReporter(own, scope="rank", rank=1, world_size=2).write(
        "running", _rank_prediction(1, 12.0)
    )
    job_out, own_out = watch(job, "--once").stdout, watch(own, "--once").stdout
    assert "\nscope     job of 2 ranks · waits for rank 1 (a straggler)\n" in job_out
    assert "\nscope     rank 1 of 2 · this rank ends last (a straggler)\n" in own_out
    # The straggler's host was busy during its capture: said, in short.
    StatusFileReporter(job, scope="job", rank=0, world_size=2).write(
        "closed", _rank_prediction(0, 0.0, straggler_host_foreign_cpu=0.7)
    )
    assert (
        "\nscope     job of 2 ranks · waited for rank 1 (a straggler; its host was busy: other "
        "processes 70% of its CPU during the capture)\n"
    ) in watch(job, "--once").stdout
    # A straggler the end does not wait for (ranks out of lock step) is named on its own.
    StatusFileReporter(own, scope="rank", rank=1, world_size=2).write(
        "running", _rank_prediction(1, 12.0, slowest_rank=0)
    )
    assert "\nscope     rank 1 of 2 · waits for rank 0 · straggler: rank 1\n" in (
        watch(own, "--once").stdout
    )
    # A single process has one file: no such line.
    single = tmp_path / "single.json"
    StatusFileReporter(single).write("running", prediction())
    assert "scope" not in watch(single, "--once").stdout


def test_sub_second_etas_print_alike_in_every_file(tmp_path: Path) -> None:
    """The job's file showed ``ETA 0s`` and a rank's ``ETA 0.0s``: one formatter, zero and
    what rounds to it print ``0s``, other sub-second times in hundredths."""
    for eta_s, shown in ((0.0, "0s"), (0.003, "0s"), (0.04, "0.04s"), (0.0105, "0.01s")):
        for name, scope, rank in (("eta.json", "job", 0), ("eta.rank1.json", "rank", 1)):
            path = tmp_path / name
            StatusFileReporter(path, scope=scope, rank=rank, world_size=2).write(
                "running", _rank_prediction(rank, eta_s)
            )
            out = watch(path, "--once").stdout
            assert f"\nETA       {shown}\n" in out, (eta_s, name, out)


def test_bad_scope_fields_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    reporter = StatusFileReporter(path, scope="rank", rank=1, world_size=2)
    for field, value in (("scope", "node"), ("world_size", "2"), ("rank", True)):
        doc = reporter.document("running", _rank_prediction(1, 1.0))
        doc[field] = value
        path.write_text(json.dumps(doc))
        assert_clean_error(watch(path, "--once"), str(path), field)
    doc = reporter.document("running", _rank_prediction(1, 1.0))
    doc["prediction"]["slowest_rank"] = "1"
    path.write_text(json.dumps(doc))
    assert_clean_error(watch(path, "--once"), str(path), "prediction.slowest_rank")


def unknown_length(elapsed_s: float = 130.0, time_limit_s: float | None = None) -> Prediction:
    """A running job whose length is unknown (an IterableDataset without len): step time only."""
    return Prediction(
        step=300,
        total_steps=None,
        remaining_steps=None,
        iteration_s=0.412,
        iteration_ci_s=0.412 * 0.011,
        total_s=None,
        total_ci_s=None,
        eta_s=None,
        elapsed_s=elapsed_s,
        finish_time=None,
        converged=True,
        source="measured",
        start_time=datetime.now(timezone.utc) - timedelta(seconds=elapsed_s),
        time_limit_s=time_limit_s,
    )


def test_unknown_total_is_said_on_every_line_that_needs_it(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusFileReporter(path).write("running", unknown_length())
    run = watch(path, "--once")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "progress  step 300 (total steps unknown)" in out
    assert "0.412 s/step ±1.1% (95%)  measured, converged" in out
    for line in ("ETA", "finish", "total"):
        assert f"{line:<10}? (total steps unknown)\n" in out, (line, out)
    assert "time limit" not in out and "[#" not in out


def test_unknown_total_with_a_time_limit_shows_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    p = unknown_length(elapsed_s=130.0, time_limit_s=3600.0)
    StatusFileReporter(path).write("running", p)
    out = watch(path, "--once").stdout
    assert p.start_time is not None
    latest = (p.start_time + timedelta(seconds=3600)).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    assert "ETA       ? (total steps unknown; at most 57m50s: time limit)" in out, out
    assert f"finish    ? (total steps unknown; {latest}" in out and "at the latest" in out
    assert "total     ? (total steps unknown; at most 1h00m: time limit)" in out
    StatusFileReporter(path).write("running", unknown_length(elapsed_s=3700.0, time_limit_s=3600.0))
    out = watch(path, "--once").stdout
    assert out.count("? (total steps unknown; time limit 1h00m reached)") == 3, out


def test_a_total_cut_to_the_time_limit_says_so(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    limited = cut_at_time_limit(replace(prediction(), time_limit_s=600.0))  # 13m50s predicted
    assert limited.stopped_by_time_limit
    StatusFileReporter(path).write("running", limited)
    out = watch(path, "--once").stdout
    assert "300/2000 15.0%" in out
    assert "ETA       7m50s (capped by the time limit)" in out, out
    assert "total     10m00s (capped by the time limit)" in out  # 3m50s past it: certain
    assert limited.finish_time is not None
    finish = limited.finish_time.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    assert f"finish    {finish}" in out
    within = replace(prediction(), time_limit_s=7200.0)  # the limit does not bind
    StatusFileReporter(path).write("running", cut_at_time_limit(within))
    out = watch(path, "--once").stdout
    assert "time limit" not in out and "total     13m50s ± 20s (95%)" in out


# ---------------------------------------------------------------------------------------------
# the live view, in a pseudo-terminal


class PtyRun:
    """``ets-hook watch ARGS`` with a pseudo-terminal as stdin, stdout and stderr."""

    def __init__(self, *args: str | Path) -> None:
        assert ETS_HOOK
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [ETS_HOOK, "watch", *map(str, args)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            # A shell's background job starts with SIGINT ignored, and Python then keeps it
            # ignored: give the child the default, as a terminal would.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.close(slave)
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self.reader.start()

    def _read(self, master: int) -> None:
        try:
            while data := os.read(master, 4096):
                self.chunks.append(data)
        except OSError:  # EIO: the child closed the terminal
            pass
        finally:
            os.close(master)

    @property
    def output(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.proc.poll() is None, self.output
            assert time.monotonic() < deadline, (text, self.output)
            time.sleep(0.02)

    def finish(self, timeout: float = 10) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        return code


def test_live_view_waits_redraws_and_exits_when_the_job_ends(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    run = PtyRun(path, "--interval", "0.2")
    run.wait_for(f"waiting for {path}")
    reporter = StatusFileReporter(path)
    reporter.write("running", prediction(step=300))
    run.wait_for("300/2000")
    run.wait_for("refreshing every 0.2s")
    reporter.write("running", prediction(step=600))
    run.wait_for("600/2000")
    assert run.proc.poll() is None  # still watching a running job
    reporter.write("closed", prediction(step=2000))
    assert run.finish() == 0, run.output
    out = run.output
    assert out.count("\x1b[H") >= 3  # redrawn in place
    last = out[out.rindex("\x1b[H") :]
    assert "2000/2000 100.0%" in last and "job ended: closed" in last
    assert "measured, final" in last and "converged" not in last  # over: no "not yet"
    assert "refreshing" not in last and "Traceback" not in out


def test_ctrl_c_exits_130_quietly(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusFileReporter(path).write("running", prediction())
    run = PtyRun(path, "--interval", "0.2")
    run.wait_for("refreshing every")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 130
    assert "Traceback" not in run.output and "KeyboardInterrupt" not in run.output


# ---------------------------------------------------------------------------------------------
# missing and bad inputs


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    assert_clean_error(watch(path, "--once"), str(path), "No such file")
    started = time.monotonic()
    run = watch(path, "--timeout", "0.3", "--interval", "0.1")
    assert time.monotonic() - started < 5
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.splitlines()[0] == f"waiting for {path} ..."
    assert "after waiting" in run.stderr.splitlines()[-1]


def test_a_missing_file_is_waited_for_then_printed(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    writer = threading.Timer(0.4, StatusFileReporter(path).write, ("running", prediction()))
    writer.start()
    try:
        run = watch(path, "--interval", "0.1", "--timeout", "10")
    finally:
        writer.join()
    assert run.returncode == 0, run.stderr
    assert "300/2000" in run.stdout


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_special_files_are_refused_unread(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "status.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    for args in ((path, "--once"), (path,)):
        assert_clean_error(watch(*args, timeout=10), str(path), "not a regular file")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "not an ets-hook status file"),
        (b'{"format": "something-else", "version": 2}', "not an ets-hook status file"),
        (b'{"format": "ets-hook-status", "version": 99}', "version 99 is newer"),
        (b'{"format": "ets-hook-status", "version": 2, "state": "done"}', "'state'"),
    ],
)
def test_invalid_files_exit_2(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(content)
    assert_clean_error(watch(path, "--once"), str(path), problem)


def test_invalid_fields_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    doc = StatusFileReporter(path).document("running", prediction())
    doc["prediction"]["step"] = "many"
    path.write_text(json.dumps(doc))
    assert_clean_error(watch(path), str(path), "prediction.step")


def test_live_view_exits_1_once_the_jobs_process_is_gone(tmp_path: Path) -> None:
    """A job killed without closing its hook (kill -9, os._exit) leaves the file at running
    forever: the live view draws that state and exits 1 instead of watching it for ever."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "status.json"
    StatusFileReporter(path).write("running", prediction())
    doc = json.loads(path.read_text())
    doc["pid"] = dead.pid  # this host, a process that has exited
    path.write_text(json.dumps(doc))
    run = PtyRun(path, "--interval", "0.2")
    assert run.finish() == 1, run.output
    last = run.output[run.output.rindex("\x1b[H") :]
    assert f"process {dead.pid} is not running on this host" in last
    assert "refreshing" not in last and "Traceback" not in run.output
