"""Prediction object and the Forecaster's contract: totals, caching, fusion, isolation."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import threading
import time
from datetime import datetime, timezone

import numpy as np
import pytest

import ets_hook.forecast.forecaster as forecaster_module
from ets_hook.forecast import stats as estimators
from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.prediction import Prediction
from ets_hook.forecast.ranks import JobView, RankForecast, aggregate_ranks
from ets_hook.forecast.stats import TraceEstimate
from ets_hook.reporters.base import ReportDispatcher

WALL_START = 1_700_000_000.0


def drive(
    forecaster: Forecaster,
    durations: list[float] | np.ndarray,
    *,
    start: float = 0.0,
    gap_s: float = 0.0,
    first_index: int = 0,
) -> float:
    now = start
    for i, d in enumerate(durations):
        now += d + gap_s
        forecaster.on_step_end(first_index + i, float(d), now)
    return now


def noisy(n: int, mean: float = 0.2, cv: float = 0.05, seed: int = 0) -> np.ndarray:
    y = mean * (1.0 + cv * np.random.default_rng(seed).standard_normal(n))
    y[0] *= 1.8
    return y


def test_no_prediction_before_the_first_step_unless_a_trace_estimate_exists() -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0, wall_start_s=WALL_START)
    assert f.prediction is None
    f.set_trace_estimate(TraceEstimate(0.25, 0.02))
    p = f.prediction
    assert p is not None
    assert p.source == "trace"
    assert p.step == 0
    assert p.total_s == pytest.approx(100 * 0.25)


def test_total_is_elapsed_plus_remaining_steps_plus_phases() -> None:
    job = JobModel.from_args(total_steps=500, eval_every=100)
    f = Forecaster(job, start_s=10.0, wall_start_s=WALL_START)
    now = drive(f, noisy(100), start=10.5)
    f.on_phase_end("eval", 4.0, now + 4.0)
    p = f.prediction
    assert p is not None
    assert p.step == 100
    assert p.remaining_steps == 400
    assert p.elapsed_s == pytest.approx(now + 4.0 - 10.0)
    assert p.remaining_phase_s == pytest.approx(4 * 4.0)  # after 200, 300, 400, 500
    expected = p.elapsed_s + 400 * (p.iteration_s + p.overhead_per_step_s) + p.remaining_phase_s
    assert p.total_s == pytest.approx(expected)
    assert p.eta_s == pytest.approx(p.total_s - p.elapsed_s)
    assert p.finish_time is not None and p.finish_time.tzinfo is not None
    assert p.finish_time.timestamp() == pytest.approx(WALL_START + p.total_s)
    assert p.start_time == datetime.fromtimestamp(WALL_START, tz=timezone.utc)
    assert p.overhead_per_step_s == 0.0  # durations cover every step exactly (no rounding left)
    assert p.total_ci_s is not None and p.total_ci_s > 0


def test_unknown_total_gives_step_time_only() -> None:
    f = Forecaster(start_s=0.0)
    drive(f, noisy(30))
    p = f.prediction
    assert p is not None
    assert p.total_steps is None
    assert p.total_s is None and p.eta_s is None and p.finish_time is None
    assert p.iteration_s == pytest.approx(0.2, rel=0.05)


def test_the_windows_input_wait_is_shown_not_added() -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0, wall_start_s=WALL_START)
    drive(f, noisy(20))
    before = f.prediction
    assert before is not None and before.data_wait_s is None and before.data_wait_share is None
    assert not before.waits_for_input
    f.set_input_wait(0.06, 0.2)
    p = f.prediction
    assert p is not None and p.data_wait_s == 0.06
    assert p.data_wait_share == pytest.approx(0.3) and p.waits_for_input
    assert p.iteration_s == before.iteration_s and p.total_s == before.total_s  # already in it
    f.set_input_wait(0.01, 0.2)
    assert f.prediction is not None and not f.prediction.waits_for_input
    f.set_input_wait(0.5, 0.2)  # a wait longer than the median step: the share stops at 1
    assert f.prediction is not None and f.prediction.data_wait_share == 1.0


@pytest.mark.parametrize(
    ("wait", "wall"), [(-0.1, 0.2), (0.1, math.nan), (math.inf, 0.2), ("0.1", 0.2)]
)
def test_an_input_wait_out_of_range_is_refused(wait: object, wall: object) -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)
    with pytest.raises(ValueError, match=r"data_wait_s|step_wall_s"):
        f.set_input_wait(wait, wall)  # type: ignore[arg-type]


def test_json_round_trip_is_strict_and_complete() -> None:
    job = JobModel.from_args(total_steps=50, checkpoint_every=10)
    f = Forecaster(job, start_s=0.0, wall_start_s=WALL_START)
    now = drive(f, noisy(12))
    f.on_phase_end("checkpoint", 1.0, now + 1.0)
    p = f.prediction
    assert p is not None
    doc = json.loads(p.to_json())
    assert doc["step"] == 12
    assert doc["source"] in ("measured", "fused")
    assert doc["finish_time"].endswith("+00:00")
    assert doc["phases"][0]["name"] == "checkpoint"
    assert doc["iteration_rel_ci"] == pytest.approx(p.iteration_rel_ci)
    odd = Prediction(
        step=1,
        total_steps=None,
        remaining_steps=None,
        iteration_s=math.inf,
        iteration_ci_s=math.nan,
        total_s=None,
        total_ci_s=None,
        eta_s=None,
        elapsed_s=1.0,
        finish_time=None,
        converged=False,
        source="prior",
    )
    assert json.loads(odd.to_json())["iteration_s"] is None


def test_prediction_is_cached_until_something_changes() -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)
    now = drive(f, noisy(10))
    p = f.prediction
    assert f.prediction is p
    f.on_step_end(10, 0.2, now + 0.2)
    p2 = f.prediction
    assert p2 is not p and p2 is not None and p2.step == 11
    f.on_phase_end("eval", 1.0, now + 1.2)
    assert f.prediction is not p2
    p3 = f.prediction
    f.set_trace_estimate(TraceEstimate(0.2, 0.01))
    assert f.prediction is not p3


def test_converges_once_the_interval_is_narrow() -> None:
    f = Forecaster(JobModel(total_steps=10_000), start_s=0.0, converge_rel_ci=0.02)
    y = noisy(400, cv=0.05, seed=3)
    drive(f, y[:3])
    early = f.prediction
    assert early is not None and not early.converged
    drive(f, y[3:], start=float(np.sum(y[:3])), first_index=3)
    late = f.prediction
    assert late is not None and late.converged
    assert late.iteration_rel_ci <= 0.02
    assert late.warmup_steps >= 1


def test_trace_estimate_is_fused_and_dominates_early() -> None:
    f = Forecaster(JobModel(total_steps=1000), start_s=0.0)
    drive(f, [0.5])  # first step only: the prior's ±28%
    f.set_trace_estimate(TraceEstimate(0.27, 0.01, step=0))
    p = f.prediction
    assert p is not None
    assert p.source == "fused"
    assert p.trace_iteration_s == 0.27
    assert p.measured_iteration_s is not None
    assert abs(p.iteration_s - 0.27) < abs(p.iteration_s - p.measured_iteration_s)
    assert p.iteration_ci_s < p.measured_ci_s  # type: ignore[operator]
    f.set_trace_estimate(None)
    p2 = f.prediction
    assert p2 is not None and p2.source == "prior"


def _shifted_job(shift_steps: int, factor: float) -> Forecaster:
    """100 steps of 10 ms with a trace estimate of 10 ms ± 0.3 ms, then ``shift_steps`` at
    ``factor`` times that."""
    f = Forecaster(JobModel(total_steps=400), start_s=0.0)
    y = noisy(100, mean=0.010, cv=0.03, seed=5)
    now = drive(f, y)
    f.set_trace_estimate(TraceEstimate(0.010, 0.0003, step=0))
    drive(
        f, noisy(shift_steps, mean=0.010 * factor, cv=0.03, seed=6)[1:], start=now, first_index=100
    )
    return f


def test_a_burst_keeps_the_trace_estimate_fused() -> None:
    p = _shifted_job(5, 10.0).prediction  # four steps at 10x: a burst
    assert p is not None and p.source == "fused"
    assert p.iteration_s == pytest.approx(0.010, rel=0.05)


def test_a_lasting_shift_sets_the_trace_estimate_aside() -> None:
    """The window's trace estimate describes the steps before the change: fused, its narrow
    interval held the prediction at the old level while every step ran 10x slower (10 ms
    with 25 steps at 100 ms; 52 ms after 50). From a run longer than a burst on, the measured
    estimate alone, its interval reaching the new level until the shift is confirmed, then at
    the new level."""
    early = _shifted_job(8, 10.0).prediction  # seven steps at 10x: longer than a burst
    assert early is not None and early.source == "measured"
    assert early.iteration_s < 0.05  # not yet moved ...
    assert early.iteration_s + early.iteration_ci_s >= 0.095  # ... but its interval reaches
    for steps in (30, 60):
        p = _shifted_job(steps, 10.0).prediction
        assert p is not None and p.source == "measured"
        assert p.iteration_s == pytest.approx(0.100, rel=0.05)
    slower = _shifted_job(60, 0.5).prediction  # the neighbour left: steps at half the time
    assert slower is not None and slower.source == "measured"
    assert slower.iteration_s == pytest.approx(0.005, rel=0.05)


def test_time_outside_step_durations_is_projected() -> None:
    # The durations miss 50 ms of data loading per step; the total must not.
    f = Forecaster(JobModel(total_steps=200), start_s=0.0)
    y = noisy(100, seed=4)
    drive(f, y, gap_s=0.05)
    p = f.prediction
    assert p is not None
    assert p.overhead_per_step_s == pytest.approx(0.05, rel=1e-6)
    actual_total = float(np.sum(y)) + 100 * 0.05 + 100 * (0.2 + 0.05)
    assert p.total_s == pytest.approx(actual_total, rel=0.02)


def test_a_phase_recorded_late_counts_where_it_ended() -> None:
    # Steps of 0.2 s back to back, the first one 0.3 s longer (a start-up measured later and
    # recorded after step 4 with the first step's end time, as the epoch seed is): nothing
    # between steps 1 and 10 is left uncovered, so the per-step overhead stays 0.
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)
    now = drive(f, [0.5, 0.2, 0.2, 0.2])
    f.on_phase_end("eval", 0.1, now + 0.1)
    now = drive(f, [0.2] * 6, start=now + 0.1, first_index=4)
    f.on_phase_end("epoch start", 0.3, 0.5, at_step=0)
    p = f.prediction
    assert p is not None
    assert abs(p.overhead_per_step_s) < 1e-9
    assert p.elapsed_s == pytest.approx(now)


def test_long_jobs_use_bounded_memory() -> None:
    f = Forecaster(JobModel(total_steps=400_000), start_s=0.0, series_capacity=1024)
    y = noisy(200_000, seed=5)
    drive(f, y)
    p = f.prediction
    assert p is not None
    assert len(f._series.values()) <= 1024
    assert len(f._series.pending) == 0
    assert p.iteration_s == pytest.approx(float(np.mean(y[10:])), rel=0.002)
    assert p.total_s == pytest.approx(2 * float(np.sum(y)), rel=0.01)


def test_constructor_validates_early() -> None:
    with pytest.raises(ValueError, match="level must be in"):
        Forecaster(start_s=0.0, level=95)
    with pytest.raises(ValueError, match="converge_rel_ci must be in"):
        Forecaster(start_s=0.0, converge_rel_ci=0)
    with pytest.raises(ValueError, match="min_warmup_steps must be >= 0, got -1"):
        Forecaster(start_s=0.0, min_warmup_steps=-1)
    with pytest.raises(ValueError, match="start_s must be finite"):
        Forecaster(start_s=math.nan)
    with pytest.raises(ValueError, match="reporters must be Reporter instances"):
        Forecaster(start_s=0.0, reports=ReportDispatcher([print]))  # type: ignore[list-item]
    f = Forecaster(start_s=0.0)
    with pytest.raises(ValueError, match="TraceEstimate"):
        f.set_trace_estimate(0.3)  # type: ignore[arg-type]


def test_internal_failure_never_reaches_the_training_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ets_hook.forecast import forecaster as prediction_module
    from ets_hook.reporters.callback import CallbackReporter

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(prediction_module, "estimate_measured", broken)
    seen: list[Prediction] = []
    f = Forecaster(
        JobModel(total_steps=10),
        start_s=0.0,
        reports=ReportDispatcher([CallbackReporter(seen.append)]),
    )
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        drive(f, noisy(5))
        assert f.prediction is None
        f.close()
    assert seen == []
    assert sum("forecaster error" in r.getMessage() for r in caplog.records) == 1


def test_prediction_can_be_read_from_another_thread() -> None:
    f = Forecaster(JobModel(total_steps=50_000), start_s=0.0)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                p = f.prediction
                if p is not None:
                    assert p.iteration_s > 0
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        drive(f, noisy(30_000, seed=6))
    finally:
        stop.set()
        thread.join()
    assert not errors
    f._series.flush()
    assert f._series.count == 30_000
    p = f.prediction
    assert p is not None and p.step == 30_000


def test_close_is_idempotent_and_returns_the_final_prediction() -> None:
    f = Forecaster(JobModel(total_steps=20), start_s=0.0)
    drive(f, noisy(20))
    final = f.close()
    assert final is not None and final.remaining_steps == 0
    assert final.total_s == pytest.approx(final.elapsed_s)
    assert f.close() is final


def test_a_job_closed_before_its_last_step_ends_as_it_ran() -> None:
    """An early stop or a ``break`` closes the hook at step 30 of 100: the final prediction
    (and the reporters' last values) are the job as it ran, not 70 steps more."""
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)
    drive(f, noisy(30))
    running = f.prediction
    assert running is not None and running.remaining_steps == 70 and running.eta_s > 0
    final = f.close()
    assert final is not None and final is f.prediction
    assert (final.step, final.total_steps, final.remaining_steps) == (30, 30, 0)
    assert final.eta_s == 0.0 and final.total_ci_s == 0.0 and final.remaining_phase_s == 0.0
    assert final.total_s == pytest.approx(running.elapsed_s)
    assert final.finish_time == running.as_of
    assert final.iteration_s == running.iteration_s  # the step time is what was measured
    assert json.loads(final.to_json())["total_steps"] == 30


def test_a_closed_jobs_step_interval_is_the_measured_steps_not_the_forecasts_widening() -> None:
    """The last steps ran off the estimate (a slowdown not yet confirmed as lasting): the
    running interval reaches their level, for the steps to come; once the job has ended no
    step is to come, and the interval is that of the steps measured."""
    f = Forecaster(JobModel(total_steps=200), start_s=0.0)
    end = drive(f, noisy(100, mean=0.010, cv=0.02))
    drive(f, noisy(12, mean=0.030, cv=0.02, seed=1), start=end, first_index=100)
    running = f.prediction
    assert running is not None and running.measured_ci_s is not None
    assert running.iteration_ci_s > 2 * running.measured_ci_s  # widened for the steps to come
    final = f.close()
    assert final is not None and final.iteration_s == running.iteration_s
    assert final.iteration_ci_s == pytest.approx(running.measured_ci_s)
    closed_early = Forecaster(JobModel(total_steps=200), start_s=0.0)
    drive(closed_early, noisy(100, mean=0.010, cv=0.02))
    steady = closed_early.prediction
    assert closed_early.close().iteration_ci_s == pytest.approx(steady.iteration_ci_s)


@pytest.mark.parametrize("outcome", ["interrupted", "failed"])
def test_an_interrupted_or_failed_job_keeps_the_whole_runs_projection(outcome: str) -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)
    drive(f, noisy(30))
    running = f.prediction
    final = f.close(outcome, "KeyboardInterrupt")
    assert final is running and final.total_steps == 100 and final.eta_s > 0


def test_an_unknown_length_is_known_once_the_job_ended() -> None:
    f = Forecaster(JobModel(total_steps=None), start_s=0.0)
    drive(f, noisy(12))
    assert f.prediction.total_steps is None and f.prediction.total_s is None
    final = f.close()
    assert (final.total_steps, final.eta_s) == (12, 0.0)
    assert final.total_s == pytest.approx(final.elapsed_s)


def test_a_loop_past_its_given_length_gets_no_made_up_total(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """total_steps=50 (miscounted) and the loop runs on: from step 51 the length is unknown,
    not 'ETA 0' for a job still running; one warning says why."""
    f = Forecaster(JobModel(total_steps=50), start_s=0.0)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    end_s = drive(f, noisy(50))
    at_end = f.prediction
    assert at_end is not None and (at_end.total_steps, at_end.remaining_steps) == (50, 0)
    drive(f, noisy(30, seed=1), start=end_s, first_index=50)
    past = f.prediction
    assert past is not None and past.step == 80
    assert past.total_steps is None and past.remaining_steps is None
    assert past.eta_s is None and past.total_s is None and past.finish_time is None
    assert past.iteration_s == pytest.approx(0.2, rel=0.1)
    warnings = [r.getMessage() for r in caplog.records if "past the job's length" in r.getMessage()]
    assert len(warnings) == 1 and "step 80, total_steps=50" in warnings[0]  # when first read
    final = f.close()  # ended: the 80 steps it ran
    assert (final.total_steps, final.eta_s) == (80, 0.0)


def test_an_unmarked_evaluation_every_n_steps_is_part_of_the_total() -> None:
    """A hand-written loop evaluates every 25 steps without ``hook.phase``: from the third
    evaluation on its share is in the step time, so the total holds (it was ~18% short)."""
    durations = noisy(300, mean=0.01, seed=3)
    durations[25::25] += 0.08  # the evaluation lands in the step after every 25th
    f = Forecaster(JobModel(total_steps=300), start_s=0.0)
    drive(f, durations[:160])
    p = f.prediction
    assert p is not None
    actual_total_s = float(durations.sum())
    assert p.total_s == pytest.approx(actual_total_s, rel=0.03)
    assert p.iteration_s > 0.0125  # the calm steps' 0.010 plus 0.08 / 25


def test_recurring_unmarked_work_is_named_once_with_a_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    durations = noisy(200, mean=0.01, seed=4)
    durations[25::25] += 0.08
    f = Forecaster(JobModel(total_steps=300), start_s=0.0)
    caplog.set_level(logging.INFO, logger="ets_hook")
    now = 0.0
    for start, end in ((0, 60), (60, 120), (120, 200)):  # read now and then, as reporters do
        now = drive(f, durations[start:end], start=now, first_index=start)
        assert f.prediction is not None
    hints = [r.getMessage() for r in caplog.records if "does not mark" in r.getMessage()]
    assert len(hints) == 1 and "every 25 steps" in hints[0] and "hook.phase" in hints[0]
    found = re.search(r"runs ([0-9.]+) ms longer", hints[0])
    assert found is not None and float(found.group(1)) == pytest.approx(80, rel=0.1)


def test_on_a_real_small_training_loop() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 64), torch.randn(256, 8)
    steps = 60
    start = time.perf_counter()
    f = Forecaster(JobModel(total_steps=steps), start_s=start, prior=estimators.StepTimePrior())
    predictions = []
    durations = []
    step_start = start
    for i in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        durations.append(now - step_start)
        f.on_step_end(i, now - step_start, now)
        step_start = now
        predictions.append(f.prediction)
    assert all(p is not None for p in predictions)
    final = predictions[-1]
    assert final is not None
    assert final.remaining_steps == 0
    assert final.total_s == pytest.approx(step_start - start)
    # The estimate is a mean (a total-time question) over the kept steps, or their recent half
    # when they drift; on a shared machine one hiccup can move it far from the median, so the
    # upper bound is on those means. Bursts of load from other processes are left out of the
    # mean (forecast.contention): under them the estimate sits at the calm steps' level, as low
    # as their median (a loaded machine's 60 steps of this loop: median 0.6 ms, mean 1-3 ms).
    kept = np.asarray(durations[final.warmup_steps :])
    means = (kept.mean(), kept[len(kept) // 2 :].mean())
    assert 0.7 * min(*means, np.median(kept)) < final.iteration_s < 1.3 * max(means)


def test_bad_durations_do_not_poison_the_estimate() -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)
    y = list(noisy(40, seed=9))
    y[5], y[6], y[7] = math.nan, math.inf, -0.1
    now = 0.0
    for i, d in enumerate(y):
        now += 0.2  # the clock is fine; only the durations are broken
        f.on_step_end(i, d, now)
    p = f.prediction
    assert p is not None and p.total_s is not None
    assert math.isfinite(p.iteration_s) and math.isfinite(p.total_s)
    assert p.iteration_s == pytest.approx(0.2, rel=0.1)


def test_capture_perturbed_steps_are_dropped_once_clean_steps_exist() -> None:
    """Steps 1-5 carry a 10% capture cost, which MSER cannot always tell from noise on 12 steps:
    marked as perturbed, they leave the measured estimate once 3 clean steps exist."""
    plain_errors, marked_errors = [], []
    for seed in range(6):
        durations = noisy(12, mean=0.2, cv=0.04, seed=seed)
        durations[1:6] *= 1.1
        plain = Forecaster(JobModel(total_steps=1000), start_s=0.0, wall_start_s=WALL_START)
        marked = Forecaster(JobModel(total_steps=1000), start_s=0.0, wall_start_s=WALL_START)
        marked.set_perturbed_steps(6)
        drive(plain, durations[:8])
        drive(marked, durations[:8])
        # two clean steps are not enough: both still rest on the perturbed steps
        assert marked.prediction.measured_steps == plain.prediction.measured_steps
        drive(plain, durations[8:], start=10.0, first_index=8)
        drive(marked, durations[8:], start=10.0, first_index=8)
        p = marked.prediction
        assert p.warmup_steps >= 6 and p.measured_steps == 12 - p.warmup_steps
        plain_errors.append(abs(plain.prediction.iteration_s / 0.2 - 1))
        marked_errors.append(abs(p.iteration_s / 0.2 - 1))
    assert all(m <= q + 1e-12 for m, q in zip(marked_errors, plain_errors, strict=True))
    assert max(marked_errors) < 0.02 < max(plain_errors)
    with pytest.raises(ValueError, match="-1"):
        Forecaster(start_s=0.0).set_perturbed_steps(-1)


def test_clean_steps_before_the_window_stay_once_clean_steps_follow_it() -> None:
    """The window after three clean steps (the default ``skip_steps``): once three clean
    steps follow the decode, the estimate rests on the clean steps before the window as well
    as after it, and never on the window or the decode; a window after one step (no clean
    step of its own before it) leaves the old rule: everything before the decode's end is
    warm-up."""
    durations = noisy(12, mean=0.2, cv=0.02, seed=4)
    durations[0] *= 2.0  # the first step
    durations[3:5] *= 1.5  # the window
    durations[5:7] *= 4.0  # the decode
    later = Forecaster(JobModel(total_steps=1000), start_s=0.0, wall_start_s=WALL_START)
    later.set_capture_window(3, 5)
    later.set_perturbed_steps(7)
    drive(later, durations[:10])
    p = later.prediction
    assert p.measured_steps == 2 + 3  # steps 1-2 and 7-9
    assert p.iteration_s == pytest.approx(0.2, rel=0.06)
    early = Forecaster(JobModel(total_steps=1000), start_s=0.0, wall_start_s=WALL_START)
    early.set_capture_window(1, 5)
    early.set_perturbed_steps(7)
    drive(early, durations[:10])
    assert early.prediction.measured_steps == 3


def test_capture_window_steps_are_corrected_and_the_disable_spike_is_ignored() -> None:
    """Inside the window steps run 1.2x slow (the profiler), the step after it carries the
    profiler's disable (20x): before any clean step exists the estimate must neither follow
    the spike nor the 20% inflation."""
    durations = noisy(8, mean=0.2, cv=0.02, seed=1)
    durations[1:6] *= 1.2
    durations[6] *= 20.0
    plain = Forecaster(JobModel(total_steps=1000), start_s=0.0, wall_start_s=WALL_START)
    aware = Forecaster(JobModel(total_steps=1000), start_s=0.0, wall_start_s=WALL_START)
    aware.set_capture_window(1, 6)
    aware.set_perturbed_steps(7)
    drive(plain, durations[:7])
    drive(aware, durations[:7])
    window_only = aware.prediction.iteration_s
    assert abs(window_only / 0.2 - 1) < 0.08  # corrected by 1/1.2, not 1.2x high
    assert abs(plain.prediction.iteration_s / 0.2 - 1) > 2 * abs(window_only / 0.2 - 1)
    drive(aware, durations[7:], start=10.0, first_index=7)
    assert abs(aware.prediction.iteration_s / 0.2 - 1) < 0.08  # the spike stays out
    with pytest.raises(ValueError, match="start_step"):
        aware.set_capture_window(5, 2)


def test_the_native_capture_is_priced_in_seconds_and_steps_until_its_window_measures_it() -> None:
    """The decode costs about a fixed time whatever the step's length: before the window's
    own measure, a 0.23 s step's job is charged well under a second for it (0.5-11 steps, the
    old prior, made 1.5 s of it); the window's measure, in the job's steps, replaces both."""
    from ets_hook.capture.ops import NativeOpCapture

    costs = NativeOpCapture.cpu_costs
    f = Forecaster(JobModel(total_steps=120), start_s=0.0, wall_start_s=WALL_START)
    f.set_capture_window(3, 5, **costs)
    drive(f, noisy(3, mean=0.23, cv=0.01, seed=4))
    p = f.prediction
    (r_lo, r_hi), (s_lo, s_hi) = costs["capture_ratio"], costs["capture_spike_steps"]
    e_lo, e_hi = costs["capture_spike_excess_s"]
    steps = (0.5 * (r_lo + r_hi) - 1.0) * 2 + 0.5 * (s_lo + s_hi)
    assert p.remaining_capture_s == pytest.approx(p.iteration_s * steps + 0.5 * (e_lo + e_hi))
    assert p.remaining_capture_s < 0.2 < 0.5 * (0.5 + 11.0) * p.iteration_s
    # The window's own measure (in steps) clears the seconds part.
    f.set_capture_window(
        3, 5, capture_ratio=(1.0, 1.1), capture_spike_steps=(0.2, 0.4), measured=True
    )
    assert f.prior.capture_spike_excess_s == (0.0, 0.0)
    with pytest.raises(ValueError, match="capture_spike_excess_s"):
        estimators.StepTimePrior(capture_spike_excess_s=(0.02, 0.01))


def test_total_includes_the_capture_cost_still_to_come() -> None:
    """Until the step after the window has ended, the total carries the window steps not yet
    run (slowed by the capture ratio) and the one-off disable + decode spike; that step
    included, the spike is in the elapsed time and no longer projected."""
    prior = estimators.StepTimePrior(capture_ratio=(1.0, 1.4), capture_spike_steps=(10.0, 20.0))
    durations = noisy(12, mean=0.2, cv=0.02, seed=3)
    durations[1:6] *= 1.2
    durations[6] *= 16.0  # the spike
    f = Forecaster(JobModel(total_steps=300), start_s=0.0, wall_start_s=WALL_START, prior=prior)
    f.set_capture_window(1, 6)
    now = drive(f, durations[:3])  # steps 0-2 done: window steps 3, 4, 5 still to run
    p = f.prediction
    assert p.remaining_capture_s == pytest.approx(p.iteration_s * (0.2 * 3 + 15.0))
    expected = p.elapsed_s + p.remaining_steps * p.iteration_s + p.remaining_capture_s
    assert p.total_s == pytest.approx(expected)
    assert p.eta_s == pytest.approx(p.total_s - p.elapsed_s)
    # the spike's spread is in the interval: a prior sure of the same spike size gives less
    sure = estimators.StepTimePrior(capture_ratio=(1.0, 1.4), capture_spike_steps=(15.0, 15.0))
    g = Forecaster(JobModel(total_steps=300), start_s=0.0, wall_start_s=WALL_START, prior=sure)
    g.set_capture_window(1, 6)
    drive(g, durations[:3])
    assert g.prediction.total_s == pytest.approx(p.total_s)
    assert p.total_ci_s > g.prediction.total_ci_s
    now = drive(f, durations[3:6], start=now, first_index=3)
    assert f.prediction.remaining_capture_s == pytest.approx(f.prediction.iteration_s * 15.0)
    drive(f, durations[6:7], start=now, first_index=6)
    assert f.prediction.remaining_capture_s == 0.0

    # a job that ends inside the window never reaches the spike
    short = Forecaster(JobModel(total_steps=4), start_s=0.0, wall_start_s=WALL_START, prior=prior)
    short.set_capture_window(1, 6)
    drive(short, durations[:2])
    assert short.prediction.remaining_capture_s == 0.0
    with pytest.raises(ValueError, match="capture_spike_steps"):
        estimators.StepTimePrior(capture_spike_steps=(5.0, 1.0))


def test_the_window_measure_is_read_when_a_prediction_is_built_not_at_every_step() -> None:
    """The window's measured costs come from a source asked only when a prediction (or the
    prior) is built: steps alone never call it, and its latest costs are the ones applied, the
    same as pushing them with ``set_capture_window``."""
    prior = estimators.StepTimePrior(
        capture_ratio=(1.0, 1.4), capture_spike_steps=(10.0, 20.0), early_in_window=False
    )
    durations = noisy(12, mean=0.2, cv=0.02, seed=3)
    measures = [
        {"capture_ratio": (1.1, 1.2), "capture_spike_steps": (2.0, 3.0), "measured": True},
        {"capture_ratio": (1.3, 1.5), "capture_spike_steps": (4.0, 6.0), "measured": True},
    ]
    calls = []

    def source() -> dict | None:
        calls.append(1)
        return measures[0] if len(calls) < 3 else measures[1]

    pulled = Forecaster(
        JobModel(total_steps=300), start_s=0.0, wall_start_s=WALL_START, prior=prior
    )
    pulled.set_capture_window(1, 6)
    pulled.set_window_measure(source)
    now = drive(pulled, durations[:3])
    assert calls == []  # three steps, no prediction read: the source was never asked
    first = pulled.prediction
    assert len(calls) == 1 and pulled.prior.capture_ratio == (1.1, 1.2)
    pushed = Forecaster(
        JobModel(total_steps=300), start_s=0.0, wall_start_s=WALL_START, prior=prior
    )
    pushed.set_capture_window(1, 6, **measures[0])
    drive(pushed, durations[:3])
    assert first.total_s == pytest.approx(pushed.prediction.total_s)
    assert first.remaining_capture_s == pytest.approx(pushed.prediction.remaining_capture_s)
    drive(pulled, durations[3:5], start=now, first_index=3)
    assert pulled.prediction.remaining_capture_s == pytest.approx(
        pulled.prediction.iteration_s * ((1.4 - 1.0) * 1 + 5.0)
    )
    assert pulled.prior.capture_spike_steps == (4.0, 6.0)


# ----------------------------------------------------------------------------------------------
# Multi-process jobs: rank, world size and the job view of a rank exchange


def _rank_forecast(rank: int, finish_wall_s: float | None, busy_s: float = 0.1) -> RankForecast:
    return RankForecast(
        rank=rank,
        step=50,
        start_wall_s=WALL_START,
        finish_wall_s=finish_wall_s,
        finish_ci_s=0.5,
        iteration_s=0.2,
        busy_s=busy_s,
        busy_se_s=0.0,  # several captured steps alike
    )


def _job_view(own_rank: int, own_finish: float, other_finish: float, **busy: float) -> JobView:
    other = 1 - own_rank
    return aggregate_ranks(
        [
            _rank_forecast(own_rank, own_finish, busy.get("own", 0.1)),
            _rank_forecast(other, other_finish, busy.get("other", 0.1)),
        ],
        exchange=0,
        world_size=2,
    )


def _rank_forecaster(rank: int = 1, world_size: int = 2, total_steps: int = 200) -> Forecaster:
    f = Forecaster(
        JobModel(total_steps=total_steps),
        start_s=0.0,
        wall_start_s=WALL_START,
        rank=rank,
        world_size=world_size,
    )
    drive(f, noisy(50))
    return f


def test_predictions_carry_rank_and_world_size() -> None:
    p = _rank_forecaster(rank=1, world_size=4).prediction
    assert p is not None
    assert (p.rank, p.world_size) == (1, 4)
    assert p.local_total_s == p.total_s
    assert p.slowest_rank is None and p.job_view_step is None and p.straggler_rank is None
    single = Forecaster(JobModel(total_steps=10), start_s=0.0)
    drive(single, noisy(3))
    assert (single.prediction.rank, single.prediction.world_size) == (0, 1)
    doc = json.loads(p.to_json())
    assert (doc["rank"], doc["world_size"], doc["local_total_s"]) == (1, 4, p.total_s)


def test_job_view_moves_total_eta_and_finish_by_the_lag() -> None:
    f = _rank_forecaster(rank=1)
    own = f.prediction
    assert own is not None and own.total_s is not None and own.finish_time is not None
    own_finish = WALL_START + own.total_s
    lag = 37.5
    view = _job_view(1, own_finish, own_finish + lag, own=0.25, other=0.1)
    assert not view.lockstep and view.slowest_rank == 0 and view.straggler_rank == 1
    f.set_job_view(view)
    p = f.prediction
    assert p is not None and p is not own  # the cached prediction is rebuilt
    assert p.total_s == pytest.approx(own.total_s + lag)
    assert p.eta_s == pytest.approx(own.eta_s + lag)
    assert p.finish_time.timestamp() == pytest.approx(own.finish_time.timestamp() + lag)
    assert p.local_total_s == pytest.approx(own.total_s)
    assert p.elapsed_s == own.elapsed_s and p.iteration_s == own.iteration_s
    assert (p.slowest_rank, p.job_view_step, p.straggler_rank) == (0, view.step, 1)
    # Later steps keep the lag measured at the exchange.
    drive(f, noisy(20, seed=5), start=own.elapsed_s, first_index=50)
    later = f.prediction
    assert later.step == own.step + 20
    assert later.total_s - later.local_total_s == pytest.approx(lag)
    assert later.job_view_step == view.step
    # Ended here (an early stop at step 70 of 200): the job as it ran, the lag (a
    # prediction) dropped: a closed job has no time left.
    final = f.close()
    assert (final.total_steps, final.remaining_steps) == (70, 0)
    assert final.local_total_s == final.total_s == pytest.approx(later.elapsed_s)
    assert final.eta_s == 0.0
    assert final.finish_time == later.as_of
    assert (final.slowest_rank, final.straggler_rank) == (0, 1)


def test_a_closed_rank_ahead_of_the_lockstep_median_has_no_time_left() -> None:
    """In lock step the job's end is the median of the ranks' ends: the rank predicted to end
    before it carries a positive lag while running, which the closed job must not keep (a
    closed job file showed ``eta_s: 0.0105`` with ``state: closed``)."""
    f = _rank_forecaster(rank=0)
    own = f.prediction
    own_finish = WALL_START + own.total_s
    view = _job_view(0, own_finish, own_finish + 0.021)  # within the intervals: lock step
    assert view.lockstep and view.finish_wall_s > own_finish and view.slowest_rank == 1
    f.set_job_view(view)
    running = f.prediction
    assert running.eta_s == pytest.approx(own.eta_s + 0.0105)  # the median is 10.5 ms later
    final = f.close()
    assert final.eta_s == 0.0
    assert final.total_s == final.local_total_s == pytest.approx(running.elapsed_s)
    assert final.finish_time == running.as_of
    assert f.prediction is final  # and so it stays


def test_the_capture_host_load_is_the_busiest_sample_around_the_window() -> None:
    """Samples as the hook gives them: at each step end, before the window starts there and
    before the forecaster hears of the step. Window [4, 7): the latest sample before it until
    one from inside it comes, then the busiest from its start to the first after its end."""
    f = Forecaster(JobModel(total_steps=100), start_s=0.0, wall_start_s=WALL_START)
    loads = {0: 0.9, 3: 0.3, 5: 0.1, 6: 0.6, 8: 0.2, 9: 0.95}  # step index -> sampled share
    seen: list[float | None] = []
    now = 0.0
    for i in range(12):
        now += 0.1
        if i in loads:
            f.set_host_load(loads[i], 0.0)
        if i == 3:
            f.set_capture_window(4, 7)
        if i == 6:
            f.set_capture_window(4, 7)  # the adaptive window's end, told again: no reset
        f.on_step_end(i, 0.1, now)
        seen.append(f.prediction.capture_host_foreign_cpu)
    assert seen[:3] == [None] * 3  # no window yet
    assert seen[3:5] == [0.3, 0.3]  # the sample just before the window
    assert seen[5] == 0.1 and seen[6:8] == [0.6, 0.6]  # samples from inside it
    assert seen[8:] == [0.6] * 4  # the one after its end (0.2) closes it; 0.95 is later
    assert f.prediction.host_foreign_cpu == 0.95  # the latest sample, as before


def test_a_straggler_on_a_busy_host_is_carried_and_said() -> None:
    f = _rank_forecaster(rank=0)
    own = f.prediction
    own_finish = WALL_START + own.total_s
    for share, expected in ((0.7, 0.7), (0.1, None)):
        view = aggregate_ranks(
            [
                dataclasses.replace(_rank_forecast(0, own_finish, 0.3), host_foreign_cpu=share),
                _rank_forecast(1, own_finish + 0.01, 0.1),
            ],
            exchange=0,
            world_size=2,
        )
        assert view.lockstep and view.straggler_rank == view.slowest_rank == 0
        f.set_job_view(view)
        p = f.prediction
        assert p.straggler_host_foreign_cpu == expected
        line = str(p)
        assert ("job of 2 ranks, this rank ends last" in line) and (
            ("its host was busy: other processes 70% of its CPU during the capture" in line)
            == (expected is not None)
        )


def test_the_slowest_rank_itself_is_not_moved() -> None:
    f = _rank_forecaster(rank=1)
    own = f.prediction
    own_finish = WALL_START + own.total_s
    f.set_job_view(_job_view(1, own_finish, own_finish - 100.0))
    p = f.prediction
    assert p.slowest_rank == 1
    assert p.total_s == pytest.approx(own.total_s)
    assert p.eta_s == pytest.approx(own.eta_s)


def test_none_restores_this_ranks_own_prediction() -> None:
    f = _rank_forecaster(rank=1)
    own = f.prediction
    own_finish = WALL_START + own.total_s
    f.set_job_view(_job_view(1, own_finish, own_finish + 60.0))
    assert f.prediction.total_s != pytest.approx(own.total_s)
    f.set_job_view(None)
    p = f.prediction
    assert p.total_s == pytest.approx(own.total_s) and p.eta_s == pytest.approx(own.eta_s)
    assert p.finish_time == own.finish_time
    assert p.local_total_s == p.total_s
    assert p.slowest_rank is None and p.job_view_step is None and p.straggler_rank is None


def test_eta_never_goes_below_zero() -> None:
    f = _rank_forecaster(rank=0)
    own = f.prediction
    own_finish = WALL_START + own.total_s
    # Two ranks in lock step whose median end lies far before this rank's own end.
    view = aggregate_ranks(
        [
            RankForecast(0, 50, WALL_START, own_finish, 1e6, 0.2),
            RankForecast(1, 50, WALL_START, own_finish - 1e5, 1e6, 0.2),
        ],
        exchange=3,
        world_size=2,
    )
    assert view.finish_wall_s - own_finish < -own.eta_s
    f.set_job_view(view)
    p = f.prediction
    assert p.eta_s == 0.0
    assert p.total_s == pytest.approx(p.elapsed_s)
    assert p.finish_time.timestamp() == pytest.approx(WALL_START + p.elapsed_s)
    assert p.local_total_s == pytest.approx(own.total_s)


def test_a_view_without_an_end_leaves_the_totals_alone() -> None:
    f = _rank_forecaster(rank=1)
    own = f.prediction
    view = _job_view(1, WALL_START + own.total_s, WALL_START)
    unknown = JobView(
        exchange=1,
        step=50,
        world_size=2,
        ranks=view.ranks,
        slowest_rank=None,
        finish_wall_s=None,
        start_wall_s=WALL_START,
    )
    f.set_job_view(unknown)
    p = f.prediction
    assert p.total_s == pytest.approx(own.total_s)
    assert p.job_view_step == 50 and p.slowest_rank is None


def test_a_view_with_an_unknown_job_length_is_harmless() -> None:
    f = Forecaster(start_s=0.0, wall_start_s=WALL_START, rank=1, world_size=2)
    drive(f, noisy(20))
    f.set_job_view(_job_view(1, WALL_START + 10.0, WALL_START + 50.0))
    p = f.prediction
    assert p.total_s is None and p.eta_s is None and p.local_total_s is None
    assert p.slowest_rank == 0


def test_set_job_view_refuses_other_objects() -> None:
    f = _rank_forecaster()
    with pytest.raises(ValueError, match="JobView"):
        f.set_job_view({"finish_wall_s": 1.0})  # type: ignore[arg-type]


@pytest.mark.parametrize(("rank", "world_size"), [(-1, 2), (2, 2), (3, 2), (0, 0), (1, 1)])
def test_rank_must_be_inside_the_world(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        Forecaster(start_s=0.0, rank=rank, world_size=world_size)


def test_workers_slower_than_the_early_steps_set_the_step_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prefetched batches make the first steps 4 ms; two workers at 20 ms a batch deliver one
    # every 10 ms, and the loop will run at that pace once the prefetched batches are gone.
    f = Forecaster(JobModel(total_steps=300), start_s=0.0)
    finish_times = [[0.02 * i for i in range(8)], [0.01 + 0.02 * i for i in range(8)]]
    reading = (finish_times, [[], []])
    f.set_input_supply(lambda: reading)
    drive(f, [0.004] * 6)
    p = f.prediction
    assert p is not None
    assert p.source == "input"
    assert p.input_period_s == pytest.approx(0.010)
    assert p.iteration_s == pytest.approx(0.010)
    assert p.measured_iteration_s < 0.005
    assert p.total_s == pytest.approx(p.elapsed_s + 294 * 0.010 + p.remaining_capture_s)
    # The same reading (no worker finished a batch since) is not worked out again.
    calls = []
    original = forecaster_module.supply_from_loaders

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(forecaster_module, "supply_from_loaders", counted)
    drive(f, [0.004] * 3, start=p.elapsed_s, first_index=6)
    assert f.prediction.iteration_s == pytest.approx(0.010)
    assert calls == []
    reading = ([[*t, t[-1] + 0.02] for t in finish_times], [[], []])  # a new batch each
    drive(f, [0.004], start=p.elapsed_s + 0.012, first_index=9)
    assert f.prediction.input_period_s == pytest.approx(0.010)
    assert calls == [1]
    f.set_input_supply(None)
    assert f.prediction.iteration_s < 0.005


def test_of_several_loaders_the_slowest_sets_the_step_time() -> None:
    """Two train loaders, a batch from each per step (Lightning's combined loaders): one
    delivers every 5 ms, the other every 12 ms; the step cannot run faster than 12 ms."""
    f = Forecaster(JobModel(total_steps=300), start_s=0.0)
    fast = ([[0.005 * i for i in range(10)]], [[]])
    slow = ([[0.024 * i for i in range(8)], [0.012 + 0.024 * i for i in range(8)]], [[], []])
    f.set_input_supply(lambda: fast)
    drive(f, [0.004] * 6)
    assert f.prediction.input_period_s == pytest.approx(0.005)
    f.set_input_supply([lambda: fast, lambda: slow])
    assert f.prediction.source == "input"
    assert f.prediction.input_period_s == pytest.approx(0.012)
    assert f.prediction.iteration_s == pytest.approx(0.012)
    f.set_input_supply([lambda: slow, lambda: ([[0.0]], [[]])])  # one without an estimate yet
    assert f.prediction.input_period_s == pytest.approx(0.012)


def test_an_unreadable_batch_clock_is_no_floor_and_no_failure() -> None:
    f = Forecaster(JobModel(total_steps=100), start_s=0.0)

    def broken() -> tuple[list[list[float]], list[list[float]]]:
        raise OSError("shared memory gone")

    f.set_input_supply(broken)
    drive(f, [0.004] * 6)
    p = f.prediction
    assert p is not None and p.source == "measured" and p.input_period_s is None
    drive(f, [0.004] * 3, first_index=6)
    assert f.prediction.step == 9  # still predicting: the forecaster did not fail


def test_a_lone_step_after_compile_steps_is_taken_at_its_own_time() -> None:
    """While every step so far is warm-up (compile steps and the one after), the prediction
    rests on the last step. Past step 0 that step's own time is the estimate, with the
    first-step prior's relative width: the first-step correction (its excess and ratio) is
    the process's first step's, and applied to a later step it halved it (a compiled job
    predicted 45% low at step 2)."""
    f = Forecaster(JobModel(total_steps=100), start_s=0.0, wall_start_s=WALL_START)
    f.set_warmup_steps(3)  # step 0 compiled: it and the next are warm-up
    now = drive(f, [0.030])
    first = f.prediction
    low, high = f.prior.first_step_range_s(0.030)
    assert first is not None and first.warming_up
    assert first.iteration_s == pytest.approx(0.5 * (low + high))  # step 0: corrected
    drive(f, [0.049], start=now, first_index=1)
    second = f.prediction
    assert second is not None and second.warming_up and second.source == "prior"
    assert second.iteration_s == pytest.approx(0.049)
    low, high = f.prior.first_step_range_s(0.049)
    assert second.iteration_ci_s == pytest.approx(0.049 * (high - low) / (high + low))
