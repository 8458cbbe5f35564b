"""trace.atomic: an error names the file the caller asked for, never ets-hook's temp file, and
no temp file is left behind; ``check_writable`` finds a folder that takes no new file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ets_hook.trace.atomic import atomic_write_bytes, check_writable
from ets_hook.trace.chrome import write_chrome


def _no_temp_files(folder: Path) -> None:
    assert not [p.name for p in folder.rglob("*.tmp")]


def test_a_missing_folder_names_the_target(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "status.json"
    with pytest.raises(FileNotFoundError) as info:
        atomic_write_bytes(target, b"{}")
    assert info.value.filename == str(target) and info.value.filename2 is None
    assert info.value.errno == errno.ENOENT and info.value.strerror
    assert str(info.value) == f"[Errno {errno.ENOENT}] {info.value.strerror}: {str(target)!r}"


@pytest.mark.parametrize("kind", ["existing", "dot", "trailing-separator", "dotdot"])
def test_a_directory_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    (tmp_path / "d").mkdir()
    path = {
        "existing": str(tmp_path / "d"),
        "dot": str(tmp_path / "d" / "."),
        "trailing-separator": str(tmp_path / "new") + os.sep,
        "dotdot": str(tmp_path / "d" / ".."),
    }[kind]
    with pytest.raises(IsADirectoryError) as info:
        atomic_write_bytes(path, b"data")
    assert info.value.filename == path and info.value.errno == errno.EISDIR
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d"]  # nothing written, no temp file


def test_an_empty_path_is_a_missing_file_as_open_says(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        atomic_write_bytes("", b"data")
    assert info.value.filename == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("step", "error"),
    [
        ("replace", PermissionError(errno.EACCES, "Permission denied", "tmp", "target")),
        ("fsync", OSError(errno.ENOSPC, "No space left on device")),
    ],
)
def test_a_failure_after_the_temp_file_names_the_target_and_removes_it(
    tmp_path: Path, monkeypatch, step: str, error: OSError
) -> None:
    target = tmp_path / "metrics.prom"
    target.write_bytes(b"old")

    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(os, step, fail)
    with pytest.raises(type(error)) as info:
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert info.value.errno == error.errno and info.value.strerror == error.strerror
    assert info.value.filename == str(target) and info.value.filename2 is None
    assert info.value.__cause__ is error  # the original, about the temp file, is kept
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.prom"]


def test_callers_get_an_oserror_naming_their_path(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as info:
        write_chrome({"traceEvents": []}, tmp_path)
    assert info.value.filename == str(tmp_path)
    _no_temp_files(tmp_path)


def test_check_writable_creates_nothing_where_a_file_can_be_written(tmp_path: Path) -> None:
    check_writable(tmp_path / "out.ets")
    check_writable(tmp_path / "out.ets")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "out.ets").write_bytes(b"kept")
    check_writable(tmp_path / "out.ets")
    assert [p.name for p in tmp_path.iterdir()] == ["out.ets"]
    assert (tmp_path / "out.ets").read_bytes() == b"kept"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
def test_check_writable_refuses_a_folder_that_takes_no_new_file(tmp_path: Path) -> None:
    """``/proc`` is a directory that ``os.access`` says root may write, but it takes no file."""
    with pytest.raises(OSError) as info:
        check_writable("/proc/ets-hook-probe.ets")
    assert info.value.filename == "/proc/ets-hook-probe.ets"
    with pytest.raises(FileNotFoundError) as info:
        check_writable(tmp_path / "missing" / "x.ets")
    assert info.value.filename == str(tmp_path / "missing" / "x.ets")
    with pytest.raises(IsADirectoryError):
        check_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []
