"""capture.steps: which signal ends a training step (``StepDetector`` / ``Authority``).

Driven directly with tiny CPU models: the boundaries reported to ``on_boundary`` (and their
source), the ``on_first_activity`` / ``on_forward`` callbacks, and the hooks installed and
removed on the module, the optimizers, ``torch.optim``'s global hook registry and a GradScaler.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import optimizer as optim_module

from ets_hook import ETSHook
from ets_hook.capture.steps import Authority, StepDetector

# ---------------------------------------------------------------------------------------------
# Helpers


class Events:
    """Records the detector's callbacks in order: ("boundary", source), ("first",), ("forward",)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []

    def boundary(self, source: str) -> None:
        self.log.append(("boundary", source))

    def first(self) -> None:
        self.log.append(("first",))

    def forward(self) -> None:
        self.log.append(("forward",))

    @property
    def boundaries(self) -> list[str]:
        return [e[1] for e in self.log if e[0] == "boundary"]

    def count(self, kind: str) -> int:
        return sum(1 for e in self.log if e[0] == kind)


def tiny_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(6, 4), torch.randint(0, 2, (6,))


def forward_backward(model: nn.Module, scale: float = 1.0) -> torch.Tensor:
    x, y = batch()
    loss = nn.functional.cross_entropy(model(x), y) * scale
    loss.backward()
    return loss


def manual_update(model: nn.Module) -> None:
    """A training update with no torch.optim optimizer at all."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad
                p.grad = None


def hook_counts(model: nn.Module, *optimizers: torch.optim.Optimizer) -> dict[str, int]:
    """How many hooks torch holds for the model, the optimizers and globally."""
    counts = {
        "module_forward_pre": len(model._forward_pre_hooks),
        "child_forward_pre": sum(len(child._forward_pre_hooks) for child in model.children()),
        "global_pre": len(optim_module._global_optimizer_pre_hooks),
        "global_post": len(optim_module._global_optimizer_post_hooks),
    }
    for k, opt in enumerate(optimizers):
        counts[f"opt{k}_pre"] = len(opt._optimizer_step_pre_hooks)
        counts[f"opt{k}_post"] = len(opt._optimizer_step_post_hooks)
    return counts


@pytest.fixture
def make() -> Iterator[Callable[..., tuple[StepDetector, Events]]]:
    """Build detectors recording into an ``Events``; every one is closed at teardown (global
    optimizer hooks would otherwise outlive the test)."""
    made: list[StepDetector] = []

    def build(
        model: nn.Module,
        optimizers: Any = (),
        *,
        grad_scaler: Any = None,
        forwards_per_step: int = 1,
    ) -> tuple[StepDetector, Events]:
        events = Events()
        detector = StepDetector(
            model,
            optimizers,
            events.boundary,
            grad_scaler=grad_scaler,
            on_first_activity=events.first,
            on_forward=events.forward,
            forwards_per_step=forwards_per_step,
        )
        made.append(detector)
        return detector, events

    yield build
    for detector in made:
        detector.close()


def scaler_iteration(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    *,
    overflow: bool = False,
) -> bool:
    """One GradScaler iteration; returns whether ``opt.step()`` really ran."""
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    x, y = batch()
    loss = nn.functional.cross_entropy(model(x), y)
    if overflow:
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)  # skips opt.step() on non-finite gradients
    scaler.update()
    return any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


# ---------------------------------------------------------------------------------------------
# Which authority


def test_authority_values_are_the_boundary_sources() -> None:
    assert {a.value for a in Authority} == {
        "grad_scaler",
        "optimizer",
        "explicit",
        "any_optimizer",
        "forward",
    }
    assert Authority.SCALER == "grad_scaler"  # a str enum: compares equal to its source


def test_the_arguments_select_the_authority(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    assert make(model, [opt], grad_scaler=scaler)[0].authority is Authority.SCALER
    assert make(model, [], grad_scaler=scaler)[0].authority is Authority.SCALER
    assert make(model, [opt])[0].authority is Authority.OPTIMIZER
    forward = make(model, [])[0]
    assert forward.authority is Authority.FORWARD
    assert forward.needs_forward_hook


# ---------------------------------------------------------------------------------------------
# 1. GradScaler


def test_scaler_update_ends_every_step_even_when_the_optimizer_step_is_skipped(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    detector, events = make(model, [opt], grad_scaler=scaler)
    stepped = [scaler_iteration(model, opt, scaler, overflow=(i == 2)) for i in range(5)]
    assert stepped == [True, True, False, True, True]  # the setup really skips one step
    assert events.boundaries == ["grad_scaler"] * 5  # optimizer steps add nothing
    assert detector.authority is Authority.SCALER


def test_explicit_steps_never_count_under_the_scaler(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    detector, events = make(model, [opt], grad_scaler=scaler)
    for i in range(4):
        scaler_iteration(model, opt, scaler, overflow=(i == 1))
        detector.explicit_step()
    detector.explicit_step()  # even twice in a row
    assert events.boundaries == ["grad_scaler"] * 4
    assert detector.authority is Authority.SCALER


def test_close_restores_the_scalers_own_update(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    detector, events = make(model, [opt], grad_scaler=scaler)
    assert "update" in vars(scaler)  # wrapped on the instance while installed
    scaler_iteration(model, opt, scaler)
    detector.close()
    assert "update" not in vars(scaler)
    assert scaler.update.__func__ is type(scaler).update
    scaler_iteration(model, opt, scaler)  # the scaler still works, and nothing is reported
    assert events.boundaries == ["grad_scaler"]


def test_close_keeps_an_update_the_scaler_instance_already_had(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    calls: list[int] = []
    class_update = scaler.update

    def users_update(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        class_update(*args, **kwargs)

    scaler.update = users_update
    detector, events = make(model, [opt], grad_scaler=scaler)
    scaler_iteration(model, opt, scaler)
    assert calls == [1] and events.boundaries == ["grad_scaler"]
    detector.close()
    assert vars(scaler).get("update") is users_update


# ---------------------------------------------------------------------------------------------
# 2. Given optimizers


def test_gradient_accumulation_counts_optimizer_steps_not_forwards(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [opt])
    for _ in range(3):
        for _ in range(4):
            forward_backward(model, 0.25)
        opt.step()
        opt.zero_grad()
    assert events.boundaries == ["optimizer"] * 3
    # step 0 starts at the first training forward; every forward is a profiler safe point
    assert events.log[0] == ("first",)
    assert events.count("first") == 1
    assert events.count("forward") == 12
    # the boundaries fall after each fourth forward, i.e. at the optimizer step
    kinds = [e[0] for e in events.log if e[0] != "first"]
    assert kinds == (["forward"] * 4 + ["boundary"]) * 3
    assert detector.authority is Authority.OPTIMIZER


@pytest.mark.parametrize("container", [list, tuple], ids=["list", "tuple"])
def test_two_optimizers_stepping_make_one_step(make, container) -> None:
    model = tiny_model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters(), lr=0.01)
    _, events = make(model, container([first, second]))
    for i in range(4):
        forward_backward(model)
        first.step()
        assert len(events.boundaries) == i  # the boundary waits for the second optimizer
        second.step()
        assert len(events.boundaries) == i + 1
        first.zero_grad()
        second.zero_grad()
    assert events.boundaries == ["optimizer"] * 4


def test_an_optimizer_that_was_not_given_is_ignored(make) -> None:
    model = tiny_model()
    given = torch.optim.SGD(model[0].parameters(), lr=0.1)
    other = torch.optim.SGD(model[2].parameters(), lr=0.1)
    _, events = make(model, [given])
    for _ in range(3):
        forward_backward(model)
        other.step()
    assert events.boundaries == []
    given.step()
    assert events.boundaries == ["optimizer"]


def test_explicit_step_is_absorbed_unless_the_optimizer_step_was_skipped(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [opt])
    detector.explicit_step()  # the very first call, before any optimizer step: not a step
    assert events.boundaries == []
    for skip in (False, False, True, False, True, True, False):
        forward_backward(model)
        if not skip:
            opt.step()
        opt.zero_grad()
        detector.explicit_step()
    # one boundary per iteration; a skipped optimizer step is counted by hook.step()
    assert events.boundaries == [
        "optimizer",
        "optimizer",
        "explicit",
        "optimizer",
        "explicit",
        "explicit",
        "optimizer",
    ]
    assert detector.authority is Authority.OPTIMIZER


@pytest.mark.parametrize("given", [True, False], ids=["optimizer-given", "no-optimizer"])
def test_lbfgs_closure_forwards_never_end_a_step(make, given: bool) -> None:
    model = tiny_model()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = batch()
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    _, events = make(model, [opt] if given else [])

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    assert len(forwards) > 3  # several forwards inside each step
    assert events.boundaries == ["optimizer" if given else "any_optimizer"] * 3
    # never a profiler safe point: the Optimizer.step# record_function scope is open there
    assert events.log.count(("forward",)) == 0


# ---------------------------------------------------------------------------------------------
# 3. Explicit hook.step() with no optimizer given


def test_explicit_steps_count_from_the_first_one(make) -> None:
    model = tiny_model()
    detector, events = make(model, [])
    for _ in range(4):
        forward_backward(model)
        manual_update(model)
        detector.explicit_step()
    assert events.boundaries == ["explicit"] * 4  # forwards stopped counting at the first call
    assert detector.authority is Authority.EXPLICIT
    assert not detector.needs_forward_hook


def test_the_first_explicit_step_after_an_optimizer_boundary_is_its_twin(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [])
    for _ in range(4):
        forward_backward(model)
        opt.step()
        opt.zero_grad()
        detector.explicit_step()
    assert events.boundaries == ["any_optimizer"] + ["explicit"] * 3
    assert detector.authority is Authority.EXPLICIT
    opt.step()  # from now on only hook.step() marks steps
    forward_backward(model)
    assert len(events.boundaries) == 4


# ---------------------------------------------------------------------------------------------
# 4. Neither: any optimizer's step, else root-module forwards


def test_root_forwards_mark_steps_from_one_to_the_next(make) -> None:
    model = tiny_model()
    detector, events = make(model, [])
    for _ in range(5):
        forward_backward(model)
        manual_update(model)
    assert events.boundaries == ["forward"] * 4  # five forwards end four steps
    assert events.log[:2] == [("first",), ("forward",)]  # only the first forward is not an end
    assert events.count("forward") == 1
    assert detector.authority is Authority.FORWARD


def test_with_accumulation_forwards_mark_a_step_per_micro_batch_group(make) -> None:
    model = tiny_model()
    _, events = make(model, [], forwards_per_step=3)
    for micro_batch in range(9):  # three steps of three micro-batches
        forward_backward(model)
        if micro_batch % 3 == 2:
            manual_update(model)
    forward_backward(model)  # the next step's first forward ends the third
    assert events.boundaries == ["forward"] * 3
    assert events.count("forward") == 7  # forwards that end no step: 10 - 3


def test_undeclared_accumulation_before_the_first_optimizer_step_counts_no_micro_batch(
    make,
) -> None:
    """No optimizer given, ``grad_accum_steps=4`` declared: the first optimizer step comes after
    four forwards, none of which may end a step (each counted one before)."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _, events = make(model, [], forwards_per_step=4)
    for micro_batch in range(12):
        forward_backward(model, scale=0.25)
        if micro_batch % 4 == 3:
            opt.step()
            opt.zero_grad()
    assert events.boundaries == ["any_optimizer"] * 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_forwards_per_step_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="forwards_per_step must be an int >= 1"):
        StepDetector(tiny_model(), [], lambda source: None, forwards_per_step=bad)


@pytest.mark.parametrize(
    "kind",
    ["eval", "no_grad", "inference_mode", "phase", "submodule", "forward_method"],
)
def test_forwards_that_never_end_a_step(make, kind: str) -> None:
    model = tiny_model()
    detector, events = make(model, [])
    x, _ = batch()

    @contextlib.contextmanager
    def context() -> Iterator[None]:
        if kind == "eval":
            model.eval()
        if kind == "phase":
            detector.in_phase = True
        guard = {"no_grad": torch.no_grad(), "inference_mode": torch.inference_mode()}.get(kind)
        with guard or contextlib.nullcontext():
            yield
        model.train()
        detector.in_phase = False

    def call() -> None:
        if kind == "submodule":
            model[0](x)  # only the root module's forward is watched
        elif kind == "forward_method":
            model.forward(x)  # bypasses module hooks
        else:
            model(x)

    forward_backward(model)  # the first training forward starts step 0
    assert events.log == [("first",), ("forward",)]
    for _ in range(3):
        with context():
            call()
    assert events.log == [("first",), ("forward",)]
    forward_backward(model)  # the next real training forward ends the step
    assert events.boundaries == ["forward"]


def test_non_training_forwards_do_not_start_step_zero(make) -> None:
    model = tiny_model()
    _, events = make(model, [])
    model.eval()
    model(batch()[0])
    model.train()
    with torch.no_grad():
        model(batch()[0])
    assert events.log == []
    forward_backward(model)
    assert events.log == [("first",), ("forward",)]


class Wrapper(nn.Module):
    """A model whose own forward the loop never calls: it calls ``body`` (a LightningModule's
    ``training_step`` calling ``self.net(x)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = tiny_model()
        self.head = nn.Linear(2, 2)


def test_a_childs_first_training_forward_starts_step_zero_when_the_root_is_never_called(
    make,
) -> None:
    model = Wrapper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [opt])
    assert hook_counts(model)["child_forward_pre"] == 2
    with torch.no_grad():
        model.body(batch()[0])  # not a training forward
    assert events.log == []
    forward_backward(model.body)
    assert events.log == [("first",)]
    assert detector.saw_training_forward
    # The children's hooks served only that: gone, and nothing counts forwards from children.
    assert hook_counts(model)["child_forward_pre"] == 0
    opt.step()
    forward_backward(model.body)
    opt.step()
    assert events.log == [("first",), ("boundary", "optimizer"), ("boundary", "optimizer")]


def test_the_roots_first_forward_drops_the_childrens_hooks(make) -> None:
    model = tiny_model()
    _, events = make(model, [])
    assert hook_counts(model)["child_forward_pre"] == 3
    forward_backward(model)
    assert events.log == [("first",), ("forward",)]  # once, from the root
    assert hook_counts(model)["child_forward_pre"] == 0


def test_a_compiled_roots_children_are_not_hooked(make) -> None:
    model = tiny_model()
    make(torch.compile(model), [])  # compiles nothing until called
    assert hook_counts(model)["child_forward_pre"] == 0
    assert hook_counts(model)["module_forward_pre"] == 0  # on the OptimizedModule only
    model.compile()
    make(model, [])
    assert hook_counts(model)["child_forward_pre"] == 0


def test_any_optimizer_step_takes_over_from_forwards(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [])
    for _ in range(4):
        opt.zero_grad()
        forward_backward(model)
        opt.step()
    # the first optimizer step switches authority: no forward ever ends a step, no double count
    assert events.boundaries == ["any_optimizer"] * 4
    assert detector.authority is Authority.ANY_OPTIMIZER
    assert not detector.needs_forward_hook
    assert events.count("forward") == 4  # every later forward is a safe point again


def test_any_optimizer_follows_an_optimizer_re_created_for_a_new_stage(make) -> None:
    """A new optimizer for each stage (layers unfrozen, a new learning rate): once the old one
    is freed, the new one alone ends the steps (the old one was waited for, for good)."""
    model = tiny_model()
    _, events = make(model, [])
    opt = None
    for _stage in range(3):
        # made while the previous one is alive (a distinct object), which is freed by rebinding
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            opt.zero_grad()
            forward_backward(model)
            opt.step()
    assert events.boundaries == ["any_optimizer"] * 12


def test_any_optimizer_counts_a_critic_stepping_several_times_per_iteration_once(make) -> None:
    """WGAN-style: the critic steps three times, then the generator once, per iteration."""
    model = tiny_model()
    critic = torch.optim.SGD(model[0].parameters(), lr=0.1)
    generator = torch.optim.SGD(model[2].parameters(), lr=0.1)
    _, events = make(model, [])
    per_iteration = []
    for _ in range(5):
        before = len(events.boundaries)
        for _ in range(3):
            critic.zero_grad()
            forward_backward(model)
            critic.step()
        generator.zero_grad()
        forward_backward(model)
        generator.step()
        per_iteration.append(len(events.boundaries) - before)
    # until the generator is first seen each critic step ends a step (and the next iteration's
    # first one closes the set it opened); from then on, one step per iteration
    assert per_iteration == [3, 2, 1, 1, 1]


def test_any_optimizer_with_two_optimizers_counts_iterations(make) -> None:
    model = tiny_model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1)
    _, events = make(model, [])
    for _ in range(5):
        forward_backward(model)
        first.step()
        second.step()
    assert events.boundaries == ["any_optimizer"] * 5


# ---------------------------------------------------------------------------------------------
# Marked phases


@pytest.mark.parametrize("mode", ["scaler", "optimizer", "explicit", "any_optimizer", "forward"])
def test_nothing_counts_inside_a_marked_phase(make, mode: str) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu") if mode == "scaler" else None
    given = [opt] if mode in ("scaler", "optimizer") else []
    detector, events = make(model, given, grad_scaler=scaler)

    def iteration() -> None:
        """One iteration as a loop of this kind runs it."""
        if scaler is not None:
            scaler_iteration(model, opt, scaler)
            return
        forward_backward(model)
        if mode in ("optimizer", "any_optimizer"):
            opt.step()
        if mode == "explicit":
            detector.explicit_step()

    iteration()
    iteration()
    before = list(events.boundaries)
    assert before  # the loop's own signal counts outside a phase

    detector.in_phase = True
    for _ in range(3):  # every signal at once, none counts
        if scaler is not None:
            scaler_iteration(model, opt, scaler)
        forward_backward(model)
        opt.step()
        detector.explicit_step()
    detector.in_phase = False
    assert events.boundaries == before

    iteration()  # outside the phase the same signal counts again
    assert len(events.boundaries) == len(before) + 1


# ---------------------------------------------------------------------------------------------
# Callbacks


def test_callback_exceptions_propagate_into_the_loop() -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def boom(source: str) -> None:
        raise RuntimeError(f"boundary from {source}")

    detector = StepDetector(model, [opt], boom)
    try:
        forward_backward(model)  # no optional callbacks given: nothing to call here
        with pytest.raises(RuntimeError, match="boundary from optimizer"):
            opt.step()
    finally:
        detector.close()


# ---------------------------------------------------------------------------------------------
# Hook lifecycle


@pytest.mark.parametrize("mode", ["scaler", "optimizer", "forward", "any_optimizer"])
def test_close_removes_every_hook_and_stops_reporting(make, mode: str) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu") if mode == "scaler" else None
    before = hook_counts(model, opt)
    detector, events = make(
        model, [opt] if mode in ("scaler", "optimizer") else [], grad_scaler=scaler
    )
    installed = hook_counts(model, opt)
    assert installed != before
    if mode == "any_optimizer":
        forward_backward(model)
        opt.step()
        assert detector.authority is Authority.ANY_OPTIMIZER
    detector.close()
    assert hook_counts(model, opt) == before
    seen = list(events.log)
    for _ in range(3):
        if scaler is not None:
            scaler_iteration(model, opt, scaler)
        forward_backward(model)
        opt.step()
        detector.explicit_step()
    assert events.log == seen
    detector.close()  # twice is fine
    assert hook_counts(model, opt) == before


def test_which_hooks_each_authority_installs(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    base = hook_counts(model, opt)

    def added(counts: dict[str, int]) -> dict[str, int]:
        return {k: v - base[k] for k, v in counts.items() if v != base[k]}

    # One forward pre-hook on the root, and one on each child until the first training forward.
    scaler_detector, _ = make(model, [opt], grad_scaler=torch.amp.GradScaler("cpu"))
    assert added(hook_counts(model, opt)) == {"module_forward_pre": 1, "child_forward_pre": 3}
    scaler_detector.close()
    optimizer_detector, _ = make(model, [opt])
    assert added(hook_counts(model, opt)) == {
        "module_forward_pre": 1,
        "child_forward_pre": 3,
        "opt0_pre": 1,
        "opt0_post": 1,
    }
    optimizer_detector.close()
    make(model, [])
    assert added(hook_counts(model, opt)) == {
        "module_forward_pre": 1,
        "child_forward_pre": 3,
        "global_pre": 1,
        "global_post": 1,
    }


def test_remove_capture_hooks_under_optimizer_authority(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [opt])
    base = hook_counts(model, opt)
    forward_backward(model)
    opt.step()
    detector.remove_capture_hooks()
    after = hook_counts(model, opt)
    assert after["module_forward_pre"] == base["module_forward_pre"] - 1
    assert after["opt0_pre"] == base["opt0_pre"] - 1
    assert after["opt0_post"] == base["opt0_post"]  # the boundary hook stays
    seen_forwards = events.count("forward")
    for _ in range(3):
        forward_backward(model)
        opt.step()
    assert events.count("forward") == seen_forwards  # no more forward callbacks
    assert events.boundaries == ["optimizer"] * 4  # steps still counted
    detector.remove_capture_hooks()  # idempotent
    assert hook_counts(model, opt) == after


def test_remove_capture_hooks_keeps_the_forward_hook_when_forwards_mark_steps(make) -> None:
    model = tiny_model()
    detector, events = make(model, [])
    forward_backward(model)  # the children's first-forward hooks go here
    base = hook_counts(model)
    detector.remove_capture_hooks()
    assert detector.needs_forward_hook
    assert hook_counts(model) == base
    for _ in range(3):
        forward_backward(model)
    assert events.boundaries == ["forward"] * 3


def test_remove_capture_hooks_after_any_optimizer_took_over(make) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [])
    base = hook_counts(model)
    forward_backward(model)
    opt.step()
    detector.remove_capture_hooks()
    after = hook_counts(model)
    assert after["module_forward_pre"] == base["module_forward_pre"] - 1
    assert after["global_pre"] == base["global_pre"] - 1
    assert after["global_post"] == base["global_post"]
    for _ in range(2):
        forward_backward(model)
        opt.step()
    assert events.boundaries == ["any_optimizer"] * 3


@pytest.mark.parametrize("optimizers_given", [False, True])
def test_a_gans_second_optimizer_joining_late_is_named_once(
    caplog: pytest.LogCaptureFixture, optimizers_given: bool
) -> None:
    """No optimizer given, a discriminator stepping twice before the generator's first step:
    those two steps ended at D's steps alone and the count runs ahead of the iterations (a
    trial: 52 steps for 50). Said once, naming what to pass; nothing when both are given."""
    caplog.set_level(logging.WARNING, logger="ets_hook")
    torch.manual_seed(0)
    generator, discriminator = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=0.01)
    hook = ETSHook(
        generator,
        [opt_g, opt_d] if optimizers_given else None,
        total_steps=20,
        capture_steps=0,
        log_every=None,
    )
    for _ in range(20):
        for _ in range(2):
            discriminator(generator(torch.randn(4, 8)).detach()).mean().backward()
            opt_d.step()
            opt_d.zero_grad()
        discriminator(generator(torch.randn(4, 8))).mean().backward()
        opt_g.step()
        opt_g.zero_grad()
    hook.close()
    notes = [r.getMessage() for r in caplog.records if "another optimizer" in r.getMessage()]
    if optimizers_given:
        assert notes == [] and hook.steps_completed == 20
    else:
        assert len(notes) == 1 and "after 2 step(s)" in notes[0]
        assert "optimizer=[...]" in notes[0]


def test_a_checkpointed_roots_recomputed_forward_is_not_a_step(make) -> None:
    """Non-reentrant activation checkpointing of the whole model runs its forward again inside
    the backward: part of the step (a trial counted 99 steps for 50 iterations)."""
    from torch.utils.checkpoint import checkpoint

    model = tiny_model()
    _, events = make(model, [])
    for _ in range(4):
        x, y = batch()
        nn.functional.cross_entropy(checkpoint(model, x, use_reentrant=False), y).backward()
        manual_update(model)
    assert events.boundaries == ["forward"] * 3  # the 4th ends at the next forward (or close)


def test_a_deep_copy_of_the_model_gets_inert_hooks(make) -> None:
    """An EMA / mean-teacher copy made after the hook: its forwards are not the model's steps,
    and the hooked model still pickles whole (``torch.save(model)``)."""
    import copy
    import io

    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector, events = make(model, [])
    ema = copy.deepcopy(model)
    opt_copy = copy.deepcopy(opt)
    for _ in range(3):
        x, y = batch()
        loss = nn.functional.cross_entropy(model(x), y) + ema(x).detach().sum() * 0
        loss.backward()
        opt.step()
        opt.zero_grad()
        opt_copy.step()  # a copy's step (stepping the copy's parameters) neither
    assert events.boundaries == ["any_optimizer"] * 3
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded(batch()[0])  # its hooks do nothing
    assert events.boundaries == ["any_optimizer"] * 3
    detector.close()
    assert hook_counts(model)["module_forward_pre"] == 0


def test_optimizers_that_update_none_of_the_models_parameters_are_not_its_steps(make) -> None:
    """No optimizer given: once the model's own optimizer has stepped, another model's (a later
    run in the same process, a linear probe trained during evaluation) does not end steps."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = nn.Linear(2, 2)
    probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)
    _, events = make(model, [])
    for step in range(4):
        forward_backward(model)
        opt.step()
        opt.zero_grad()
        if step % 2 == 1:  # the probe, several steps, on frozen features
            for _ in range(3):
                probe(torch.randn(4, 2)).sum().backward()
                probe_opt.step()
    assert events.boundaries == ["any_optimizer"] * 4


def test_an_optimizer_of_copied_parameters_counts_while_it_is_the_only_one(make) -> None:
    """fp32 master weights (the optimizer steps copies, not the model's parameters): with no
    optimizer of the model's own, its steps are the job's steps."""
    model = tiny_model()
    masters = [p.detach().clone().requires_grad_() for p in model.parameters()]
    opt = torch.optim.SGD(masters, lr=0.1)
    _, events = make(model, [])
    for _ in range(3):
        forward_backward(model)
        for master, p in zip(masters, model.parameters(), strict=True):
            master.grad = p.grad
        opt.step()
    assert events.boundaries == ["any_optimizer"] * 3


def test_close_ends_the_last_step_that_forwards_mark(make) -> None:
    model = tiny_model()
    detector, events = make(model, [], forwards_per_step=2)
    for _ in range(3):
        for _ in range(2):
            forward_backward(model)
        manual_update(model)
    forward_backward(model)  # half a step: the loop stopped inside it
    assert events.boundaries == ["forward"] * 3
    detector.finish_forward_step()
    assert events.boundaries == ["forward"] * 3
    detector, events = make(model, [])
    for _ in range(3):
        forward_backward(model)
        manual_update(model)
    detector.finish_forward_step()
    assert events.boundaries == ["forward"] * 3


def test_a_closures_first_forward_starts_step_zero(make) -> None:
    """Lightning's automatic optimization runs training_step inside ``optimizer.step(closure)``:
    its forwards never end a step, but the first one starts step 0 (before, step 0 started at
    the hook's creation there, and autocast or a loader's first wait went unseen)."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _, events = make(model, [opt])

    def closure() -> torch.Tensor:
        opt.zero_grad()
        return forward_backward(model)

    for _ in range(3):
        opt.step(closure)
    assert events.log == [("first",), *[("boundary", "optimizer")] * 3]


# ---------------------------------------------------------------------------------------------
# TorchScript models: no forward hooks


def _scripted(kind: str) -> nn.Module:
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    if kind == "scripted root":
        return torch.jit.script(mlp)
    if kind == "traced root":
        return torch.jit.trace(mlp, torch.randn(2, 16))
    return nn.Sequential(torch.jit.script(mlp), nn.Identity())  # an eager wrapper


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script / trace
@pytest.mark.parametrize("kind", ["scripted root", "traced root", "scripted child"])
def test_torchscript_models_are_timed_by_their_optimizer(kind: str, caplog) -> None:
    """``register_forward_pre_hook`` raises on a ScriptModule: a scripted (or traced) root or
    child must not make ``ETSHook(...)`` raise; the optimizer's steps are counted, the window
    captures the scripted ops, and a scripted root is named once in the log (a traced one
    takes forward hooks: nothing to say)."""
    model = _scripted(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        hook = ETSHook(
            model,
            optimizer=opt,
            total_steps=8,
            skip_steps=1,
            capture_steps=2,
            log_every=None,
            decode_in_background=False,
        )
        for _ in range(8):
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
        hook.close()
    assert hook.steps_completed == 8
    trace = hook.trace
    assert trace is not None and len(trace.iterations) == 2
    assert any("addmm" in op.name or "linear" in op.name for op in trace.iterations[0].ops)
    notes = [r for r in caplog.records if "TorchScript" in r.getMessage()]
    assert len(notes) == (1 if kind == "scripted root" else 0)


# ---------------------------------------------------------------------------------------------
# Several optimizers given, one of them skipping iterations


@pytest.mark.parametrize("skip_every", [0, 5])
def test_a_given_optimizer_stepping_twice_in_one_step_is_said_once(skip_every: int, caplog) -> None:
    """A step ends once every given optimizer has stepped: where one of them skips an
    iteration (a sparse embedding's optimizer with no features in the batch), the other's two
    steps make one step. That rule stays; one note says so, naming the optimizer."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    dense = torch.optim.Adam(model[0].parameters())
    other = torch.optim.SGD(model[1].parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        hook = ETSHook(model, optimizer=[dense, other], capture_steps=0, log_every=None)
        for i in range(20):
            model(torch.randn(2, 4)).sum().backward()
            dense.step()
            if not skip_every or i % skip_every != skip_every - 1:
                other.step()
        hook.close()
    notes = [r.getMessage() for r in caplog.records if "stepped again" in r.getMessage()]
    if skip_every:
        assert hook.steps_completed == 16  # the documented rule: four steps hold two each
        assert len(notes) == 1 and "#0 of optimizer= (Adam)" in notes[0]
    else:
        assert hook.steps_completed == 20 and not notes
