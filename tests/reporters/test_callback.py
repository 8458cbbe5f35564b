"""reporters.callback: user callbacks get the due predictions and the final one."""

from __future__ import annotations

import itertools

from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.builder import build_reporters


def test_callbacks_get_predictions_and_the_final_one() -> None:
    seen: list[Prediction] = []
    f = Forecaster(
        JobModel(total_steps=30),
        start_s=0.0,
        reports=ReportDispatcher(build_reporters(on_prediction=seen.append)),
    )
    run_job(f, 30, 0.1)
    f.close()
    steps = [p.step for p in seen]
    # Early checkpoints, then at least once per second of job time (10 steps of 0.1 s).
    assert {1, 2, 3, 5, 10, 20} <= set(steps) and steps == sorted(steps)
    assert max(b - a for a, b in itertools.pairwise(steps)) <= 10
    assert len(steps) < 30, "not every step: predictions are built only when due"
    assert seen[-1].step == 30 and seen[-1].remaining_steps == 0
