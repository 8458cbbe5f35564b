"""``ets-hook demo`` with ``ETS_HOOK_DISABLE`` set, run through the installed entry point.

The demo shows the hook, which the switch turns off: it refuses at once, one usage-error line
(``ets-hook demo: error: ...``, exit 2, as cli/common.py's other input errors), without
importing torch, building the native op observer or writing any file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ETS_HOOK = Path(sys.executable).with_name("ets-hook")


@pytest.mark.parametrize("value", ["1", "true"])
def test_demo_with_the_hook_disabled_refuses_without_doing_anything(
    value: str, tmp_path: Path
) -> None:
    assert ETS_HOOK.is_file(), f"the console script is not installed next to python: {ETS_HOOK}"
    cache = tmp_path / "cache"  # where the native op observer would be built
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "ETS_HOOK_DISABLE": value,
        "ETS_HOOK_CACHE_DIR": str(cache),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    args = ["demo", "--steps", "20", "--model", "gpt", "--trace", str(work / "demo.ets")]
    run = subprocess.run(
        [sys.executable, "-X", "importtime", str(ETS_HOOK), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=work,
        env=env,
    )
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == ""
    said = [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
    assert len(said) == 1, run.stderr
    assert said[0].startswith("ets-hook demo: error: "), said
    assert f"ETS_HOOK_DISABLE={value} " in said[0], said
    assert "Traceback" not in run.stderr
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in run.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "ets_hook.cli.demo" in imported  # the check sees the package's own imports
    assert "torch" not in imported  # nothing was trained, nothing built
    # Nothing written: no observer build, no trace, no file in the working directory.
    assert not cache.exists()
    assert not (tmp_path / "xdg").exists()
    assert list(work.iterdir()) == []
