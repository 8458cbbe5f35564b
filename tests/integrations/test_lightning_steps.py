"""ETSCallback on Lightning jobs whose steps are not one optimizer step per batch, and what it
costs a step: several optimizers (manual optimization), a GradientAccumulationScheduler,
hand-written accumulation, ``min_epochs`` past a fired EarlyStopping, logging steps, and a fit
that runs past its expected length without a progress bar. Small fits on CPU.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as L
from lightning.pytorch.callbacks import (
    EarlyStopping,
    GradientAccumulationScheduler,
    ModelCheckpoint,
)
from support import quiet_lightning_trainer
from torch.utils.data import DataLoader, TensorDataset

from ets_hook import ETSHook
from ets_hook.forecast.early_stop import EarlyStoppingRule, EarlyStopTracker
from ets_hook.forecast.text import format_duration
from ets_hook.integrations import common
from ets_hook.integrations.common import BAR_EAGER_STEPS, BAR_REFRESH_S, BarRefresh
from ets_hook.integrations.lightning import ETSCallback
from ets_hook.integrations.lightning_trainer import (
    scheduled_total_steps,
    trainer_checkpoint_every,
    trainer_min_stop_step,
    trainer_total_steps,
)


def loader(batches: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4 * batches, 8, generator=g), torch.randn(4 * batches, 1))
    return DataLoader(data, batch_size=4)


def fit(module: L.LightningModule, train: Any, val: Any = None, **kwargs: Any) -> L.Trainer:
    trainer = quiet_lightning_trainer(**{"num_sanity_val_steps": 0, **kwargs})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hints for tiny CPU runs
        trainer.fit(module, train, val)
    return trainer


class Linear(L.LightningModule):
    """A linear regression; counts the ets/ values it is asked to log."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.ets_logs = 0

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.ets_logs += name.startswith("ets/")
        super().log(name, value, *args, **kwargs)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.tensor(1.0))  # never improves

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TwoOptimizers(Linear):
    """Manual optimization stepping two optimizers on every batch (a GAN's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.other = torch.nn.Linear(8, 1)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        first, second = self.optimizers()
        for optimizer, net in ((first, self.net), (second, self.other)):
            optimizer.zero_grad()
            self.manual_backward(torch.nn.functional.mse_loss(net(x), y))
            optimizer.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self.net.parameters(), lr=0.01),
            torch.optim.SGD(self.other.parameters(), lr=0.01),
        ]


class EveryOtherBatch(Linear):
    """Manual optimization with hand-written accumulation: a step every second batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.manual_backward(torch.nn.functional.mse_loss(self.net(x), y))
        if batch_idx % 2 == 1:
            optimizer = self.optimizers()
            optimizer.step()
            optimizer.zero_grad()


# --------------------------------------------------------------------------------------------
# Steps of the job


def test_two_optimizers_count_global_steps_as_the_trainer_does(tmp_path: Any) -> None:
    # 6 batches an epoch, both optimizers step on each: trainer.global_step moves by 2 a
    # batch, so max_steps=16 ends the fit after 8 batches, and every_n_train_steps=4 saves
    # every 2 batches.
    callback = ETSCallback(capture_steps=0, log_every=None)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1)
    trainer = fit(
        TwoOptimizers(),
        loader(6),
        max_epochs=5,
        max_steps=16,
        callbacks=[callback, checkpoint],
        enable_checkpointing=True,
    )
    hook = callback.hook
    assert hook is not None and trainer.global_step == 16
    assert hook.total_steps == 8 == hook.steps_completed
    assert callback.resolved_options["checkpoint_every"] == 2
    prediction = callback.prediction
    assert prediction is not None and prediction.step == prediction.total_steps == 8
    saves = {p.name: p for p in prediction.phases}["checkpoint"]
    assert saves.occurrences == 4  # after batches 2, 4, 6, 8: each projected


@pytest.mark.parametrize(("global_per_step", "every", "period"), [(1, 7, 7), (2, 8, 4), (2, 7, 7)])
def test_a_checkpoint_period_in_global_steps_becomes_hook_steps(
    global_per_step: int, every: int, period: int
) -> None:
    trainer = SimpleNamespace(
        num_training_batches=16,
        accumulate_grad_batches=1,
        enable_validation=False,
        callbacks=[ModelCheckpoint(every_n_train_steps=every)],
    )
    assert trainer_checkpoint_every(trainer, None, global_per_step) == period


def test_a_gradient_accumulation_schedule_is_counted_epoch_by_epoch() -> None:
    # 8 batches an epoch: epochs 0-1 step on each (8 + 8), epochs 2-3 every 4 batches (2 + 2).
    callback = ETSCallback(capture_steps=0, log_every=None)
    scheduler = GradientAccumulationScheduler(scheduling={0: 1, 2: 4})
    fit(Linear(), loader(8), max_epochs=4, callbacks=[callback, scheduler])
    hook = callback.hook
    assert hook is not None and hook.total_steps == 20 == hook.steps_completed


def test_scheduled_total_steps_reads_the_schedule() -> None:
    scheduler = GradientAccumulationScheduler(scheduling={0: 1, 1: 3})
    trainer = SimpleNamespace(max_epochs=3, num_training_batches=10, max_steps=-1)
    assert scheduled_total_steps(trainer, scheduler) == 10 + 4 + 4
    trainer.callbacks = [scheduler]
    assert trainer_total_steps(trainer) == 18
    trainer.max_steps = 24  # global steps: 12 hook steps with two optimizers
    assert trainer_total_steps(trainer, global_per_step=2) == 12
    assert (
        scheduled_total_steps(SimpleNamespace(max_epochs=-1, num_training_batches=10), scheduler)
        is None
    )


def test_hand_written_accumulation_is_said_after_the_first_epoch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback = ETSCallback(capture_steps=0, log_every=None)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    fit(EveryOtherBatch(), loader(8), max_epochs=2, callbacks=[callback])
    said = [r.getMessage() for r in caplog.records if "manual optimization" in r.getMessage()]
    assert len(said) == 1, said
    assert "stepped 4 times in the first epoch" in said[0] and "(8)" in said[0]
    assert "total_steps=" in said[0]


def test_one_step_per_batch_under_manual_optimization_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback = ETSCallback(capture_steps=0, log_every=None)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    fit(TwoOptimizers(), loader(4), max_epochs=2, callbacks=[callback])
    assert callback.hook is not None and callback.hook.steps_completed == 8
    assert not [r for r in caplog.records if "manual optimization" in r.getMessage()]


# --------------------------------------------------------------------------------------------
# Early stopping held back by min_epochs


def test_min_epochs_holds_the_stop_back() -> None:
    # val_loss never improves: EarlyStopping(patience=1) fires at the second validation
    # (step 8), and Lightning goes on to the end of min_epochs=4 (step 16).
    callback = ETSCallback(capture_steps=0, log_every=None)
    early = EarlyStopping(monitor="val_loss", patience=1)
    seen: list[tuple[int, Any]] = []

    class Watch(L.Callback):
        def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
            seen.append((trainer.global_step, callback.prediction))

    trainer = fit(
        Linear(),
        loader(4),
        loader(1),
        max_epochs=8,
        min_epochs=4,
        callbacks=[callback, early, Watch()],
    )
    assert trainer.global_step == 16
    rule = callback.resolved_options["early_stopping"]
    assert rule.min_stop_step == 16
    # The hook takes the monitor in after this watcher's look: it knows of the firing from
    # the next validation on (step 12), where it used to say "stopped at step 8".
    fired = [(step, p) for step, p in seen if step > 8]
    assert fired and all(p.expected_stop_step == 16 for _, p in fired), fired
    # Never a total below the time already spent, never a stop already past.
    for step, prediction in fired:
        assert prediction.expected_stop_step >= step
        assert prediction.total_range_s[0] >= prediction.elapsed_s
    final = callback.prediction
    assert final.step == 16 and final.expected_stop_step == 16


def test_the_min_stop_step_of_a_trainer() -> None:
    trainer = SimpleNamespace(
        min_steps=None, min_epochs=3, num_training_batches=10, accumulate_grad_batches=2,
        callbacks=[],
    )  # fmt: skip
    assert trainer_min_stop_step(trainer) == 15
    trainer.min_steps = 40  # global steps; two optimizers: 20 hook steps
    assert trainer_min_stop_step(trainer, global_per_step=2) == 20
    trainer.callbacks = [GradientAccumulationScheduler(scheduling={0: 1, 1: 2})]
    trainer.min_steps = None  # epochs of varying length: min_epochs is not a step count
    assert trainer_min_stop_step(trainer) == 0


def test_a_fired_rule_stops_the_loop_at_its_minimum_step() -> None:
    tracker = EarlyStopTracker(EarlyStoppingRule(1, min_stop_step=40), max_steps=100)
    for step in (10, 20, 30):
        tracker.observe(step, 1.0)  # fires at 20
    forecast = tracker.forecast()
    assert forecast is not None and forecast.expected_stop_step == 40
    tracker.observe(40, 1.0)
    assert tracker.forecast().expected_stop_step == 40
    tracker.observe(50, 1.0)  # went on past it: the rule is not what ends this loop
    assert tracker.forecast() is None
    # Before it fires, the projected stops are never before the minimum either.
    rising = EarlyStopTracker(EarlyStoppingRule(2, min_stop_step=90), max_steps=100)
    for step, value in zip(range(5, 30, 5), (1.0, 0.6, 0.5, 0.45, 0.44)):
        rising.observe(step, value)
    projected = rising.forecast()
    assert projected is not None and projected.earliest_stop_step >= 90


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_min_stop_step_must_be_a_whole_number(value: Any) -> None:
    with pytest.raises(ValueError, match="min_stop_step"):
        EarlyStoppingRule(1, min_stop_step=value)


# --------------------------------------------------------------------------------------------
# What logging costs, and a fit that outgrows its length


def test_values_are_logged_at_lightnings_logging_steps_only() -> None:
    # pl_module.log costs ~2 ms: at every step that is a tenth of a small job's time.
    module = Linear()
    callback = ETSCallback(capture_steps=0, log_every=None)
    fit(module, loader(20), max_epochs=1, log_every_n_steps=5, callbacks=[callback])
    assert callback.hook is not None and callback.hook.steps_completed == 20
    assert module.ets_logs == 3 * (20 // 5)  # three keys at steps 5, 10, 15, 20


class _Growing(L.LightningDataModule):
    """Each epoch's train loader is longer than the last (reloaded every epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def train_dataloader(self) -> DataLoader:
        self.calls += 1
        return loader(4 * self.calls)


def test_a_fit_past_its_length_keeps_logging_without_a_bar(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The length read at the start (4 batches x 3 epochs) is outgrown: the ETA becomes
    # unknown. The key logged with prog_bar=True stays the same (Lightning refuses a change).
    callback = ETSCallback(capture_steps=0, log_every=None)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    trainer = fit(
        Linear(),
        _Growing(),
        max_epochs=3,
        log_every_n_steps=1,
        reload_dataloaders_every_n_epochs=1,
        callbacks=[callback],
    )
    assert trainer.global_step == 4 + 8 + 12
    assert not [r for r in caplog.records if "logging the prediction" in r.getMessage()]
    metrics = trainer.callback_metrics
    assert math.isnan(float(metrics["ets/eta_s"]))  # unknown, not the last value
    assert math.isnan(float(metrics["ets/total_s"]))
    assert float(metrics["ets/iteration_s"]) > 0


def test_values_that_become_unknown_are_nan_with_the_bar_on(tmp_path: Any) -> None:
    # The wrapped bar shows the ETA as text; the logged numbers still turn NaN, not stale.
    callback = ETSCallback(capture_steps=0, log_every=None, total_steps=6)
    trainer = fit(
        Linear(),
        loader(12),
        max_epochs=1,
        log_every_n_steps=1,
        enable_progress_bar=True,
        callbacks=[callback],
    )
    assert trainer.global_step == 12
    metrics = trainer.callback_metrics
    assert math.isnan(float(metrics["ets/eta_s"])) and math.isnan(float(metrics["ets/total_s"]))


def test_a_dataloader_alone_keeps_the_trainers_length() -> None:
    # dataloader= gives the steps per epoch; the job's length stays the Trainer's.
    train = loader(6)
    callback = ETSCallback(capture_steps=0, log_every=None, dataloader=train)
    fit(Linear(), train, max_epochs=3, callbacks=[callback])
    assert callback.hook is not None and callback.hook.total_steps == 18
    assert callback.prediction.step == 18


def test_the_bar_reads_the_prediction_rarely_after_the_first_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every batch refreshes Lightning's bar; reading a prediction costs ~0.1-0.2 ms.
    reads = [0]
    original = ETSHook.prediction

    def counted(self: ETSHook) -> Any:
        reads[0] += 1
        return original.fget(self)

    monkeypatch.setattr(ETSHook, "prediction", property(counted))
    callback = ETSCallback(capture_steps=0, log_every=None)
    started = time.monotonic()
    fit(
        Linear(),
        loader(80),
        max_epochs=1,
        enable_progress_bar=True,
        log_every_n_steps=1000,
        callbacks=[callback],
    )
    seconds = time.monotonic() - started
    assert callback.hook is not None and callback.hook.steps_completed == 80
    # The first BAR_EAGER_STEPS steps, then one read per BAR_REFRESH_S, the last step's values
    # and the closing ones.
    assert reads[0] <= BAR_EAGER_STEPS + seconds / BAR_REFRESH_S + 6, (reads[0], seconds)


def test_bar_refresh_is_due_every_step_at_first_then_by_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(common.time, "monotonic", lambda: now[0])
    refresh = BarRefresh()
    assert all(refresh.due(step) for step in range(1, BAR_EAGER_STEPS + 1))
    assert not refresh.due(BAR_EAGER_STEPS + 1)  # BAR_REFRESH_S after the last one
    assert not refresh.due(BAR_EAGER_STEPS + 2)
    now[0] += BAR_REFRESH_S / 2
    assert not refresh.due(BAR_EAGER_STEPS + 3)
    now[0] += BAR_REFRESH_S / 2
    assert refresh.due(BAR_EAGER_STEPS + 4)


def test_a_first_epoch_cut_short_by_max_steps_is_not_hand_written_accumulation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two optimizers, 8 batches an epoch, max_steps=10 global steps: 5 batches, then the end.
    callback = ETSCallback(capture_steps=0, log_every=None)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    trainer = fit(TwoOptimizers(), loader(8), max_epochs=3, max_steps=10, callbacks=[callback])
    assert trainer.global_step == 10 and callback.hook.steps_completed == 5
    assert not [r for r in caplog.records if "manual optimization" in r.getMessage()]


def test_the_bar_shows_the_last_steps_eta_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past the eager steps the bar's text is made again twice a second at most, and at the
    # job's last step always: the bar's last text is not a stale ETA.
    monkeypatch.setattr(common, "BAR_REFRESH_S", 3600.0)
    callback = ETSCallback(capture_steps=0, log_every=None)
    shown: list[dict[str, str]] = []

    class Look(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            shown.append(callback.bar_items())

    fit(Linear(), loader(30), max_epochs=1, callbacks=[callback, Look()])
    prediction = callback.hook.prediction
    assert len(shown) == 30
    assert shown[20] == shown[28]  # not due: the text made at the last eager step
    assert shown[-1]["ETA"] == format_duration(prediction.eta_s)
