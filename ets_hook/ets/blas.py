"""One BLAS thread for the hook's own numpy work (the background decode and trace model).

Why: numpy wheels bundle OpenBLAS, whose worker threads busy-wait for about 0.1 s after every
multi-threaded call. The trace model's matrix products woke them from the decode thread, and
they then took the cores away from the training loop: on 2 cores the ~7 training steps after
each decode ran 3-20x slower (``mlp-w128``: 9-39 ms instead of ~2 ms); with one BLAS thread
those steps ran at their normal speed.

``single_threaded_blas()`` calls the library's ``*_set_num_threads_local`` (OpenBLAS >= 0.3.27,
MKL), which returns the previous value, and restores it on exit. MKL and OpenMP builds of
OpenBLAS apply it to the calling thread only; the pthreads OpenBLAS in numpy's wheels applies
it process-wide, so numpy calls on other threads (rare inside a training loop) also run on one
BLAS thread while the decode lasts (0.05-0.5 s). Where neither library is found (another BLAS,
no ``/proc/self/maps``) it does nothing and yields False.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np  # noqa: F401  (loads numpy's BLAS before the libraries are scanned)

# (library file-name marker, its ``*_set_num_threads_local``: returns the previous value)
_LOCAL_SETTERS = (
    ("openblas", "openblas_set_num_threads_local"),
    ("mkl", "mkl_set_num_threads_local"),
)


# A maps line's path (after its five fields) whose last component names a shared library.
_MAPPED_LIBRARY = re.compile(r"^(?:\S+[ \t]+){5}(/[^\n]*?\.so[^/\n]*?)[ \t]*$", re.MULTILINE)


def _loaded_libraries(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of the shared libraries mapped into this process (Linux), in load order. One
    regex pass over the file (~0.4 ms for a torch process's ~2,000 lines; per line in Python,
    1.0-1.2 ms: paid by every hook's constructor)."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            text = maps.read()
    except OSError:
        return []
    return list(dict.fromkeys(_MAPPED_LIBRARY.findall(text)))


@functools.cache
def blas_thread_setter() -> Callable[[int], int] | None:
    """The setter of numpy's BLAS thread count, found once per process (module docs).

    Returns:
        ``set(n) -> previous``: the library's ``*_set_num_threads_local``; None when no
        OpenBLAS or MKL with that symbol is loaded (or ``/proc/self/maps`` is unreadable).
    """
    for path in _loaded_libraries():
        name = Path(path).name.lower()
        for marker, symbol in _LOCAL_SETTERS:
            if marker not in name:
                continue
            try:
                function = getattr(ctypes.CDLL(path), symbol)
            except (OSError, AttributeError):
                continue
            function.argtypes = [ctypes.c_int]
            function.restype = ctypes.c_int
            return function
    return None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[bool]:
    """Run the body with one BLAS thread (module docs), restoring the previous count on exit.

    Yields:
        Whether the thread count could be set (False: the body runs unchanged).
    """
    setter = blas_thread_setter()
    if setter is None:
        yield False
        return
    previous = setter(1)
    try:
        yield True
    finally:
        setter(previous)
