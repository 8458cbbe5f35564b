"""Build ets_hook._C (pybind11 only: no torch headers, no libtorch, no CUDA libraries linked).

CUPTI support is compiled in when CUPTI headers are found under $CUDA_HOME, $CUDA_PATH or
/usr/local/cuda (include/ or extras/CUPTI/include/). libcupti itself is never linked: the extension
dlopen()s it at run time, so the same build imports on machines without CUDA.

Environment knobs:
  ETS_HOOK_NO_CUPTI=1   build without CUPTI even when headers exist (status: "no_headers")
  ETS_HOOK_DEBUG=1      -O0 -g (fast to compile; used by the no-CUPTI build test)
  MAX_JOBS=N            parallel compilation of the translation units (default: CPU count)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCES = [
    "csrc/bindings.cpp",
    "csrc/string_table.cpp",
    "csrc/cupti_api.cpp",
    "csrc/activity_collector.cpp",
    "csrc/cupti_controller.cpp",
    "csrc/testing.cpp",
]
_TRUE = {"1", "true", "yes", "on"}


def _cupti_include_dirs() -> list[str]:
    """Include dirs holding cupti.h and cuda.h, or [] when CUPTI is not to be compiled in."""
    if os.environ.get("ETS_HOOK_NO_CUPTI", "").strip().lower() in _TRUE:
        return []
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, roots):
        base = Path(root)
        cuda_h = base / "include" / "cuda.h"
        for inc in (base / "include", base / "extras" / "CUPTI" / "include"):
            if (inc / "cupti.h").is_file() and cuda_h.is_file():
                return sorted({str(inc), str(cuda_h.parent)})
    return []


def _newest_struct(include_dirs: list[str], stem: str) -> str | None:
    """Newest version of an activity struct the headers declare, e.g. CUpti_ActivityKernel10."""
    pattern = re.compile(r"}\s*(" + stem + r"(\d*))\s*;")
    best: tuple[int, str] | None = None
    for inc in include_dirs:
        for header in ("cupti_activity.h", "cupti_activity_deprecated.h"):
            path = Path(inc) / header
            if not path.is_file():
                continue
            for match in pattern.finditer(path.read_text(errors="replace")):
                version = int(match.group(2) or 1)
                if best is None or version > best[0]:
                    best = (version, match.group(1))
    return best[1] if best else None


def _extension() -> Pybind11Extension:
    include_dirs = _cupti_include_dirs()
    macros: list[tuple[str, str | None]] = []
    if include_dirs:
        macros.append(("ETS_HAVE_CUPTI", "1"))
        for macro, stem in (
            ("ETS_CUPTI_KERNEL_T", "CUpti_ActivityKernel"),
            ("ETS_CUPTI_MEMCPY_T", "CUpti_ActivityMemcpy"),
            ("ETS_CUPTI_MEMSET_T", "CUpti_ActivityMemset"),
        ):
            struct = _newest_struct(include_dirs, stem)
            if struct:
                macros.append((macro, struct))
    debug = os.environ.get("ETS_HOOK_DEBUG", "").strip().lower() in _TRUE
    flags = ["-O0", "-g"] if debug else ["-O3"]
    print(
        "ets_hook._C: CUPTI "
        + (
            f"compiled in ({', '.join(include_dirs)}; {dict(macros)})"
            if include_dirs
            else "disabled"
        )
    )
    return Pybind11Extension(
        "ets_hook._C",
        sources=SOURCES,
        depends=sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.h")),
        include_dirs=["csrc", *include_dirs],
        define_macros=macros,
        extra_compile_args=[*flags, "-Wall", "-Wextra", "-Wno-unused-parameter"],
        libraries=["dl"],
        cxx_std=17,
    )


# The operator observer (ets_hook._ops) is compiled at run time against the torch the job imports
# (ets_hook/capture/native_ops.py), so its sources ship inside the package.
OPS_SOURCES = ("ops_observer.cpp", "string_table.cpp", "string_table.h")


class build_py_with_ops_sources(build_py):
    """build_py that also copies the observer's C++ sources to ets_hook/capture/_ops_src/."""

    def run(self) -> None:
        self._remove_stale_modules()
        super().run()
        target = Path(self.build_lib) / "ets_hook" / "capture" / "_ops_src"
        self.mkpath(str(target))
        for name in OPS_SOURCES:
            self.copy_file(str(HERE / "csrc" / name), str(target / name))

    def _remove_stale_modules(self) -> None:
        """Remove modules that build_lib kept from an earlier build but the source tree no
        longer has (moved or deleted since): a wheel built in place would ship them."""
        built = Path(self.build_lib) / "ets_hook"
        if not built.is_dir():
            return
        for path in sorted(built.rglob("*.py")):
            if not (HERE / path.relative_to(self.build_lib)).exists():
                path.unlink()


ParallelCompile("MAX_JOBS", default=0).install()
setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": build_ext, "build_py": build_py_with_ops_sources},
)
