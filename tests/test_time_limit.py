"""Jobs of unknown length and wall-clock limits: ``ETSHook(time_limit_s=...)``,
``prediction.cut_at_time_limit`` and the log line of a plain loop (no made-up total)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
import torch
from support import log_lines, sample_prediction
from torch.utils.data import DataLoader, IterableDataset

from ets_hook import ETSHook
from ets_hook.forecast.prediction import Prediction, cut_at_time_limit

STEP_SLEEP_S = 0.01  # each step sleeps this long: the predicted total is at least steps x it


class _Stream(IterableDataset):
    """A stream without ``len()``: the job's length is unknown."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(8, generator=g), torch.randn(1, generator=g)


def _train(hook: ETSHook, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    batches = iter(DataLoader(_Stream(), batch_size=4))
    for _ in range(steps):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        time.sleep(STEP_SLEEP_S)
        opt.step()


def _job(**options: Any) -> tuple[ETSHook, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(model, optimizer=opt, capture_steps=0, verbose=False, **options)
    return hook, model, opt


@pytest.mark.parametrize(
    ("time_limit_s", "tail"),
    [(None, " · total unknown"), (3600.0, " · total unknown, at most 1h00m (time limit)")],
)
def test_a_loop_over_a_stream_without_len_gets_step_time_and_total_unknown(
    caplog: pytest.LogCaptureFixture, time_limit_s: float | None, tail: str
) -> None:
    caplog.set_level(logging.INFO, logger="ets_hook")
    hook, model, opt = _job(
        dataloader=DataLoader(_Stream(), batch_size=4), time_limit_s=time_limit_s
    )
    _train(hook, model, opt, 6)
    p = hook.prediction
    assert p is not None and p.step == 6
    assert p.total_steps is None and p.remaining_steps is None
    assert p.total_s is None and p.eta_s is None and p.finish_time is None  # none made up
    # a step time, corrected by the early-step prior (steps 2..k of a job run slower)
    assert p.iteration_s > 0.5 * STEP_SLEEP_S
    assert p.time_limit_s == time_limit_s and not p.stopped_by_time_limit
    lines = [line for line in log_lines(caplog) if line.startswith("step ")]
    assert {"step 1", "step 3", "step 5"} <= {line.split(" · ")[0] for line in lines}
    assert all(line.endswith(tail) and "ETA" not in line for line in lines), lines
    hook.close()
    ended = hook.prediction
    assert ended is not None and (ended.total_steps, ended.eta_s) == (6, 0.0)
    assert ended.time_limit_s == time_limit_s and not ended.stopped_by_time_limit


def test_a_time_limit_below_the_predicted_total_becomes_the_total(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ets_hook")
    # 100_000 steps of at least STEP_SLEEP_S: ~1000 s predicted, far past the 60 s limit (even
    # the first step's estimate, a few ms, gives several minutes).
    hook, model, opt = _job(total_steps=100_000, time_limit_s=60)
    _train(hook, model, opt, 10)
    p = hook.prediction
    assert p is not None and p.step == 10
    assert p.elapsed_s < 60.0
    assert p.stopped_by_time_limit and p.time_limit_s == 60.0
    assert p.total_s == 60.0 and p.eta_s == pytest.approx(60.0 - p.elapsed_s)
    assert p.total_steps == 100_000 and p.remaining_steps == 99_990  # the planned length
    assert p.start_time is not None and p.finish_time is not None
    assert abs(p.finish_time - (p.start_time + timedelta(seconds=60))) < timedelta(milliseconds=1)
    assert p.local_total_s == 60.0
    lines = [line for line in log_lines(caplog) if line.startswith("step ")]
    assert lines and all(
        line.endswith(" · total 1m00s (capped by the time limit)") for line in lines
    )
    hook.close()  # the loop ended (a break) long before the limit: not stopped by it
    ended = hook.prediction
    assert ended is not None and ended.total_steps == 10 and not ended.stopped_by_time_limit


def test_without_a_time_limit_the_same_job_predicts_past_it() -> None:
    hook, model, opt = _job(total_steps=100_000)
    _train(hook, model, opt, 10)
    p = hook.prediction
    assert p is not None and p.time_limit_s is None and not p.stopped_by_time_limit
    assert p.total_s is not None and p.total_s > 60.0
    hook.close()


@pytest.mark.parametrize(
    "bad", [0, -5.0, math.nan, math.inf, True, "60", [60]], ids=lambda v: repr(v)
)
def test_invalid_time_limits_name_the_argument_and_value(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"time_limit_s") as info:
        ETSHook(torch.nn.Linear(2, 1), time_limit_s=bad, capture_steps=0)
    assert repr(bad) in str(info.value)


def test_a_numpy_time_limit_counts_as_the_number_it_is() -> None:
    hook = ETSHook(torch.nn.Linear(2, 1), time_limit_s=np.float32(90.0), capture_steps=0)
    hook.close()


# ---------------------------------------------------------------------------------------------
# cut_at_time_limit


def _prediction(**overrides: Any) -> Prediction:
    fields: dict[str, Any] = {
        "iteration_ci_s": 0.005,
        "total_ci_s": 40.0,
        "finish_time": datetime(2030, 1, 1, tzinfo=timezone.utc),
        "local_total_s": 825.0,
        "expected_stop_step": 1200,
        "total_range_s": (500.0, 825.0),
    }
    return sample_prediction(**{**fields, **overrides})


def test_cut_moves_every_end_back_by_the_excess() -> None:
    p = _prediction(time_limit_s=800.0)  # 25 s past the limit
    cut = cut_at_time_limit(p)
    assert cut.stopped_by_time_limit
    assert (cut.total_s, cut.eta_s, cut.total_ci_s) == (800.0, 787.0, 15.0)
    assert p.finish_time is not None
    assert cut.finish_time == p.finish_time - timedelta(seconds=25)
    assert cut.local_total_s == 800.0 and cut.total_range_s == (500.0, 800.0)
    assert (cut.total_steps, cut.remaining_steps, cut.step) == (2000, 1970, 30)
    assert cut.to_dict()["stopped_by_time_limit"] is True
    assert p.total_s == 825.0  # the original is not changed


def test_cut_far_past_the_limit_leaves_no_interval() -> None:
    cut = cut_at_time_limit(_prediction(time_limit_s=400.0))
    assert (cut.total_s, cut.total_ci_s) == (400.0, 0.0)
    assert cut.total_range_s == (400.0, 400.0)


def test_past_the_limit_the_job_ends_at_this_step() -> None:
    cut = cut_at_time_limit(_prediction(time_limit_s=10.0))  # 13 s elapsed
    assert (cut.total_s, cut.eta_s) == (13.0, 0.0) and cut.stopped_by_time_limit


@pytest.mark.parametrize(
    "fields",
    [
        {"time_limit_s": None},
        {"time_limit_s": 825.0},  # exactly the total: nothing to cut
        {"time_limit_s": 900.0},
        {"time_limit_s": 60.0, "total_s": None, "eta_s": None, "total_ci_s": None},
    ],
)
def test_nothing_to_cut(fields: dict[str, Any]) -> None:
    p = _prediction(**fields)
    assert cut_at_time_limit(p) is p


def test_a_limit_within_the_total_is_not_a_stop() -> None:
    p = _prediction(time_limit_s=900.0)
    assert not p.stopped_by_time_limit
    assert not replace(p, time_limit_s=None).stopped_by_time_limit
    assert p.to_dict()["time_limit_s"] == 900.0
