"""ETSCallback (ets_hook.integrations.lightning) on real Lightning, on CPU.

One module-scoped fixture runs a fit (3 epochs, validation each epoch, accumulate_grad_batches=2,
a ModelCheckpoint, a CSVLogger) and a fit resumed from its last checkpoint (5 epochs), with
validation and checkpoint saving slowed on purpose; most tests assert on those two runs.
"""

from __future__ import annotations

import csv
import gc
import json
import logging
import math
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from support import (
    Seen,
    check_forecasts_until_the_stop,
    quiet_lightning_trainer,
    readme_python_blocks,
)
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from ets_hook.capture.batch_clock import TimedCollate
from ets_hook.forecast.early_stop import MIN_POINTS, EarlyStoppingRule
from ets_hook.forecast.epochs import EPOCH_START
from ets_hook.forecast.job import (
    CHECKPOINT_FIXED_S,
    CHECKPOINT_SERIALIZE_BYTES_PER_S,
    CHECKPOINT_WRITE_BYTES_PER_S,
)
from ets_hook.forecast.text import format_duration, format_step_time
from ets_hook.integrations.lightning import (
    BAR_KEY,
    LOG_KEYS,
    ETSCallback,
    trainer_checkpoint_every,
    trainer_checkpoint_files,
    trainer_eval_every,
)

VAL_SLEEP_S = 0.4  # once per validation run (not in the sanity check)
SAVE_SLEEP_S = 0.25  # per checkpoint save (two per epoch: the epoch's file and last.ckpt)
BATCHES_PER_EPOCH = 16  # micro-batches; accumulate_grad_batches=2: 8 optimizer steps per epoch
STEPS_PER_EPOCH = 8
LOG_EVERY_N_STEPS = 2
REPO = Path(__file__).resolve().parents[2]


class TinyModule(L.LightningModule):
    """A linear model whose validation and checkpoint saving are slow on purpose."""

    def __init__(self, val_sleep_s: float = 0.0, save_sleep_s: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.val_sleep_s = val_sleep_s
        self.save_sleep_s = save_sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0 and not self.trainer.sanity_checking:
            time.sleep(self.val_sleep_s)
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        time.sleep(self.save_sleep_s)  # inside trainer.save_checkpoint

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loaders(batches: int = BATCHES_PER_EPOCH) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(4 * batches, 8, generator=g), torch.randn(4 * batches, 1))
    val = TensorDataset(torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g))
    return DataLoader(train, batch_size=4), DataLoader(val, batch_size=4)


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    return quiet_lightning_trainer(**kwargs)


class PredictionAt(L.Callback):
    """Keeps ``callback``'s prediction once ``trainer.global_step`` reaches ``at``, and what
    the Trainer's progress bar (if any) shows then (``bar_metrics``)."""

    def __init__(self, callback: Any, at: int) -> None:
        self.callback, self.at = callback, at
        self.prediction: Any = None
        self.bar_metrics: dict[str, Any] | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if self.prediction is None and trainer.global_step >= self.at:
            self.prediction = self.callback.prediction
            bar = trainer.progress_bar_callback
            if bar is not None:
                self.bar_metrics = bar.get_metrics(trainer, pl_module)


@dataclass
class Run:
    callback: Any
    trainer: L.Trainer
    module: TinyModule
    checkpoint: ModelCheckpoint
    log_dir: Path
    status_path: Path
    seconds: float
    early: PredictionAt


@dataclass
class Runs:
    first: Run
    resumed: Run
    restored_step: int
    log_lines: list[str]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _fit(tmp: Path, name: str, epochs: int, ckpt_path: str | None = None) -> Run:
    status_path = tmp / f"{name}.json"
    callback = ETSCallback(status_path=status_path, capture_steps=5)
    checkpoint = ModelCheckpoint(dirpath=tmp / "ckpt", save_top_k=-1, save_last=True)
    early = PredictionAt(callback, at=3)
    trainer = L.Trainer(
        max_epochs=epochs,
        accumulate_grad_batches=2,
        check_val_every_n_epoch=1,
        num_sanity_val_steps=1,
        log_every_n_steps=LOG_EVERY_N_STEPS,
        callbacks=[callback, checkpoint, early],
        logger=CSVLogger(tmp, name=name),
        accelerator="cpu",
        devices=1,
        enable_model_summary=False,
        enable_progress_bar=True,
    )
    module = TinyModule(val_sleep_s=VAL_SLEEP_S, save_sleep_s=SAVE_SLEEP_S)
    train, val = loaders()
    started = time.perf_counter()
    trainer.fit(module, train, val, ckpt_path=ckpt_path)
    assert trainer.logger is not None and trainer.logger.log_dir is not None
    return Run(
        callback,
        trainer,
        module,
        checkpoint,
        Path(trainer.logger.log_dir),
        status_path,
        time.perf_counter() - started,
        early,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("lightning")
    ours = logging.getLogger("ets_hook")
    collect, level = _Collect(), ours.level
    ours.addHandler(collect)
    ours.setLevel(logging.INFO)
    # The runs' step times are asserted against the phases' sleeps, so no pause unrelated to
    # the phases may land in a step. One whole-suite run saw a 0.375 s step (alone, the
    # longest is ~17 ms); a full garbage collection of a large test process's objects is the
    # likely one and is kept out of the fits (not shown to be the cause).
    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's hints for tiny CPU runs
            first = _fit(tmp, "first", epochs=3)
            last = first.checkpoint.last_model_path
            restored_step = torch.load(last, weights_only=False)["global_step"]
            resumed = _fit(tmp, "resumed", epochs=5, ckpt_path=last)
        gc.enable()
        yield Runs(first, resumed, restored_step, collect.lines)
    finally:
        gc.enable()
        ours.removeHandler(collect)
        ours.setLevel(level)


# --------------------------------------------------------------------------------------------
# The shared runs
# --------------------------------------------------------------------------------------------


def test_callback_is_a_callback_of_the_trainers_package() -> None:
    callback = ETSCallback(log_every=5, prog_bar=False)
    assert isinstance(callback, L.Callback)
    assert ETSCallback.__module__ == "ets_hook.integrations.lightning"
    assert ETSCallback.__qualname__ == "ETSCallback"
    # Picklable by reference before a fit (ddp_spawn sends the Trainer's callbacks).
    copy = pickle.loads(pickle.dumps(callback))
    assert type(copy) is ETSCallback
    assert copy.hook_options == {"log_every": 5} and copy.prog_bar is False


def test_steps_counted_equal_the_trainers_global_step(runs: Runs) -> None:
    first, resumed = runs.first, runs.resumed
    assert first.trainer.global_step == 3 * STEPS_PER_EPOCH
    assert first.callback.hook.steps_completed == first.trainer.global_step
    assert first.callback.prediction.step == first.trainer.global_step
    assert resumed.trainer.global_step == 5 * STEPS_PER_EPOCH
    assert resumed.callback.hook.steps_completed == 2 * STEPS_PER_EPOCH
    assert resumed.callback.prediction.step == resumed.trainer.global_step


def test_job_is_read_from_the_trainer(runs: Runs) -> None:
    options = runs.first.callback.resolved_options
    assert options["model"] is runs.first.module
    assert options["optimizer"] is runs.first.trainer.optimizers[0]
    assert options["total_steps"] == runs.first.trainer.estimated_stepping_batches == 24
    assert options["grad_accum_steps"] == 2
    assert options["initial_step"] == 0
    assert options["eval_every"] == STEPS_PER_EPOCH  # validation every epoch
    assert options["checkpoint_every"] == STEPS_PER_EPOCH  # ModelCheckpoint after each one
    assert options["checkpoint_files"] == 2  # its own file and last.ckpt
    assert options["checkpoint_in_memory"] is True  # serialised into a BytesIO, then written
    assert options["steps_per_epoch"] == STEPS_PER_EPOCH  # epoch start-up as a phase
    assert runs.first.callback.hook.total_steps == 24
    assert runs.first.callback.prediction.total_steps == 24
    assert runs.first.callback.hook_options == {
        "status_path": runs.first.status_path,
        "capture_steps": 5,
    }


def test_resumed_fit_starts_at_the_restored_step(runs: Runs) -> None:
    options = runs.resumed.callback.resolved_options
    assert runs.restored_step == 3 * STEPS_PER_EPOCH
    assert options["initial_step"] == runs.restored_step
    assert options["total_steps"] == 5 * STEPS_PER_EPOCH
    assert runs.resumed.callback.prediction.remaining_steps == 0


def test_validation_and_checkpoints_are_phases_not_step_time(runs: Runs) -> None:
    for run, epochs in ((runs.first, 3), (runs.resumed, 2)):
        phases = {p.name: p for p in run.callback.prediction.phases}
        # The sanity check is before the hook; each epoch after the first starts a phase.
        assert set(phases) == {"eval", "checkpoint", EPOCH_START}
        # Epochs 2-3 of the first fit, epoch 5 of the resumed one (its first step is warm-up).
        assert phases[EPOCH_START].occurrences == epochs - 1
        assert phases[EPOCH_START].period_steps == STEPS_PER_EPOCH
        assert phases["eval"].occurrences == epochs
        assert phases["eval"].spent_s >= epochs * VAL_SLEEP_S
        assert phases["eval"].period_steps == STEPS_PER_EPOCH
        assert phases["eval"].period_source == "hint"
        assert phases["checkpoint"].occurrences == epochs  # two saves per epoch, one phase
        assert phases["checkpoint"].spent_s >= epochs * 2 * SAVE_SLEEP_S
        step_times = run.callback.hook.step_times_s
        assert len(step_times) == epochs * STEPS_PER_EPOCH
        assert max(step_times) < SAVE_SLEEP_S  # no validation or save inside any step
        # Step times and phases account for the fit's time.
        assert sum(step_times) + sum(p.spent_s for p in phases.values()) < run.seconds


def test_validations_are_priced_before_the_first_one(runs: Runs) -> None:
    prediction = runs.first.early.prediction  # at step 3: no validation yet
    assert prediction is not None and prediction.step == 3
    validation = {p.name: p for p in prediction.phases}["eval"]
    assert validation.occurrences == 0 and validation.cost_source == "prior"
    # 2 validation batches of the training batch size, each a forward (1/3) of one of the 2
    # micro-batches of a step: 1/3 of a steady step per validation.
    assert validation.mean_s == pytest.approx(prediction.iteration_s / 3)
    assert validation.remaining == 3  # after steps 8, 16 and 24 (the last step: the fit's end)
    # The ModelCheckpoint's saves (after every validation), priced from the state they write:
    # the module's parameters and SGD's (empty: no momentum) state, twice (the epoch's file
    # and last.ckpt), each serialised into memory and then written.
    checkpoint = {p.name: p for p in prediction.phases}["checkpoint"]
    assert checkpoint.cost_source == "prior" and checkpoint.remaining == 3
    state_bytes = sum(t.numel() * t.element_size() for t in runs.first.module.parameters())
    assert checkpoint.mean_s == pytest.approx(
        2
        * (
            CHECKPOINT_FIXED_S
            + state_bytes / CHECKPOINT_WRITE_BYTES_PER_S
            + state_bytes / CHECKPOINT_SERIALIZE_BYTES_PER_S
        )
    )
    assert prediction.remaining_phase_s == pytest.approx(
        3 * validation.mean_s + 3 * checkpoint.mean_s
    )
    after = {p.name: p for p in runs.first.callback.prediction.phases}
    assert after["eval"].cost_source == after["checkpoint"].cost_source == "measured"


def test_sanity_check_is_timed_but_not_a_phase(runs: Runs) -> None:
    assert runs.first.callback.sanity_check_s is not None
    assert runs.first.callback.sanity_check_s > 0


def test_metrics_reach_the_csv_logger_at_its_logging_steps(runs: Runs) -> None:
    for run in (runs.first, runs.resumed):
        with open(run.log_dir / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert set(LOG_KEYS) <= set(rows[0])
        logged = [row for row in rows if row["ets/eta_s"]]
        steps = run.callback.hook.steps_completed
        assert len(logged) == steps // LOG_EVERY_N_STEPS
        for row in logged:
            values = [float(row[key]) for key in LOG_KEYS]
            assert all(math.isfinite(v) and v >= 0 for v in values)
            assert float(row["ets/total_s"]) >= float(row["ets/eta_s"])
        # Logged at the last step, before the fit's last validation and save: what is left is
        # them, measured by then (two earlier ones each), sleeps included.
        assert float(logged[-1]["ets/eta_s"]) >= VAL_SLEEP_S + 2 * SAVE_SLEEP_S


def test_eta_is_in_the_progress_bar_as_text(runs: Runs) -> None:
    """The bar (Lightning's default: rich's, where rich is installed) shows the ETA as
    ``ETA: 5.6s``, not the raw seconds; the loggers keep the numbers."""
    trainer, module, early = runs.first.trainer, runs.first.module, runs.first.early
    bar = trainer.progress_bar_callback
    assert bar is not None
    shown = early.bar_metrics  # what the bar showed at step 3, during training
    assert shown is not None
    assert shown[BAR_KEY] == format_duration(early.prediction.eta_s)
    assert not [key for key in shown if key.startswith("ets/")]
    assert not set(LOG_KEYS) & set(trainer.progress_bar_metrics)
    assert set(LOG_KEYS) <= set(trainer.logged_metrics)
    assert all(isinstance(trainer.logged_metrics[key], torch.Tensor) for key in LOG_KEYS)
    # After training the bar is Lightning's own again.
    assert "get_metrics" not in vars(bar)
    assert BAR_KEY not in bar.get_metrics(trainer, module)


def test_hook_is_closed_after_training(runs: Runs) -> None:
    assert not torch.autograd._profiler_enabled()
    for run in (runs.first, runs.resumed):
        hook = run.callback.hook
        assert hook.capture_status.startswith("done")
        for module in run.module.modules():
            assert not module._forward_pre_hooks
            assert not module._forward_hooks
        optimizer = run.trainer.optimizers[0]
        assert not optimizer._optimizer_step_pre_hooks
        assert not optimizer._optimizer_step_post_hooks
        assert "save_checkpoint" not in vars(run.trainer)  # the wrapper is gone
        status = json.loads(run.status_path.read_text())
        assert status["state"] == "closed"
        assert status["prediction"]["step"] == run.trainer.global_step


def test_no_ets_log_line_disagrees_in_the_plain_runs(runs: Runs) -> None:
    assert not [line for line in runs.log_lines if "given; the Trainer says" in line]
    assert not [line for line in runs.log_lines if "unknown" in line]


# --------------------------------------------------------------------------------------------
# Other Trainer settings (small fits of their own)
# --------------------------------------------------------------------------------------------


class _Stream(IterableDataset):
    """Six batches' worth of samples, without len()."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(1)
        for _ in range(24):
            yield torch.randn(8, generator=g), torch.randn(1, generator=g)


def test_unknown_length_with_max_time_gives_step_time_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback = ETSCallback(capture_steps=0)
    at_step_5 = PredictionAt(callback, at=5)
    trainer = quiet_trainer(
        max_epochs=1,
        max_time={"minutes": 5},
        callbacks=[callback, at_step_5],
        enable_progress_bar=True,
        log_every_n_steps=1,  # the values are logged at Lightning's logging steps
    )
    caplog.set_level(logging.INFO, logger="ets_hook")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyModule(), DataLoader(_Stream(), batch_size=4))
    prediction = at_step_5.prediction
    assert trainer.global_step == 6
    assert prediction.step == 5
    assert prediction.total_steps is None  # no made-up total
    assert prediction.eta_s is None and prediction.total_s is None
    assert prediction.iteration_s > 0
    # max_time is the job's only bound: the Timer's time left at training start, in seconds.
    assert 0 < callback.resolved_options["time_limit_s"] <= 300.0
    assert prediction.time_limit_s == callback.resolved_options["time_limit_s"]
    assert not prediction.stopped_by_time_limit
    ended = callback.prediction  # once the fit is over, its length is known
    assert (ended.step, ended.total_steps, ended.eta_s) == (6, 6, 0.0)
    assert ended.time_limit_s == prediction.time_limit_s and not ended.stopped_by_time_limit
    assert "total_steps" not in callback.resolved_options
    # The bar says the ETA is unknown and shows the step time, as text.
    assert at_step_5.bar_metrics is not None
    assert at_step_5.bar_metrics[BAR_KEY] == f"? ({format_step_time(prediction.iteration_s)})"
    assert "ets/iteration_s" in trainer.callback_metrics
    assert "ets/eta_s" not in trainer.logged_metrics
    messages = [r.getMessage() for r in caplog.records if r.name == "ets_hook"]
    assert any("job length in steps is unknown" in m for m in messages)
    assert any("max_time" in m and "only bound" in m for m in messages)


def test_explicit_options_win_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    callback = ETSCallback(total_steps=10, grad_accum_steps=1, capture_steps=0)
    trainer = quiet_trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[callback])
    caplog.set_level(logging.INFO, logger="ets_hook")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyModule(), loaders(batches=4)[0])
    assert trainer.global_step == callback.prediction.step == 4
    assert callback.hook.total_steps == 10
    assert callback.resolved_options["grad_accum_steps"] == 1
    messages = [r.getMessage() for r in caplog.records if "the Trainer says" in r.getMessage()]
    assert sorted(messages) == [
        "grad_accum_steps=1 given; the Trainer says 2 (using 1)",
        "the job length given resolves to 10 steps; the Trainer says 4 (using 10)",
    ]


def test_without_a_logger_the_values_are_kept_without_lightnings_warning() -> None:
    """``Trainer(logger=False)``: ``self.log(..., logger=True)`` warns once per key that no
    logger is configured; the values still belong in ``callback_metrics`` and the bar."""
    callback = ETSCallback(capture_steps=0)
    trainer = quiet_trainer(max_steps=4, callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyModule(), loaders(batches=8)[0])
    about_ours = [str(w.message) for w in caught if "ets/" in str(w.message)]
    assert about_ours == []
    assert callback.prediction.step == 4
    assert "ets/eta_s" in trainer.callback_metrics
    assert "ets/eta_s" in trainer.progress_bar_metrics


class _SlowFirstBatch(L.Callback):
    """Set-up work before the first batch's training step (a framework's, a callback's)."""

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == 0 and idx == 0:
            time.sleep(SETUP_SLEEP_S)


SETUP_SLEEP_S = 0.3


def test_step_zero_starts_at_the_first_training_forward_and_sees_autocast() -> None:
    """Lightning runs ``training_step`` inside ``optimizer.step(closure)``: its first forward
    (not the hook's creation at ``on_train_start``) starts step 0, and bf16-mixed autocast,
    on there, is seen (the hook's low-precision prior)."""
    callback = ETSCallback(capture_steps=0, verbose=False)
    trainer = quiet_trainer(
        max_steps=4, callbacks=[callback, _SlowFirstBatch()], precision="bf16-mixed"
    )
    trainer.fit(TinyModule(), loaders(batches=8)[0])
    hook = callback.hook
    assert hook is not None and hook.steps_completed == 4
    assert hook.step_times_s[0] < SETUP_SLEEP_S
    assert hook._forecaster._low_precision  # private: the prior it chose has no public name


class _DropoutModule(TinyModule):
    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.drop(x))


def test_callback_does_not_change_a_seeded_run() -> None:
    """Reading the job's length before Lightning set up the train data (inside the sanity
    check's isolate_rng) would shift the random stream; at on_train_start it does not."""

    def train(callbacks: list[Any]) -> list[torch.Tensor]:
        L.seed_everything(0, verbose=False)
        module = _DropoutModule()
        g = torch.Generator().manual_seed(2)
        data = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
        train_loader = DataLoader(data, batch_size=4, shuffle=True)
        val_loader = DataLoader(data, batch_size=8)
        trainer = quiet_trainer(max_epochs=2, num_sanity_val_steps=2, callbacks=callbacks)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, train_loader, val_loader)
        return [p.detach().clone() for p in module.parameters()]

    without = train([])
    callback = ETSCallback()
    with_callback = train([callback])
    assert callback.prediction.step == 16
    assert all(torch.equal(a, b) for a, b in zip(without, with_callback, strict=True))


class _Boom(RuntimeError):
    pass


class _FailingModule(TinyModule):
    def __init__(self, error: type[BaseException] = _Boom) -> None:
        super().__init__()
        self.error = error

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 3:
            raise self.error("step 3")
        return super().training_step(batch, batch_idx)


class _PreemptedModule(TinyModule):
    """A SIGTERM as Lightning handles it: its handler sets ``received_sigterm`` and the fit
    loop raises ``SIGTERMException`` (a ``SystemExit``) at the next step. (A real signal here
    would reach the test process's own handlers.)"""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 3:
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            self.trainer._signal_connector.received_sigterm = True
            raise SIGTERMException
        return super().training_step(batch, batch_idx)


def test_a_sigterm_stop_closes_the_hook_as_interrupted(tmp_path: Path) -> None:
    """Lightning stops gracefully on SIGTERM with its ``SIGTERMException``, a ``SystemExit``:
    a preempted job, not a finished one (before: ``closed``, its length cut to the steps
    run)."""
    status_path = tmp_path / "eta.json"
    callback = ETSCallback(status_path=status_path)
    trainer = quiet_trainer(max_epochs=1, callbacks=[callback])
    with warnings.catch_warnings(), pytest.raises(SystemExit):
        warnings.simplefilter("ignore")
        trainer.fit(_PreemptedModule(), loaders(batches=8)[0])
    status = json.loads(status_path.read_text())
    assert (status["state"], status.get("error")) == ("interrupted", None)
    assert status["prediction"]["total_steps"] == 8  # the whole run's projection is kept


@pytest.mark.parametrize(
    ("error", "state", "error_name"),
    [(_Boom, "failed", "_Boom"), (KeyboardInterrupt, "interrupted", None)],
)
def test_an_exception_closes_the_hook_as_the_job_ended(
    tmp_path: Path, error: type[BaseException], state: str, error_name: str | None
) -> None:
    """A failure closes as ``failed`` with the exception's type; Ctrl-C, which Lightning
    handles itself (a graceful shutdown, then ``exit(1)``), as ``interrupted`` with no error,
    as the hook's own exit paths record it (``exits.ending_of``)."""
    status_path = tmp_path / "eta.json"
    callback = ETSCallback(status_path=status_path)
    trainer = quiet_trainer(max_epochs=1, callbacks=[callback])
    module = _FailingModule(error)
    sigint = signal.getsignal(signal.SIGINT)  # Lightning ignores SIGINT while it shuts down
    try:
        with warnings.catch_warnings(), pytest.raises((error, SystemExit)):
            warnings.simplefilter("ignore")
            trainer.fit(module, loaders(batches=8)[0])
    finally:
        signal.signal(signal.SIGINT, sigint)
    status = json.loads(status_path.read_text())
    assert status["state"] == state
    assert status.get("error") == error_name
    assert callback.hook.steps_completed == trainer.global_step == 3
    assert not torch.autograd._profiler_enabled()
    assert not any(m._forward_pre_hooks for m in module.modules())
    assert "save_checkpoint" not in vars(trainer)


SLOW_SAMPLE_S = 0.005  # per sample, in the loader's worker processes


class _SlowSamples(torch.utils.data.Dataset):
    """32 samples of the TinyModule's shape, each ``SLOW_SAMPLE_S`` to load."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SLOW_SAMPLE_S)
        return torch.full((8,), float(index)), torch.zeros(1)


class _SlowData(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(_SlowSamples(), batch_size=4, num_workers=2)


class _TunableModule(TinyModule):
    """A ``TinyModule`` whose learning rate ``LearningRateFinder`` can set."""

    def __init__(self) -> None:
        super().__init__()
        self.lr = 0.01

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("source", ["loader", "datamodule", "datamodule after a finder"])
def test_the_train_loaders_workers_are_timed_from_their_first_batch(source: str) -> None:
    # Lightning starts the first epoch's iterator (the workers) before on_train_start: the
    # clock must be on the loader before that, whether fit() got the loader or a datamodule
    # builds it, and also when a finder callback's own fit built a loader first.
    from lightning.pytorch.callbacks import LearningRateFinder

    callback = ETSCallback(capture_steps=0)
    finder = [LearningRateFinder(num_training_steps=3)] if "finder" in source else []
    trainer = quiet_trainer(max_steps=6, num_sanity_val_steps=0, callbacks=[*finder, callback])
    loader = DataLoader(_SlowSamples(), batch_size=4, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if source == "loader":
            trainer.fit(TinyModule(), train_dataloaders=loader)
        else:
            trainer.fit(_TunableModule() if finder else TinyModule(), datamodule=_SlowData())
            loader = trainer.train_dataloader
    prediction = callback.prediction
    assert prediction is not None and prediction.step == 6
    # Two workers, each 4 samples of SLOW_SAMPLE_S a batch: at least 2 x SLOW_SAMPLE_S a step.
    assert prediction.input_period_s is not None
    assert prediction.input_period_s >= 0.9 * 4 * SLOW_SAMPLE_S / 2
    (clock,) = callback.hook._batch_clocks
    assert clock.loader is loader
    first = [times[0] for times in clock.read()[0] if times]
    assert len(first) == 2  # both workers' batches from the start, prefetched ones included
    assert not isinstance(loader.collate_fn, TimedCollate)  # given back at close
    assert "dataloader" not in vars(trainer.fit_loop._data_source)  # the source unwrapped


def test_every_train_loader_is_found_in_lightnings_collections() -> None:
    from lightning.pytorch.utilities import CombinedLoader

    from ets_hook.integrations.lightning_trainer import train_loaders

    one, two = loaders(batches=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own pytree deprecation notice
        combined_one = CombinedLoader([one], "max_size_cycle")
        combined_two = CombinedLoader({"a": one, "b": two})
        sequential = CombinedLoader({"a": one, "b": two}, "sequential")
    assert train_loaders(one) == [one]
    assert train_loaders([one]) == [one]
    assert train_loaders({"train": one}) == [one]
    assert train_loaders(combined_one) == [one]
    assert train_loaders([one, two]) == [one, two]
    assert train_loaders(combined_two) == [one, two]
    assert train_loaders({"a": [one, two], "b": one}) == [one, two]  # nested, each once
    assert train_loaders(sequential) == []  # a batch of one loader per step: no common pace
    assert train_loaders(None) == []
    assert train_loaders(range(3)) == []


class _TwoLoaders(TinyModule):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch["fast"], batch_idx) + super().training_step(
            batch["slow"], batch_idx
        )


def test_several_train_loaders_are_each_timed_and_the_slowest_paces_the_step() -> None:
    """Two train loaders (Lightning combines them: a batch from each per step): both timed
    from their first batch; the slow one (one worker, 4 samples of SLOW_SAMPLE_S a batch)
    sets the floor, not the fast one (no sleep)."""

    class _Fast(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.zeros(8), torch.zeros(1)

    fast = DataLoader(_Fast(), batch_size=4, num_workers=1)
    slow = DataLoader(_SlowSamples(), batch_size=4, num_workers=1)
    callback = ETSCallback(capture_steps=0)
    trainer = quiet_trainer(max_steps=6, num_sanity_val_steps=0, callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_TwoLoaders(), train_dataloaders={"fast": fast, "slow": slow})
    prediction = callback.prediction
    assert prediction is not None and prediction.step == 6
    assert prediction.input_period_s is not None
    assert prediction.input_period_s >= 0.9 * 4 * SLOW_SAMPLE_S  # the slow loader's pace
    clocks = callback.hook._batch_clocks
    assert sorted(id(clock.loader) for clock in clocks) == sorted([id(fast), id(slow)])
    for clock in clocks:  # each from its first batch on: attached before the workers started
        assert [len(times) > 0 for times in clock.read()[0]] == [True]
    assert not isinstance(fast.collate_fn, TimedCollate)
    assert not isinstance(slow.collate_fn, TimedCollate)  # both given back at close


def test_a_fit_that_fails_before_training_gives_the_loader_back() -> None:
    callback = ETSCallback()
    trainer = quiet_trainer(max_steps=2, num_sanity_val_steps=0, callbacks=[callback])
    loader = DataLoader(_SlowSamples(), batch_size=4, num_workers=1)

    class _FailsAtStart(L.Callback):
        def on_train_start(self, *args: Any) -> None:
            raise _Boom("before the first step")

    trainer.callbacks.insert(0, _FailsAtStart())
    with warnings.catch_warnings(), pytest.raises(_Boom):
        warnings.simplefilter("ignore")
        trainer.fit(TinyModule(), train_dataloaders=loader)
    assert callback.hook is None
    assert not isinstance(loader.collate_fn, TimedCollate)
    assert "dataloader" not in vars(trainer.fit_loop._data_source)


def test_unknown_options_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="total_step"):
        ETSCallback(total_step=10)


#: Options ETSHook rejects, each with what the error must say (the option and its value).
BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    (
        {"status_path": "/nonexistent/eta.json"},
        "status_path's directory does not exist: /nonexistent",
    ),
    ({"total_steps": -1}, "total_steps must be an int >= 1, got -1"),
    ({"total_steps": 2.5}, "total_steps must be an int >= 1, got 2.5"),
    ({"capture_steps": -1}, "capture_steps must be an int >= 0, got -1"),
    ({"trace_path": "/nonexistent/run.ets"}, "trace_path's directory does not exist: /nonexistent"),
    ({"deadline_policy": "soon"}, "deadline_policy must be one of"),
    ({"deadline": -5}, "deadline must be seconds > 0, got -5"),
    ({"time_limit_s": 0}, "time_limit_s must be a finite number of seconds > 0 or None, got 0"),
    ({"log_every": -1}, "log_every must be an int >= 1"),
    ({"early_stopping": 3}, "early_stopping must be (patience, min_delta, mode)"),
    ({"epochs": 0, "steps_per_epoch": 4}, "epochs must be a number > 0, got 0"),
    ({"phase_every": {"eval": -2}}, "phase_every['eval'] must be an int >= 0, got -2"),
    ({"total_steps": 5, "initial_step": 6}, "initial_step (6) is past the job's end"),
    ({"prometheus_port": 70000}, "prometheus_port must be an int in 1-65535, got 70000"),
    ({"checkpoint_files": 0}, "checkpoint_files must be an int >= 1, got 0"),
    ({"op_capture": "fast"}, "op_capture must be one of"),
    ({"on_prediction": 3}, "on_prediction must be callable, got 3"),
    ({"prog_bar": "yes"}, "prog_bar must be True or False, got 'yes'"),
    ({"decode_in_background": "no"}, "decode_in_background must be True or False, got 'no'"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=lambda v: str(v)[:40])
def test_invalid_option_values_raise_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        ETSCallback(**options)
    assert message in str(raised.value)


def test_epochs_without_an_epoch_length_raises_at_construction() -> None:
    """Given ``epochs``, the callback reads no steps per epoch from the Trainer: ETSHook would
    refuse it at training start."""
    with pytest.raises(ValueError, match="epochs=2 needs the length of an epoch"):
        ETSCallback(epochs=2)
    assert ETSCallback(epochs=2, steps_per_epoch=4).hook_options["epochs"] == 2


def test_valid_options_construct_and_write_nothing(tmp_path: Path) -> None:
    callback = ETSCallback(
        status_path=tmp_path / "eta.json",
        trace_path=tmp_path / "run{rank}.ets",
        total_steps=np.int64(40),
        capture_steps=0,
        log_every=5,
        deadline=3600.0,
        deadline_policy="point",
        early_stopping=(3, 0.0, "min"),
        time_limit_s=600,
        phase_every={"eval": 10},
        prometheus_textfile=tmp_path / "ets.prom",
    )
    assert callback.hook is None and callback.hook_options["deadline_policy"] == "point"
    assert list(tmp_path.iterdir()) == []  # checked, nothing opened or written


def test_option_values_invalid_with_the_trainers_raise_when_training_starts() -> None:
    """Each value valid alone, but past the Trainer's total: ETSHook refuses it at training
    start, before any step."""
    callback = ETSCallback(initial_step=100)
    trainer = quiet_trainer(max_steps=2, callbacks=[callback])
    with warnings.catch_warnings(), pytest.raises(ValueError, match="initial_step"):
        warnings.simplefilter("ignore")
        trainer.fit(TinyModule(), loaders(batches=2)[0])
    assert callback.hook is None and trainer.global_step == 0


def test_a_long_value_is_named_by_its_type_in_the_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    module = TinyModule()
    callback = ETSCallback(model=module.net, capture_steps=0)
    trainer = quiet_trainer(max_steps=2, callbacks=[callback])
    caplog.set_level(logging.INFO, logger="ets_hook")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loaders(batches=2)[0])
    assert callback.resolved_options["model"] is module.net
    linear = "Linear(in_features=8, out_features=1, bias=True)"  # short: shown as it is
    expected = f"model={linear} given; the Trainer says <TinyModule> (using {linear})"
    assert expected in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"num_training_batches": 16, "accumulate_grad_batches": 2, "val_check_batch": 16}, 8),
        (
            {
                "num_training_batches": 16,
                "accumulate_grad_batches": 2,
                "val_check_batch": 16,
                "check_val_every_n_epoch": 3,
            },
            24,
        ),
        ({"num_training_batches": 15, "accumulate_grad_batches": 2, "val_check_batch": 15}, 8),
        ({"num_training_batches": 16, "accumulate_grad_batches": 2, "val_check_batch": 4}, 2),
        ({"num_training_batches": 16, "accumulate_grad_batches": 4, "val_check_batch": 6}, None),
        ({"num_training_batches": 16, "accumulate_grad_batches": 2, "val_check_batch": 5}, None),
        (
            {
                "num_training_batches": 16,
                "accumulate_grad_batches": 2,
                "val_check_batch": 10,
                "check_val_every_n_epoch": None,
            },
            5,
        ),
        ({"num_training_batches": float("inf"), "val_check_batch": float("inf")}, None),
        ({"num_training_batches": 16, "val_check_batch": 16, "enable_validation": False}, None),
        (
            {"num_training_batches": 16, "val_check_batch": None, "_val_check_time_interval": 60.0},
            None,
        ),
    ],
)
def test_validation_period_in_optimizer_steps(
    settings: dict[str, Any], expected: int | None
) -> None:
    class FakeTrainer:
        enable_validation = True
        accumulate_grad_batches = 1
        check_val_every_n_epoch = 1
        _val_check_time_interval = None

    trainer = FakeTrainer()
    for key, value in settings.items():
        setattr(trainer, key, value)
    assert trainer_eval_every(trainer) == expected


@pytest.mark.parametrize(
    ("checkpoints", "files"),
    [
        ([{}], 1),  # the best file only (save_top_k=1)
        ([{"save_top_k": -1, "save_last": True}], 2),  # its file and a copy in last.ckpt
        ([{"save_last": "link"}], 1),  # last.ckpt a link: written once
        ([{"save_top_k": 0, "save_last": True}], 1),  # last.ckpt only
        ([{}, {"save_last": True}], 3),  # two callbacks
        ([], 1),
    ],
)
def test_checkpoint_files_per_save(checkpoints: list[dict[str, Any]], files: int) -> None:
    trainer = SimpleNamespace(callbacks=[ModelCheckpoint(**kwargs) for kwargs in checkpoints])
    assert trainer_checkpoint_files(trainer) == files


@pytest.mark.parametrize(
    ("checkpoints", "validates", "eval_every", "expected"),
    [
        ([{}], True, 8, 8),  # after every validation (every epoch)
        ([{}], True, 24, 24),  # validation every 3 epochs: saves follow it
        ([{"every_n_epochs": 2}], True, 24, 48),  # every 3rd and every 2nd epoch: lcm 6
        ([{"every_n_epochs": 2}], False, None, 16),  # no validation: every 2nd epoch's end
        ([{}], True, 4, 4),  # validation twice an epoch, a save after each
        ([{"every_n_epochs": 2}], True, 4, None),  # twice an epoch, every other epoch
        ([{"every_n_train_steps": 5}], True, 8, 5),
        ([{"every_n_train_steps": 5}, {}], True, 8, 5),  # several: the shortest
        ([{"train_time_interval": timedelta(minutes=5)}], True, 8, None),
        ([{"every_n_epochs": 0}], True, 8, None),  # saves only when asked
        ([{}], True, None, None),  # after validations of unknown period
        ([], True, 8, None),
    ],
)
def test_checkpoint_period_in_optimizer_steps(
    checkpoints: list[dict[str, Any]], validates: bool, eval_every: int | None, expected: int | None
) -> None:
    trainer = SimpleNamespace(
        num_training_batches=16,
        accumulate_grad_batches=2,  # 8 steps per epoch
        enable_validation=validates,
        callbacks=[ModelCheckpoint(**kwargs) for kwargs in checkpoints],
    )
    assert trainer_checkpoint_every(trainer, eval_every) == expected


# --------------------------------------------------------------------------------------------
# Import names and the README snippet
# --------------------------------------------------------------------------------------------

_BLOCKED_IMPORTS = textwrap.dedent(
    """
    import sys
    for blocked in {blocked!r}:
        sys.modules[blocked] = None
    try:
        import ets_hook.integrations.{module}
    except ImportError as exc:
        print(exc)
    else:
        print("imported")
    assert "torch" not in sys.modules  # the check comes first
    """
)

_PL_NEEDED = (
    "ets_hook.integrations.pytorch_lightning needs the `pytorch_lightning` package",
    "pip install pytorch-lightning",
    # the extra brings `lightning`, not `pytorch_lightning`: said as such, with the import to use
    "pip install 'ets-hook[lightning]'` installs the `lightning` package",
    "ets_hook.integrations.lightning.ETSCallback",
)


@pytest.mark.parametrize(
    ("module", "blocked", "needles"),
    [
        (
            "lightning",
            ("lightning", "pytorch_lightning"),
            ("ets_hook.integrations.lightning needs", "pip install 'ets-hook[lightning]'"),
        ),
        ("pytorch_lightning", ("lightning", "pytorch_lightning"), _PL_NEEDED),
        ("pytorch_lightning", ("pytorch_lightning",), _PL_NEEDED),  # `lightning` alone
    ],
    ids=["lightning", "pytorch_lightning", "pytorch_lightning-with-lightning"],
)
def test_without_lightning_the_import_error_says_what_to_install(
    module: str, blocked: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    code = _BLOCKED_IMPORTS.format(module=module, blocked=blocked)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    for needle in needles:
        assert needle in out.stdout, (needle, out.stdout)


_BOTH_NAMES = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import ets_hook.integrations.lightning as ets_lightning
    assert not {"lightning", "pytorch_lightning"} & set(sys.modules)  # imported at first use

    # The pytorch_lightning name: only that package is imported (the other would reroute
    # Lightning's log lines), and the callback works with its Trainer.
    from ets_hook.integrations.pytorch_lightning import ETSCallback
    import pytorch_lightning as pl
    assert "lightning" not in sys.modules

    class M(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(24, 8), torch.randn(24, 1)), batch_size=4)
    callback = ETSCallback(capture_steps=0)
    assert isinstance(callback, pl.Callback)
    trainer = pl.Trainer(
        max_epochs=2, accumulate_grad_batches=2, callbacks=callback, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1,
    )
    trainer.fit(M(), data)
    assert trainer.global_step == callback.prediction.step == callback.hook.total_steps == 6

    # The preferred name gives the lightning.pytorch class, made at first use.
    import lightning.pytorch as L
    preferred = ets_lightning.ETSCallback()
    assert isinstance(preferred, L.Callback) and not isinstance(preferred, pl.Callback)
    assert not isinstance(callback, L.Callback)
    print("ok")
    """
)


def test_both_import_names_import_only_their_package() -> None:
    pytest.importorskip("pytorch_lightning")
    out = subprocess.run(
        [sys.executable, "-c", _BOTH_NAMES], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


#: The README's Lightning example, verbatim (test_readme_shows_this_snippet keeps them equal).
README_SNIPPET = """\
import lightning as L
from ets_hook.integrations.lightning import ETSCallback

ets = ETSCallback(status_path="eta.json")        # any ETSHook option
trainer = L.Trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[ets])
trainer.fit(model, train_loader, val_loader)    # ETA in the bar, ets/* metrics in the loggers
if ets.prediction is not None:                  # None with ETS_HOOK_DISABLE=1
    print(ets.prediction.total_s, ets.prediction.eta_s)
"""


@pytest.mark.parametrize("disabled", [False, True], ids=["enabled", "ETS_HOOK_DISABLE"])
def test_readme_snippet_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    disabled: bool,
) -> None:
    monkeypatch.chdir(tmp_path)  # lightning_logs/ and eta.json
    if disabled:
        monkeypatch.setenv("ETS_HOOK_DISABLE", "1")
    train_loader, val_loader = loaders(batches=4)
    namespace: dict[str, Any] = {
        "model": TinyModule(),
        "train_loader": train_loader,
        "val_loader": val_loader,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(README_SNIPPET, "README.md", "exec"), namespace)
    ets, trainer = namespace["ets"], namespace["trainer"]
    assert trainer.global_step == 4
    printed = capsys.readouterr().out.splitlines()
    if disabled:  # the hook does nothing: no prediction (the snippet ran to its end), no file
        assert ets.prediction is None and not (tmp_path / "eta.json").exists()
        return
    assert ets.prediction.step == trainer.global_step
    assert ets.prediction.eta_s == 0.0
    assert f"{ets.prediction.total_s} 0.0" in printed
    assert json.loads((tmp_path / "eta.json").read_text())["state"] == "closed"
    assert set(LOG_KEYS) <= set(trainer.logged_metrics)


def test_readme_shows_this_snippet() -> None:
    assert README_SNIPPET in readme_python_blocks("PyTorch Lightning")


# --------------------------------------------------------------------------------------------
# Early stopping: the hook follows the Trainer's EarlyStopping


class _FallingValLoss(TinyModule):
    """``val_loss`` falls with each validation: early stopping never fires."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.tensor(1.0 / (1.0 + self.global_step)))


#: ``val_loss`` at the k-th validation (k = 1..30) of the run that stops early: 0.4 +
#: 0.6·exp(-k/1.5) plus N(0, 0.002) noise (numpy seed 0), rounded. It levels off from about the
#: 9th validation, so ``EarlyStopping(patience=2)`` stops the fit well before its 60 steps (at
#: step 24: what the test reads is the Trainer's own stop).
PLATEAU_VAL_LOSS = [
    0.7083, 0.5579, 0.4825, 0.4419, 0.4203, 0.4117, 0.4083, 0.4048, 0.4001, 0.3982,
    0.3991, 0.4003, 0.3955, 0.3996, 0.3975, 0.3985, 0.3989, 0.3994, 0.4008, 0.4021,
    0.3997, 0.4027, 0.3987, 0.4007, 0.4018, 0.4002, 0.3985, 0.3982, 0.3991, 0.4004,
]  # fmt: skip


class _PlateauValLoss(TinyModule):
    """``val_loss`` takes the values of ``PLATEAU_VAL_LOSS``, one per validation run."""

    def __init__(self) -> None:
        super().__init__()
        self.validations = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.tensor(PLATEAU_VAL_LOSS[self.validations]))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.validations += 1


class _PredictionAtEachEvaluation(L.Callback):
    """Placed after ``ETSCallback``: its prediction each time its hook has taken in a new
    value of the monitored metric (at validation end or train epoch end, as EarlyStopping)."""

    def __init__(self, callback: ETSCallback) -> None:
        self.callback = callback
        self.seen: list[Seen] = []
        self.validations = 0

    def _look(self, trainer: L.Trainer) -> None:
        hook = self.callback.hook
        tracker = hook._forecaster._early_stop if hook is not None else None
        if tracker is not None and tracker.evaluations > len(self.seen):
            self.seen.append(
                Seen(trainer.global_step, tracker.evaluations, self.callback.prediction)
            )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validations += 1
            self._look(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._look(trainer)


@pytest.mark.parametrize(
    ("trainer_kwargs", "module_class", "at_epoch_end"),
    [
        ({"max_epochs": 8}, _FallingValLoss, True),  # 32 steps, a validation every 4
        ({"max_epochs": 15, "val_check_interval": 2}, _PlateauValLoss, False),  # 60, every 2
    ],
    ids=["keeps-improving-checked-at-train-epoch-end", "plateaus-checked-at-validation-end"],
)
def test_follows_the_trainers_early_stopping(
    trainer_kwargs: dict[str, Any], module_class: type[TinyModule], at_epoch_end: bool
) -> None:
    early = EarlyStopping(monitor="val_loss", patience=2)
    callback = ETSCallback(capture_steps=0, log_every=None)
    watcher = _PredictionAtEachEvaluation(callback)
    trainer = quiet_trainer(
        num_sanity_val_steps=1, callbacks=[callback, early, watcher], **trainer_kwargs
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module_class(), *loaders(batches=4))
    max_steps = 4 * trainer_kwargs["max_epochs"]  # 4 batches an epoch, no accumulation
    assert early._check_on_train_epoch_end is at_epoch_end
    assert callback.resolved_options["early_stopping"] == EarlyStoppingRule(
        2, 0.0, "min", stop_on_non_finite=True
    )
    tracker = callback.hook._forecaster._early_stop
    assert tracker is not None
    # Every validation's monitor was taken in (the sanity check's is not reported).
    assert tracker.evaluations == watcher.validations == len(watcher.seen) >= MIN_POINTS + 2
    stop_step = trainer.global_step
    if module_class is _PlateauValLoss:
        # The monitor plateaus: the fit stops early, at the validation where the hook's rule
        # fired; at the last validation before it, the expected stop is within 40% of the real
        # one (the tolerance the synthetic-curve tests hold the forecast to).
        assert stop_step < max_steps
        assert tracker.stopped_step == stop_step == watcher.seen[-1].step
        last = [s for s in watcher.seen if s.step < stop_step][-1]
        assert abs(last.prediction.expected_stop_step - stop_step) <= 0.4 * stop_step, last
        assert watcher.seen[-1].prediction.expected_stop_step == stop_step
    else:
        assert stop_step == max_steps and not tracker.stopped
    check_forecasts_until_the_stop(
        watcher.seen, max_steps, stop_step, keeps_improving=module_class is _FallingValLoss
    )
    prediction = callback.prediction
    assert prediction.expected_stop_step == stop_step == prediction.step
    assert prediction.total_range_s is not None


def test_explicit_early_stopping_wins(caplog: pytest.LogCaptureFixture) -> None:
    early = EarlyStopping(monitor="val_loss", patience=2, min_delta=0.01)
    callback = ETSCallback(capture_steps=0, log_every=None, early_stopping=(4, 0.5))
    trainer = quiet_trainer(max_epochs=4, callbacks=[callback, early])
    caplog.set_level(logging.INFO, logger="ets_hook")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_FallingValLoss(), *loaders(batches=2))
    tracker = callback.hook._forecaster._early_stop
    assert tracker is not None and tracker.rule == EarlyStoppingRule(4, 0.5, "min")
    assert tracker.evaluations == 4  # the monitor is still reported
    assert any("early_stopping=(4, 0.5) given" in r.getMessage() for r in caplog.records)


class _ReportsItsValLoss(_FallingValLoss):
    """Reports ``val_loss`` to the ETS callback's hook itself, as the warning says to."""

    def __init__(self, callback: Any) -> None:
        super().__init__()
        self.ets = callback

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.ets.hook.report_metric("val_loss", 1.0 / (1.0 + self.global_step))


def test_an_explicit_rule_without_early_stopping_says_what_feeds_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback = ETSCallback(capture_steps=0, log_every=None, early_stopping=[3, 0.0, "min"])
    trainer = quiet_trainer(max_epochs=3, callbacks=[callback])
    caplog.set_level(logging.INFO, logger="ets_hook")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_ReportsItsValLoss(callback), *loaders(batches=2))
    said = [r for r in caplog.records if "no EarlyStopping callback" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "ets.hook.report_metric(name, value)" in said[0].getMessage()
    tracker = callback.hook._forecaster._early_stop
    assert tracker is not None and tracker.rule == EarlyStoppingRule(3, 0.0, "min")  # a list
    assert tracker.evaluations == 3  # what the module reported, one per validation


class _StopAt(L.Callback):
    """Stops the fit once ``trainer.global_step`` reaches ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("max_steps", [-1, 1_000_000])
def test_max_time_bounds_a_fit_without_an_epoch_limit(max_steps: int) -> None:
    # max_epochs=-1: with max_steps=-1 the length is unknown and max_time is the only bound;
    # with a million steps the predicted total is far past 30 s, so max_time ends the job.
    max_time_s = 30.0 if max_steps > 0 else 3600.0
    callback = ETSCallback(capture_steps=0, log_every=None)
    at_step_5 = PredictionAt(callback, at=5)
    trainer = quiet_trainer(
        max_epochs=-1,
        max_steps=max_steps,
        max_time=timedelta(seconds=max_time_s),
        callbacks=[callback, at_step_5, _StopAt(6)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyModule(), loaders()[0])
    prediction = at_step_5.prediction
    assert trainer.global_step == 6 and prediction.step == 5
    assert 0 < prediction.time_limit_s <= max_time_s
    if max_steps < 0:
        assert prediction.total_steps is None and prediction.total_s is None
        assert not prediction.stopped_by_time_limit
    else:
        assert prediction.total_steps == max_steps
        assert prediction.stopped_by_time_limit
        assert prediction.total_s == prediction.time_limit_s
        assert prediction.eta_s == pytest.approx(prediction.time_limit_s - prediction.elapsed_s)
    assert not callback.prediction.stopped_by_time_limit  # stopped at step 6, before the limit
