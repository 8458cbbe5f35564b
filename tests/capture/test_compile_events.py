"""capture.compile_events and the step hooks under ``torch.compile``.

Backends: the watcher's facts come from dynamo's compile callbacks, which bracket dynamo's frame
compile and AOTAutograd's lazy backward compile whatever the backend, so the real-compile tests
use ``backend="aot_eager"`` (dynamo + AOTAutograd, forward/backward graphs, guards and
recompiles, no C++ build: ~1 s instead of ~20 s for a cold inductor compile on 2 cores). The
step-hook tests use dynamo's ``CompileCounter`` backend with ``fullgraph=True``: any graph break
raises and any recompile shows in its frame count. One ``slow`` test compiles with the default
inductor backend into a fresh cache under ``tmp_path`` to check that its whole cold compile (C++
build included) lies inside the callbacks.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch._dynamo  # the tests compile; importing ets_hook must not (see the subprocess test)
from torch import nn
from torch._dynamo.callback import CallbackArgs, CallbackTrigger, callback_handler
from torch._dynamo.testing import CompileCounter

from ets_hook.capture.compile_events import BACKFILLED, CompileEvent, CompileWatcher
from ets_hook.capture.steps import StepDetector, step_always_breaks_graph

# torch's compile stack warns about its own use of torch.jit.script_method.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

# ---------------------------------------------------------------------------------------------
# Helpers


class FakeClock:
    """A nanosecond clock the test moves by hand."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def args(trigger: str = "DYNAMO", compile_id: str = "0/0") -> CallbackArgs:
    return CallbackArgs(CallbackTrigger[trigger], compile_id)


def interval(watcher: CompileWatcher, clock: FakeClock, start: int, end: int, **kw: Any) -> None:
    """One compile from ``start`` to ``end`` on the fake clock."""
    clock.now = start
    watcher.on_compile_start(args(**kw))
    clock.now = end
    watcher.on_compile_end(args(**kw))


class Net(nn.Module):
    """A user-defined module: dynamo starts tracing at its ``forward`` frame."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def tiny(kind: str = "net") -> nn.Module:
    torch.manual_seed(0)
    if kind == "sequential":  # a built-in container: dynamo traces its __call__, hooks included
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return Net()


def train_step(model: Callable[[torch.Tensor], torch.Tensor], opt: Any, batch: int = 6) -> None:
    opt.zero_grad(set_to_none=True)
    x, y = torch.randn(batch, 4), torch.randn(batch, 2)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


# ---------------------------------------------------------------------------------------------
# The watcher alone (callbacks driven by hand)


def test_intervals_totals_and_window_queries() -> None:
    clock = FakeClock()
    watcher = CompileWatcher(clock=clock)
    interval(watcher, clock, 100, 400, trigger="DYNAMO", compile_id="0/0")
    interval(watcher, clock, 500, 600, trigger="LAZY_BACKWARD", compile_id="0/0")
    assert watcher.events == [
        CompileEvent(100, 400, "DYNAMO", "0/0"),
        CompileEvent(500, 600, "LAZY_BACKWARD", "0/0"),
    ]
    assert (watcher.total_ns, watcher.count, watcher.last_end_ns) == (400, 2, 600)
    assert watcher.compile_ns_in(0, 1000) == 400
    assert watcher.compile_ns_in(300, 550) == 100 + 50  # clipped at both ends
    assert watcher.compile_ns_in(400, 500) == 0  # between the intervals
    assert watcher.compile_ns_in(600, 100) == 0  # empty window
    assert [e.trigger for e in watcher.events_in(350, 510)] == ["DYNAMO", "LAZY_BACKWARD"]
    assert watcher.events_in(600, 700) == []


def test_only_the_outermost_start_and_a_matched_end_count() -> None:
    clock = FakeClock()
    watcher = CompileWatcher(clock=clock)
    clock.now = 50
    watcher.on_compile_end(args())  # a compile that began before we listened: ignored
    clock.now = 100
    watcher.on_compile_start(args("DYNAMO", "0/0"))
    clock.now = 150
    watcher.on_compile_start(args("LAZY_BACKWARD", "1/0"))  # cannot nest: the first one wins
    clock.now = 300
    watcher.on_compile_end(args())
    assert watcher.events == [CompileEvent(100, 300, "DYNAMO", "0/0")]


def test_a_running_compile_counts_up_to_now() -> None:
    clock = FakeClock()
    watcher = CompileWatcher(clock=clock)
    clock.now = 100
    watcher.on_compile_start(args())
    clock.now = 250
    assert watcher.in_progress
    assert watcher.compile_ns_in(0, 10_000) == 150
    assert (watcher.count, watcher.total_ns) == (0, 0)  # totals hold completed ones only


def test_memory_is_bounded_and_totals_stay_exact() -> None:
    clock = FakeClock()
    watcher = CompileWatcher(max_events=3, clock=clock)
    for k in range(5):
        interval(watcher, clock, 1000 * k, 1000 * k + 10)
    assert [e.start_ns for e in watcher.events] == [2000, 3000, 4000]
    assert (watcher.dropped, watcher.count, watcher.total_ns) == (2, 5, 50)


@pytest.mark.parametrize(
    ("compile_id", "recompile"),
    [
        ("0/0", False),
        ("0/1", True),
        ("3/12", True),
        ("!0/2/0", False),
        ("[1/2]", True),
        ("", False),
    ],
)
def test_a_compile_id_with_attempt_above_zero_is_a_recompile(
    compile_id: str, recompile: bool
) -> None:
    assert CompileEvent(0, 1, "DYNAMO", compile_id).is_recompile is recompile


def test_max_events_is_checked() -> None:
    with pytest.raises(ValueError, match="max_events must be an int >= 1, got 0"):
        CompileWatcher(max_events=0)


def test_failures_never_raise_and_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken_clock() -> int:
        raise RuntimeError("clock broke")

    watcher = CompileWatcher(clock=broken_clock)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        watcher.on_compile_start(args())
        watcher.on_compile_end(args())
        watcher.on_compile_start(args())
    assert [r.getMessage() for r in caplog.records if "compile watcher" in r.getMessage()] == [
        "compile watcher failed (RuntimeError: clock broke); compile time may be "
        "counted as step time"
    ]
    assert watcher.events == []


# ---------------------------------------------------------------------------------------------
# Registration with dynamo


def test_without_dynamo_nothing_is_registered_or_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torch._dynamo", "torch._dynamo.callback", "torch._dynamo.utils"):
        monkeypatch.delitem(sys.modules, name)
    watcher = CompileWatcher()
    assert watcher.ensure_registered() is False
    assert "torch._dynamo.callback" not in sys.modules


def test_importing_ets_hook_never_imports_dynamo() -> None:
    code = (
        "import sys, ets_hook, ets_hook.capture.compile_events, ets_hook.capture.steps\n"
        "from ets_hook.capture.compile_events import CompileWatcher\n"
        "CompileWatcher().ensure_registered()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"


def test_close_unregisters_and_dynamo_reset_is_survived() -> None:
    watcher = CompileWatcher()
    assert watcher.ensure_registered() and watcher.ensure_registered()  # idempotent
    assert callback_handler.start_callbacks.count(watcher.on_compile_start) == 1
    assert callback_handler.end_callbacks.count(watcher.on_compile_end) == 1
    torch._dynamo.reset()  # empties dynamo's callback lists
    assert not watcher.registered
    assert watcher.ensure_registered() and watcher.registered
    watcher.close()
    watcher.close()  # twice is fine
    assert watcher.on_compile_start not in callback_handler.start_callbacks
    assert watcher.on_compile_end not in callback_handler.end_callbacks
    assert watcher.ensure_registered() is False  # closed for good


def test_compiles_before_registration_are_backfilled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torch._dynamo", "torch._dynamo.callback", "torch._dynamo.utils"):
        monkeypatch.delitem(sys.modules, name)
    clock = FakeClock(10_000_000_000)
    watcher = CompileWatcher(clock=clock)  # dynamo absent: all its compiles come later
    handler = type(callback_handler)()
    metrics = {"_compile.compile_inner": [1.5], "backward._backward_impl": [0.5], "other": [9.0]}
    monkeypatch.setitem(
        sys.modules, "torch._dynamo.callback", types.SimpleNamespace(callback_handler=handler)
    )
    monkeypatch.setitem(
        sys.modules,
        "torch._dynamo.utils",
        types.SimpleNamespace(compilation_time_metrics=metrics),
    )
    assert watcher.ensure_registered()
    assert watcher.events == [CompileEvent(8_000_000_000, 10_000_000_000, BACKFILLED, "")]
    handler.start_callbacks.clear()
    assert watcher.ensure_registered()
    assert watcher.count == 1  # not again


# ---------------------------------------------------------------------------------------------
# Real compiles (aot_eager): what the callbacks see in a training loop


class Step(NamedTuple):
    start_ns: int
    end_ns: int
    batch: int


class CompiledRun(NamedTuple):
    watcher: CompileWatcher
    steps: list[Step]


@pytest.fixture(scope="module")
def compiled_run() -> Iterator[CompiledRun]:
    """Six training steps of a compiled model: batch 6 for steps 0-3, then 5 (a recompile)."""
    # Dynamo's and the backend's first use in a process imports and sets up a great deal
    # (seconds in a fresh CI environment, outside any compile event): done here, on another
    # function, so that the first timed step holds the model's compile, not the imports.
    warm = torch.ones(2, requires_grad=True)
    torch.compile(lambda x: (x * 2).sum(), backend="aot_eager")(warm).backward()
    torch._dynamo.reset()
    watcher = CompileWatcher()
    assert watcher.ensure_registered()
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="aot_eager")
    steps = []
    for batch in (6, 6, 6, 6, 5, 5):
        start_ns = time.perf_counter_ns()
        train_step(compiled, opt, batch)
        steps.append(Step(start_ns, time.perf_counter_ns(), batch))
    yield CompiledRun(watcher, steps)
    watcher.close()
    torch._dynamo.reset()


def test_the_first_step_compiles_the_forward_then_the_lazy_backward(compiled_run) -> None:
    watcher, steps = compiled_run
    first = steps[0]
    events = watcher.events_in(first.start_ns, first.end_ns)
    assert [(e.trigger, e.compile_id, e.is_recompile) for e in events] == [
        ("DYNAMO", "0/0", False),
        ("LAZY_BACKWARD", "0/0", False),
    ]
    assert all(first.start_ns <= e.start_ns < e.end_ns <= first.end_ns for e in events)
    assert all(e.duration_ns > 1_000_000 for e in events)  # > 1 ms each: real compile work
    compile_ns = watcher.compile_ns_in(first.start_ns, first.end_ns)
    step_ns = first.end_ns - first.start_ns
    # The compile events hold far more than a compiled step's work (not a share of the first
    # step: on a slow VM its time outside the events, guards and tracing, was 62% of it).
    steady_ns = max(s.end_ns - s.start_ns for s in steps[1:4])
    assert 10 * steady_ns < compile_ns < step_ns


def test_steady_steps_record_no_compile(compiled_run) -> None:
    watcher, steps = compiled_run
    for step in (steps[1], steps[2], steps[3], steps[5]):
        assert watcher.events_in(step.start_ns, step.end_ns) == []
        assert watcher.compile_ns_in(step.start_ns, step.end_ns) == 0


def test_a_new_batch_size_recompiles_visibly(compiled_run) -> None:
    watcher, steps = compiled_run
    step = steps[4]
    events = watcher.events_in(step.start_ns, step.end_ns)
    # Dynamic shapes from the second size on: the backward is compiled with the forward.
    assert [(e.trigger, e.compile_id, e.is_recompile) for e in events] == [("DYNAMO", "0/1", True)]
    assert watcher.compile_ns_in(step.start_ns, step.end_ns) == events[0].duration_ns > 0


def test_the_totals_are_the_sum_of_the_step_windows(compiled_run) -> None:
    watcher, steps = compiled_run
    assert watcher.count == 3 and not watcher.in_progress
    per_step = sum(watcher.compile_ns_in(s.start_ns, s.end_ns) for s in steps)
    assert per_step == watcher.total_ns == sum(e.duration_ns for e in watcher.events)


# ---------------------------------------------------------------------------------------------
# Step hooks under compile: no graph break, no recompile, boundaries still counted


class Recorder:
    """Step-detector callbacks that dynamo cannot trace: were one traced into a graph, the
    explicit graph break would make ``fullgraph=True`` raise."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def _note(self, what: str) -> None:
        torch._dynamo.graph_break()  # a no-op when run as plain Python
        time.perf_counter_ns()
        self.log.append(what)

    def boundary(self, source: str) -> None:
        self._note(source)

    def first(self) -> None:
        self._note("first")

    def forward(self) -> None:
        self._note("forward")


@pytest.mark.parametrize("order", ["on_compiled_module", "compiled_after", "inlined", "in_place"])
def test_step_hooks_cause_no_graph_break_and_no_recompile(order: str) -> None:
    torch._dynamo.reset()
    counter = CompileCounter()
    model = tiny("sequential" if order == "inlined" else "net")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder()

    def detector_on(module: nn.Module) -> StepDetector:
        return StepDetector(
            module, [opt], rec.boundary, on_first_activity=rec.first, on_forward=rec.forward
        )

    if order == "on_compiled_module":
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        detector = detector_on(compiled)
    else:
        detector = detector_on(model)
        if order == "in_place":
            model.compile(backend=counter, fullgraph=True)
            compiled = model
        else:
            compiled = torch.compile(model, backend=counter, fullgraph=True)
    try:
        train_step(compiled, opt)
        train_step(compiled, opt)
        detector.in_phase = True  # state the hooks read changes: must not reach any guard
        train_step(compiled, opt)
        detector.in_phase = False
        detector.remove_capture_hooks()  # the window's end
        train_step(compiled, opt)
    finally:
        detector.close()
    assert counter.frame_count == 1  # one graph: no graph break, no recompile
    assert rec.log.count("optimizer") == 3  # the phase's step is not one
    if order == "inlined":  # the module hook ran inside the graph, as a no-op
        assert "first" not in rec.log and not detector.saw_training_forward
    else:
        assert rec.log[:3] == ["first", "forward", "optimizer"]
        assert rec.log.count("forward") == 2 and detector.saw_training_forward


def test_a_hook_compiled_into_the_graph_is_kept_at_the_windows_end() -> None:
    model = tiny("sequential")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    detector = StepDetector(model, [opt], lambda source: None)
    try:
        opt.step()  # steps, but no forward was ever seen
        detector.remove_capture_hooks()
        assert len(model._forward_pre_hooks) == 1
    finally:
        detector.close()
    assert len(model._forward_pre_hooks) == 0


def test_a_compiled_builtin_optimizer_step_still_ends_steps() -> None:
    torch._dynamo.reset()
    model = tiny()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    assert step_always_breaks_graph(opt)
    assert not step_always_breaks_graph(torch.optim.LBFGS(model.parameters()))
    rec = Recorder()
    detector = StepDetector(model, [opt], rec.boundary)

    @torch.compile(backend="eager")
    def optimizer_step() -> None:
        opt.step()

    try:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(torch.randn(6, 4)), torch.randn(6, 2)).backward()
            optimizer_step()
    finally:
        detector.close()
    assert rec.log == ["optimizer"] * 3


# ---------------------------------------------------------------------------------------------
# The default backend (slow: a cold inductor compile builds C++ on 2 cores, ~20 s)


@pytest.mark.slow
def test_a_cold_inductor_compile_lies_inside_the_callbacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(inductor_config, "compile_threads", 1)  # no worker pool left behind
    torch._dynamo.reset()
    watcher = CompileWatcher()
    assert watcher.ensure_registered()
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model)
    windows = []
    try:
        for _ in range(3):
            start_ns = time.perf_counter_ns()
            train_step(compiled, opt)
            windows.append((start_ns, time.perf_counter_ns()))
    finally:
        watcher.close()
        torch._dynamo.reset()
    first_start, first_end = windows[0]
    triggers = [e.trigger for e in watcher.events_in(first_start, first_end)]
    assert triggers == ["DYNAMO", "LAZY_BACKWARD"]
    assert watcher.compile_ns_in(first_start, first_end) > 0.9 * (first_end - first_start)
    assert all(watcher.compile_ns_in(*window) == 0 for window in windows[1:])
