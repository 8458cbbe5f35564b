"""capture.accumulation: gradient accumulation the hook was not told of, with a job length read
from len(dataloader)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ets_hook import ETSHook
from ets_hook.capture.accumulation import UndeclaredAccumulation
from ets_hook.hook import BARE_AFTER_STEP


def _train(
    k: int,
    *,
    declared: bool = False,
    capture_steps: int | None = 0,
    optimizer_given: bool = True,
    **options,
) -> ETSHook:
    """Two epochs of an 80-batch loader, ``k`` micro-batches per optimizer step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(640, 16), torch.randn(640, 1))
    loader = DataLoader(data, batch_size=8)
    options = {"dataloader": loader, "epochs": 2, **options}
    hook = ETSHook(
        model,
        opt if optimizer_given else None,
        log_every=None,
        capture_steps=capture_steps,
        grad_accum_steps=k if declared else 1,
        **options,
    )
    hooks_after_check = None
    for _ in range(2):
        for i, (x, y) in enumerate(loader):
            torch.nn.functional.mse_loss(model(x), y).backward()
            if (i + 1) % k == 0:
                opt.step()
                opt.zero_grad()
                if hook.steps_completed == BARE_AFTER_STEP + 2:
                    hooks_after_check = len(model._forward_pre_hooks)
    hook.close()
    hook.hooks_after_check = hooks_after_check  # type: ignore[attr-defined]
    return hook


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "training forwards" in r.getMessage()]


@pytest.mark.parametrize("capture_steps", [0, None])
def test_undeclared_accumulation_is_named_once(
    caplog: pytest.LogCaptureFixture, capture_steps: int | None
) -> None:
    caplog.set_level(logging.WARNING, logger="ets_hook")
    hook = _train(4, capture_steps=capture_steps)
    assert hook.steps_completed == 40 and hook.total_steps == 160  # the length stays as given
    (warning,) = _warnings(caplog)
    assert "took 4 training forwards" in warning and "len(dataloader)=80" in warning
    assert "grad_accum_steps=4" in warning and "steps_per_epoch=80" in warning
    # The module hook kept for the count (the window, or its dropping, ended first) goes
    # once it is done: the job runs bare.
    assert hook.hooks_after_check == 0  # type: ignore[attr-defined]


def test_undeclared_accumulation_is_named_without_the_optimizer_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No ``optimizer=``: forwards mark the steps until the first optimizer step (3 extra steps
    for k = 4), then optimizer steps do. The count of forwards per step starts after that
    switch (before, it counted the forward-marked steps, saw k = 1 and never warned: every ETA
    4x too long without a word), and the switch itself is named once."""
    caplog.set_level(logging.WARNING, logger="ets_hook")
    hook = _train(4, optimizer_given=False)
    assert hook.steps_completed == 40 + 3  # the 3 forward-marked steps before the first
    (warning,) = _warnings(caplog)
    assert "took 4 training forwards" in warning and "grad_accum_steps=4" in warning
    switches = [r.getMessage() for r in caplog.records if "model forwards in" in r.getMessage()]
    assert len(switches) == 1
    assert "came 4 model forwards in" in switches[0] and "runs 3 ahead" in switches[0]


def test_no_switch_note_for_one_forward_a_step(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ets_hook")
    hook = _train(1, optimizer_given=False)
    assert hook.steps_completed == 160
    assert not [r for r in caplog.records if "model forwards in" in r.getMessage()]


@pytest.mark.parametrize(
    ("k", "declared", "options"),
    [
        (4, True, {}),  # told: grad_accum_steps=4
        (1, False, {}),  # one forward a step
        (4, False, {"dataloader": None, "steps_per_epoch": 20}),  # given in optimizer steps
        (4, False, {"dataloader": None, "epochs": None, "total_steps": 40}),  # no loader length
    ],
)
def test_nothing_to_say_when_the_length_is_right_or_not_from_the_loader(
    caplog: pytest.LogCaptureFixture, k: int, declared: bool, options: dict
) -> None:
    caplog.set_level(logging.WARNING, logger="ets_hook")
    _train(k, declared=declared, **options)
    assert _warnings(caplog) == []


def test_uneven_forwards_per_step_are_not_accumulation() -> None:
    check = UndeclaredAccumulation(batches_per_epoch=100)
    for step, forwards in enumerate([0, 2, 3, 2]):  # step 0's opening forward is not reported
        for _ in range(forwards):
            check.on_forward()
        assert check.on_step(step) is None
    assert check.done
    stopped = UndeclaredAccumulation(batches_per_epoch=100)
    stopped.on_step(0)
    assert stopped.on_step(1) is None and stopped.done  # no forward reported: hook gone
