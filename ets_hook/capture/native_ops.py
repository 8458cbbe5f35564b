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
atomically under a file lock, so concurrent processes (ranks of one job) build once.

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

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None
_background: threading.Thread | None = None


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
    """Compile the observer into the cache unless it is there already.

    Args:
        force: rebuild even when a cached module exists.
        nice: run the compiler at the lowest CPU priority (a build beside a training job).

    Returns:
        The path of the compiled extension module.

    Raises:
        NativeOpsBuildError: no sources or compiler, or the compile failed (the message holds
            the compiler's last lines), or it ran past ``BUILD_TIMEOUT_S``.
    """
    plan = build_plan()
    if plan.output.is_file() and not force:
        return plan.output
    plan.output.parent.mkdir(parents=True, exist_ok=True)
    with open(plan.output.parent / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process may be building the same key
        if plan.output.is_file() and not force:
            return plan.output
        fd, tmp = tempfile.mkstemp(dir=plan.output.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        command = [*plan.command, tmp]
        if nice and shutil.which("nice"):
            command = ["nice", "-n", "19", *command]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
            )
            if result.returncode != 0:
                tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-12:])
                raise NativeOpsBuildError(f"compiling the op observer failed:\n{tail}")
            os.chmod(tmp, 0o755 & ~_umask())
            os.replace(tmp, plan.output)
        except subprocess.TimeoutExpired as exc:
            raise NativeOpsBuildError(
                f"compiling the op observer took over {exc.timeout} s"
            ) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return plan.output


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load(*, build_if_missing: bool = False) -> ModuleType | None:
    """The observer module for the running torch, or None (``unavailable_reason`` says why).

    Args:
        build_if_missing: compile it now (blocking) when it is not cached.

    Returns:
        The loaded ``ets_hook._ops`` module, or None when it is not built (and
        ``build_if_missing`` is False) or cannot be built or loaded.
    """
    global _module, _failure
    with _lock:
        if _module is not None:
            return _module
        if os.environ.get("ETS_HOOK_NATIVE_OPS", "").strip().lower() in {"0", "off", "no"}:
            _failure = "disabled by ETS_HOOK_NATIVE_OPS"
            return None
        try:
            plan = build_plan()
            path = build() if build_if_missing else plan.output
            if not path.is_file():
                _failure = "not built yet for this torch"
                return None
            _module = _import(path)
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

    Returns:
        The module if it can be loaded now, else None (a later ``load()`` returns it once the
        background build has finished).
    """
    global _background, _failure
    module = load()
    if module is not None or _failure != "not built yet for this torch":
        return module
    with _lock:
        if _background is None or not _background.is_alive():
            _background = threading.Thread(
                target=_build_quietly, name="ets-hook-build-ops", daemon=True
            )
            _background.start()
    return None


def _build_quietly() -> None:
    global _failure
    started = time.perf_counter()
    try:
        build(nice=True)
    except NativeOpsBuildError as exc:
        with _lock:
            _failure = str(exc)
        return
    with _lock:
        _failure = f"built in the background in {time.perf_counter() - started:.1f} s"
    load()


def unavailable_reason() -> str | None:
    """Why the last ``load`` returned None (None when the module is loaded or never tried)."""
    return None if _module is not None else _failure
