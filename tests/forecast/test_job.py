"""Job model: step counting (epochs, gradient accumulation), phase measurement and projection."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import (
    CHECKPOINT_FIXED_S,
    CHECKPOINT_SERIALIZE_BYTES_PER_S,
    CHECKPOINT_WRITE_BYTES_PER_S,
    FORWARD_SHARE,
    JobModel,
    PhaseCostPrior,
    PhaseTracker,
    checkpoint_cost_prior,
    eval_cost_prior,
    eval_prior_from_loaders,
    remaining_phase_time,
)


class Loader:
    def __init__(self, n: int, batch_size: int | None = None) -> None:
        self.n = n
        self.batch_size = batch_size

    def __len__(self) -> int:
        return self.n


# ---------------------------------------------------------------------------------------------
# Step counting


def test_total_steps_from_epochs_and_dataloader_with_grad_accumulation() -> None:
    # 100 micro-batches per epoch, 4 per optimizer step: 25 optimizer steps per epoch.
    job = JobModel.from_args(epochs=3, dataloader=Loader(100), grad_accum_steps=4)
    assert job.steps_per_epoch == 25
    assert job.total_steps == 75
    # A trailing partial accumulation still makes an optimizer step.
    assert JobModel.from_args(epochs=2, batches_per_epoch=101, grad_accum_steps=4).total_steps == 52
    assert JobModel.from_args(total_batches=1000, grad_accum_steps=8).total_steps == 125
    assert JobModel.from_args(epochs=2.5, steps_per_epoch=10).total_steps == 25


def test_an_iterable_loader_without_len_gives_no_epochs_but_is_no_error() -> None:
    """An IterableDataset's loader: the length comes from total_steps (or is unknown)."""
    job = JobModel.from_args(total_steps=10, dataloader=iter([1, 2]))
    assert job.total_steps == 10 and job.steps_per_epoch is None
    assert JobModel.from_args(dataloader=iter([1, 2])).total_steps is None
    with_epoch_length = JobModel.from_args(epochs=2, steps_per_epoch=5, dataloader=iter([1]))
    assert with_epoch_length.total_steps == 10


def test_whichever_limit_comes_first_ends_the_job() -> None:
    job = JobModel.from_args(total_steps=50, epochs=10, steps_per_epoch=100)
    assert job.total_steps == 50
    assert JobModel.from_args(total_steps=5000, epochs=2, steps_per_epoch=100).total_steps == 200
    assert JobModel.from_args().total_steps is None
    assert JobModel.from_args().remaining_steps(10) is None
    assert JobModel.from_args(total_steps=10).remaining_steps(12) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total_steps": 0}, "total_steps must be an int >= 1, got 0"),
        ({"grad_accum_steps": 0}, "grad_accum_steps must be an int >= 1, got 0"),
        ({"epochs": 2}, "epochs needs steps_per_epoch"),
        ({"epochs": -1, "steps_per_epoch": 3}, "epochs must be a number > 0, got -1"),
        ({"epochs": 1, "dataloader": iter([1, 2])}, "dataloader has no len()"),
        ({"total_steps": 5, "dataloader": 7}, "dataloader must be a data loader (iterable)"),
        ({"eval_every": 0}, "eval_every must be an int >= 1, got 0"),
        ({"phase_every": {"save": -2}}, "phase_every['save'] must be an int >= 0, got -2"),
        ({"initial_step": -1}, "initial_step must be an int >= 0, got -1"),
        (
            {"steps_per_epoch": 10, "batches_per_epoch": 100, "grad_accum_steps": 4},
            "contradicts",
        ),
    ],
)
def test_bad_job_arguments_raise_with_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        JobModel.from_args(**kwargs)


# ---------------------------------------------------------------------------------------------
# Phase projection


def test_hinted_eval_phase_is_projected_over_the_remaining_schedule() -> None:
    job = JobModel.from_args(total_steps=1000, eval_every=100)
    tracker = PhaseTracker(job)
    (eval_,) = tracker.project(50)
    # Evaluations after steps 100..1000: the one after the last step ends the job.
    assert eval_.remaining == 10
    assert eval_.remaining_s is None  # cost unknown before the first one
    # At step 100 the evaluation due there has not happened yet: still pending.
    assert tracker.project(100)[0].remaining == 10
    tracker.record("eval", 10.0, 100)
    (eval_,) = tracker.project(100)
    assert eval_.occurrences == 1
    assert eval_.remaining == 9
    assert eval_.remaining_s == pytest.approx(90.0)
    # At the last step, the final evaluation is still to come; once run, nothing is.
    for step in range(200, 1001, 100):
        assert tracker.project(step)[0].remaining == 1 + (1000 - step) // 100
        tracker.record("eval", 10.0, step)
    assert tracker.project(1000)[0].remaining == 0
    assert eval_.period_source == "hint"


def test_first_occurrence_is_not_taken_as_the_typical_cost() -> None:
    job = JobModel.from_args(total_steps=1000, checkpoint_every=100)
    tracker = PhaseTracker(job)
    for step, cost in ((100, 30.0), (200, 10.0), (300, 12.0), (400, 8.0)):
        tracker.record("checkpoint", cost, step)
    (ckpt,) = tracker.project(400)
    assert ckpt.mean_s == pytest.approx(10.0)
    assert ckpt.spent_s == pytest.approx(60.0)
    assert ckpt.remaining == 6  # after 500..1000
    total, ci = remaining_phase_time((ckpt,))
    assert total == pytest.approx(60.0)
    assert 0 < ci < total


def test_a_first_occurrence_known_as_a_lower_bound_prices_the_next_from_its_range() -> None:
    job = JobModel.from_args(total_steps=400, phase_every={"epoch start": 100})
    tracker = PhaseTracker(job)
    tracker.record("epoch start", 0.1, 0, first_to_later=(1.0, 2.2))
    (start,) = tracker.project(5)
    assert start.mean_s == pytest.approx(0.16) and start.mean_ci_s == pytest.approx(0.06)
    assert start.spent_s == pytest.approx(0.1)  # what it took, not what it prices
    assert start.remaining == 3 and start.remaining_s == pytest.approx(0.48)
    # once a later one is measured, the later ones alone price it, as for any phase
    tracker.record("epoch start", 0.25, 100)
    (start,) = tracker.project(105)
    assert start.mean_s == pytest.approx(0.25)
    # the default: the first occurrence, +-50%
    tracker.record("eval", 2.0, 50)
    assert tracker.project(105)[1].mean_ci_s == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [(0.0, 1.0), (2.0, 1.0), (1.0, float("inf")), (-1.0, 1.0)])
def test_a_first_occurrence_range_must_be_positive_and_ordered(bad: tuple[float, float]) -> None:
    tracker = PhaseTracker(JobModel.from_args(total_steps=10))
    with pytest.raises(ValueError, match="first_to_later"):
        tracker.record("epoch start", 0.1, 0, first_to_later=bad)


def test_period_is_inferred_from_occurrences_without_hints() -> None:
    tracker = PhaseTracker(JobModel.from_args(total_steps=600))
    tracker.record("val", 5.0, 150)
    (val,) = tracker.project(150)
    assert (val.period_steps, val.period_source, val.remaining) == (150, "single", 3)
    tracker.record("val", 5.0, 300)
    tracker.record("val", 5.0, 450)
    (val,) = tracker.project(460)
    assert (val.period_steps, val.period_source, val.remaining) == (150, "inferred", 1)
    (val,) = tracker.project(600)
    assert val.remaining == 1  # after the last step (600): part of the job time
    tracker.record("val", 5.0, 600)
    assert tracker.project(600)[0].remaining == 0


def test_phase_before_training_and_one_off_hint_are_not_projected() -> None:
    job = JobModel.from_args(total_steps=100, phase_every={"profile": 0})
    tracker = PhaseTracker(job)
    tracker.record("setup", 3.0, 0)
    tracker.record("profile", 2.0, 10)
    by_name = {p.name: p for p in tracker.project(10)}
    assert by_name["setup"].period_source == "one-off"
    assert by_name["setup"].remaining == 0
    assert by_name["profile"].period_source == "one-off"
    assert by_name["profile"].remaining_s == 0.0


def test_occurrences_at_the_same_step_add_up() -> None:
    tracker = PhaseTracker(JobModel.from_args(total_steps=400, eval_every=100))
    for step in (100, 200):
        tracker.record("eval", 4.0, step)  # validation set
        tracker.record("eval", 6.0, step)  # test set
    (eval_,) = tracker.project(200)
    assert eval_.occurrences == 2
    assert eval_.mean_s == pytest.approx(10.0)
    assert eval_.remaining_s == pytest.approx(20.0)  # after 300 and 400


def test_resumed_job_counts_global_steps() -> None:
    job = JobModel.from_args(total_steps=1000, initial_step=600, eval_every=100)
    tracker = PhaseTracker(job)
    (eval_,) = tracker.project(650)
    assert eval_.remaining == 4  # after 700, 800, 900, 1000


# ---------------------------------------------------------------------------------------------
# The job model inside the forecaster


def simulate(
    forecaster: Forecaster,
    steps: int,
    *,
    step_s: float,
    eval_every: int,
    eval_s: float,
    seed: int = 0,
    stop_at: int | None = None,
) -> float:
    """Drive the forecaster like the hook would; returns the wall time at the end."""
    rng = np.random.default_rng(seed)
    now = 0.5  # setup between hook creation and the first step
    for i in range(stop_at or steps):
        duration = step_s * (1.7 if i == 0 else 1.0) * (1.0 + 0.05 * rng.standard_normal())
        now += duration
        forecaster.on_step_end(i, duration, now)
        if (i + 1) % eval_every == 0:  # the last step's too: the loop runs it
            cost = eval_s * (1.5 if i + 1 == eval_every else 1.0)
            now += cost
            forecaster.on_phase_end("eval", cost, now)
    return now


def test_eval_phases_and_grad_accumulation_give_the_right_total() -> None:
    # 2 epochs of 160 micro-batches with 4-step accumulation = 80 optimizer steps,
    # an evaluation every 20 optimizer steps (first one slower).
    job = JobModel.from_args(epochs=2, dataloader=Loader(160), grad_accum_steps=4, eval_every=20)
    assert job.total_steps == 80
    actual = simulate(
        Forecaster(job, start_s=0.0), 80, step_s=0.2, eval_every=20, eval_s=3.0, seed=1
    )
    forecaster = Forecaster(job, start_s=0.0)
    simulate(forecaster, 80, step_s=0.2, eval_every=20, eval_s=3.0, seed=1, stop_at=40)
    p = forecaster.prediction
    assert p is not None
    # Evaluations are out of the step rate...
    assert p.iteration_s == pytest.approx(0.2, rel=0.05)
    # ...and projected: two more evaluations (after steps 60 and 80) at the later cost.
    eval_, epoch_start = p.phases  # the epoch start is hinted by the epochs, not yet seen
    assert (eval_.name, epoch_start.name) == ("eval", "epoch start")
    assert epoch_start.occurrences == 0 and epoch_start.remaining_s is None
    assert eval_.remaining == 2
    assert eval_.mean_s == pytest.approx(3.0)
    assert p.total_s == pytest.approx(actual, rel=0.03)
    assert abs(p.total_s - actual) <= p.total_ci_s


# ---------------------------------------------------------------------------------------------
# Phases priced before they are measured


def test_a_prior_prices_a_hinted_phase_until_it_is_measured() -> None:
    tracker = PhaseTracker(JobModel.from_args(total_steps=1000, eval_every=100))
    tracker.set_prior("eval", PhaseCostPrior(seconds=1.0, train_steps=20.0, rel_ci=0.5))
    (eval_,) = tracker.project(50, iteration_s=0.1)
    assert eval_.cost_source == "prior" and eval_.occurrences == 0
    assert eval_.mean_s == pytest.approx(1.0 + 20 * 0.1)
    assert eval_.mean_ci_s == pytest.approx(0.5 * 3.0)
    assert eval_.remaining == 10 and eval_.remaining_s == pytest.approx(30.0)
    # The part in training steps follows the step time; without one it is not used.
    assert tracker.project(50, iteration_s=0.2)[0].mean_s == pytest.approx(5.0)
    (unpriced,) = tracker.project(50)
    assert unpriced.cost_source == "unknown" and unpriced.remaining_s is None
    # The first measured occurrence replaces the prior.
    tracker.record("eval", 7.0, 100)
    (eval_,) = tracker.project(100, iteration_s=0.1)
    assert eval_.cost_source == "measured" and eval_.mean_s == pytest.approx(7.0)
    # A fixed prior in seconds needs no step time; None removes a prior.
    tracker2 = PhaseTracker(JobModel.from_args(total_steps=1000, checkpoint_every=500))
    tracker2.set_prior("checkpoint", PhaseCostPrior(seconds=2.0))
    (ckpt,) = tracker2.project(10)
    assert ckpt.cost_source == "prior" and ckpt.remaining_s == pytest.approx(4.0)  # 500, 1000
    tracker2.set_prior("checkpoint", None)
    assert tracker2.project(10)[0].cost_source == "unknown"


def test_an_evaluation_is_priced_at_a_forward_per_batch() -> None:
    prior = eval_cost_prior(batches=30, batch_ratio=2.0, grad_accum_steps=4)
    assert prior.train_steps == pytest.approx(30 * 2.0 * FORWARD_SHARE / 4)
    assert prior.seconds == 0.0 and prior.rel_ci > 0
    # From the loaders: batches from len(), the ratio from their batch sizes.
    from_loaders = eval_prior_from_loaders(Loader(30, 64), Loader(1000, 32), grad_accum_steps=4)
    assert from_loaders == prior
    # Unknown batch sizes: ratio 1; an empty evaluation: no prior.
    assert eval_prior_from_loaders(Loader(30)).train_steps == pytest.approx(30 * FORWARD_SHARE)
    assert eval_prior_from_loaders(Loader(0)) is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PhaseCostPrior(seconds=-1.0), "seconds"),
        (lambda: PhaseCostPrior(train_steps=float("nan")), "train_steps"),
        (lambda: PhaseCostPrior(seconds=1.0, rel_ci=True), "rel_ci"),
        (lambda: PhaseCostPrior(), "seconds > 0 or train_steps > 0"),
        (lambda: eval_cost_prior(0), "batches"),
        (lambda: eval_cost_prior(3, batch_ratio=0.0), "batch_ratio"),
        (lambda: eval_cost_prior(3, grad_accum_steps=0), "grad_accum_steps"),
        (lambda: eval_prior_from_loaders(iter([1, 2])), "eval_dataloader has no len"),
        (lambda: checkpoint_cost_prior(-1), "state_bytes"),
        (lambda: checkpoint_cost_prior(10, files=0), "files"),
    ],
)
def test_bad_phase_priors_raise_naming_the_value(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_checkpoint_is_priced_at_its_bytes_written() -> None:
    prior = checkpoint_cost_prior(3 * 10**9)
    assert prior.seconds == pytest.approx(CHECKPOINT_FIXED_S + 3e9 / CHECKPOINT_WRITE_BYTES_PER_S)
    assert prior.train_steps == 0.0
    assert checkpoint_cost_prior(0).seconds == pytest.approx(CHECKPOINT_FIXED_S)
    # A save that writes the state twice (Lightning's own file and last.ckpt) costs twice.
    assert checkpoint_cost_prior(3 * 10**9, files=2).seconds == pytest.approx(2 * prior.seconds)
    # Serialised into memory first (Lightning's saves), one more pass over the bytes per file.
    in_memory = checkpoint_cost_prior(3 * 10**9, files=2, in_memory=True)
    assert in_memory.seconds == pytest.approx(
        2
        * (
            CHECKPOINT_FIXED_S
            + 3e9 / CHECKPOINT_WRITE_BYTES_PER_S
            + 3e9 / CHECKPOINT_SERIALIZE_BYTES_PER_S
        )
    )


def test_a_priced_evaluation_brings_the_early_total_closer() -> None:
    # 80 steps of 0.2 s, an evaluation of 30 batches after steps 20, 40, 60, 80 (the simulated
    # evaluation costs what the prior says: 30 forwards at a third of a step each = 2 s).
    job = JobModel.from_args(total_steps=80, eval_every=20)
    actual = simulate(Forecaster(job, start_s=0.0), 80, step_s=0.2, eval_every=20, eval_s=2.0)
    priced, unpriced = Forecaster(job, start_s=0.0), Forecaster(job, start_s=0.0)
    priced.set_phase_prior("eval", eval_cost_prior(30))
    for forecaster in (priced, unpriced):
        simulate(forecaster, 80, step_s=0.2, eval_every=20, eval_s=2.0, stop_at=10)
    with_prior, without = priced.prediction, unpriced.prediction
    assert with_prior is not None and without is not None
    assert without.remaining_phase_s == 0.0
    assert with_prior.remaining_phase_s == pytest.approx(4 * 30 / 3 * with_prior.iteration_s)
    assert abs(with_prior.total_s - actual) < abs(without.total_s - actual)
    assert with_prior.total_ci_s > without.total_ci_s  # the prior's uncertainty is in it


def test_final_phases_run_once_more_after_the_last_step() -> None:
    """A phase the loop runs after its last step whatever its period (the Trainer's final save)
    counts once more, never twice when its period lands on the last step; an epoch start does
    not follow the last step."""
    off_period = PhaseTracker(
        JobModel.from_args(total_steps=1000, checkpoint_every=300, final_phases=("checkpoint",))
    )
    assert off_period.project(50)[0].remaining == 4  # 300, 600, 900 and the final save
    for step in (300, 600, 900):
        off_period.record("checkpoint", 1.0, step)
    assert off_period.project(950)[0].remaining == 1
    off_period.record("checkpoint", 1.0, 1000)
    assert off_period.project(1000)[0].remaining == 0
    on_period = PhaseTracker(
        JobModel.from_args(total_steps=1000, checkpoint_every=500, final_phases=("checkpoint",))
    )
    assert on_period.project(50)[0].remaining == 2  # 500 and 1000, which is the final one
    no_period = PhaseTracker(JobModel.from_args(total_steps=100, final_phases=("eval",)))
    (final_eval,) = no_period.project(10)
    assert final_eval.name == "eval" and final_eval.remaining == 1
    epochs = PhaseTracker(JobModel.from_args(total_steps=300, steps_per_epoch=100))
    assert epochs.project(0)[0].remaining == 2  # epochs 2 and 3 begin; none after step 300


@pytest.mark.parametrize("value", ["eval", 3, ["eval", ""], [["eval"]], {"eval": 1, 2: 3}])
def test_bad_final_phases_are_value_errors(value: object) -> None:
    with pytest.raises(ValueError, match="final"):
        JobModel.from_args(total_steps=10, final_phases=value)  # type: ignore[arg-type]


def test_a_job_ended_short_is_noted_with_what_accumulation_means() -> None:
    from ets_hook.forecast.job import ended_short_note

    assert ended_short_note(10, 10, 4) is None  # ran its length
    assert ended_short_note(0, 10, 1) is None
    assert ended_short_note(5, None, 1) is None
    plain = ended_short_note(4, 10, 1)
    assert plain == "finished at step 4 of the 10 steps it was given: every ETA was for all 10"
    accumulating = ended_short_note(22, 84, 4)
    assert accumulating is not None and accumulating.startswith("finished at step 22 of the 84")
    assert "grad_accum_steps=4" in accumulating and "counted in batches" in accumulating
    # The slip's hint only where it fits: a quarter of a length given as such.
    one_short = ended_short_note(83, 84, 4)
    assert one_short is not None and "counted in batches" not in one_short
    worked_out = ended_short_note(22, 84, 4, total_given=False)  # from epochs and the loader
    assert worked_out is not None and "counted in batches" not in worked_out
