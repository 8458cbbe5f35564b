"""Shared pytest configuration.

- The ``requires_cuda`` marker skips where no usable GPU exists.
- The native operator observer (``ets_hook._ops``) is built once per session into a private
  cache (``ETS_HOOK_CACHE_DIR``, inherited by subprocesses), so every test that captures ops
  runs the native path; ``tests/capture/test_native_ops.py`` fails if it could not be built.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

_CACHE = tempfile.mkdtemp(prefix="ets-hook-test-cache-")
os.environ["ETS_HOOK_CACHE_DIR"] = _CACHE


@functools.cache
def _cuda_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a CUDA build of PyTorch")
    for item in items:
        if "requires_cuda" in item.keywords and not _cuda_usable():
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def native_ops_built() -> str | None:
    """Build the observer before the first test; the build error (or None) for tests to show."""
    from ets_hook.capture import native_ops
    from ets_hook.errors import NativeOpsBuildError

    try:
        native_ops.build()
    except NativeOpsBuildError as exc:
        return str(exc)
    return None


@pytest.fixture(autouse=True)
def _ranks_notes_restored() -> Iterator[None]:
    """Each test starts as a rank that logs: one that builds reporters for a rank without log
    lines makes this process keep ets-hook's INFO notes to itself from then on
    (``console.quiet_below_warning``: process-wide, as a process is one rank)."""
    yield
    from ets_hook.reporters.console import quiet_below_warning

    quiet_below_warning(False)


@pytest.fixture(autouse=True)
def _logging_left_enabled() -> Iterator[None]:
    """A test that leaves ``logging.disable`` set (code it calls in-process that quiets logging
    for its run and does not restore it) fails, instead of silencing later tests' log lines."""
    yield
    import logging

    disabled = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    assert disabled == logging.NOTSET, f"the test left logging.disable({disabled}) set"


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)
