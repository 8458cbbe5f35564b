"""forecast.text: durations, step times, relative errors and the one-line prediction."""

from __future__ import annotations

from typing import Any

import pytest
from support import PREDICTION_LINE, sample_prediction

from ets_hook.forecast.prediction import Prediction, cut_at_time_limit
from ets_hook.forecast.text import (
    format_duration,
    format_prediction,
    format_relative,
    format_step_time,
)

prediction = sample_prediction


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.04, "0.04s"),
        (0.42, "0.42s"),
        (0.2, "0.2s"),
        (0.001, "0s"),  # rounds to zero: printed as zero is, never "0.0s"
        (0.0049, "0s"),
        (0.0105, "0.01s"),
        (-0.004, "0s"),
        (-0.04, "-0.04s"),
        (0.996, "1.0s"),
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
    assert format_prediction(unknown) == "step 30 · 0.412 s/step ±1.1% · total unknown"


def test_str_of_a_prediction_is_its_log_line_and_repr_keeps_the_fields() -> None:
    p = prediction(host_foreign_cpu=0.4, host_steal=0.01)
    assert str(p) == format_prediction(p)
    assert str(p).endswith(" · host busy: other processes 40% CPU")
    assert f"{p}" == str(p) and "\n" not in str(p)
    assert repr(p).startswith("Prediction(step=30, ") and "host_steal=0.01" in repr(p)


def test_host_busy_shares_keep_only_the_shares_past_their_thresholds() -> None:
    assert prediction().host_busy_shares == (None, None) and not prediction().host_busy
    assert prediction(host_foreign_cpu=0.2, host_steal=0.04).host_busy_shares == (None, None)
    both = prediction(host_foreign_cpu=0.25, host_steal=0.05)
    assert both.host_busy_shares == (0.25, 0.05) and both.host_busy
    assert prediction(host_steal=0.3).host_busy_shares == (None, 0.3)


def test_an_input_bound_step_time_says_so() -> None:
    text = format_prediction(prediction(source="input", input_period_s=0.412))
    assert text == format_prediction(prediction()) + " · input-bound: DataLoader workers"
    assert "input-bound" not in format_prediction(prediction(source="fused"))


def test_a_step_that_mostly_waits_for_input_says_so() -> None:
    text = format_prediction(prediction(data_wait_s=0.256, data_wait_share=0.62))
    assert text == format_prediction(prediction()) + " · 62% of a step waits for input"
    assert "waits for input" not in format_prediction(prediction(data_wait_share=0.2))
    assert "waits for input" not in format_prediction(prediction(data_wait_share=None))
    # The workers' pace already says the step is input-bound: one note, not two.
    both = prediction(source="input", input_period_s=0.412, data_wait_share=0.62)
    assert format_prediction(both).endswith(" · input-bound: DataLoader workers")


def test_job_suffix_names_the_rank_the_job_waits_for() -> None:
    local = format_prediction(prediction(rank=2, world_size=8))
    text = format_prediction(prediction(rank=2, world_size=8, slowest_rank=3, job_view_step=30))
    suffix = " · job of 8 ranks, waits for rank 3"
    assert text == local + suffix
    assert PREDICTION_LINE.match(text[: -len(suffix)])


def test_job_suffix_comes_after_the_early_stop_range() -> None:
    text = format_prediction(
        prediction(
            world_size=2,
            slowest_rank=0,
            expected_stop_step=1200,
            total_range_s=(500.0, 825.0),
        )
    )
    assert text.index("early stop") < text.index("job of 2 ranks")
    assert text.endswith("job of 2 ranks, this rank ends last")  # rank 0 names no one else


def test_an_early_stop_that_happened_shows_no_range() -> None:
    """A job closed by its early stop: the range has collapsed to the job's total (was
    ``total 3.7s–3.7s``)."""
    ahead = format_prediction(prediction(expected_stop_step=1200, total_range_s=(500.0, 825.0)))
    assert ahead.endswith(" · early stop ~step 1200 · total 8m20s–13m45s")
    ended = format_prediction(prediction(expected_stop_step=460, total_range_s=(3.7, 3.7)))
    assert ended.endswith(" · early stop at step 460")


@pytest.mark.parametrize(
    "fields",
    [
        {"world_size": 1, "slowest_rank": 0},  # a single process never shows it
        {"world_size": 4, "slowest_rank": None},  # before the first exchange
        {"world_size": 4},
    ],
)
def test_no_job_suffix(fields: dict[str, Any]) -> None:
    text = format_prediction(prediction(**fields))
    assert "job of" not in text and "waits for" not in text
    assert PREDICTION_LINE.match(text)


def unknown_length(**overrides: Any) -> Prediction:
    """A prediction of a job whose length is unknown: step time only."""
    fields: dict[str, Any] = {
        "total_steps": None,
        "remaining_steps": None,
        "total_s": None,
        "total_ci_s": None,
        "eta_s": None,
    }
    return prediction(**{**fields, **overrides})


def test_unknown_total_with_a_time_limit_ahead_gives_the_bound() -> None:
    text = format_prediction(unknown_length(time_limit_s=3600.0))  # 13 s elapsed
    assert text == "step 30 · 0.412 s/step ±1.1% · total unknown, at most 1h00m (time limit)"
    assert "ETA" not in text


def test_unknown_total_past_its_time_limit_says_it_was_reached() -> None:
    text = format_prediction(unknown_length(time_limit_s=600.0, elapsed_s=601.0))
    assert text == "step 30 · 0.412 s/step ±1.1% · total unknown, time limit 10m00s reached"


def test_a_total_cut_to_the_time_limit_says_the_limit_stops_the_job() -> None:
    limited = cut_at_time_limit(prediction(time_limit_s=600.0))  # predicted 825 s: past it
    assert limited.stopped_by_time_limit
    text = format_prediction(limited)
    assert text == (
        "step 30/2000 · 0.412 s/step ±1.1% · ETA 9m47s · total 10m00s (capped by the time limit)"
    )


def test_a_time_limit_beyond_the_total_changes_nothing() -> None:
    within = cut_at_time_limit(prediction(time_limit_s=3600.0))
    assert not within.stopped_by_time_limit
    assert format_prediction(within) == format_prediction(prediction())
    assert PREDICTION_LINE.match(format_prediction(within))
