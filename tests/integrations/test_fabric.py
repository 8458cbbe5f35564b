"""ETSHook in a plain Lightning Fabric loop (CPU): ``fabric.setup`` returns an optimizer wrapper
(``_FabricOptimizer``) that takes on its optimizer's class and forwards attribute reads, so it
passes for an optimizer with step hooks; the hook unwraps it to the optimizer torch calls the
hooks with, and counts that optimizer's steps. Before, the wrapper was kept: the first step went
uncounted and the second raised ``StopIteration`` into the loop."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("lightning")  # only so the core suite runs where the extra is absent

import lightning as L
import torch
from support import readme_python_blocks, tiny_regression_job

from ets_hook import ETSHook
from ets_hook.capture.steps import unwrap_optimizer

BATCHES = 12
ACCUMULATION = 4

#: The README's Fabric example, verbatim (test_readme_shows_this_snippet keeps them equal).
README_SNIPPET = """\
import lightning as L
from ets_hook import ETSHook

fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(loader)
with ETSHook(model, optimizer=optimizer, epochs=epochs, dataloader=loader) as hook:
    for epoch in range(epochs):
        for x, y in loader:
            loss = loss_fn(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
print(hook.prediction)
"""


def tiny_job() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    """A small MLP, its AdamW optimizer and a loader of ``BATCHES`` batches of 4 samples."""
    return tiny_regression_job(torch.optim.AdamW, BATCHES)


def counted(optimizer: torch.optim.Optimizer) -> tuple[list[int], Any]:
    """A list that counts ``optimizer``'s real steps, and the handle to stop counting."""
    steps: list[int] = []
    return steps, optimizer.register_step_post_hook(lambda *args: steps.append(1))


def test_readme_shows_this_snippet() -> None:
    assert README_SNIPPET in readme_python_blocks("Lightning Fabric (plain loop)")


def test_readme_snippet_counts_the_optimizers_steps(caplog: pytest.LogCaptureFixture) -> None:
    model, optimizer, loader = tiny_job()
    inner_steps, handle = counted(optimizer)
    namespace: dict[str, Any] = {
        "model": model,
        "optimizer": optimizer,
        "loader": loader,
        "loss_fn": torch.nn.functional.mse_loss,
        "epochs": 2,
    }
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        try:
            exec(compile(README_SNIPPET, "README.md", "exec"), namespace)
        finally:
            handle.remove()
    hook, wrapper = namespace["hook"], namespace["optimizer"]
    assert wrapper is not optimizer and isinstance(wrapper, torch.optim.AdamW)  # the wrapper
    assert unwrap_optimizer(wrapper) is optimizer
    assert len(inner_steps) == 2 * BATCHES
    assert hook.steps_completed == 2 * BATCHES == hook.total_steps
    prediction = hook.prediction
    assert prediction is not None
    assert prediction.step == prediction.total_steps == 2 * BATCHES
    assert prediction.eta_s == 0 and prediction.total_s > 0
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
    # Closed by the with block: nothing left on the model or the optimizer.
    assert not torch.autograd._profiler_enabled()
    assert not optimizer._optimizer_step_pre_hooks
    assert not optimizer._optimizer_step_post_hooks


def test_accumulation_under_no_backward_sync_counts_optimizer_steps() -> None:
    fabric = L.Fabric(accelerator="cpu", devices=1)
    model, optimizer, loader = tiny_job()
    inner_steps, handle = counted(optimizer)
    model, wrapper = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    total = 2 * (BATCHES // ACCUMULATION)
    hook = ETSHook(
        model, optimizer=wrapper, total_steps=total, grad_accum_steps=ACCUMULATION, log_every=None
    )
    try:
        for _ in range(2):
            for i, (x, y) in enumerate(loader):
                accumulating = (i + 1) % ACCUMULATION != 0
                with fabric.no_backward_sync(model, enabled=accumulating):
                    loss = torch.nn.functional.mse_loss(model(x), y) / ACCUMULATION
                    fabric.backward(loss)
                if not accumulating:
                    wrapper.step()
                    wrapper.zero_grad()
        prediction = hook.prediction
    finally:
        hook.close()
        handle.remove()
    assert len(inner_steps) == total
    assert hook.steps_completed == total
    assert prediction is not None and prediction.step == total and prediction.eta_s == 0


def test_lightnings_optimizer_wrapper_is_unwrapped_too() -> None:
    """``LightningOptimizer`` (``self.optimizers()`` under manual optimization) copies its
    optimizer's ``__dict__``: the hook dicts are the optimizer's, and torch calls the hooks
    with the optimizer, so that is the one to count."""
    from lightning.pytorch.core.optimizer import LightningOptimizer

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = LightningOptimizer(optimizer)
    assert unwrap_optimizer(wrapper) is optimizer
    hook = ETSHook(model, optimizer=wrapper, total_steps=6, log_every=None)
    try:
        for _ in range(6):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()  # what the wrapper's step() ends in (it needs a Trainer here)
            optimizer.zero_grad()
    finally:
        hook.close()
    assert hook.steps_completed == 6
