"""Build and load ``ets_hook._ops``, the native operator observer, against the installed torch.

Why at run time: the observer calls libtorch's C++ API, so it must be compiled against the torch
the job imports (headers, C++ ABI, the library it links). pip's build isolation would install
another torch (a multi-GB CUDA wheel of whatever version resolves) into the build environment,
and a torch upgraded after install would break an install-time build anyway. So the observer is
compiled on first use (about 4 s with g++ on 2 cores) into a per-user cache keyed by everything
the binary depends on, and loaded from there; ``ets-hook build-ops`` does the same ahead of time
(for images and clusters). Until it is ready, op capture uses the torch profiler.

Cache: ``$ETS_HOOK_CACHE_DIR``, else ``$XDG_CACHE_HOME/ets-hook``, else ``~/.cache/ets-hook``;
one folder per key (source hash, torch version and build, C++ ABI, Python ABI), written
atomically under a file lock, so concurrent processes (ranks of one job) build once. The compile
runs in a child process that installs the module and holds the lock until done, so a build
outlives a job shorter than it; a failed build is reported, and not retried, for the rest of the
process; a truncated cached module is rebuilt, never imported.

Supported torch: 2.2 and newer (the package's own floor); the RecordFunction API the observer
uses (global callbacks with ids and inputs, ``handle``, ``seqNr``, ``forwardThreadId``) is
unchanged across that range. The check is the build itself: a torch whose headers do not fit
fails to compile, is recorded as the reason, and the hook uses the profiler.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import NativeOpsBuildError

#: The observer's sources, looked up in the wheel (``_ops_src``) or the source checkout (csrc/).
SOURCES = ("ops_observer.cpp", "string_table.cpp", "string_table.h")
MODULE_NAME = "ets_hook._ops"
BUILD_TIMEOUT_S = 300.0

#: ``unavailable_reason`` while no module is cached for this torch (and no build failed).
NOT_BUILT = "not built yet for this torch"

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None
_missing = False  # the last ``load`` found no valid module (a build would help)
_background: threading.Thread | None = None
#: Builds that failed in this process, by output path (the cache folder and key), and why.
_failed_builds: dict[Path, str] = {}


@dataclass(frozen=True, slots=True)
class BuildPlan:
    """Everything one build of the observer depends on.

    Attributes:
        sources: the C++ files to compile (absolute paths).
        output: where the extension module goes (inside the cache folder ``key`` names).
        command: the compiler command line.
        key: the cache key (hex), a hash of the sources and the build inputs.
        torch_version: ``torch.__version__`` the module is built against.
    """

    sources: tuple[Path, ...]
    output: Path
    command: tuple[str, ...]
    key: str
    torch_version: str


def cache_dir() -> Path:
    """The folder compiled observers are cached in (not created here).

    Returns:
        ``$ETS_HOOK_CACHE_DIR``, else ``$XDG_CACHE_HOME/ets-hook``, else ``~/.cache/ets-hook``.
    """
    explicit = os.environ.get("ETS_HOOK_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ets-hook"


def source_dir() -> Path | None:
    """The folder holding the observer's sources: in the installed wheel, or the checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_ops_src", here.parents[1] / "csrc"):
        if all((candidate / name).is_file() for name in SOURCES):
            return candidate
    return None


def build_plan() -> BuildPlan:
    """The build for the running interpreter and torch.

    Returns:
        The plan (nothing is run).

    Raises:
        NativeOpsBuildError: no sources, no C++ compiler, or torch's headers are missing.
    """
    import torch

    sources = source_dir()
    if sources is None:
        raise NativeOpsBuildError("the observer's C++ sources are not installed")
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        raise NativeOpsBuildError("no C++ compiler found (set CXX or install g++)")
    torch_dir = Path(torch.__file__).resolve().parent
    include = torch_dir / "include"
    if not (include / "ATen" / "record_function.h").is_file():
        raise NativeOpsBuildError(f"torch's C++ headers are missing under {include}")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cpp = [sources / name for name in SOURCES if name.endswith(".cpp")]
    flags = (
        "-O2",
        "-DNDEBUG",  # RecordFunction::inputs() asserts outside a start callback without it
        "-std=c++20",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f'-DETS_TORCH_VERSION="{torch.__version__}"',
        f"-I{sources}",
        f"-I{include}",
        f"-I{sysconfig.get_paths()['include']}",
    )
    links = (f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}")
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((sources / name).read_bytes())
    for part in (*flags[:-3], *links[1:3], torch.__version__, str(torch.version.git_version)):
        digest.update(part.encode())
    digest.update(sys.implementation.cache_tag.encode())
    key = digest.hexdigest()[:16]
    output = cache_dir() / f"ops-{torch.__version__}-{key}" / f"_ops{suffix}"
    command = (compiler, *flags, *map(str, cpp), *links, "-o")
    return BuildPlan(tuple(cpp), output, command, key, torch.__version__)


def build(*, force: bool = False, nice: bool = False) -> Path:
    """Compile the observer into the cache unless a valid module is there already.

    The compile runs in a child process (``_INSTALLER``) that renames the module into place
    itself and holds the folder's build lock until it is done, so a build this process started
    completes, installs and unlocks even when the process exits first (a short job, whose
    build thread is a daemon): a later process waiting on the lock then finds the module.
    While the lock is held, temporary files left by killed builds are removed. A failure is
    remembered for the process (``load`` reports it rather than building again).

    Args:
        force: rebuild even when a cached module exists.
        nice: run the compiler at the lowest CPU priority (a build beside a training job).

    Returns:
        The path of the compiled extension module.

    Raises:
        NativeOpsBuildError: no sources or compiler, or the compile failed (the message holds
            the compiler's last lines), or it ran past ``BUILD_TIMEOUT_S``.
        OSError: the cache folder cannot be created or written.
    """
    plan = build_plan()
    if not force and module_problem(plan.output) is None:
        return plan.output
    try:
        _build_locked(plan, force=force, nice=nice)
    except Exception as exc:
        _failed_builds[plan.output] = _failure_reason(exc)
        raise
    _failed_builds.pop(plan.output, None)
    return plan.output


def _build_locked(plan: BuildPlan, *, force: bool, nice: bool) -> None:
    """``build``'s compile and install, under the cache folder's lock.

    Args:
        plan: the build.
        force: rebuild even when the cached module is valid.
        nice: prefix the compiler with ``nice -n 19``.

    Raises:
        NativeOpsBuildError: the compile failed or timed out, or wrote no valid module.
        OSError: the cache folder cannot be created or written.
    """
    folder = plan.output.parent
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process may be building the same key
        if not force and module_problem(plan.output) is None:
            return
        for stale in folder.glob(".build-*"):  # left by killed builds: no one builds now
            with contextlib.suppress(OSError):
                stale.unlink()
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".build-", suffix=".so")
        os.close(fd)
        command = [*plan.command, tmp]
        if nice and shutil.which("nice"):
            command = ["nice", "-n", "19", *command]
        installer = [sys.executable, "-I", "-S", "-c", _INSTALLER, tmp, str(plan.output)]
        child = subprocess.Popen(
            [*installer, str(BUILD_TIMEOUT_S), *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(lock_file.fileno(),),  # the lock is held until the child exits
            start_new_session=True,  # the job's Ctrl-C or hang-up does not stop it
        )
        try:
            _, err = child.communicate(timeout=BUILD_TIMEOUT_S + INSTALLER_GRACE_S)
        except subprocess.TimeoutExpired as exc:  # the child's own timeout did not end it
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise NativeOpsBuildError(
                f"compiling the op observer took over {BUILD_TIMEOUT_S} s"
            ) from exc
        if child.returncode != 0:
            message = err.decode(errors="replace").strip()
            raise NativeOpsBuildError(
                message or f"compiling the op observer failed (exit status {child.returncode})"
            )
    problem = module_problem(plan.output)
    if problem is not None:
        raise NativeOpsBuildError(f"the compiler wrote no valid module: {problem}")


#: ``build``'s child: ``python -I -S -c _INSTALLER TMP OUTPUT TIMEOUT_S COMPILER...``. It runs
#: the compiler (writing TMP); on success gives TMP the mode the umask allows, syncs it to disk
#: and renames it to OUTPUT (atomic: a reader sees the old module or the whole new one; synced
#: first, so a crash cannot leave a named but truncated module); on failure removes TMP and
#: writes the reason on stderr (exit status 1). It needs nothing of the process that started
#: it, which may have exited meanwhile (its message then goes nowhere).
_INSTALLER = r"""
import os, signal, subprocess, sys

tmp, output, timeout_s, *command = sys.argv[1:]


def fail(message):
    try:
        os.unlink(tmp)
    except OSError:
        pass
    try:
        os.write(2, message.encode(errors="replace"))
    except OSError:
        pass
    sys.exit(1)


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


try:
    compiler = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
except OSError as exc:
    fail(f"cannot run the compiler: {exc}")
try:
    out, _ = compiler.communicate(timeout=float(timeout_s))
except subprocess.TimeoutExpired:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)  # the compiler and its own children: all in our group
    compiler.wait()
    fail(f"compiling the op observer took over {timeout_s} s")
if compiler.returncode != 0:
    tail = "\n".join(out.decode(errors="replace").strip().splitlines()[-12:])
    fail(f"compiling the op observer failed:\n{tail}")
try:
    mask = os.umask(0)  # this process has a single thread: no one sees the 0 meanwhile
    os.umask(mask)
    os.chmod(tmp, 0o755 & ~mask)
    fsync(tmp)
    os.replace(tmp, output)
    fsync(os.path.dirname(output))
except OSError as exc:
    fail(f"installing the op observer failed: {exc}")
"""
#: How much longer than ``BUILD_TIMEOUT_S`` ``build`` waits for its child before killing it.
INSTALLER_GRACE_S = 30.0


def module_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete compiled module (a stat and 64 bytes read).

    A truncated shared object (a copy cut short, a crash before its data reached the disk)
    kills the process with SIGBUS when imported: ``dlopen`` maps past the end of the file.
    The linker writes the section header table last, so a file that ends before the end of
    the table the ELF header points to is truncated.

    Args:
        path: the cached module.

    Returns:
        None when it is an ELF file whose section header table lies within it, else the
        reason (``NOT_BUILT`` when there is no file).
    """
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            header = file.read(64)
    except (FileNotFoundError, NotADirectoryError):
        return NOT_BUILT
    except OSError as exc:
        return f"cannot read the cached module {path}: {exc.strerror or exc}"
    if header[:4] != b"\x7fELF" or len(header) < 52:
        return f"the cached module {path} is not an ELF file ({size} bytes)"
    order = "<" if header[5] == 1 else ">"  # EI_DATA: 1 little-endian, 2 big-endian
    if header[4] == 2 and len(header) == 64:  # ELF64
        (shoff,) = struct.unpack_from(order + "Q", header, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", header, 0x3A)
    elif header[4] == 1:  # ELF32
        (shoff,) = struct.unpack_from(order + "I", header, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", header, 0x2E)
    else:
        return f"the cached module {path} is not an ELF file ({size} bytes)"
    end = shoff + shentsize * shnum
    if size < end:
        return f"the cached module {path} is truncated ({size} bytes, at least {end} expected)"
    return None


def _failure_reason(exc: BaseException) -> str:
    """What ``unavailable_reason`` says about a build that raised ``exc``."""
    if isinstance(exc, OSError):
        where = f"{os.fsdecode(exc.filename)}: " if exc.filename is not None else ""
        return (
            f"cannot build it in the cache ({where}{exc.strerror or exc}); "
            "set ETS_HOOK_CACHE_DIR to a writable folder"
        )
    if isinstance(exc, NativeOpsBuildError):
        return str(exc)
    return f"building it failed: {type(exc).__name__}: {exc}"


def load(*, build_if_missing: bool = False) -> ModuleType | None:
    """The observer module for the running torch, or None (``unavailable_reason`` says why).

    A cached module that is not complete (``module_problem``) is never imported: it counts as
    not built. Once a build failed in this process, that failure is the reason and no other
    build starts here (``build`` itself still tries, e.g. ``ets-hook build-ops``).

    Args:
        build_if_missing: compile it now (blocking) when it is not cached.

    Returns:
        The loaded ``ets_hook._ops`` module, or None when it is not built (and
        ``build_if_missing`` is False) or cannot be built or loaded.
    """
    global _module, _failure, _missing
    with _lock:
        _missing = False
        if _module is not None:
            return _module
        if os.environ.get("ETS_HOOK_NATIVE_OPS", "").strip().lower() in {"0", "off", "no"}:
            _failure = "disabled by ETS_HOOK_NATIVE_OPS"
            return None
        try:
            plan = build_plan()
            problem = module_problem(plan.output)
            if problem is not None:
                failed = _failed_builds.get(plan.output)
                if failed is not None:
                    _failure = failed
                    return None
                if not build_if_missing:
                    _failure, _missing = problem, True
                    return None
                try:
                    build()
                except (NativeOpsBuildError, OSError) as exc:
                    _failure = _failed_builds.get(plan.output) or str(exc)
                    return None
            _module = _import(plan.output)
            if plan.torch_version != _module.TORCH_VERSION:
                _failure = f"built for torch {_module.TORCH_VERSION}, running {plan.torch_version}"
                _module = None
                return None
            _failure = None
        except (NativeOpsBuildError, OSError, ImportError) as exc:
            _failure = str(exc)
            return None
        return _module


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE_NAME] = module
    return module


def load_in_background() -> ModuleType | None:
    """The observer when it is cached; else start building it on a low-priority thread.

    No build starts when one failed in this process already (``load`` reports that failure)
    or one is running. Nothing the build raises leaves its thread: the reason is what
    ``unavailable_reason`` says afterwards.

    Returns:
        The module if it can be loaded now, else None (a later ``load()`` returns it once the
        background build has finished).
    """
    global _background
    module = load()
    with _lock:
        if module is not None or not _missing:
            return module
        if _background is None or not _background.is_alive():
            _background = threading.Thread(
                target=_build_quietly, name="ets-hook-build-ops", daemon=True
            )
            _background.start()
    return None


def _build_quietly() -> None:
    """``load_in_background``'s thread: build (nice'd), then load; never raises."""
    global _failure
    started = time.perf_counter()
    try:
        build(nice=True)
    except Exception as exc:  # reported (unavailable_reason), never raised into the job
        with _lock:
            _failure = _failure_reason(exc)
        return
    with _lock:
        _failure = f"built in the background in {time.perf_counter() - started:.1f} s"
    load()


def unavailable_reason() -> str | None:
    """Why the last ``load`` returned None (None when the module is loaded or never tried)."""
    return None if _module is not None else _failure
