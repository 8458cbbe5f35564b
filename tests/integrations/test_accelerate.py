"""ETSHook in a plain Hugging Face Accelerate loop (CPU): ``accelerator.prepare`` wraps the
optimizer in an ``AcceleratedOptimizer`` (a ``torch.optim.Optimizer`` subclass that never ran
``Optimizer.__init__``), which the hook unwraps to the optimizer it holds; with gradient
accumulation the wrapper steps that optimizer once per accumulation, and the hook counts those
optimizer steps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("accelerate")  # only so the core suite runs where the extra is absent

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

from ets_hook import ETSHook

BATCHES = 12
ACCUMULATION = 2


@dataclass
class Loop:
    hook: ETSHook
    model: Any
    optimizer: Any
    inner_steps: int


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    """12 micro-batches, accumulation 2: 6 optimizer steps, under an ETSHook."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.utils.data.TensorDataset(
            torch.randn(4 * BATCHES, 8), torch.randn(4 * BATCHES, 1)
        )
        loader = torch.utils.data.DataLoader(data, batch_size=4)
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
        # Accelerate's state is process-wide: leave none behind for other tests' Trainers.
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def test_steps_counted_are_optimizer_steps(loop: Loop) -> None:
    assert loop.inner_steps == BATCHES // ACCUMULATION
    assert loop.hook.steps_completed == BATCHES // ACCUMULATION
    assert len(loop.hook.step_times_s) == BATCHES // ACCUMULATION
    prediction = loop.hook.prediction
    assert prediction is not None
    assert prediction.step == prediction.total_steps == BATCHES // ACCUMULATION
    assert prediction.eta_s == 0


def test_closed_hook_leaves_nothing(loop: Loop) -> None:
    assert not torch.autograd._profiler_enabled()
    assert not loop.model._forward_pre_hooks
    inner = loop.optimizer.optimizer
    assert not inner._optimizer_step_pre_hooks
    assert not inner._optimizer_step_post_hooks
