"""ETSTrainerCallback where the Trainer's schedule is not the plain one: the evaluation the
Trainer runs after a last step off its period, logs that carry ``train_runtime`` at every step
(``include_num_input_tokens_seen``), evaluations that generate (``Seq2SeqTrainer`` with
``predict_with_generate``), and the message when the Trainer retries its loop itself.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_callback import DefaultFlowCallback

from ets_hook.forecast.job import (
    BEAM_COST_EXPONENT,
    EVAL_PRIOR_REL_CI,
    FORWARD_SHARE,
    GENERATE_PRIOR_REL_CI,
    GENERATED_TOKEN_FORWARD_SHARE,
    eval_cost_prior,
)
from ets_hook.integrations import transformers as hf
from ets_hook.integrations.transformers import ETSTrainerCallback, _trainer_options


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class PredictionAt(TrainerCallback):
    def __init__(self, callback: ETSTrainerCallback, at: int) -> None:
        self.callback, self.at, self.prediction = callback, at, None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            self.prediction = self.callback.prediction


@pytest.fixture(scope="module")
def tokens_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """5 steps, an evaluation every 2 (the Trainer also evaluates after step 5, off its
    period), a log at every step, token counting on (every log carries train_runtime)."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    )
    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("hf-tokens")),
        max_steps=5,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
        include_num_input_tokens_seen=True,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = ETSTrainerCallback(capture_steps=0, log_every=None)
    first = PredictionAt(callback, at=1)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(32),
        eval_dataset=Tokens(8),
        callbacks=[callback, first],
    )
    trainer.train()
    return SimpleNamespace(trainer=trainer, callback=callback, first=first.prediction)


def test_token_counting_logs_do_not_close_the_hook(tokens_run: SimpleNamespace) -> None:
    callback, history = tokens_run.callback, tokens_run.trainer.state.log_history
    step_logs = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in step_logs] == [1, 2, 3, 4, 5]
    assert all("train_runtime" in entry for entry in step_logs)  # what used to close it
    # Open until the end: time still to go at every step but the last.
    assert all(entry["ets/eta_s"] > 0 for entry in step_logs[:-1])
    final = callback.prediction
    assert final is not None and final.step == final.total_steps == 5
    assert callback.hook is not None and callback.hook.closed


def test_the_evaluation_after_a_last_step_off_its_period_is_projected(
    tokens_run: SimpleNamespace,
) -> None:
    ran = [entry["step"] for entry in tokens_run.trainer.state.log_history if "eval_loss" in entry]
    assert ran == [2, 4, 5]
    phases = {p.name: p for p in tokens_run.first.phases}
    assert phases["eval"].remaining == len(ran)


def test_the_final_evaluation_follows_the_installed_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    def options() -> dict[str, Any]:
        hf._evaluates_at_the_end.cache_clear()
        args = SimpleNamespace(
            gradient_accumulation_steps=1, eval_strategy="steps", save_strategy="no",
            eval_steps=30, save_steps=500,
        )  # fmt: skip
        state = SimpleNamespace(max_steps=100, global_step=0, eval_steps=30, save_steps=500)
        return _trainer_options(args, state, None, None)

    try:
        # This transformers evaluates at max_steps (100) although 100 is not a multiple of 30.
        assert options()["final_phases"] == ("eval",)

        def on_period_only(self: Any, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if state.global_step % state.eval_steps == 0:  # the 4.x rule
                control.should_evaluate = True
            return control

        monkeypatch.setattr(DefaultFlowCallback, "on_step_end", on_period_only)
        assert "final_phases" not in options()

        def broken(self: Any, *args: Any, **kw: Any) -> Any:
            raise AttributeError("another flow")

        monkeypatch.setattr(DefaultFlowCallback, "on_step_end", broken)
        assert "final_phases" not in options()  # unknown: the 4.x rule
    finally:
        hf._evaluates_at_the_end.cache_clear()


# --------------------------------------------------------------------------------------------
# Evaluations that generate


def test_a_generating_evaluation_is_priced_per_generated_token() -> None:
    plain = eval_cost_prior(4, batch_ratio=2.0, grad_accum_steps=2)
    assert plain.train_steps == pytest.approx(4 * 2.0 * FORWARD_SHARE / 2)
    assert plain.rel_ci == EVAL_PRIOR_REL_CI
    greedy = eval_cost_prior(4, 2.0, 2, generated_tokens=64)
    per_forward = 1 + 64 * GENERATED_TOKEN_FORWARD_SHARE
    assert greedy.train_steps == pytest.approx(plain.train_steps * per_forward)
    assert greedy.rel_ci == GENERATE_PRIOR_REL_CI
    beams = eval_cost_prior(4, 2.0, 2, generated_tokens=64, num_beams=4)
    per_forward = 1 + 64 * GENERATED_TOKEN_FORWARD_SHARE * 4**BEAM_COST_EXPONENT
    assert beams.train_steps == pytest.approx(plain.train_steps * per_forward)
    for bad in ({"generated_tokens": -1}, {"num_beams": 0}, {"generated_tokens": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            eval_cost_prior(4, **bad)


def tiny_t5(**generation: Any) -> T5ForConditionalGeneration:
    config = T5Config(
        vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config)
    for key, value in generation.items():
        setattr(model.generation_config, key, value)
    return model


def _metrics(prediction: Any) -> dict[str, float]:
    return {}


@pytest.mark.parametrize(
    ("arguments", "generation", "metrics", "expected"),
    [
        ({"predict_with_generate": True, "generation_max_length": 48}, {}, True, (48, 1)),
        (
            {"predict_with_generate": True, "generation_num_beams": 4},
            {"max_new_tokens": 30},
            True,
            (30, 4),
        ),
        ({"predict_with_generate": True}, {"max_length": 25, "num_beams": 2}, True, (25, 2)),
        # Without compute_metrics the Trainer evaluates the loss only: no generation.
        ({"predict_with_generate": True, "generation_max_length": 48}, {}, False, (0, 1)),
        ({"predict_with_generate": True, "prediction_loss_only": True}, {}, True, (0, 1)),
        ({"predict_with_generate": False}, {}, True, (0, 1)),
    ],
)
def test_what_an_evaluation_generates_is_read_from_the_trainer(
    tmp_path: Path,
    arguments: dict[str, Any],
    generation: dict[str, Any],
    metrics: bool,
    expected: tuple[int, int],
) -> None:
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, **arguments)
    trainer = SimpleNamespace(
        model=tiny_t5(**generation), compute_metrics=_metrics if metrics else None
    )
    assert hf._generation(trainer, args) == expected
    assert hf._generation(trainer, TrainingArguments(output_dir=str(tmp_path))) == (0, 1)


# --------------------------------------------------------------------------------------------
# The Trainer's own retry


@pytest.mark.parametrize("retry", [False, True])
def test_a_loop_left_open_says_why_it_may_have_been(
    retry: bool, caplog: pytest.LogCaptureFixture
) -> None:
    callback = ETSTrainerCallback(capture_steps=0, log_every=None)
    callback.hook = SimpleNamespace(
        closed=False,
        steps_completed=4,
        close_at_exit=lambda outcome, error: None,
        end_phase=lambda: None,
        prediction=None,
    )
    caplog.set_level(logging.WARNING, logger="ets_hook")
    callback._close_hook(finished=False, retry=retry)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "stopped at step 4 without ending" in said
    assert ("auto_find_batch_size" in said) is retry
