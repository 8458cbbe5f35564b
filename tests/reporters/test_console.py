"""reporters.console: ETA lines on stderr by default, never twice, never through a progress bar."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap

import pytest

from ets_hook.reporters.console import ConsoleHandler, ensure_console_handler

SCRIPT = textwrap.dedent(
    """
    import logging, sys, torch
    mode = sys.argv[1]
    if mode == "configured":
        logging.basicConfig(level=logging.INFO, format="APP %(name)s %(message)s")
    from ets_hook import ETSHook
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=40, capture_steps=0,
                   verbose=mode != "quiet", log_every=None if mode == "no-lines" else 100)
    for _ in range(40):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    hook.close()
    ETSHook(torch.nn.Linear(2, 2), total_steps=5, capture_steps=0, log_every=None,
            verbose=mode != "quiet").close()
    """
)
MODES = ("default", "quiet", "configured", "no-lines")


@pytest.fixture(scope="module")
def runs() -> dict[str, str]:
    """stderr of the script in each mode (run at once, separate processes)."""
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", SCRIPT, mode], stderr=subprocess.PIPE, text=True
        )
        for mode in MODES
    }
    out = {}
    for mode, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        out[mode] = err
    return out


def _lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def test_notes_carry_the_prefix_once_on_stderr_and_none_in_the_apps_handlers(runs) -> None:
    """A warning (a hook closed without a step): ``ets-hook: ...`` from our handler; through
    the application's formatter, which names the logger, no ``ets-hook:`` of its own (before:
    ``ets_hook: ets-hook: ...`` beside ``ets_hook: step 3/60 ...``)."""
    note = "closed without a single training step"
    assert _lines(runs["default"], f"ets-hook: {note}")
    assert "ets-hook: ets-hook:" not in runs["default"]
    assert _lines(runs["configured"], f"APP ets_hook {note}")


def test_lines_show_on_stderr_by_default(runs) -> None:
    lines = _lines(runs["default"], "ets-hook: step ")
    assert [line.split()[2].split("/")[0] for line in lines[:3]] == ["1", "3", "5"]
    assert all("s/step" in line and "ETA" in line for line in lines)
    assert _lines(runs["default"], "ets-hook: finished at step 40")


def test_verbose_false_shows_nothing(runs) -> None:
    """Warnings included: before, Python's last-resort handler printed them bare."""
    assert "ets-hook" not in runs["quiet"]
    assert "closed without a single training step" not in runs["quiet"]
    assert runs["quiet"].strip() == "", runs["quiet"]


def test_configured_logging_gets_each_line_once_through_its_own_handlers(runs) -> None:
    err = runs["configured"]
    assert _lines(err, "APP ets_hook step 1/40")
    assert not _lines(err, "ets-hook: step ")  # our handler stepped aside


def test_log_every_none_means_no_lines(runs) -> None:
    assert "step 1/40" not in runs["no-lines"]
    assert "finished at step 40" not in runs["no-lines"]  # an INFO line


def test_without_lines_warnings_still_come_out_as_ets_hooks(runs) -> None:
    """``log_every=None``: no ETA lines, but a warning is ets-hook's, prefixed (before: bare,
    through Python's last-resort handler, so nothing said which library wrote it)."""
    assert _lines(runs["no-lines"], "ets-hook: closed without a single training step")
    assert not _lines(runs["no-lines"], "closed without a single training step")


def test_lines_go_through_tqdm_write_when_tqdm_is_loaded(monkeypatch) -> None:
    tqdm = pytest.importorskip("tqdm")
    written: list[str] = []
    monkeypatch.setattr(
        tqdm.tqdm, "write", classmethod(lambda cls, s, file=None: written.append(s))
    )
    handler = ConsoleHandler(io.StringIO())
    record = logging.LogRecord("ets_hook", logging.INFO, __file__, 1, "step %d", (3,), None)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    handler.emit(record)
    assert written == ["ets-hook: step 3"]


def test_the_handler_is_attached_once_and_only_without_logging(monkeypatch) -> None:
    logger = logging.getLogger("ets_hook")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    first = ensure_console_handler(io.StringIO())
    assert isinstance(first, ConsoleHandler) and ensure_console_handler() is first
    assert logger.handlers == [first] and logger.level == logging.INFO
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    assert ensure_console_handler() is None and logger.handlers == []


def test_a_rank_without_log_lines_keeps_its_notes_below_warning_to_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """torchrun scripts often call logging.basicConfig(level=INFO) on every rank: a note such
    as "capture dropped" must then come from the log ranks only; warnings from every rank."""
    from ets_hook.reporters.builder import build_reporters
    from ets_hook.reporters.console import quiet_below_warning

    ours = logging.getLogger("ets_hook")
    caplog.set_level(logging.INFO, logger="ets_hook")
    try:
        build_reporters(log_every_n_steps=None, rank=1, world_size=2)  # log_ranks=(0,)
        ours.info("ets-hook: a note")
        ours.warning("ets-hook: this rank's own trouble")
        assert [r.getMessage() for r in caplog.records] == ["ets-hook: this rank's own trouble"]
        caplog.clear()
        build_reporters(log_every_n_steps=None, rank=1, world_size=2, log_ranks=None)
        ours.info("ets-hook: a note")
        assert [r.getMessage() for r in caplog.records] == ["ets-hook: a note"]
    finally:
        quiet_below_warning(False)
