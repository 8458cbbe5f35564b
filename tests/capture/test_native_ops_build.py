"""Building and caching the native operator observer (``capture.native_ops``) where things go
wrong: an unwritable cache, a compile that fails, a job shorter than the build, a truncated
cached module. A fake compiler (``$CXX``, a shell script) stands in for g++: it writes a small
ELF file (or fails, or waits for a gate file), and logs each run with its niceness."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from ets_hook import ETSHook
from ets_hook.capture import native_ops
from ets_hook.errors import NativeOpsBuildError

SECTION_HEADERS_AT, SECTION_HEADER_SIZE, SECTION_HEADERS = 128, 64, 3
#: A little-endian ELF64 header whose section header table ends at byte 320, padded to there.
FAKE_ELF = struct.pack(
    "<4s5B7xHHIQQQIHHHHHH",
    b"\x7fELF", 2, 1, 1, 0, 0,  # ELF64, little-endian, version 1
    3, 62, 1, 0, 0, SECTION_HEADERS_AT, 0, 64, 0, 0, SECTION_HEADER_SIZE, SECTION_HEADERS, 0,
).ljust(SECTION_HEADERS_AT + SECTION_HEADER_SIZE * SECTION_HEADERS, b"\0")  # fmt: skip


class FakeCompiler:
    """A ``$CXX`` that writes ``FAKE_ELF`` to its last argument (the ``-o`` target).

    Attributes:
        path: the script.
        log: one line per run: its pid and its niceness.
        gate: with ``wait``, the script touches ``gate.started`` and waits for ``gate``.
    """

    def __init__(self, folder: Path, *, fail: str | None = None, wait: bool = False) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.log, self.gate = folder / "fake-cxx", folder / "runs", folder / "gate"
        elf = folder / "module.elf"
        elf.write_bytes(FAKE_ELF)
        waiting = (
            f'touch "{self.gate}.started"; i=0\n'
            f'while [ ! -e "{self.gate}" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n'
            if wait
            else ""
        )
        failing = f'echo "fake.cpp:1:1: error: {fail}" >&2; exit 1\n' if fail else ""
        self.path.write_text(
            "#!/bin/sh\n"
            'for arg; do out="$arg"; done\n'
            f'echo "$$ $(nice)" >> "{self.log}"\n'
            f"{waiting}{failing}"
            f'cat "{elf}" > "$out"\n'
        )
        self.path.chmod(0o755)

    def runs(self) -> list[tuple[int, int]]:
        """(pid, niceness) of each run so far."""
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [(int(pid), int(niceness)) for pid, niceness in map(str.split, lines)]


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """A process that has not loaded or built the observer, with an empty cache; importing is
    stubbed (the fake modules are not loadable): the paths ``_import`` was given."""
    imported: list[Path] = []

    def fake_import(path: Path) -> ModuleType:
        imported.append(path)
        module = ModuleType(native_ops.MODULE_NAME)
        module.TORCH_VERSION = torch.__version__  # type: ignore[attr-defined]
        return module

    for name, value in (("_module", None), ("_failure", None), ("_missing", False)):
        monkeypatch.setattr(native_ops, name, value)
    monkeypatch.setattr(native_ops, "_background", None)
    monkeypatch.setattr(native_ops, "_failed_builds", {})
    monkeypatch.setattr(native_ops, "_import", fake_import)
    monkeypatch.setenv("ETS_HOOK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ETS_HOOK_NATIVE_OPS", raising=False)
    yield imported
    if native_ops._background is not None:
        native_ops._background.join(120)


@pytest.fixture
def fake_cxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeCompiler]:
    def make(**options: object) -> FakeCompiler:
        compiler = FakeCompiler(tmp_path / "cxx", **options)  # type: ignore[arg-type]
        monkeypatch.setenv("CXX", str(compiler.path))
        return compiler

    return make


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """Exceptions that escaped a thread (what Python would print as ``Exception in thread``)."""
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


def wait_for_background_build() -> None:
    thread = native_ops._background
    assert thread is not None, native_ops.unavailable_reason()
    thread.join(120)
    assert not thread.is_alive()


def mlp_and_sgd() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


# ---------------------------------------------------------------------------------------------
# An unwritable cache


@pytest.mark.parametrize("where", ["ETS_HOOK_CACHE_DIR under a file", "HOME=/dev/null"])
def test_an_unwritable_cache_is_the_reason_and_nothing_escapes_the_build_thread(
    fresh, fake_cxx, thread_errors, tmp_path: Path, monkeypatch, where: str
) -> None:
    compiler = fake_cxx()
    if where == "HOME=/dev/null":
        monkeypatch.delenv("ETS_HOOK_CACHE_DIR")
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        monkeypatch.setenv("HOME", "/dev/null")
    else:
        (tmp_path / "a-file").write_text("")
        monkeypatch.setenv("ETS_HOOK_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    assert native_ops.load_in_background() is None
    wait_for_background_build()
    assert thread_errors == []
    reason = native_ops.unavailable_reason()
    assert reason is not None and "Not a directory" in reason, reason
    assert "ETS_HOOK_CACHE_DIR" in reason  # what to do about it
    assert native_ops.load() is None and native_ops.unavailable_reason() == reason
    assert compiler.runs() == []
    with pytest.raises(NotADirectoryError):  # ets-hook build-ops: one line from the OSError
        native_ops.build()


# ---------------------------------------------------------------------------------------------
# A failed compile


def test_a_failed_build_is_the_reason_and_no_later_hook_starts_it_again(
    fresh, fake_cxx, thread_errors
) -> None:
    """Three hooks made one after the other in a process whose compile fails: one compile; the
    compiler's error is the reason each hook's window gives, and an explicit build still runs
    the compiler again (``ets-hook build-ops``)."""
    compiler = fake_cxx(fail="'RecordFunctionCallback' was not declared in this scope")
    hooks = []
    for _ in range(3):
        model, opt = mlp_and_sgd()
        hooks.append(ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None))
        if native_ops._background is not None:
            native_ops._background.join(120)
        reason = native_ops.unavailable_reason()
        assert reason is not None and "was not declared in this scope" in reason, reason
    assert len(compiler.runs()) == 1
    assert native_ops.load() is None and native_ops.load(build_if_missing=True) is None
    assert "was not declared" in (native_ops.unavailable_reason() or "")
    assert len(compiler.runs()) == 1
    for hook in hooks:
        hook.close()
    assert thread_errors == []
    with pytest.raises(NativeOpsBuildError, match="was not declared in this scope"):
        native_ops.build(force=True)
    with pytest.raises(NativeOpsBuildError, match="was not declared in this scope"):
        native_ops.build()
    assert len(compiler.runs()) == 3


def test_the_window_of_a_hook_after_a_failed_build_says_the_compilers_error(
    fresh, fake_cxx
) -> None:
    compiler = fake_cxx(fail="expected ';' before '}' token")
    assert native_ops.load_in_background() is None
    wait_for_background_build()
    model, opt = mlp_and_sgd()
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    hook.close()
    trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert "expected ';' before '}' token" in hook.capture_status, hook.capture_status
    assert len(compiler.runs()) == 1


def test_a_build_past_the_timeout_is_stopped_and_leaves_nothing(
    fresh, fake_cxx, monkeypatch
) -> None:
    compiler = fake_cxx(wait=True)  # never opened: runs until stopped
    monkeypatch.setattr(native_ops, "BUILD_TIMEOUT_S", 0.5)
    with pytest.raises(NativeOpsBuildError, match=r"took over 0\.5 s"):
        native_ops.build()
    ((pid, _),) = compiler.runs()
    with pytest.raises(ProcessLookupError):  # the compiler is stopped (and reaped)
        os.kill(pid, 0)
    folder = native_ops.build_plan().output.parent
    assert [p.name for p in folder.iterdir()] == [".lock"]
    assert native_ops.load() is None and "took over" in (native_ops.unavailable_reason() or "")


# ---------------------------------------------------------------------------------------------
# A job shorter than the build


SHORT_JOB = textwrap.dedent(
    """
    import os, sys, time
    from ets_hook.capture import native_ops

    os.umask(0o027)
    assert native_ops.load_in_background() is None, "nothing cached yet"
    for _ in range(1200):  # exits while the compiler runs
        if os.path.exists(sys.argv[1]):
            break
        time.sleep(0.05)
    else:
        sys.exit("the compiler never started")
    print("EXIT", flush=True)
    """
)


def test_a_build_completes_and_installs_itself_after_the_job_that_started_it_exits(
    fresh, fake_cxx
) -> None:
    """The job exits while its background build compiles: the compile goes on, installs the
    module (mode from the job's umask) and holds the lock until then, so a later process
    waiting on the lock finds the module and builds nothing; stale temporary files of killed
    builds are gone."""
    compiler = fake_cxx(wait=True)
    output = native_ops.build_plan().output
    output.parent.mkdir(parents=True)
    (output.parent / ".build-killed.so").write_bytes(FAKE_ELF[:100])
    job = subprocess.run(
        [sys.executable, "-c", SHORT_JOB, f"{compiler.gate}.started"],
        capture_output=True, text=True, timeout=300, check=False, env=os.environ.copy(),
    )  # fmt: skip
    assert job.returncode == 0 and "EXIT" in job.stdout, job.stderr
    assert job.stderr == ""  # nothing printed into the job
    assert not output.exists()  # the compiler still waits for its gate
    compiler.gate.touch()
    with open(output.parent / ".lock") as lock:  # a later process, waiting for the build
        for _ in range(1200):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                threading.Event().wait(0.05)
        else:
            pytest.fail("the build never released its lock")
    assert output.read_bytes() == FAKE_ELF
    assert stat.S_IMODE(output.stat().st_mode) == 0o750  # 0o755 under the job's umask 0o027
    assert sorted(p.name for p in output.parent.iterdir()) == [".lock", output.name]
    ((_, niceness),) = compiler.runs()
    assert niceness == 19  # a background build, beside the job's training
    assert native_ops.load_in_background() is not None  # found, nothing built
    assert fresh == [output] and len(compiler.runs()) == 1


# ---------------------------------------------------------------------------------------------
# A truncated cached module


def test_module_problem_accepts_a_complete_module_and_names_what_is_wrong_otherwise(
    native_ops_built: str | None, tmp_path: Path
) -> None:
    path = tmp_path / "_ops.so"
    assert native_ops.module_problem(path) == native_ops.NOT_BUILT
    assert native_ops.module_problem(tmp_path / "a-file" / "x.so") == native_ops.NOT_BUILT
    path.write_bytes(FAKE_ELF)
    assert native_ops.module_problem(path) is None
    path.write_bytes(FAKE_ELF + b"more")
    assert native_ops.module_problem(path) is None
    for cut in (0, 10, 63, len(FAKE_ELF) - 1):
        path.write_bytes(FAKE_ELF[:cut])
        problem = native_ops.module_problem(path)
        assert problem is not None and str(path) in problem, cut
        assert ("truncated" if cut >= 64 else "not an ELF file") in problem
    path.write_bytes(b"#!/bin/sh\n" * 40)
    assert "not an ELF file" in (native_ops.module_problem(path) or "")
    # the real module, and the same cut short
    assert native_ops_built is None, native_ops_built
    real = native_ops.build_plan().output
    assert native_ops.module_problem(real) is None
    path.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    assert "truncated" in (native_ops.module_problem(path) or "")


@pytest.mark.parametrize("via", ["load_in_background", "build"])
def test_a_truncated_cached_module_is_rebuilt_and_never_imported(fresh, fake_cxx, via: str) -> None:
    compiler = fake_cxx()
    output = native_ops.build_plan().output
    output.parent.mkdir(parents=True)
    output.write_bytes(FAKE_ELF[:200])
    assert native_ops.load() is None
    assert "truncated" in (native_ops.unavailable_reason() or "")
    assert fresh == []  # not imported
    if via == "build":
        assert native_ops.build() == output
    else:
        assert native_ops.load_in_background() is None
        wait_for_background_build()
    assert output.read_bytes() == FAKE_ELF and len(compiler.runs()) == 1
    assert native_ops.load() is not None
    assert fresh == [output]


TRUNCATED = textwrap.dedent(
    """
    from ets_hook.capture import native_ops

    print("LOAD", native_ops.load(), native_ops.unavailable_reason(), flush=True)
    print("BUILD", native_ops.load(build_if_missing=True), native_ops.unavailable_reason())
    """
)


def test_a_truncated_real_module_in_the_cache_does_not_kill_the_process(
    native_ops_built: str | None, tmp_path: Path
) -> None:
    """Imported, the module cut short kills the process with SIGBUS (or fails to load)."""
    assert native_ops_built is None, native_ops_built
    real = native_ops.build_plan().output
    compiler = FakeCompiler(tmp_path / "cxx", fail="no compiler today")
    env = {**os.environ, "ETS_HOOK_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(compiler.path)}
    cached = tmp_path / "cache" / real.parent.name / real.name
    cached.parent.mkdir(parents=True)
    shutil.copyfile(real, cached)
    with open(cached, "r+b") as file:
        file.truncate(real.stat().st_size * 2 // 3)
    run = subprocess.run(
        [sys.executable, "-c", TRUNCATED], env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stderr)
    assert f"LOAD None the cached module {cached} is truncated" in run.stdout, run.stdout
    assert "BUILD None compiling the op observer failed" in run.stdout, run.stdout
    assert "no compiler today" in run.stdout
