"""ets-hook: early, honest training-time prediction for PyTorch jobs.

``ETSHook`` (and everything that needs torch) is imported lazily, so ``import ets_hook`` and the
trace/encoder/predictor modules stay usable on machines where importing torch is slow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .trace import (
    CaptureInfo,
    DeviceInfo,
    HostInfo,
    IterationTrace,
    KernelEvent,
    KernelKind,
    OpEvent,
    Phase,
    Trace,
)

__version__ = "0.1.0"

__all__ = [
    "CaptureInfo",
    "DeadlineExceededError",
    "DeviceInfo",
    "ETSHook",
    "HostInfo",
    "IterationTrace",
    "JobModel",
    "KernelEvent",
    "KernelKind",
    "OpEvent",
    "Phase",
    "Prediction",
    "Trace",
    "TraceEstimate",
    "__version__",
]

if TYPE_CHECKING:
    from .estimators import TraceEstimate
    from .hook import ETSHook
    from .jobmodel import JobModel
    from .prediction import Prediction
    from .reporting import DeadlineExceededError

_LAZY = {
    "ETSHook": ("hook", "ETSHook"),
    "Prediction": ("prediction", "Prediction"),
    "JobModel": ("jobmodel", "JobModel"),
    "TraceEstimate": ("estimators", "TraceEstimate"),
    "DeadlineExceededError": ("reporting", "DeadlineExceededError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module_name}", __name__), attr)
    raise AttributeError(f"module 'ets_hook' has no attribute {name!r}")
