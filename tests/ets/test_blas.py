"""ets_hook.ets.blas: numpy's BLAS runs on one thread while the hook decodes, then is restored."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.ets import blas


def test_loaded_libraries_parses_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libfoo.so.1\n"
        "7f01-7f02 r--p 00001000 08:01 1 /usr/lib/libfoo.so.1\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f03-7f04 r-xp 00000000 08:01 2 /opt/numpy.libs/libscipy_openblas64_-x.so\n"
        "7f04-7f05 r-xp 00000000 08:01 3 /usr/bin/python3.11\n"
        "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"
        "7f06-7f07 r-xp 00000000 08:01 4 /opt/a dir/libbar.so.2 (deleted)\n"
        "7f07-7f08 r--p 00000000 08:01 5 /opt/libs.so.d/notes.txt\n"
    )
    assert blas._loaded_libraries(str(maps)) == [
        "/usr/lib/libfoo.so.1",
        "/opt/numpy.libs/libscipy_openblas64_-x.so",
        "/opt/a dir/libbar.so.2 (deleted)",
    ]
    assert blas._loaded_libraries(str(tmp_path / "missing")) == []


def _numpy_blas_has_setter() -> bool:
    return blas.blas_thread_setter() is not None


@pytest.mark.skipif(
    not _numpy_blas_has_setter(),
    reason="numpy's BLAS here has no *_set_num_threads_local (not OpenBLAS >= 0.3.27 or MKL)",
)
def test_single_threaded_blas_sets_one_thread_and_restores():
    setter = blas.blas_thread_setter()
    assert setter is not None
    before = setter(3)  # a recognisable value
    try:
        with blas.single_threaded_blas() as applied:
            assert applied
            seen_inside = setter(1)  # returns the value the context set
            # numpy still works and agrees with itself under one thread
            a = np.arange(256 * 256, dtype=np.float64).reshape(256, 256) / 1e4
            assert np.allclose(a @ a.T, (a @ a.T).T)
        restored = setter(3)
    finally:
        setter(before)
    assert seen_inside == 1
    assert restored == 3


def test_single_threaded_blas_without_a_library(monkeypatch):
    monkeypatch.setattr(blas, "_loaded_libraries", lambda maps_path="": [])
    blas.blas_thread_setter.cache_clear()
    try:
        with blas.single_threaded_blas() as applied:
            assert applied is False
    finally:
        monkeypatch.undo()
        blas.blas_thread_setter.cache_clear()


def test_hook_decodes_under_single_threaded_blas(monkeypatch):
    """The background decode (trace model included) runs inside the BLAS limit, on its thread."""
    entered: list[str] = []
    original = blas.single_threaded_blas

    @contextlib.contextmanager
    def recording():
        entered.append(threading.current_thread().name)
        with original() as applied:
            yield applied

    monkeypatch.setattr("ets_hook.hook.single_threaded_blas", recording)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    assert hook.wait_for_trace(60) is not None
    hook.close()
    assert entered == ["ets-hook-decode"]
