"""reporters.console and the dispatcher on streams that cannot take the text: an ASCII stderr
(ASCII substitutes, not Python's ``\\xb7`` escapes), a closed or broken stderr (the line is
dropped; the other reporters, the status file among them, keep working)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import sample_prediction

from ets_hook.reporters.base import ReportDispatcher, Reporter, ReportSchedule
from ets_hook.reporters.console import ConsoleHandler

LINE = "step 3/60 · 14.4 ms/step ±21% · ETA 0.8s — total 1.2s"


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("ets_hook", level, __file__, 1, message, None, None)


def _stream(encoding: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict")


def _written(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode(stream.encoding)  # type: ignore[attr-defined]


def _unconfigure(monkeypatch: pytest.MonkeyPatch) -> None:
    """No root handler (the handler steps aside otherwise; pytest adds its own during the
    test's call, so this runs in the test body), tqdm not loaded."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.delitem(sys.modules, "tqdm", raising=False)


# ---------------------------------------------------------------------------------------------
# an ASCII stream


def test_the_handler_writes_ascii_substitutes_where_the_stream_cannot_encode_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unconfigure(monkeypatch)
    stream = _stream("ascii")
    ConsoleHandler(stream).emit(_record(LINE))
    assert _written(stream) == (
        "ets-hook: step 3/60 | 14.4 ms/step +/-21% | ETA 0.8s -- total 1.2s\n"
    )


def test_the_handler_keeps_what_the_stream_can_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    _unconfigure(monkeypatch)
    utf8 = _stream("utf-8")
    ConsoleHandler(utf8).emit(_record(LINE))
    assert _written(utf8) == f"ets-hook: {LINE}\n"
    latin1 = _stream("latin-1")  # has ± and ·, not the dash
    ConsoleHandler(latin1).emit(_record(LINE))
    assert _written(latin1) == "ets-hook: step 3/60 · 14.4 ms/step ±21% · ETA 0.8s -- total 1.2s\n"


def test_characters_without_a_substitute_become_question_marks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unconfigure(monkeypatch)
    stream = _stream("ascii")
    ConsoleHandler(stream).emit(_record("µs ≤ 5 × 2 → ∞ … ☃"))
    assert _written(stream) == "ets-hook: us <= 5 x 2 -> inf ... ?\n"


SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from ets_hook import ETSHook
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=40, capture_steps=0)
    for _ in range(40):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    hook.close()
    print(sys.stderr.encoding, sys.stderr.errors)
    """
)


def test_log_lines_on_an_ascii_stderr_use_the_substitutes() -> None:
    """A library user's script under ``LC_ALL=C PYTHONIOENCODING=ascii``: the log lines read
    ``step 1/40 | 5.8 ms/step +/-100% | ...`` (before: ``\\xb7`` and ``\\xb1``), and the
    application's ``sys.stderr`` is left as it was."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONUTF8", "LC_CTYPE")},
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONIOENCODING": "ascii",
    }
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, env=env, timeout=120)
    err = run.stderr.decode("ascii", "replace")
    assert run.returncode == 0, err
    assert run.stdout.decode().split() == ["ascii", "backslashreplace"]
    assert run.stderr.isascii() and "\\x" not in err, err
    steps = [line for line in err.splitlines() if line.startswith("ets-hook: step ")]
    assert steps and steps[0].startswith("ets-hook: step 1/40 | "), err
    assert all(" | " in line and "s/step +/-" in line for line in steps), err


# ---------------------------------------------------------------------------------------------
# a closed or broken stream


class _BrokenPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("broken", ["closed", "broken pipe"])
def test_the_handler_drops_the_line_when_stderr_cannot_take_it(
    monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """stderr closed (or a broken pipe): nothing raises, not even Python's report of the
    logging error, which goes to the same stderr (before: ``ValueError: I/O operation on
    closed file`` out of ``emit``)."""
    stderr: io.StringIO = io.StringIO() if broken == "closed" else _BrokenPipe()
    if broken == "closed":
        stderr.close()
    _unconfigure(monkeypatch)
    monkeypatch.setattr(sys, "stderr", stderr)
    handler = ConsoleHandler()  # writes to sys.stderr as it is at each write
    handler.emit(_record(LINE))
    handler.emit(_record("ets-hook: a warning", logging.WARNING))
    handler.handleError(_record(LINE))


class _Recorder(Reporter):
    schedule = ReportSchedule(first_steps=10)

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_prediction(self, prediction) -> None:  # type: ignore[no-untyped-def]
        self.steps.append(prediction.step)


class _Failing(Reporter):
    schedule = ReportSchedule(first_steps=10)

    def on_prediction(self, prediction) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")


class _RaisingHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise ValueError("I/O operation on closed file.")


def test_a_failure_that_cannot_be_logged_still_disables_only_that_reporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatcher logs a failing reporter; when that log line raises too (a handler that
    cannot write), the failing reporter is dropped and the others are still called (before:
    the handler's error escaped ``dispatch``)."""
    monkeypatch.setattr(logging.getLogger("ets_hook"), "handlers", [_RaisingHandler()])
    good = _Recorder()
    dispatcher = ReportDispatcher([_Failing(), good])
    prediction = sample_prediction(step=1)
    dispatcher.dispatch(1, 1, 0.0, lambda: prediction)
    dispatcher.dispatch(2, 2, 1.0, lambda: prediction)
    assert dispatcher.reporters == [good]
    assert good.steps == [1, 1]
    dispatcher.close(prediction)


CLOSED_STDERR = textwrap.dedent(
    """
    import json, os, sys, torch
    from torch import nn
    from ets_hook import ETSHook
    path = sys.argv[1]
    torch.manual_seed(0)
    m = nn.Linear(8, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sys.stderr.close()
    hook = ETSHook(m, optimizer=opt, total_steps=30, status_path=path)
    during = None
    for step in range(1, 31):
        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
        if step == 10:
            with open(path) as f:
                during = json.load(f)
    hook.close()
    with open(path) as f:
        after = json.load(f)
    print(json.dumps({"during": during, "after": after}))
    """
)


def test_a_closed_stderr_leaves_the_status_file_working(tmp_path: Path) -> None:
    """The user trial: ``sys.stderr.close()`` before the hook. The log reporter cannot write,
    but the status file is written at its milestones and at close (before: never written, the
    failure's own log line having disabled every reporter)."""
    path = tmp_path / "st.json"
    run = subprocess.run(
        [sys.executable, "-c", CLOSED_STDERR, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, (run.stdout, run.stderr)
    docs = json.loads(run.stdout)
    assert docs["during"]["state"] == "running"
    assert docs["during"]["prediction"]["step"] >= 5
    assert docs["after"]["state"] == "closed"
    assert docs["after"]["prediction"]["step"] == 30
