"""reporters.format: durations, step times, relative errors and the one-line prediction."""

from __future__ import annotations

from typing import Any

import pytest
from support import PREDICTION_LINE

from ets_hook.forecast.prediction import Prediction
from ets_hook.reporters.format import (
    format_duration,
    format_prediction,
    format_relative,
    format_step_time,
)


def prediction(**overrides: Any) -> Prediction:
    fields: dict[str, Any] = {
        "step": 30,
        "total_steps": 2000,
        "remaining_steps": 1970,
        "iteration_s": 0.412,
        "iteration_ci_s": 0.011 * 0.412,
        "total_s": 825.0,
        "total_ci_s": 9.0,
        "eta_s": 812.0,
        "elapsed_s": 13.0,
        "finish_time": None,
        "converged": True,
        "source": "measured",
    }
    fields.update(overrides)
    return Prediction(**fields)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.42, "0.4s"),
        (4.24, "4.2s"),
        (42.4, "42s"),
        (59.6, "1m00s"),
        (812.0, "13m32s"),
        (3599.6, "1h00m"),
        (7500.0, "2h05m"),
        (3 * 86400 + 4 * 3600, "3d04h"),
        (-90.0, "-1m30s"),
        (None, "?"),
        (float("nan"), "?"),
        (float("inf"), "∞"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_step_time_and_relative() -> None:
    assert format_step_time(0.412) == "0.412 s/step"
    assert format_step_time(1.234) == "1.23 s/step"
    assert format_step_time(0.0123) == "12.3 ms/step"
    assert format_step_time(0.0008) == "800 µs/step"
    assert format_relative(0.011) == "±1.1%"
    assert format_relative(0.123) == "±12%"


def test_log_line_format() -> None:
    text = format_prediction(prediction())
    assert text == "step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s"
    assert PREDICTION_LINE.match(text)
    unknown = prediction(total_steps=None, total_s=None, eta_s=None)
    assert format_prediction(unknown) == "step 30 · 0.412 s/step ±1.1%"
