"""``CallbackReporter``: the user's ``on_prediction`` callable, called with each due prediction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import EARLY_STEPS, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction


class CallbackReporter(Reporter):
    """Calls ``fn(prediction)`` when due, and once more at close with the final prediction.

    An exception from ``fn`` is logged and disables this reporter (``DeadlineExceededError``
    excepted: it propagates).
    """

    def __init__(
        self, fn: Callable[[Prediction], Any], schedule: ReportSchedule | None = None
    ) -> None:
        """Wrap the user's callable.

        Args:
            fn: called with each due ``Prediction``; its return value is ignored.
            schedule: when ``fn`` is due; None: after local step counts 1, 2, 3, 5, 10, 20, 50
                (``EARLY_STEPS``) and at the first step end at least 1 s after the last call.

        Raises:
            ValueError: ``fn`` is not callable.
        """
        if not callable(fn):
            raise ValueError(f"on_prediction must be callable, got {fn!r}")
        self.fn = fn
        self.schedule = schedule or ReportSchedule(
            first_steps=0, interval_s=1.0, early_steps=EARLY_STEPS
        )

    def on_prediction(self, prediction: Prediction) -> None:
        """Call ``fn(prediction)``."""
        self.fn(prediction)

    def on_close(self, prediction: Prediction | None) -> None:
        """Call ``fn`` with the final prediction (not called if it is None)."""
        if prediction is not None:
            self.fn(prediction)
