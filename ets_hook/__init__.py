"""ets-hook: early, honest training-time prediction for PyTorch jobs.

The public API is what this module exports (plus the ``ets-hook`` command line). ``ETSHook`` and
everything else that needs torch is imported lazily, so ``import ets_hook`` and the trace model
stay usable (and fast to import) on machines where importing torch is slow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import DeadlineExceededError, TraceFileError
from .trace.events import (
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
from .trace.io import load_trace, save_trace

__version__ = "0.1.0"

__all__ = [
    "CaptureInfo",
    "DeadlineExceededError",
    "DeadlineMiss",
    "DeviceInfo",
    "ETSHook",
    "EarlyStoppingRule",
    "HostInfo",
    "IterationTrace",
    "JobModel",
    "JobView",
    "KernelEvent",
    "KernelKind",
    "OpEvent",
    "Phase",
    "PhaseForecast",
    "Prediction",
    "Trace",
    "TraceEstimate",
    "TraceFileError",
    "__version__",
    "load_trace",
    "save_trace",
]

if TYPE_CHECKING:
    from .forecast.early_stop import EarlyStoppingRule
    from .forecast.job import JobModel, PhaseForecast
    from .forecast.prediction import Prediction
    from .forecast.ranks import JobView
    from .forecast.stats import TraceEstimate
    from .hook import ETSHook
    from .reporters.deadline import DeadlineMiss

_LAZY = {
    "ETSHook": ("hook", "ETSHook"),
    "EarlyStoppingRule": ("forecast.early_stop", "EarlyStoppingRule"),
    "Prediction": ("forecast.prediction", "Prediction"),
    "JobModel": ("forecast.job", "JobModel"),
    "PhaseForecast": ("forecast.job", "PhaseForecast"),
    "JobView": ("forecast.ranks", "JobView"),
    "DeadlineMiss": ("reporters.deadline", "DeadlineMiss"),
    "TraceEstimate": ("forecast.stats", "TraceEstimate"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module_name}", __name__), attr)
    raise AttributeError(f"module 'ets_hook' has no attribute {name!r}")
