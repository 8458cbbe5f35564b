"""``CallbackReporter``: the user's ``on_prediction`` callable, called with each due prediction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import EARLY_STEPS, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction


class CallbackReporter(Reporter):
    """Calls ``fn(prediction)`` when due (default: each of the first 20 steps, then every second)
    and once more at close with the final prediction."""

    def __init__(
        self, fn: Callable[[Prediction], Any], schedule: ReportSchedule | None = None
    ) -> None:
        if not callable(fn):
            raise ValueError(f"on_prediction must be callable, got {fn!r}")
        self.fn = fn
        self.schedule = schedule or ReportSchedule(
            first_steps=0, interval_s=1.0, early_steps=EARLY_STEPS
        )

    def on_prediction(self, prediction: Prediction) -> None:
        self.fn(prediction)

    def on_close(self, prediction: Prediction | None) -> None:
        if prediction is not None:
            self.fn(prediction)
