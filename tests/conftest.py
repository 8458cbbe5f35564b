"""Shared pytest configuration: the ``requires_cuda`` marker skips where no usable GPU exists."""

from __future__ import annotations

import functools

import pytest


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
