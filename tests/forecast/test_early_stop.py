"""Early stopping: the frameworks' patience rule, and the forecast of when it fires."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType

import numpy as np
import pytest

from ets_hook.forecast.early_stop import (
    EarlyStopForecast,
    EarlyStoppingRule,
    EarlyStopTracker,
    total_range_s,
)


def lightning_reference(values, patience, min_delta, mode, check_finite):
    """Index at which Lightning's ``EarlyStopping._evaluate_stopping_criteria`` stops, or None
    (ported from lightning/pytorch/callbacks/early_stopping.py, without thresholds)."""
    sign = 1 if mode == "max" else -1
    delta = abs(min_delta) * sign
    better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
    best, wait = (-math.inf if mode == "max" else math.inf), 0
    for i, v in enumerate(values):
        if check_finite and not math.isfinite(v):
            return i
        if better(v - delta, best):
            best, wait = v, 0
        else:
            wait += 1
            if wait >= patience:
                return i
    return None


def hf_reference(values, patience, threshold, greater_is_better):
    """Index at which HF's ``EarlyStoppingCallback`` stops, or None; ``best`` follows the
    Trainer's ``state.best_metric`` (moved on any strict improvement, after the check)."""
    op = np.greater if greater_is_better else np.less
    best, counter = None, 0
    for i, v in enumerate(values):
        if best is None or (op(v, best) and abs(v - best) > threshold):
            counter = 0
        else:
            counter += 1
        if best is None or op(v, best):
            best = v
        if counter >= patience:
            return i
    return None


def first_fire(tracker: EarlyStopTracker, values, start: int = 1) -> int | None:
    for i, v in enumerate(values):
        if tracker.observe(start + i, v):
            return i
    return None


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"patience": 0}, "patience"),
        ({"patience": -2}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"patience": True}, "patience"),
        ({"patience": 3, "min_delta": -0.1}, "min_delta"),
        ({"patience": 3, "min_delta": math.nan}, "min_delta"),
        ({"patience": 3, "min_delta": math.inf}, "min_delta"),
        ({"patience": 3, "mode": "auto"}, "mode"),
    ],
)
def test_rule_rejects_bad_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        EarlyStoppingRule(**kwargs)


@pytest.mark.parametrize(
    ("value", "name"),
    [((0, 0.0, "min"), "patience"), ((3, -1.0, "min"), "min_delta"), ((3, 0.0, "up"), "mode")],
)
def test_the_hooks_tuple_is_named_as_the_argument_it_came_in(value, name):
    """``ETSHook(early_stopping=(patience, min_delta, mode))``: a bad value's error names the
    argument the user wrote, then the value inside it."""
    with pytest.raises(ValueError, match=rf"^early_stopping=\(.*\): {name} must"):
        EarlyStoppingRule.coerce(value)


class _ConfigList(Sequence):
    """A config library's list (OmegaConf's ``ListConfig``): a sequence, not a list."""

    def __init__(self, *items):
        self._items = list(items)

    def __getitem__(self, index):
        return self._items[index]

    def __len__(self):
        return len(self._items)


@pytest.mark.parametrize(
    "value",
    [
        [3, 0.5, "max"],
        _ConfigList(3, 0.5, "max"),
        {"patience": 3, "min_delta": 0.5, "mode": "max"},
        MappingProxyType({"patience": 3, "min_delta": 0.5, "mode": "max"}),
    ],
)
def test_config_files_lists_and_mappings_are_the_rule(value):
    """YAML, Hydra and OmegaConf have no tuples: a list or a mapping is the rule as well."""
    assert EarlyStoppingRule.coerce(value) == EarlyStoppingRule(3, 0.5, "max")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"patiense": 3}, r"^early_stopping=\{'patiense': 3\}: unknown key\(s\) \['patiense'\]"),
        ([0], r"^early_stopping=\[0\]: patience must be an int >= 1"),
        ([3, 0.0, "min", 1], r"^early_stopping must be .*got \[3, 0\.0, 'min', 1\]$"),
        ("min", r"^early_stopping must be .*got 'min'$"),
    ],
)
def test_a_bad_list_or_mapping_is_named_as_given(value, message):
    with pytest.raises(ValueError, match=message):
        EarlyStoppingRule.coerce(value)


def test_patience_counts_consecutive_evaluations_without_improvement():
    tracker = EarlyStopTracker(EarlyStoppingRule(3), max_steps=100)
    # improvement at index 3 resets the count; then 3 misses fire at index 6
    assert first_fire(tracker, [1.0, 0.9, 0.95, 0.8, 0.8, 0.85, 0.81, 0.7]) == 6
    assert tracker.stopped and tracker.stopped_step == 7
    assert tracker.best == pytest.approx(0.8)


def test_min_delta_requires_improvement_by_more_than_it():
    tracker = EarlyStopTracker(EarlyStoppingRule(2, min_delta=0.05), max_steps=100)
    tracker.observe(1, 1.0)
    tracker.observe(2, 0.95)  # exactly min_delta: not an improvement
    assert tracker.wait == 1 and tracker.best == 1.0
    tracker.observe(3, 0.94)  # beats 1.0 by 0.06
    assert tracker.wait == 0 and tracker.best == pytest.approx(0.94)


def test_mode_max_and_non_finite_values():
    tracker = EarlyStopTracker(EarlyStoppingRule(2, mode="max"), max_steps=100)
    assert first_fire(tracker, [0.5, 0.6, math.nan, 0.7, 0.65, math.inf]) == 5
    assert tracker.best == pytest.approx(0.7)
    lightning = EarlyStopTracker(EarlyStoppingRule.from_lightning(5, check_finite=True), 100)
    assert first_fire(lightning, [1.0, 0.9, math.nan]) == 2


@pytest.mark.parametrize("seed", range(6))
def test_tracker_fires_where_lightning_and_keras_would(seed):
    rng = np.random.default_rng(seed)
    values = list(1.0 / np.arange(1, 61) + rng.normal(0, 0.01, 60))
    values[int(rng.integers(10, 50))] = math.nan
    for patience in (1, 3, 6):
        for min_delta in (0.0, 0.004):
            for mode in ("min", "max"):
                seq = values if mode == "min" else [-v for v in values]
                for check_finite in (False, True):
                    rule = EarlyStoppingRule.from_lightning(
                        patience, -min_delta, mode, check_finite
                    )
                    got = first_fire(EarlyStopTracker(rule, 1000), seq)
                    assert got == lightning_reference(seq, patience, min_delta, mode, check_finite)


@pytest.mark.parametrize("seed", range(6))
def test_tracker_fires_where_hf_would(seed):
    rng = np.random.default_rng(seed)
    values = list(1.0 / np.arange(1, 61) + rng.normal(0, 0.005, 60))
    for patience in (1, 3, 6):
        for threshold in (0.0, 0.003):
            for greater in (False, True):
                seq = [-v for v in values] if greater else values
                rule = EarlyStoppingRule.from_hf(patience, threshold, greater)
                got = first_fire(EarlyStopTracker(rule, 1000), seq)
                assert got == hf_reference(seq, patience, threshold, greater)


def test_hf_best_moves_on_improvements_below_the_threshold():
    seq = [1.0, 0.99, 0.98, 0.97]
    hf = EarlyStopTracker(EarlyStoppingRule.from_hf(3, 0.015), 100)
    lightning = EarlyStopTracker(EarlyStoppingRule.from_lightning(3, 0.015), 100)
    assert first_fire(hf, seq) == 3
    assert first_fire(lightning, seq) is None


def test_observe_validates_steps_and_values():
    tracker = EarlyStopTracker(EarlyStoppingRule(3), max_steps=100)
    tracker.observe(10, 1.0)
    with pytest.raises(ValueError, match="increase"):
        tracker.observe(10, 0.9)
    with pytest.raises(ValueError, match="max_steps"):
        tracker.observe(101, 0.9)
    with pytest.raises(ValueError, match="value"):
        tracker.observe(20, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps"):
        EarlyStopTracker(EarlyStoppingRule(3), max_steps=0)


def test_forecast_needs_four_finite_points():
    tracker = EarlyStopTracker(EarlyStoppingRule(3), max_steps=1000)
    for i, v in enumerate([1.0, 0.8, math.nan, 0.7]):
        tracker.observe(10 * (i + 1), v)
        assert tracker.forecast() is None
    tracker.observe(50, 0.65)
    assert isinstance(tracker.forecast(), EarlyStopForecast)


def noisy_curve(family: str, seed: int, evals: int = 200, gap: int = 100):
    rng = np.random.default_rng(seed)
    steps = gap * np.arange(1, evals + 1)
    if family == "exp":
        clean = 0.5 + 2.0 * np.exp(-steps / 3000)
    else:
        clean = 0.3 + 3.0 * (steps / gap) ** -0.7
    return steps, clean + rng.normal(0.0, 0.01, evals)


@pytest.mark.parametrize("family", ["exp", "power"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_forecast_finds_the_true_stop_on_noisy_curves(family, seed):
    steps, values = noisy_curve(family, seed)
    max_steps = int(steps[-1])
    rule = EarlyStoppingRule(5)
    truth = EarlyStopTracker(rule, max_steps)
    stop = next(int(s) for s, v in zip(steps, values) if truth.observe(int(s), float(v)))
    tracker = EarlyStopTracker(rule, max_steps)
    for s, v in zip(steps[:16], values[:16]):
        tracker.observe(int(s), float(v))
    f = tracker.forecast()
    assert f is not None
    assert abs(f.expected_stop_step - stop) <= 0.4 * stop
    assert f.earliest_stop_step <= f.expected_stop_step <= f.latest_stop_step <= max_steps
    assert f.range_steps == (f.earliest_stop_step, max_steps)
    assert 0.0 <= f.probability_stops_early <= 1.0


def test_forecast_never_exceeds_max_steps_and_is_deterministic():
    steps, values = noisy_curve("exp", 7, evals=12)
    a, b = (
        EarlyStopTracker(EarlyStoppingRule(4), 1250),
        EarlyStopTracker(EarlyStoppingRule(4), 1250),
    )
    for s, v in zip(steps, values):
        a.observe(int(s), float(v))
        b.observe(int(s), float(v))
    fa = a.forecast()
    assert fa == b.forecast()
    assert fa is not None and fa.latest_stop_step <= 1250 and fa.expected_stop_step <= 1250


def test_a_curve_that_keeps_improving_runs_to_max_steps():
    tracker = EarlyStopTracker(EarlyStoppingRule(3), max_steps=5000)
    for i in range(1, 11):
        tracker.observe(100 * i, 10.0 - 0.01 * 100 * i)
    f = tracker.forecast()
    assert f is not None
    assert f.expected_stop_step == 5000
    assert f.probability_stops_early < 0.1


def test_a_plateau_is_forecast_to_stop_soon():
    tracker = EarlyStopTracker(EarlyStoppingRule(5), max_steps=10_000)
    for i, v in enumerate([0.9, 0.62, 0.6, 0.601, 0.6005], start=1):
        tracker.observe(100 * i, v)
    assert tracker.wait == 2 and not tracker.stopped
    f = tracker.forecast()
    assert f is not None
    assert 800 <= f.expected_stop_step <= 1500
    assert f.probability_stops_early > 0.9


def test_forecast_after_the_rule_fired():
    tracker = EarlyStopTracker(EarlyStoppingRule(2), max_steps=1000)
    first_fire(tracker, [1.0, 0.9, 0.8, 0.7, 0.75, 0.76], start=1)
    f = tracker.forecast()
    assert f is not None and f.family == "stopped" and f.expected_stop_step == 6
    tracker.observe(7, 0.6)  # the loop went on: the rule is not what ends it
    assert tracker.forecast() is None


def test_total_range_s():
    f = EarlyStopForecast(600, 400, 900, 0.8, 1000, 10, "exp")
    assert total_range_s(f, total_s=500.0, cadence_s=0.5) == (300.0, 500.0)
    assert total_range_s(f, total_s=100.0, cadence_s=0.5) == (0.0, 100.0)
