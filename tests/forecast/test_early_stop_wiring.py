"""Early stopping through the hook and the forecaster: expected stop and total range in the
prediction, the log line and the status file."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ets_hook import ETSHook
from ets_hook.forecast.early_stop import EarlyStoppingRule
from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.text import format_prediction


def _loss(evaluation: int) -> float:
    return 0.2 + 2.0 * math.exp(-0.25 * evaluation)  # flattens: the rule fires long before 1000


def test_forecaster_predicts_the_stop_and_the_total_range() -> None:
    f = Forecaster(JobModel(total_steps=10_000), start_s=0.0)
    f.set_early_stopping(EarlyStoppingRule(patience=3, min_delta=0.01))
    for step in range(900):
        f.on_step_end(step, 0.1, 0.1 * (step + 1))
        if step == 99:
            assert f.prediction.expected_stop_step is None  # no evaluation yet
        if step % 100 == 99:  # an evaluation every 100 steps
            f.on_metric(_loss(step // 100))
    p = f.prediction
    assert p.expected_stop_step is not None and p.step < p.expected_stop_step < 10_000
    low, high = p.total_range_s
    assert low < high == pytest.approx(p.total_s)
    assert "early stop ~step" in format_prediction(p)
    assert json.loads(p.to_json())["total_range_s"] == [low, high]
    final = f.close()  # stopped at step 900: the forecast collapses to what happened
    assert (final.expected_stop_step, final.total_steps, final.eta_s) == (900, 900, 0.0)
    assert final.total_range_s == (final.total_s, final.total_s) == (p.elapsed_s, p.elapsed_s)


def test_hook_report_metric_and_bad_arguments(tmp_path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=5000,
        capture_steps=0,
        log_every=None,
        early_stopping=(3, 0.01, "min"),
        status_path=tmp_path / "eta.json",
    )
    for step in range(400):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        if step % 40 == 39:
            hook.report_metric("val_loss", _loss(step // 40))
            hook.report_metric("accuracy", 0.5)  # not the monitored one: ignored
    p = hook.prediction
    hook.close()
    assert p.expected_stop_step is not None and p.expected_stop_step < 5000
    doc = json.loads((tmp_path / "eta.json").read_text())
    assert doc["version"] >= 3 and doc["prediction"]["expected_stop_step"] is not None
    with pytest.raises(ValueError, match="early_stopping"):
        ETSHook(model, early_stopping="soon")
    with pytest.raises(ValueError, match="patience"):
        ETSHook(model, early_stopping=(0, 0.0, "min"))
