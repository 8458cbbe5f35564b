"""``Prediction``: one frozen, JSON-serialisable forecast of a job (what reporters receive)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

from .job import PhaseForecast
from .stats import (
    DEFAULT_LEVEL,
)


def utc_from_timestamp(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


@dataclass(frozen=True, slots=True)
class Prediction:
    """What ets-hook predicts, as of the last step (or phase) the forecaster was told about.

    Times are seconds; ``*_ci_s`` are half-widths of ``level`` (95%) intervals. Fields that need
    the job length (``total_steps``) are None while it is unknown.
    """

    # Completed training steps (global, including ``JobModel.initial_step``).
    step: int
    total_steps: int | None
    remaining_steps: int | None
    # Steady-state mean time of one training step (marked phases excluded).
    iteration_s: float
    iteration_ci_s: float
    # Wall time from hook creation to the end of the last step, and what is left of it.
    total_s: float | None
    total_ci_s: float | None
    eta_s: float | None
    elapsed_s: float
    finish_time: datetime | None
    converged: bool
    # "prior", "measured", "trace" (or the trace estimator's own label) or "fused".
    source: str
    level: float = DEFAULT_LEVEL
    iteration_median_s: float | None = None
    warmup_steps: int = 0
    measured_steps: int = 0
    measured_iteration_s: float | None = None
    measured_ci_s: float | None = None
    trace_iteration_s: float | None = None
    trace_ci_s: float | None = None
    # Per-step wall time the step durations do not cover (should be ~0), projected per step.
    overhead_per_step_s: float = 0.0
    # Projected time of the remaining non-training phases, and each phase.
    remaining_phase_s: float = 0.0
    # Cost still to come from ets-hook's own capture (window steps not yet run, the one-off
    # profiler disable and decode after it); 0 once the step after the window has ended.
    remaining_capture_s: float = 0.0
    phases: tuple[PhaseForecast, ...] = ()
    start_time: datetime | None = None
    as_of: datetime | None = None

    @property
    def iteration_rel_ci(self) -> float:
        """Relative half-width of the step-time interval (0.011 = ±1.1%)."""
        return self.iteration_ci_s / self.iteration_s if self.iteration_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: datetimes as ISO 8601 with offset, non-finite floats as None."""
        out: dict[str, Any] = {f.name: _json_safe(getattr(self, f.name)) for f in fields(self)}
        out["iteration_rel_ci"] = _json_safe(self.iteration_rel_ci)
        return out

    def to_json(self, **kwargs: Any) -> str:
        """``to_dict()`` as strict JSON (no NaN/Infinity); kwargs go to ``json.dumps``."""
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, PhaseForecast):
        return {f.name: _json_safe(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (tuple, list)):
        return [_json_safe(v) for v in value]
    return value
