"""ETSHook in a plain Hugging Face Accelerate loop (CPU): ``accelerator.prepare`` wraps the
optimizer in an ``AcceleratedOptimizer`` (a ``torch.optim.Optimizer`` subclass that never ran
``Optimizer.__init__``), which the hook unwraps to the optimizer it holds; with gradient
accumulation the wrapper steps that optimizer once per accumulation, and the hook counts those
optimizer steps."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")  # only so the core suite runs where the extra is absent

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from support import readme_python_blocks, tiny_regression_job

from ets_hook import ETSHook

BATCHES = 12
ACCUMULATION = 2
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Loop:
    hook: ETSHook
    model: Any
    optimizer: Any
    inner_steps: int


def tiny_job() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    """A small MLP, its SGD optimizer and a loader of ``BATCHES`` batches of 4 samples."""
    return tiny_regression_job(torch.optim.SGD, BATCHES)


def reset_accelerate_state() -> None:
    """Accelerate's state is process-wide: leave none behind for other tests' Trainers."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    """12 micro-batches, accumulation 2: 6 optimizer steps, under an ETSHook."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    try:
        model, optimizer, loader = tiny_job()
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        inner_steps = 0

        def count(*args: Any) -> None:
            nonlocal inner_steps
            inner_steps += 1

        counter = optimizer.optimizer.register_step_post_hook(count)
        hook = ETSHook(
            model,
            optimizer=optimizer,
            total_steps=BATCHES // ACCUMULATION,
            grad_accum_steps=ACCUMULATION,
            log_every=None,
        )
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        hook.close()
        counter.remove()
        yield Loop(hook, model, optimizer, inner_steps)
    finally:
        reset_accelerate_state()


def test_steps_counted_are_optimizer_steps(loop: Loop) -> None:
    assert loop.inner_steps == BATCHES // ACCUMULATION
    assert loop.hook.steps_completed == BATCHES // ACCUMULATION
    assert len(loop.hook.step_times_s) == BATCHES // ACCUMULATION
    prediction = loop.hook.prediction
    assert prediction is not None
    assert prediction.step == prediction.total_steps == BATCHES // ACCUMULATION
    assert prediction.eta_s == 0


def test_epochs_with_an_odd_number_of_micro_batches_count_accelerates_steps(caplog) -> None:
    """Accelerate also steps at the end of an epoch: 5 micro-batches, accumulation 2, are 3
    optimizer steps an epoch, which ``epochs=, dataloader=, grad_accum_steps=`` (the README's
    advice) works out; micro-batches / 2 would be 2 short over 2 epochs."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.utils.data.TensorDataset(torch.randn(20, 8), torch.randn(20, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=4)  # 5 micro-batches
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        hook = ETSHook(
            model,
            optimizer=optimizer,
            epochs=2,
            dataloader=loader,
            grad_accum_steps=ACCUMULATION,
            log_every=None,
        )
        with caplog.at_level(logging.WARNING, logger="ets_hook"):
            for _ in range(2):
                for x, y in loader:
                    with accelerator.accumulate(model):
                        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                        optimizer.step()
                        optimizer.zero_grad()
            hook.close()
        assert hook.total_steps == hook.steps_completed == 6
        assert not [r for r in caplog.records if "ran past" in r.getMessage()]
    finally:
        reset_accelerate_state()


def test_closed_hook_leaves_nothing(loop: Loop) -> None:
    assert not torch.autograd._profiler_enabled()
    assert not loop.model._forward_pre_hooks
    inner = loop.optimizer.optimizer
    assert not inner._optimizer_step_pre_hooks
    assert not inner._optimizer_step_post_hooks


# --------------------------------------------------------------------------------------------
# The README's snippet, verbatim

#: The README's Accelerate example, verbatim (test_readme_shows_this_snippet keeps them equal;
#: test_readme_snippet_runs runs it).
README_SNIPPET = """\
from accelerate import Accelerator
from ets_hook import ETSHook

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
with ETSHook(model, optimizer=optimizer, epochs=epochs, dataloader=loader) as hook:
    for epoch in range(epochs):
        for x, y in loader:
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
print(hook.prediction)
"""


def test_readme_shows_this_snippet() -> None:
    assert README_SNIPPET in readme_python_blocks("Accelerate (plain loop)")


def test_readme_snippet_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # CPU where a GPU is present too
    model, optimizer, loader = tiny_job()
    inner = optimizer
    inner_steps = 0

    def count(*args: Any) -> None:
        nonlocal inner_steps
        inner_steps += 1

    counter = inner.register_step_post_hook(count)
    namespace: dict[str, Any] = {
        "model": model,
        "optimizer": optimizer,
        "loader": loader,
        "loss_fn": torch.nn.functional.mse_loss,
        "epochs": 2,
    }
    caplog.set_level(logging.INFO, logger="ets_hook")
    try:
        exec(compile(README_SNIPPET, "README.md", "exec"), namespace)
    finally:
        counter.remove()
        reset_accelerate_state()
    # The loader is the hook's: no note asking for it (the epochs' length comes from it).
    assert not [r for r in caplog.records if "dataloader=" in r.getMessage()]
    hook, prepared = namespace["hook"], namespace["optimizer"]
    assert prepared is not inner and prepared.optimizer is inner  # the AcceleratedOptimizer
    assert inner_steps == 2 * BATCHES
    assert hook.steps_completed == 2 * BATCHES == hook.total_steps
    prediction = hook.prediction
    assert prediction is not None
    assert prediction.step == prediction.total_steps == 2 * BATCHES
    assert prediction.eta_s == 0 and prediction.total_s > 0
    # Closed by the with block: nothing left on the model or the optimizer.
    assert not torch.autograd._profiler_enabled()
    assert not namespace["model"]._forward_pre_hooks
    assert not inner._optimizer_step_pre_hooks
    assert not inner._optimizer_step_post_hooks
