"""ETSHook on ``torch.compile``d models: compile time is a one-off phase, compile steps are
warm-up and outside the capture window, and no prediction extrapolates a compile step.

One run per hook order (hook on the compiled module; hook on the module, compiled afterwards),
shared by the tests. ``backend="aot_eager"`` goes through dynamo and AOTAutograd (the same
compile events as inductor) in about a second instead of inductor's C++ build.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ets_hook import ETSHook, Prediction

STEPS = 24


@dataclass
class CompiledRun:
    hook: ETSHook
    predictions: list[Prediction]
    frames: int
    graph_breaks: int
    wall_s: list[float]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _timed_steps(
    compiled: Any, optimizer: torch.optim.Optimizer, hook: ETSHook, batches: list[Any]
) -> tuple[list[Prediction | None], list[float]]:
    """One training step per batch: the hook's prediction after each, and each step's wall
    time."""
    import time

    predictions, wall_s = [], []
    for x, y in batches:
        started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        wall_s.append(time.perf_counter() - started)
        predictions.append(hook.prediction)
    return predictions, wall_s


def _train(order: str) -> CompiledRun:

    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if order == "hook on the compiled module":
        compiled = torch.compile(model, backend="aot_eager")
        hook = ETSHook(compiled, optimizer, total_steps=STEPS, capture_steps=3, log_every=None)
    else:
        hook = ETSHook(model, optimizer, total_steps=STEPS, capture_steps=3, log_every=None)
        compiled = torch.compile(model, backend="aot_eager")
    batch = (torch.randn(8, 32), torch.randint(0, 4, (8,)))
    predictions, wall_s = _timed_steps(compiled, optimizer, hook, [batch] * STEPS)
    hook.close()
    frames = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    return CompiledRun(hook, predictions, frames, breaks, wall_s)


@pytest.fixture(scope="module", params=["hook on the compiled module", "compiled afterwards"])
def run(request: Any) -> CompiledRun:
    return _train(request.param)


def test_every_step_counted_without_graph_breaks_or_recompiles(run: CompiledRun) -> None:
    assert run.hook.steps_completed == STEPS
    assert run.graph_breaks == 0 and run.frames == 1


def test_compile_time_is_a_one_off_phase_not_step_time(run: CompiledRun) -> None:
    phases = {p.name: p for p in run.predictions[-1].phases}
    compile_phase = phases["compile"]
    assert compile_phase.occurrences == 1 and compile_phase.remaining == 0
    assert compile_phase.remaining_s == 0.0
    # The first step's wall time was mostly compile; the hook's step time leaves it out.
    assert compile_phase.spent_s > 0.5 * run.wall_s[0]
    assert run.hook.step_times_s[0] < run.wall_s[0] - 0.5 * compile_phase.spent_s


def test_the_window_starts_after_the_default_skip(run: CompiledRun) -> None:
    hook = run.hook
    assert hook.skip_steps == 3  # step 0 compiled; steps 1 and 2 were clean: the default
    trace = hook.wait_for_trace(30)
    assert trace is not None
    assert [it.step for it in trace.iterations] == [3, 4, 5]
    assert trace.capture.skip_steps == 3


def test_no_prediction_extrapolates_the_compile_step(run: CompiledRun) -> None:
    first, second, later = run.predictions[0], run.predictions[1], run.predictions[5]
    assert first.warming_up and second.warming_up and not later.warming_up
    assert first.source == "prior" and first.iteration_rel_ci > 0.2  # the prior's wide interval
    # Never the compile step's wall time extrapolated: the first step's time left it out.
    assert first.iteration_s < 0.5 * run.wall_s[0]
    assert first.total_s is not None and first.total_s < first.elapsed_s + STEPS * run.wall_s[0]
    assert later.warmup_steps >= 2  # the compile step and the one after it


def test_a_recompile_postpones_the_window_until_two_compile_free_steps() -> None:
    """A batch of another size at step 2 recompiles: the window, due after step 2, waits for
    two compile-free steps in a row (steps 3 and 4) and captures from step 5."""
    import torch._dynamo

    torch._dynamo.reset()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="aot_eager")
    hook = ETSHook(compiled, optimizer, total_steps=12, capture_steps=2, log_every=None)
    for step in range(9):
        x = torch.randn(12 if step >= 2 else 8, 32)
        y = torch.randint(0, 4, (x.shape[0],))
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hook.close()
    trace = hook.wait_for_trace(30)
    assert hook.skip_steps == 5
    assert trace is not None and [it.step for it in trace.iterations] == [5, 6]


RECOMPILE_STEPS = 28
RECOMPILE_AT = 18  # the batch grows from 8 to 12 rows here: one recompile, long after warm-up


@dataclass
class RecompiledRun:
    hook: ETSHook
    predictions: list[Prediction]
    wall_s: list[float]
    graphs: int


def _train_with_batch_sizes(
    hook_args: dict[str, Any], steps: int, grow_at: int
) -> tuple[ETSHook, list[Prediction], list[float], int]:
    """A compiled model (static shapes) trained ``steps`` steps on batches of 8 rows, 12 from
    step ``grow_at`` on: dynamo compiles at step 0 and recompiles at ``grow_at``. Returns the
    closed hook, the prediction after each step, each step's wall time and dynamo's graphs."""

    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    hook = ETSHook(compiled, optimizer, log_every=None, **hook_args)
    batches = {rows: (torch.randn(rows, 32), torch.randint(0, 4, (rows,))) for rows in (8, 12)}
    order = [batches[12 if step >= grow_at else 8] for step in range(steps)]
    predictions, wall_s = _timed_steps(compiled, optimizer, hook, order)
    hook.close()
    return hook, predictions, wall_s, counters["stats"]["unique_graphs"]


@pytest.fixture(scope="module")
def recompiled() -> RecompiledRun:
    hook, predictions, wall_s, graphs = _train_with_batch_sizes(
        {"total_steps": RECOMPILE_STEPS, "capture_steps": 3}, RECOMPILE_STEPS, RECOMPILE_AT
    )
    return RecompiledRun(hook, predictions, wall_s, graphs)


def test_a_recompile_mid_job_is_a_compile_phase(recompiled: RecompiledRun) -> None:
    assert recompiled.graphs == 2  # dynamo really compiled a second graph
    assert recompiled.hook.steps_completed == RECOMPILE_STEPS
    before = {p.name: p for p in recompiled.predictions[RECOMPILE_AT - 1].phases}["compile"]
    after = {p.name: p for p in recompiled.predictions[RECOMPILE_AT].phases}["compile"]
    assert (before.occurrences, after.occurrences) == (1, 2)
    assert after.remaining == 0 and after.remaining_s == 0.0  # a one-off: not projected
    recompile_s = after.spent_s - before.spent_s
    # The recompile step's wall time was mostly compile; its step time leaves that out.
    assert recompile_s > 0.5 * recompiled.wall_s[RECOMPILE_AT]
    assert recompiled.hook.step_times_s[RECOMPILE_AT] < (
        recompiled.wall_s[RECOMPILE_AT] - 0.5 * recompile_s
    )


def test_a_recompile_mid_job_leaves_the_step_time_estimate_in_place(
    recompiled: RecompiledRun,
) -> None:
    """The estimates after the recompile stay at the level of the job's steps, nowhere near
    the recompile step's wall time (a new steady state taken from it would be): within 3x the
    level the steps ran at around it (the batch grew by half), and below a quarter of that
    step's wall time (its compile alone is tens of steps). That level is the larger of the
    median of the steps that did not compile, the estimate just before the recompile and the
    median of the four steps after it: on a loaded machine whole stretches of steps run 20-40x
    slower (time slices of other processes), before and after the recompile alike."""
    times = recompiled.hook.step_times_s
    steady_s = statistics.median(times[2:RECOMPILE_AT] + times[RECOMPILE_AT + 1 :])
    level_s = max(
        steady_s,
        recompiled.predictions[RECOMPILE_AT - 1].iteration_s,
        statistics.median(times[RECOMPILE_AT + 1 : RECOMPILE_AT + 5]),
    )
    recompile_wall_s = recompiled.wall_s[RECOMPILE_AT]
    assert recompile_wall_s > 5 * steady_s  # the test's premise: compiling is slow
    for prediction in recompiled.predictions[RECOMPILE_AT : RECOMPILE_AT + 4]:
        assert prediction.iteration_s < 3 * level_s
        assert prediction.iteration_s < 0.25 * recompile_wall_s


def test_a_recompile_mid_job_does_not_restart_the_warm_up(recompiled: RecompiledRun) -> None:
    before = recompiled.predictions[RECOMPILE_AT - 1]
    assert not before.warming_up and before.warmup_steps < RECOMPILE_AT
    for prediction in recompiled.predictions[RECOMPILE_AT:]:
        assert not prediction.warming_up
        assert prediction.warmup_steps < RECOMPILE_AT  # a restart would drop steps 0..19


def test_a_recompile_inside_the_window_is_left_out_of_the_trace() -> None:
    """The window (steps 3-5, ``skip_steps`` given) keeps its length; step 4 recompiles: its
    ops are mostly the compiler's, so the trace holds steps 3 and 5."""
    hook, _, _, graphs = _train_with_batch_sizes(
        {"total_steps": 12, "capture_steps": 3, "skip_steps": 3}, steps=8, grow_at=4
    )
    trace = hook.wait_for_trace(30)
    assert graphs == 2
    assert trace is not None and [it.step for it in trace.iterations] == [3, 5]
