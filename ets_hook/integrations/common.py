"""What the framework integrations share: which ``ETSHook`` options a callback accepts, the
metrics they log, and reading counts from a framework's (loosely typed) state."""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

from ..hook import ETSHook

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

#: Every keyword argument of ``ETSHook`` (``model`` included: a callback may exclude it).
HOOK_ARGUMENTS = frozenset(inspect.signature(ETSHook.__init__).parameters) - {"self"}


def whole_number(value: Any, minimum: int | None = None) -> int | None:
    """``value`` as an int when it is a finite whole number (an int, or a float such as 12.0),
    at least ``minimum`` when given; else None (bools, strings, NaN, infinity included).

    Args:
        value: what the framework reports (``trainer.max_steps``, ``state.global_step``, ...).
        minimum: the smallest value accepted; None: any.

    Returns:
        The int, or None.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value != int(value):
        return None
    number = int(value)
    return number if minimum is None or number >= minimum else None


#: The metrics both integrations log, named after the ``Prediction`` fields they hold.
LOG_KEYS = ("ets/iteration_s", "ets/eta_s", "ets/total_s")


def prediction_metrics(prediction: Prediction | None) -> dict[str, float]:
    """The logged values of a prediction.

    Args:
        prediction: the hook's prediction, or None.

    Returns:
        ``{"ets/iteration_s": ..., "ets/eta_s": ..., "ets/total_s": ...}`` as floats; a key is
        left out while its value is unknown (no job length: no ETA, no total) or not finite
        (empty for None).
    """
    if prediction is None:
        return {}
    out: dict[str, float] = {}
    for key in LOG_KEYS:
        value = getattr(prediction, key.removeprefix("ets/"))
        if value is not None and math.isfinite(value):
            out[key] = float(value)
    return out
