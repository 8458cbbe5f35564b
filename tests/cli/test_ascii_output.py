"""``ets-hook`` where the output streams cannot encode its text (``LC_ALL=C``,
``PYTHONIOENCODING=ascii``), through the installed console script.

Never a ``UnicodeEncodeError``: ``±``, ``·`` and the like come out as ASCII substitutes
(``+/-``, ``|``), on stdout and in the hook's log lines on stderr (before: exit 1 with a
traceback at the first ``±``). A UTF-8 stream keeps them (test_watch.py, test_main.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import status_prediction

from ets_hook.reporters.status_file import StatusFileReporter

ETS_HOOK = Path(sys.executable).with_name("ets-hook")

#: A C locale with ASCII standard streams (what the user trial ran with).
ASCII_ENV = {
    **{k: v for k, v in os.environ.items() if k not in ("PYTHONUTF8", "LC_CTYPE")},
    "LC_ALL": "C",
    "LANG": "C",
    "PYTHONIOENCODING": "ascii",
}


def ascii_cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    """Run ``ets-hook ARGS`` with ASCII stdout and stderr; the output is left as bytes."""
    assert ETS_HOOK.is_file(), f"the console script is not installed next to python: {ETS_HOOK}"
    return subprocess.run(
        [str(ETS_HOOK), *map(str, args)], capture_output=True, timeout=timeout, env=ASCII_ENV
    )


def assert_ascii_success(run: subprocess.CompletedProcess[bytes]) -> tuple[str, str]:
    """Exit 0, no traceback, both streams pure ASCII without Python's ``\\xNN`` escapes."""
    err = run.stderr.decode("utf-8", "replace")
    assert run.returncode == 0, (run.returncode, err)
    assert "Traceback" not in err and "UnicodeEncodeError" not in err, err
    assert run.stdout.isascii() and run.stderr.isascii(), (run.stdout, run.stderr)
    out, err = run.stdout.decode("ascii"), run.stderr.decode("ascii")
    assert "\\x" not in out + err and "\\u" not in out + err, (out, err)
    return out, err


def test_watch_snapshot_on_an_ascii_stdout(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusFileReporter(path).write("running", status_prediction(300))
    out, err = assert_ascii_success(ascii_cli("watch", "--once", path))
    assert err == ""
    assert "0.412 s/step +/-1.1% (95%)  measured, converged" in out
    assert "total     13m50s +/- 20s (95%)" in out
    assert "ETA       11m40s" in out


def test_demo_on_ascii_streams() -> None:
    """The demo's own table (stdout) and the hook's log lines (stderr, ``ConsoleHandler``)."""
    out, err = assert_ascii_success(ascii_cli("demo", "--model", "mlp", "--steps", "40"))
    assert "  after step    1: " in out and "s/step +/-" in out
    assert "actual: total " in out
    steps = [line for line in err.splitlines() if line.startswith("ets-hook: step ")]
    assert steps and all(" | " in line and "s/step +/-" in line for line in steps), err
    assert "ets-hook: finished at step 40" in err
