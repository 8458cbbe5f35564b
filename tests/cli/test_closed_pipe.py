"""``ets-hook`` writing into a pipe whose reader goes away (``ets-hook info T.ets | head -1``).

Like a Unix tool stopped by SIGPIPE, it exits 141 (128 + SIGPIPE) with nothing on stderr: no
``BrokenPipeError`` traceback, no "Exception ignored" from the interpreter's final flush. Run
through the installed console script with a real pipe: read what ``head`` would, then close it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import ETS_HOOK, sample_trace
from support import status_prediction as prediction

from ets_hook.cli.common import EXIT_CODES_HELP
from ets_hook.reporters.status_file import StatusFileReporter
from ets_hook.trace.events import IterationTrace
from ets_hook.trace.io import save_trace

#: 128 + SIGPIPE: what a shell reports for a tool that SIGPIPE stopped.
EXIT_BROKEN_PIPE = 141
#: Iterations of the big trace: ``info`` prints far more than a pipe holds (64 KiB).
BIG_STEPS = 4000


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = sample_trace()
    trace.iterations = [
        IterationTrace(step=i, start_ns=1_000 * i, end_ns=1_000 * i + 900) for i in range(BIG_STEPS)
    ]
    return save_trace(trace, tmp_path_factory.mktemp("big") / "big.ets")


def read_then_close(args: list[str | Path], read: int | None = None) -> tuple[bytes, int, bytes]:
    """Run ``ets-hook ARGS``, read its first line (or ``read`` bytes) and close the pipe.

    Returns:
        What was read, the exit status and everything on stderr.
    """
    assert ETS_HOOK, "the console script is not installed next to python"
    proc = subprocess.Popen(
        [ETS_HOOK, *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline() if read is None else proc.stdout.read(read)
        proc.stdout.close()  # the reader goes away, as head does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return head, proc.returncode, err


@pytest.mark.parametrize(
    ("args", "read", "starts"),
    [
        (["info", "{t}"], None, b"trace    "),  # ets-hook info T.ets | head -1
        (["info", "--json", "{t}"], 600, b"{\n"),  # ets-hook info --json T.ets | head -c 600
        (["info", "{t}", "{t}"], None, b"trace    "),  # several traces
    ],
    ids=["info", "info-json", "info-several"],
)
def test_a_reader_that_stops_early_ends_it_quietly_with_141(
    big_trace: Path, args: list[str], read: int | None, starts: bytes
) -> None:
    head, code, err = read_then_close([a.format(t=big_trace) for a in args], read)
    assert head.startswith(starts), head
    assert (code, err) == (EXIT_BROKEN_PIPE, b""), err.decode(errors="replace")


def run_into_a_closed_pipe(*args: str | Path, buffered: bool) -> subprocess.CompletedProcess[bytes]:
    """Run ``ets-hook ARGS`` with stdout a pipe whose reader is already gone.

    ``buffered``: stdout block-buffered (small output then fails at the final flush), else
    ``PYTHONUNBUFFERED=1`` (it fails at the first write).
    """
    assert ETS_HOOK, "the console script is not installed next to python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [ETS_HOOK, *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            env=env,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_watch_into_a_closed_pipe_exits_141_quietly(tmp_path: Path, buffered: bool) -> None:
    path = tmp_path / "status.json"
    StatusFileReporter(path).write("running", prediction())
    for args in ((path, "--once"), (path,)):  # watch --once STATUS | head -1; not a terminal
        run = run_into_a_closed_pipe("watch", *args, buffered=buffered)
        assert (run.returncode, run.stderr) == (EXIT_BROKEN_PIPE, b""), run.stderr.decode()


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_info_and_export_into_a_closed_pipe_exit_141_quietly(
    tmp_path: Path, buffered: bool
) -> None:
    trace = save_trace(sample_trace(), tmp_path / "t.ets")  # small: fits the stdout buffer
    for args in (["info", trace], ["info", "--json", trace], ["info", trace, trace]):
        run = run_into_a_closed_pipe(*args, buffered=buffered)
        assert (run.returncode, run.stderr) == (EXIT_BROKEN_PIPE, b""), (args, run.stderr)
    out = tmp_path / "c.json"
    run = run_into_a_closed_pipe("export", trace, "--chrome", out, buffered=buffered)
    assert (run.returncode, run.stderr) == (EXIT_BROKEN_PIPE, b""), run.stderr.decode()
    assert out.is_file()  # written before the line saying so


def test_help_documents_the_broken_pipe_exit_code() -> None:
    assert "\n  141  " in EXIT_CODES_HELP
    for command in ("info", "export", "demo", "build-ops", "train", "evaluate", "watch"):
        run = subprocess.run(
            [str(ETS_HOOK), command, "--help"], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        codes = run.stdout[run.stdout.index("\nexit codes:\n") :]
        assert "\n  141  " in codes, (command, codes)
