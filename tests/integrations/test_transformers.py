"""ETSTrainerCallback on a real ``transformers.Trainer`` (CPU, a tiny GPT-2 built from a config,
random tokens, no downloads).

One module-scoped fixture trains twice: 30 optimizer steps (gradient accumulation 2, a log every 5
steps, an evaluation every 10, a checkpoint every 20, one slow evaluation and one slow save), then
a second Trainer resumes from the step-20 checkpoint up to 40 steps. The tests read those runs.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import json
import logging
import pickle
import re
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

pytest.importorskip("transformers")  # only so the core suite runs where the extra is absent

import torch
from support import Seen, check_forecasts_until_the_stop, readme_python_blocks
from transformers import (
    EarlyStoppingCallback,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.integrations import integration_utils
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ets_hook.capture.batch_clock import TimedCollate
from ets_hook.capture.sysinfo import training_state_bytes
from ets_hook.forecast.early_stop import MIN_POINTS, EarlyStoppingRule
from ets_hook.forecast.epochs import EPOCH_START
from ets_hook.forecast.job import CHECKPOINT_FIXED_S, CHECKPOINT_WRITE_BYTES_PER_S
from ets_hook.integrations.common import HOOK_ARGUMENTS
from ets_hook.integrations.transformers import (
    LOG_KEYS,
    ETSLogInjector,
    ETSTrainerCallback,
    _monitored_metric,
    _trainer_options,
    log_values,
)

#: Seconds the slow evaluation (compute_metrics at step 10) and the slow save (step 20) sleep:
#: far above a step of this model (~10 ms), so a step that absorbed one would show.
SLOW_S = 0.8
RECORDER = "ets-test-recorder"  # a report_to name registered for the fixture


class TokenSet(torch.utils.data.Dataset):
    """Random token sequences; each item is its own causal-LM target."""

    def __init__(self, n: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def training_args(output_dir: Path, **overrides: Any) -> TrainingArguments:
    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": 30,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "logging_steps": 5,
        "eval_strategy": "steps",
        "eval_steps": 10,
        "save_strategy": "steps",
        "save_steps": 20,
        "report_to": [],
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


class Recorder(TrainerCallback):
    """Placed by the Trainer like a ``report_to`` integration: keeps a copy of every log."""

    instances: ClassVar[list[Recorder]] = []

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []
        Recorder.instances.append(self)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.logs.append({**logs, "step": state.global_step})


class BarWatcher(TrainerCallback):
    """Added after the ProgressCallback: the bar's postfix at each step end."""

    def __init__(self) -> None:
        self.postfixes: list[str] = []
        self.progress: ProgressCallback | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        bar = getattr(self.progress, "training_bar", None)
        if bar is not None:
            self.postfixes.append(str(bar.postfix or ""))


class PredictOnce(TrainerCallback):
    """Calls ``trainer.predict`` once, inside training (at step ``at``)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.trainer: Trainer | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at and self.trainer is not None:
            self.trainer.predict(TokenSet(4, seed=3))


class PredictionAt(TrainerCallback):
    """Keeps ``ETSTrainerCallback``'s prediction at step ``at`` (placed after it)."""

    def __init__(self, callback: ETSTrainerCallback, at: int) -> None:
        self.callback, self.at = callback, at
        self.prediction: Any = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            self.prediction = self.callback.prediction


class SlowSaveTrainer(Trainer):
    """Its save at ``slow_step`` takes ``SLOW_S`` longer."""

    slow_step = 20

    def save_model(self, *args: Any, **kwargs: Any) -> None:
        if self.state.global_step == self.slow_step:
            time.sleep(SLOW_S)
        super().save_model(*args, **kwargs)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Run:
    trainer: Trainer
    callback: ETSTrainerCallback
    recorder: Recorder
    lines: list[str]
    bar: BarWatcher | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def slow_metrics_at(step: int, trainer_box: list[Trainer]) -> Any:
    def compute_metrics(prediction: Any) -> dict[str, float]:
        if trainer_box and trainer_box[0].state.global_step == step:
            time.sleep(SLOW_S)
        return {"seen": 1.0}

    return compute_metrics


def train(make_trainer: Any, callback: ETSTrainerCallback, **train_kwargs: Any) -> Run:
    records = Records()
    ets_logger = logging.getLogger("ets_hook")
    ets_logger.addHandler(records)
    level = ets_logger.level
    ets_logger.setLevel(logging.INFO)
    Recorder.instances.clear()
    try:
        trainer = make_trainer(callback)
        trainer.train(**train_kwargs)
    finally:
        ets_logger.removeHandler(records)
        ets_logger.setLevel(level)
    (recorder,) = Recorder.instances
    return Run(trainer, callback, recorder, records.lines)


@dataclass
class Runs:
    first: Run
    resumed: Run
    out: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Run 1: 30 steps, total_steps=32 given explicitly (disagrees with max_steps=30), the
    ProgressCallback's bar on; run 2: resumed from checkpoint-20 up to max_steps=40, with a
    ``trainer.predict`` at step 25. Both report_to the recorder (and TensorBoard if installed)."""
    out = tmp_path_factory.mktemp("hf")
    report_to = [RECORDER]
    if integration_utils.is_tensorboard_available():
        report_to.append("tensorboard")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, RECORDER, Recorder)

        box1: list[Trainer] = []
        bar = BarWatcher()

        def first(callback: ETSTrainerCallback) -> Trainer:
            trainer = SlowSaveTrainer(
                model=tiny_gpt2(),
                args=training_args(out, report_to=report_to, disable_tqdm=False),
                train_dataset=TokenSet(64),
                eval_dataset=TokenSet(8, seed=1),
                compute_metrics=slow_metrics_at(10, box1),
                callbacks=[callback],
            )
            box1.append(trainer)
            trainer.add_callback(bar)
            trainer.add_callback(before_eval)
            bar.progress = next(
                cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ProgressCallback)
            )
            return trainer

        callback1 = ETSTrainerCallback(total_steps=32, capture_steps=5)
        before_eval = PredictionAt(callback1, at=5)
        run1 = train(first, callback1)
        run1.bar = bar
        run1.extra["before_eval"] = before_eval.prediction
        run1.extra["callbacks"] = [
            type(cb).__name__ for cb in run1.trainer.callback_handler.callbacks
        ]

        predict = PredictOnce(at=25)

        def second(callback: ETSTrainerCallback) -> Trainer:
            trainer = Trainer(
                model=tiny_gpt2(),
                args=training_args(out, max_steps=40, report_to=report_to),
                train_dataset=TokenSet(64),
                eval_dataset=TokenSet(8, seed=1),
                callbacks=[callback, predict],
            )
            predict.trainer = trainer
            return trainer

        run2 = train(
            second,
            ETSTrainerCallback(capture_steps=5),
            resume_from_checkpoint=str(out / "checkpoint-20"),
        )
    return Runs(run1, run2, out)


# --------------------------------------------------------------------------------------------
# Steps, totals, resume


def test_steps_counted_are_optimizer_steps(runs: Runs) -> None:
    first, resumed = runs.first, runs.resumed
    assert first.trainer.state.global_step == 30
    assert first.callback.hook is not None
    # 60 micro-batches, 30 optimizer steps: the hook counts the optimizer's.
    assert first.callback.hook.steps_completed == 30
    assert len(first.callback.hook.step_times_s) == 30
    assert resumed.trainer.state.global_step == 40
    assert resumed.callback.hook is not None
    assert resumed.callback.hook.steps_completed == 20
    assert resumed.callback.prediction is not None
    assert resumed.callback.prediction.step == 40


def test_resumed_run_starts_at_the_checkpoint_step(runs: Runs) -> None:
    resumed = runs.resumed
    hook = resumed.callback.hook
    assert hook is not None
    assert hook.total_steps == 40 == resumed.trainer.state.max_steps
    prediction = resumed.callback.prediction
    assert prediction is not None
    assert prediction.step - hook.steps_completed == 20  # initial_step: the checkpoint's
    assert prediction.total_steps == 40
    assert prediction.remaining_steps == 0
    assert not [line for line in resumed.lines if "ETSTrainerCallback" in line]


def test_explicit_total_steps_wins_with_one_log_line(runs: Runs) -> None:
    first = runs.first
    assert first.callback.hook is not None
    assert first.callback.hook.total_steps == 32
    assert first.extra["before_eval"].total_steps == 32  # while training: the explicit value
    ended = first.callback.prediction  # once ended: the 30 steps the Trainer ran
    assert ended is not None
    assert (ended.step, ended.total_steps, ended.eta_s) == (30, 30, 0.0)
    lines = [line for line in first.lines if "ETSTrainerCallback" in line]
    assert len(lines) == 1, first.lines
    assert "total_steps=32" in lines[0] and "30" in lines[0]


def test_phase_periods_come_from_the_trainer(runs: Runs) -> None:
    prediction = runs.resumed.callback.prediction
    assert prediction is not None
    periods = {p.name: (p.period_steps, p.period_source) for p in prediction.phases}
    assert periods["eval"] == (10, "hint")
    assert periods["checkpoint"] == (20, "hint")


# --------------------------------------------------------------------------------------------
# Phases


def test_eval_and_save_are_phases_not_step_time(runs: Runs) -> None:
    hook = runs.first.callback.hook
    assert hook is not None
    assert max(hook.step_times_s) < SLOW_S, hook.step_times_s
    # The steps right after the slow evaluation (step 10) and the slow save (step 20).
    assert hook.step_times_s[10] < SLOW_S / 2
    assert hook.step_times_s[20] < SLOW_S / 2
    prediction = runs.first.callback.prediction
    assert prediction is not None
    phases = {p.name: p for p in prediction.phases}
    # The train dataloader's epochs (16 steps each) begin with their start-up as a phase.
    assert set(phases) - {EPOCH_START} == {"eval", "checkpoint"}
    assert phases["eval"].occurrences == 3  # steps 10, 20, 30
    assert phases["checkpoint"].occurrences == 2  # steps 20, 30 (the final save)
    assert phases["eval"].spent_s >= SLOW_S
    assert phases["checkpoint"].spent_s >= SLOW_S
    # Steps and phases tile the hook's wall time: nothing counted twice, no phase lost.
    accounted = sum(hook.step_times_s) + sum(p.spent_s for p in phases.values())
    assert 0.8 * prediction.elapsed_s <= accounted <= prediction.elapsed_s + 1e-3


def test_evaluations_are_priced_before_the_first_one(runs: Runs) -> None:
    prediction = runs.first.extra["before_eval"]  # at step 5: no evaluation yet
    assert prediction is not None and prediction.step == 5
    phases = {p.name: p for p in prediction.phases}
    evaluation = phases["eval"]
    assert evaluation.occurrences == 0 and evaluation.cost_source == "prior"
    # 8 samples at eval batch 4 = 2 batches, each a forward (1/3) of a micro-batch twice the
    # training one (2), over 2 micro-batches per step: 2/3 of a steady step each.
    assert evaluation.mean_s == pytest.approx(2 / 3 * prediction.iteration_s)
    # Steps 10, 20, 30, and the one the Trainer runs after the job's last step (32 as given:
    # off the period).
    assert evaluation.remaining == 4
    assert evaluation.remaining_s == pytest.approx(4 * evaluation.mean_s)
    # Saves (every 20 steps) are priced from the state they write: the model and AdamW's two
    # moments (and step counts), at the assumed write rate.
    checkpoint = phases["checkpoint"]
    # After step 20 and once more after the last step (the Trainer's final save).
    assert checkpoint.cost_source == "prior" and checkpoint.remaining == 2
    state_bytes = training_state_bytes(
        runs.first.trainer.model, [runs.first.trainer.optimizer.optimizer]
    )
    assert state_bytes > 3 * sum(p.numel() * 4 for p in runs.first.trainer.model.parameters())
    assert checkpoint.mean_s == pytest.approx(
        CHECKPOINT_FIXED_S + state_bytes / CHECKPOINT_WRITE_BYTES_PER_S
    )
    assert prediction.remaining_phase_s == pytest.approx(
        evaluation.remaining_s + checkpoint.remaining_s
    )
    # Once measured, the measurement replaces the prior.
    after = runs.first.callback.prediction
    assert after is not None
    assert {p.name: p.cost_source for p in after.phases if p.name != EPOCH_START} == {
        "eval": "measured",
        "checkpoint": "measured",
    }


def test_predict_inside_training_is_a_phase(runs: Runs) -> None:
    prediction = runs.resumed.callback.prediction
    assert prediction is not None
    phases = {p.name: p for p in prediction.phases}
    assert phases["predict"].occurrences == 1
    assert phases["eval"].occurrences == 2  # steps 30, 40
    assert phases["checkpoint"].occurrences == 1  # step 40


# --------------------------------------------------------------------------------------------
# Logs


def _training_entries(entries: list[dict[str, Any]], after: int = 0) -> list[dict[str, Any]]:
    return [e for e in entries if "loss" in e and e["step"] > after]


def test_predictions_in_log_history(runs: Runs) -> None:
    for run, after, steps in (
        (runs.first, 0, range(5, 31, 5)),
        (runs.resumed, 20, range(25, 41, 5)),
    ):
        history = run.trainer.state.log_history
        training = _training_entries(history, after)
        assert [e["step"] for e in training] == list(steps)
        for entry in training:
            assert set(LOG_KEYS) <= set(entry), entry
            assert entry["ets/iteration_s"] > 0
            assert entry["ets/total_s"] >= entry["ets/eta_s"] >= 0
        evals = [e for e in history if "eval_loss" in e and e["step"] > after]
        assert evals and not any(k in e for e in evals for k in LOG_KEYS)
        final = history[-1]
        assert "train_runtime" in final and set(LOG_KEYS) <= set(final)
    assert runs.resumed.trainer.state.log_history[-1]["ets/eta_s"] == 0
    # The first run planned 32 steps (explicit) and ran the Trainer's 30: its closing summary
    # is the job as it ran.
    summary = runs.first.trainer.state.log_history[-1]
    assert summary["ets/eta_s"] == 0 and summary["ets/total_s"] > 0
    first_entry = _training_entries(runs.first.trainer.state.log_history)[0]
    # The first run's total is 32 steps (explicit): 27 of them remain after step 5.
    assert first_entry["ets/eta_s"] > 20 * first_entry["ets/iteration_s"]


def test_predictions_reach_report_to_integrations(runs: Runs) -> None:
    first = runs.first
    assert first.extra["callbacks"][0] == "ETSLogInjector"
    assert first.extra["callbacks"].index("Recorder") < first.extra["callbacks"].index(
        "ETSTrainerCallback"
    )
    for run in (runs.first, runs.resumed):
        history = [e for e in run.trainer.state.log_history if "loss" in e or "train_loss" in e]
        received = [e for e in run.recorder.logs if "loss" in e or "train_loss" in e]
        assert len(received) == len(history[-len(received) :]) > 0
        for got, kept in zip(received, history[-len(received) :], strict=True):
            assert {k: got[k] for k in LOG_KEYS} == {k: kept[k] for k in LOG_KEYS}


def _tensorboard_scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """Tag -> [(step, value)] from every TensorBoard event file under ``root``."""
    try:
        from tensorboardX.proto import event_pb2
    except ImportError:
        from tensorboard.compat.proto import event_pb2
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in glob.glob(str(root / "**" / "events.out.tfevents*"), recursive=True):
        data = Path(path).read_bytes()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_predictions_reach_tensorboard(runs: Runs) -> None:
    if not integration_utils.is_tensorboard_available():
        pytest.skip("neither tensorboard nor tensorboardX is installed")
    scalars = _tensorboard_scalars(runs.out)
    for key in LOG_KEYS:
        steps = {step for step, _ in scalars.get(f"train/{key}", [])}
        assert {5, 10, 15, 25, 30, 35, 40} <= steps, sorted(scalars)


def test_eta_on_the_trainers_progress_bar(runs: Runs) -> None:
    bar = runs.first.bar
    assert bar is not None and len(bar.postfixes) == 30
    assert all("/step" in p and "ETA" in p for p in bar.postfixes), bar.postfixes


# --------------------------------------------------------------------------------------------
# Closed after training


def test_hook_closed_after_training(runs: Runs) -> None:
    assert not torch.autograd._profiler_enabled()
    for run in (runs.first, runs.resumed):
        model = run.trainer.model
        assert not model._forward_pre_hooks
        assert not model._forward_hooks
        inner = run.trainer.optimizer.optimizer  # the AcceleratedOptimizer's optimizer
        assert isinstance(inner, torch.optim.Optimizer)
        assert not inner._optimizer_step_post_hooks
        assert not inner._optimizer_step_pre_hooks
        assert run.callback.hook is not None
        assert run.callback.hook.capture_status.startswith("done")


# --------------------------------------------------------------------------------------------
# The README's snippet, verbatim

REPO = Path(__file__).resolve().parents[2]

#: The README's Hugging Face Trainer example, verbatim (test_readme_shows_this_snippet keeps
#: them equal; test_readme_snippet runs it).
README_SNIPPET = """\
from transformers import Trainer
from ets_hook.integrations.transformers import ETSTrainerCallback

ets = ETSTrainerCallback()  # ETSHook options go here, e.g. status_path="eta.json"
trainer = Trainer(model=model, args=args, train_dataset=train_set, callbacks=[ets])
trainer.train()  # ets/iteration_s, ets/eta_s, ets/total_s in the logs; ETA on the bar
print(ets.prediction)  # the final Prediction
"""


def test_readme_shows_this_snippet() -> None:
    assert README_SNIPPET in readme_python_blocks("Hugging Face Trainer")


def test_readme_snippet(tmp_path: Path) -> None:
    model = tiny_gpt2()
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, logging_steps=2, report_to="none", use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    namespace: dict[str, Any] = {"model": model, "args": args, "train_set": TokenSet(16)}
    exec(compile(README_SNIPPET, "README.md", "exec"), namespace)
    ets, trainer = namespace["ets"], namespace["trainer"]

    assert ets.prediction is not None and ets.prediction.step == 6
    assert ets.hook is not None and ets.hook.total_steps == 6
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in logged] == [2, 4, 6]
    assert all(set(LOG_KEYS) <= set(e) for e in logged)
    # After training the hook is closed: a later evaluation logs without our values.
    trainer.evaluate(TokenSet(4, seed=2))
    assert "eval_loss" in trainer.state.log_history[-1]
    assert not set(LOG_KEYS) & set(trainer.state.log_history[-1])
    assert not model._forward_pre_hooks


class SlowTokenSet(TokenSet):
    """Each sample takes ``SLOW_ITEM_S`` to load (in the DataLoader's worker)."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(SLOW_ITEM_S)
        return super().__getitem__(i)


SLOW_ITEM_S = 0.010


class SlowTokenStream(torch.utils.data.IterableDataset):
    """``SlowTokenSet`` as an iterable dataset (no ``len()``: the Trainer needs max_steps)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        samples = SlowTokenSet(32)
        for i in range(len(samples)):
            yield samples[i]


@pytest.mark.parametrize("dataset", ["sized", "iterable"])
def test_the_trainers_dataloader_workers_are_timed(tmp_path: Path, dataset: str) -> None:
    args = training_args(
        tmp_path, max_steps=8, gradient_accumulation_steps=1, eval_strategy="no",
        save_strategy="no", dataloader_num_workers=1,
    )  # fmt: skip
    ets = ETSTrainerCallback(capture_steps=0)
    train_set = SlowTokenSet(32) if dataset == "sized" else SlowTokenStream()
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=train_set, callbacks=[ets])
    trainer.train()
    prediction = ets.prediction
    assert prediction is not None and prediction.step == 8
    # The worker's pace: two samples a batch, each sleeping SLOW_ITEM_S, bound it from below.
    assert prediction.input_period_s is not None
    assert prediction.input_period_s >= 0.9 * 2 * SLOW_ITEM_S
    assert ets.hook is not None and ets.hook._batch_clocks
    assert not isinstance(ets.hook._batch_clocks[0].loader.collate_fn, TimedCollate)  # given back


def test_eta_in_the_notebook_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """In a notebook the Trainer shows transformers' HTML bar, not tqdm: our ETA ends the
    comment it shows beside the bar (``Epoch 1/3 · ... ETA 2.1s``), and ``done`` at the end."""
    notebook = pytest.importorskip("transformers.utils.notebook")
    comments: list[str] = []

    class NotebookProgressCallback(notebook.NotebookProgressCallback):  # keeps what it shows
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            super().on_step_end(args, state, control, **kwargs)
            comments.append(self.training_tracker.comment)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            tracker = self.training_tracker
            super().on_train_end(args, state, control, **kwargs)
            comments.append(tracker.comment)

    args = training_args(tmp_path, max_steps=12, eval_strategy="no", save_strategy="no")
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenSet(64))
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(NotebookProgressCallback)
    trainer.add_callback(ETSTrainerCallback(log_every=None, capture_steps=0))
    trainer.train()
    capsys.readouterr()  # the bar's HTML, displayed as text outside a notebook
    assert re.fullmatch(r"Epoch \S+/\S+", comments[0])  # before any prediction: the Trainer's
    assert any(re.fullmatch(r"Epoch \S+/\S+ · .+/step ±.+ · ETA .+", c) for c in comments)
    assert comments[-1].endswith(" · done"), comments


def test_added_after_init_still_reaches_report_to(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, RECORDER, Recorder)
        Recorder.instances.clear()
        args = training_args(
            tmp_path, max_steps=4, logging_steps=2, eval_strategy="no", save_strategy="no",
            report_to=[RECORDER],
        )  # fmt: skip
        trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenSet(16))
        callback = ETSTrainerCallback(log_every=None)
        trainer.add_callback(callback)
        trainer.train()
    (recorder,) = Recorder.instances
    logged = [e for e in recorder.logs if "loss" in e]
    assert [e["step"] for e in logged] == [2, 4]
    assert all(set(LOG_KEYS) <= set(e) for e in logged)
    assert type(trainer.callback_handler.callbacks[0]) is ETSLogInjector
    # Picklable (hyperparameter search backends pickle the Trainer): options kept, no hook.
    clone = pickle.loads(pickle.dumps(trainer.callback_handler.callbacks))
    (copied,) = [cb for cb in clone if isinstance(cb, ETSTrainerCallback)]
    assert copied.hook is None and copied._options == {"log_every": None}
    assert clone[0]._owner() is copied


class RaiseAtStep(TrainerCallback):
    """Raises inside ``train()`` at one step (an out-of-memory error, a user's bug)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError("simulated out of memory")


def test_a_train_call_that_raised_is_closed_as_interrupted(tmp_path: Path, caplog) -> None:
    """The Trainer has no exception event: a hook still open when ``train()`` is called again
    belongs to a call that raised (the user caught it). It closes as interrupted, keeping the
    whole run's projection, not as a job that finished at the step it stopped at."""
    status = tmp_path / "eta.json"
    args = training_args(
        tmp_path, max_steps=12, gradient_accumulation_steps=1, eval_strategy="no",
        save_strategy="no",
    )  # fmt: skip
    ets = ETSTrainerCallback(capture_steps=0, status_path=str(status), log_every=None)
    trainer = Trainer(
        model=tiny_gpt2(), args=args, train_dataset=TokenSet(32), callbacks=[ets, RaiseAtStep(4)]
    )
    with pytest.raises(RuntimeError, match="simulated"):
        trainer.train()
    first = ets.hook
    assert first is not None and not first.closed  # nothing told the callback yet
    trainer.remove_callback(RaiseAtStep)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        trainer.train()  # the user retries
    assert first.closed and ets.hook is not first
    said = [r.getMessage() for r in caplog.records if "without ending" in r.getMessage()]
    assert len(said) == 1 and "step 4" in said[0]
    doc = json.loads(status.read_text())  # the retry's own file, closed as it finished
    assert doc["state"] == "closed" and doc["prediction"]["step"] == 12


def test_a_train_call_that_raised_reads_interrupted_at_exit(tmp_path: Path) -> None:
    """The same stop, then the script ends: the status file says interrupted, with the
    projection of the whole run."""
    status = tmp_path / "eta.json"
    script = f"""
import sys
sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1])]!r}
from test_transformers import ETSTrainerCallback, RaiseAtStep, Trainer, TokenSet, tiny_gpt2
from test_transformers import training_args
args = training_args({str(tmp_path)!r}, max_steps=12, gradient_accumulation_steps=1,
                     eval_strategy="no", save_strategy="no")
ets = ETSTrainerCallback(capture_steps=0, status_path={str(status)!r}, log_every=None)
trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenSet(32),
                  callbacks=[ets, RaiseAtStep(4)])
try:
    trainer.train()
except RuntimeError:
    pass
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(status.read_text())
    assert doc["state"] == "interrupted", doc["state"]
    assert doc["prediction"]["step"] == 4 and doc["prediction"]["total_steps"] == 12
    assert "before the framework ended training" in run.stderr


# --------------------------------------------------------------------------------------------
# Reading the Trainer's arguments; options


def _args(**kw: Any) -> SimpleNamespace:
    base = {
        "gradient_accumulation_steps": 2,
        "eval_strategy": "no",
        "save_strategy": "no",
        "eval_steps": None,
        "save_steps": 500,
    }
    return SimpleNamespace(**{**base, **kw})


def _state(**kw: Any) -> SimpleNamespace:
    base = {"max_steps": 100, "global_step": 0, "eval_steps": None, "save_steps": 500}
    return SimpleNamespace(**{**base, **kw})


def test_epoch_strategies_use_steps_per_epoch() -> None:
    loader = list(range(33))  # 33 micro-batches, accumulation 2: 17 optimizer steps an epoch
    found = _trainer_options(
        _args(eval_strategy="epoch", save_strategy="epoch"), _state(), None, loader
    )
    assert found["eval_every"] == 17 and found["checkpoint_every"] == 17
    assert found["grad_accum_steps"] == 2 and found["total_steps"] == 100
    assert "optimizer" not in found
    # The epoch that max_steps (100, not a multiple of 17) cuts short still ends with an
    # evaluation and a save: both run once more after the last step.
    assert found["final_phases"] == ("eval", "checkpoint")


def test_step_no_and_best_strategies() -> None:
    found = _trainer_options(
        _args(eval_strategy="steps", save_strategy="best", eval_steps=50),
        _state(eval_steps=25, global_step=40),
        None,
        None,
    )
    # The state's periods (what DefaultFlowCallback uses) win over the arguments'.
    assert found["eval_every"] == 25
    assert found["checkpoint_every"] == 25  # "best" saves only after an evaluation
    assert found["initial_step"] == 40
    # "best" saves only follow evaluations; "steps" evaluations after a last step off their
    # period as this transformers' DefaultFlowCallback runs them (100 is a multiple of 25).
    assert found.get("final_phases") in (None, ("eval",))
    found = _trainer_options(_args(save_strategy="steps"), _state(), None, None)
    assert found["final_phases"] == ("checkpoint",)  # the Trainer saves at max_steps too
    found = _trainer_options(_args(), _state(), None, None)
    assert found["eval_every"] is None and found["checkpoint_every"] is None
    assert "final_phases" not in found
    # A checkpoint past max_steps: the hook stays valid (the Trainer stops at once).
    found = _trainer_options(_args(), _state(max_steps=10, global_step=12), None, None)
    assert found["total_steps"] == 12 and found["initial_step"] == 12


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="model"):
        ETSTrainerCallback(model=torch.nn.Linear(1, 1))
    with pytest.raises(TypeError, match="totl_steps"):
        ETSTrainerCallback(totl_steps=3)


def test_signature_names_every_hook_option_and_defaults_count_as_not_given() -> None:
    parameters = inspect.signature(ETSTrainerCallback).parameters
    assert set(parameters) == HOOK_ARGUMENTS - {"model"}
    assert all(p.kind is p.KEYWORD_ONLY for p in parameters.values())
    # What a configuration tool passes for options not given: the Trainer's values are read.
    at_defaults = {name: p.default for name, p in parameters.items()}
    at_defaults.update(dashboard_ranks=[0], log_ranks=[0])  # a config file's lists
    assert ETSTrainerCallback(**at_defaults)._options == {}
    given = ETSTrainerCallback(grad_accum_steps=1, total_steps=None, log_every=5)
    assert given._options == {"grad_accum_steps": 1, "log_every": 5}  # 1 given: it wins


#: Options ETSHook rejects, each with what the error must say (the option and its value).
BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"total_steps": -1}, "total_steps must be an int >= 1, got -1"),
    ({"status_path": "/nonexistent/eta.json"}, "status_path's directory does not exist"),
    ({"trace_path": "/nonexistent/run.ets"}, "trace_path's directory does not exist"),
    ({"capture_steps": True}, "capture_steps must be an int >= 0, got True"),
    ({"grad_accum_steps": 0}, "grad_accum_steps must be an int >= 1, got 0"),
    ({"eval_every": -3}, "eval_every must be an int >= 1, got -3"),
    ({"on_deadline": "explode"}, "on_deadline must be 'warn', 'raise' or a callable"),
    ({"rank_exchange_timeout_s": -1}, "rank_exchange_timeout_s must be None, 0 or"),
    ({"record_shapes": "some"}, "record_shapes must be one of"),
    ({"dashboard_ranks": 0}, "dashboard_ranks must be a collection of ranks"),
    ({"verbose": "yes"}, "verbose must be True or False, got 'yes'"),
    ({"trace_estimator": "magic"}, "trace_estimator must be 'auto', None or a callable"),
    ({"decode_in_background": None}, "decode_in_background must be True or False, got None"),
    ({"capture_kernels": "on"}, "capture_kernels must be True, False or None (on CUDA)"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=lambda v: str(v)[:40])
def test_invalid_option_values_raise_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        ETSTrainerCallback(**options)
    assert message in str(raised.value)


def test_valid_options_construct_and_write_nothing(tmp_path: Path) -> None:
    """The options ETSHook takes construct (epochs alone: the Trainer gives the dataloader),
    and checking them opens or writes nothing; an unpickled copy keeps them."""
    options = {
        "status_path": tmp_path / "eta.json",
        "trace_path": tmp_path / "run.ets",
        "total_steps": 40,
        "epochs": 2,
        "capture_steps": 0,
        "log_every": None,
        "deadline": 3600,
        "deadline_policy": "likely",
        "early_stopping": (3, 0.0, "min"),
        "eval_every": 10,
    }
    callback = ETSTrainerCallback(**options)
    assert callback.hook is None
    assert list(tmp_path.iterdir()) == []
    assert pickle.loads(pickle.dumps(callback))._options == options


def test_log_values() -> None:
    assert log_values(None) == {}
    prediction = SimpleNamespace(iteration_s=0.5, eta_s=None, total_s=float("inf"))
    assert log_values(prediction) == {"ets/iteration_s": 0.5}  # type: ignore[arg-type]


def test_injector_holds_its_owner_weakly() -> None:
    callback = ETSTrainerCallback()
    injector = ETSLogInjector(callback)
    del callback
    logs = {"loss": 1.0}
    injector.on_log(None, SimpleNamespace(log_history=[]), None, logs=logs)  # type: ignore[arg-type]
    assert logs == {"loss": 1.0}


# --------------------------------------------------------------------------------------------
# Imports


def test_import_ets_hook_never_imports_transformers() -> None:
    code = (
        "import sys, ets_hook, ets_hook.integrations; "
        "assert 'transformers' not in sys.modules, 'transformers'; "
        "assert 'accelerate' not in sys.modules, 'accelerate'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_import_without_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "ets_hook.integrations.transformers")
    with pytest.raises(ImportError, match=r"pip install 'ets-hook\[transformers\]'"):
        importlib.import_module("ets_hook.integrations.transformers")


# --------------------------------------------------------------------------------------------
# Early stopping: the hook follows the Trainer's EarlyStoppingCallback


#: The accuracy-like metric the early-stopping run reports at its k-th evaluation (k = 1..30):
#: 0.8 - 0.6·exp(-k/1.5) plus N(0, 0.002) noise (numpy seed 0), rounded. It levels off from
#: about the 8th evaluation, so ``EarlyStoppingCallback(patience=2)`` stops the run well before
#: ``EARLY_STOP_MAX_STEPS`` (at step 20 of 60: what the test reads is the Trainer's own stop).
PLATEAU_ACCURACY = [
    0.4922, 0.6416, 0.7201, 0.7585, 0.7775, 0.7897, 0.797, 0.799, 0.7971, 0.7967,
    0.7984, 0.7999, 0.7952, 0.7995, 0.7975, 0.7985, 0.7989, 0.7994, 0.8008, 0.8021,
    0.7997, 0.8027, 0.7987, 0.8007, 0.8018, 0.8002, 0.7985, 0.7982, 0.7991, 0.8004,
]  # fmt: skip
EARLY_STOP_MAX_STEPS = 60  # an evaluation every 2 steps: one value above for each


class PredictionAtEachEvaluation(TrainerCallback):
    """Placed after ``ETSTrainerCallback``: its prediction at each evaluation, once the hook
    has taken in the evaluation's metric."""

    def __init__(self, callback: ETSTrainerCallback) -> None:
        self.callback = callback
        self.seen: list[Seen] = []

    def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        hook = self.callback.hook
        tracker = hook._forecaster._early_stop if hook is not None else None
        evaluations = tracker.evaluations if tracker is not None else 0
        self.seen.append(Seen(state.global_step, evaluations, self.callback.prediction))


@dataclass
class EarlyStoppingRun:
    trainer: Trainer
    callback: ETSTrainerCallback
    lines: list[str]
    seen: list[Seen]


def _early_stopping_run(
    tmp_path: Path, max_steps: int, accuracy: list[float] | None = None, **hook_options: Any
) -> EarlyStoppingRun:
    """A run evaluating (and saving) every 2 steps under ``EarlyStoppingCallback(patience=2)``.

    It monitors ``eval_loss`` on its own training data (which falls), or with ``accuracy`` an
    ``accuracy`` metric (greater is better) taking those values, one per evaluation.
    """
    data = TokenSet(16)
    evaluated: list[int] = []

    def compute_metrics(prediction: Any) -> dict[str, float]:
        evaluated.append(1)
        assert accuracy is not None
        return {"accuracy": accuracy[len(evaluated) - 1]}

    args = training_args(
        tmp_path, max_steps=max_steps, gradient_accumulation_steps=1, logging_steps=2,
        eval_steps=2, save_steps=2, save_total_limit=1, load_best_model_at_end=True,
        metric_for_best_model="eval_loss" if accuracy is None else "accuracy",
        learning_rate=1e-3,
    )  # fmt: skip
    records = Records()
    ets_logger = logging.getLogger("ets_hook")
    ets_logger.addHandler(records)
    level = ets_logger.level
    ets_logger.setLevel(logging.INFO)
    callback = ETSTrainerCallback(log_every=None, capture_steps=0, **hook_options)
    watcher = PredictionAtEachEvaluation(callback)
    trainer = Trainer(
        model=tiny_gpt2(), args=args, train_dataset=data, eval_dataset=TokenSet(4),
        compute_metrics=None if accuracy is None else compute_metrics,
        callbacks=[callback, EarlyStoppingCallback(early_stopping_patience=2), watcher],
    )  # fmt: skip
    try:
        trainer.train()
    finally:
        ets_logger.removeHandler(records)
        ets_logger.setLevel(level)
    return EarlyStoppingRun(trainer, callback, records.lines, watcher.seen)


def test_follows_the_trainers_early_stopping_callback(tmp_path: Path) -> None:
    run = _early_stopping_run(tmp_path, EARLY_STOP_MAX_STEPS, accuracy=PLATEAU_ACCURACY)
    hook = run.callback.hook
    assert hook is not None
    tracker = hook._forecaster._early_stop
    assert tracker is not None
    # metric_for_best_model="accuracy": the Trainer reports (and stops on) "eval_accuracy",
    # greater is better.
    assert tracker.rule == EarlyStoppingRule(2, 0.0, "max", best_on_any_improvement=True)
    evaluations = [e for e in run.trainer.state.log_history if "eval_accuracy" in e]
    assert tracker.evaluations == len(evaluations) == len(run.seen) >= MIN_POINTS + 2
    # The metric plateaus: the Trainer stops early, at the evaluation where the hook's rule
    # fired.
    stop_step = run.trainer.state.global_step
    assert stop_step < EARLY_STOP_MAX_STEPS
    assert tracker.stopped_step == stop_step == run.seen[-1].step
    check_forecasts_until_the_stop(run.seen, EARLY_STOP_MAX_STEPS, stop_step)
    # At the last evaluation before the stop, the expected stop is within 40% of the real one
    # (the tolerance the synthetic-curve tests hold the forecast to); at the stop, it is it.
    last = [s for s in run.seen if s.step < stop_step][-1]
    assert abs(last.prediction.expected_stop_step - stop_step) <= 0.4 * stop_step, last
    assert run.seen[-1].prediction.expected_stop_step == stop_step
    final = run.callback.prediction
    assert final is not None and final.expected_stop_step == stop_step == final.step
    assert final.total_range_s is not None and final.total_range_s[0] == final.total_range_s[1]


def test_explicit_early_stopping_wins(tmp_path: Path) -> None:
    run = _early_stopping_run(tmp_path, max_steps=8, early_stopping=(5, 0.1))
    callback, lines = run.callback, run.lines
    assert callback.hook is not None
    tracker = callback.hook._forecaster._early_stop
    assert tracker is not None and tracker.rule == EarlyStoppingRule(5, 0.1, "min")
    assert tracker.evaluations == 4  # eval_loss is still reported
    assert any("early_stopping=(5, 0.1)" in line for line in lines)


def test_monitored_metric_is_prefixed_as_the_trainer_does() -> None:
    assert _monitored_metric(SimpleNamespace(metric_for_best_model="loss")) == "eval_loss"
    assert _monitored_metric(SimpleNamespace(metric_for_best_model="eval_acc")) == "eval_acc"
    assert _monitored_metric(SimpleNamespace(metric_for_best_model=None)) is None
