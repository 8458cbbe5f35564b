"""The native operator observer (ets_hook._ops): built for this torch, complete and nested events
on every thread, shapes and dtypes, no callback left after the window, coexistence with a user's
torch.profiler, the same ops as the profiler path, dropped records counted, and the fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ets_hook import ETSHook, Phase
from ets_hook.capture import native_ops, window_runner
from ets_hook.capture.ops import (
    NativeObserverBusyError,
    NativeOpCapture,
    ProfilerOpCapture,
    native_observer_holder,
)
from ets_hook.capture.window import DEFAULT_SKIP_STEPS
from ets_hook.trace.decode import RawOp, StepBounds, build_iterations
from ets_hook.trace.names import AUTOGRAD_NODE_PREFIX, BACKWARD_SCOPE, USER_SCOPE


@pytest.fixture(scope="module")
def ops(native_ops_built: str | None):
    assert native_ops_built is None, f"the native observer must build here: {native_ops_built}"
    module = native_ops.load()
    assert module is not None, native_ops.unavailable_reason()
    return module


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def sgd_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


def capture(ops, fn, *, record_shapes: bool = True) -> list[RawOp]:
    cap = NativeOpCapture(ops)
    cap.start(record_shapes)
    try:
        fn()
    finally:
        cap.stop()
    return cap.read()


def contains(outer: RawOp, inner: RawOp) -> bool:
    return (
        outer.thread == inner.thread
        and outer.start_ns <= inner.start_ns
        and inner.start_ns + inner.duration_ns <= outer.start_ns + outer.duration_ns
    )


# ---------------------------------------------------------------------------------------------
# The path that runs


def test_the_stub_declares_what_the_module_has(ops) -> None:
    """``ets_hook/_ops.pyi`` (shipped beside ``_C.pyi``): every public name of the compiled
    module, and nothing it lacks; callables declared as functions, constants as values."""
    import ast

    stub = ast.parse((Path(native_ops.__file__).parents[1] / "_ops.pyi").read_text())
    functions = {n.name for n in stub.body if isinstance(n, ast.FunctionDef)}
    constants = {
        n.target.id
        for n in stub.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    public = {name for name in dir(ops) if not name.startswith("_")}
    assert functions | constants == public
    assert all(callable(getattr(ops, name)) for name in functions)
    assert not any(callable(getattr(ops, name)) for name in constants)


def test_the_hook_runs_the_native_observer_by_default(ops) -> None:
    """CI guard: a silent fallback to the profiler fails here."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, log_every=None)
    for _ in range(6):
        sgd_step(model, opt, torch.randn(8, 16))
    hook.close()
    trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert trace.capture.op_capture == NativeOpCapture.name
    assert "native RecordFunction observer" in hook.capture_status
    assert torch.__version__ == ops.TORCH_VERSION
    phases = [{op.phase for op in it.top_level_ops()} for it in trace.iterations]
    assert all({Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= p for p in phases)


def test_the_callback_is_gone_after_the_window_while_training_goes_on(ops) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None)
    seen = []
    for step in range(5):
        sgd_step(model, opt, torch.randn(8, 16))
        seen.append((step, ops.registered(), ops.has_global_callbacks()))
    hook.close()
    # the window is steps 1-2: registered after step 0 ends, removed when step 2 ends
    assert seen == [
        (0, True, True),
        (1, True, True),
        (2, False, False),
        (3, False, False),
        (4, False, False),
    ]


# ---------------------------------------------------------------------------------------------
# Events


def test_forward_backward_optimizer_and_annotations_are_complete_and_nested(ops) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)

    def step() -> None:
        with torch.autograd.profiler.record_function("## user block"):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

    rows = capture(ops, step)
    by_name = Counter(r.name for r in rows)
    assert by_name["aten::linear"] == 2 and by_name["aten::addmm"] == 2
    assert by_name["autograd::engine::evaluate_function: AddmmBackward0"] == 2
    assert by_name["Optimizer.step#SGD.step"] == 1
    assert all(r.duration_ns >= 0 and r.start_ns > 0 for r in rows)
    (block,) = [r for r in rows if r.name == "## user block"]
    assert block.scope == USER_SCOPE
    assert all(contains(block, r) for r in rows if r is not block and r.thread == block.thread)
    for linear in (r for r in rows if r.name == "aten::linear"):
        assert any(r.name == "aten::addmm" and contains(linear, r) for r in rows)
    # the autograd nodes themselves carry their forward op's sequence number
    nodes = [r for r in rows if r.scope == BACKWARD_SCOPE and r.name.endswith("Backward0")]
    assert {r.name for r in nodes} >= {"AddmmBackward0", "SumBackward0"}
    assert all(r.sequence_nr >= 0 for r in nodes)
    forward_seq = {r.sequence_nr for r in rows if r.name == "aten::addmm"}
    assert forward_seq <= {r.sequence_nr for r in nodes}  # the forward <-> backward link

    bounds = [StepBounds(0, block.start_ns - 1, block.start_ns + block.duration_ns + 1)]
    (iteration,) = build_iterations(rows, bounds)
    phases = Counter(op.phase for op in iteration.top_level_ops())
    assert phases[Phase.FORWARD] and phases[Phase.BACKWARD] and phases[Phase.OPTIMIZER]


def test_a_backward_on_another_thread_is_recorded_there(ops) -> None:
    model = mlp()
    x = torch.randn(8, 16)
    worker_tid: list[int] = []

    def step() -> None:
        loss = model(x).sum()

        def backward() -> None:
            worker_tid.append(threading.get_native_id())
            loss.backward()

        thread = threading.Thread(target=backward)
        thread.start()
        thread.join()

    rows = capture(ops, step)
    main_tid = threading.get_native_id()
    backward = [r for r in rows if r.name.startswith(AUTOGRAD_NODE_PREFIX)]
    assert backward and {r.thread for r in backward} == {worker_tid[0]}
    assert {r.thread for r in rows if r.name == "aten::linear"} == {main_tid}
    # events of the worker thread nest among themselves
    (outer,) = [r for r in backward if r.name.endswith("SumBackward0")]
    assert all(r.start_ns >= outer.start_ns for r in backward)


def test_a_checkpointed_backward_recomputes_the_forward_inside_the_backward(ops) -> None:
    model = mlp()
    x = torch.randn(8, 16, requires_grad=True)

    def step() -> None:
        checkpoint(model, x, use_reentrant=False).sum().backward()

    rows = capture(ops, step)
    linears = sorted((r for r in rows if r.name == "aten::linear"), key=lambda r: r.start_ns)
    assert len(linears) == 4  # 2 in the forward, 2 recomputed in the backward
    first_backward = min(r.start_ns for r in rows if r.name.startswith(AUTOGRAD_NODE_PREFIX))
    assert [r.start_ns > first_backward for r in linears] == [False, False, True, True]


def test_names_are_stable_and_shapes_and_dtypes_right(ops) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    first = capture(ops, lambda: sgd_step(model, opt, x))
    second = capture(ops, lambda: sgd_step(model, opt, x))
    key = lambda r: (r.thread, r.start_ns)  # noqa: E731
    assert [r.name for r in sorted(first, key=key)] == [r.name for r in sorted(second, key=key)]
    (linear, *_) = [r for r in first if r.name == "aten::linear"]
    assert linear.input_shapes == ((8, 16), (32, 16), (32,))
    assert linear.input_dtypes == ("float", "float", "float")

    def mixed() -> None:
        b = torch.ones(3, dtype=torch.bfloat16)
        torch.add(b, b, alpha=2)
        torch.cat([torch.ones(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)])

    rows = capture(ops, mixed)
    (add,) = [r for r in rows if r.name == "aten::add"]
    assert add.input_shapes == ((3,), (3,), ())
    assert add.input_dtypes == ("c10::BFloat16", "c10::BFloat16", "Scalar")
    (cat,) = [r for r in rows if r.name == "aten::cat"]
    assert cat.input_dtypes[0] == "TensorList"
    without = capture(ops, lambda: sgd_step(model, opt, x), record_shapes=False)
    assert without and all(r.input_shapes == () for r in without)


def test_the_same_steps_seen_by_both_paths_agree(ops) -> None:
    """Cross-check: our observer and the torch profiler running on the same steps."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    sgd_step(model, opt, x)  # lazy state out of the way
    native, profiler = NativeOpCapture(ops), ProfilerOpCapture()
    native.start(True)
    profiler.start(True)
    bounds = []
    for step in range(2):
        start = time.time_ns()
        sgd_step(model, opt, x)
        bounds.append(StepBounds(step, start, time.time_ns()))
    profiler.stop()
    native.stop()
    ours = build_iterations(native.read(), bounds)
    theirs = build_iterations(profiler.read(), bounds)
    for a, b in zip(ours, theirs, strict=True):
        assert [op.name for op in a.ops] == [op.name for op in b.ops]
        assert [op.depth for op in a.ops] == [op.depth for op in b.ops]
        assert [op.phase for op in a.ops] == [op.phase for op in b.ops]
        assert [op.input_shapes for op in a.ops] == [op.input_shapes for op in b.ops]
        assert [op.input_dtypes for op in a.ops] == [op.input_dtypes for op in b.ops]


def test_a_users_profiler_during_the_window_gets_its_full_trace_and_so_do_we(ops) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, log_every=None)
    sgd_step(model, opt, torch.randn(8, 16))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):  # the whole window
            sgd_step(model, opt, torch.randn(8, 16))
    hook.close()
    trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert [it.step for it in trace.iterations] == [1, 2, 3]
    ours = [sum(op.name == "aten::linear" for op in it.ops) for it in trace.iterations]
    assert ours == [2, 2, 2]
    theirs = [e for e in prof.events() if e.name == "aten::linear"]
    assert len(theirs) == 6  # their three steps, complete
    assert not torch.autograd._profiler_enabled()


def test_a_users_profiler_open_before_the_window_and_across_it_gets_its_full_trace_and_so_do_we(
    ops,
) -> None:
    """The user's profiler is already running when the hook is made and stays open past the
    window's end: the window is still captured natively, and the user's trace still holds
    every step, the window's included."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        hook = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, log_every=None)
        for _ in range(5):  # step 0, the window (steps 1-3), step 4
            sgd_step(model, opt, torch.randn(8, 16))
        assert not ops.registered()  # the window is over, the user's profiler still runs
        assert torch.autograd._profiler_enabled()
    hook.close()
    trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert trace.capture.op_capture == NativeOpCapture.name, hook.capture_status
    assert "backed off" not in hook.capture_status
    assert [it.step for it in trace.iterations] == [1, 2, 3]
    for iteration in trace.iterations:
        assert sum(op.name == "aten::linear" for op in iteration.ops) == 2
        phases = {op.phase for op in iteration.top_level_ops()}
        assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= phases
    theirs = Counter(e.name for e in prof.events())
    assert theirs["aten::linear"] == 10  # all five steps, the window's three among them
    assert theirs["Optimizer.step#SGD.step"] == 5
    assert theirs["autograd::engine::evaluate_function: AddmmBackward0"] == 10
    assert not torch.autograd._profiler_enabled()


QUIET = textwrap.dedent(
    """
    import sys, torch
    from ets_hook import ETSHook

    def train(op_capture):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None,
                       op_capture=op_capture)
        for _ in range(5):
            opt.zero_grad(); model(torch.randn(8, 16)).sum().backward(); opt.step()
        hook.close()
        trace = hook.wait_for_trace(30)
        print("STATUS", op_capture, hook.capture_status, flush=True)
        print("OPS", op_capture, trace.capture.op_capture, len(trace.iterations), flush=True)

    train("native")
    print("=== profiler", file=sys.stderr, flush=True)
    train("profiler")
    """
)
KINETO_MARKERS = ("usdt", "profiler_start", "profiler_stop", "kineto", "stage:")


def test_the_native_path_prints_nothing_on_stderr() -> None:
    """Kineto prints ``USDT: ... profiler_start/stop`` lines on stderr (into the users'
    progress bars); the native path prints nothing there. The profiler path then runs in the
    same process, so the check is seen to catch Kineto's lines."""
    run = subprocess.run(
        [sys.executable, "-c", QUIET], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "STATUS native done: ops: native RecordFunction observer" in run.stdout, run.stdout
    assert "OPS native native RecordFunction observer 2" in run.stdout, run.stdout
    assert "OPS profiler torch kineto cpu profiler 2" in run.stdout, run.stdout
    native_err, marker, profiler_err = run.stderr.partition("=== profiler\n")
    assert marker, run.stderr
    assert native_err == "", native_err
    assert any(m in profiler_err.lower() for m in KINETO_MARKERS), profiler_err


def test_records_past_the_budget_are_dropped_and_counted(ops) -> None:
    capture(ops, lambda: None)  # every buffer trimmed to one chunk
    held = ops.allocated_bytes()
    cap = NativeOpCapture(ops, thread_budget_bytes=ops.CHUNK_BYTES)
    a = torch.ones(2)
    cap.start(False)
    for _ in range(20_000):  # 40,000 records: far past one chunk of events
        torch.add(a, a)
    cap.stop()
    rows = cap.read()
    assert 0 < len(rows) < 20_000
    assert cap.dropped > 0
    assert ops.allocated_bytes() == held  # read() trimmed the buffers again


def test_a_capture_holds_the_observer_until_its_records_are_read(ops) -> None:
    a = torch.ones(2)
    first, second = NativeOpCapture(ops), NativeOpCapture(ops)
    first.start(False)
    try:
        with pytest.raises(NativeObserverBusyError, match="another capture"):
            second.start(False)
        torch.add(a, a)
    finally:
        first.stop()
    assert native_observer_holder() is not None
    # stopped but unread: a second start would forget the first capture's records
    with pytest.raises(NativeObserverBusyError):
        second.start(False)
    assert [r.name for r in first.read()] == ["aten::add"]
    assert native_observer_holder() is None
    second.start(False)
    try:
        torch.mul(a, a)
    finally:
        second.stop()
    first.discard()  # given back already: must not reset what the second one holds
    assert first.read() == []
    assert [r.name for r in second.read()] == ["aten::mul"]
    assert native_observer_holder() is None


def test_a_discarded_or_refused_capture_gives_the_observer_back(ops) -> None:
    dropped = NativeOpCapture(ops)
    dropped.start(False)
    dropped.stop()
    dropped.discard()
    assert native_observer_holder() is None
    # torch refusing the callback (here: a session registered behind the captures' back)
    # leaves the observer free, not held by a capture that never started
    ops.start(False, ops.CHUNK_BYTES)
    try:
        with pytest.raises(RuntimeError, match="already open"):
            NativeOpCapture(ops).start(False)
        assert native_observer_holder() is None
    finally:
        ops.stop()
        ops.reset()


def gan_step(
    g: nn.Module, d: nn.Module, og: torch.optim.Optimizer, od: torch.optim.Optimizer
) -> None:
    z = torch.randn(8, 16)
    od.zero_grad()
    (d(g(z).detach()).pow(2).mean() + (d(torch.randn(8, 4)) - 1).pow(2).mean()).backward()
    od.step()
    og.zero_grad()
    (d(g(z)) - 1).pow(2).mean().backward()
    og.step()


@pytest.mark.parametrize(("background", "stale_after"), [(True, 8), (False, 8), (True, 1)])
def test_two_hooks_in_one_process_take_the_observer_in_turn(
    ops, background: bool, stale_after: int, caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    """A GAN's generator and discriminator, one hook each: both windows are captured by the
    native observer, one after the other (the second waits until the first's records are
    read); nothing is reported as an internal error, and a live window is never taken as a
    stopped one (even when a single step without a boundary would make it stale)."""
    monkeypatch.setattr(window_runner, "STALE_HOLDER_STEPS", stale_after)
    torch.manual_seed(0)
    g = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    d = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    og = torch.optim.SGD(g.parameters(), lr=0.01)
    od = torch.optim.SGD(d.parameters(), lr=0.01)
    options = {"capture_steps": 2, "log_every": None, "decode_in_background": background}
    hooks = [ETSHook(g, optimizer=og, **options), ETSHook(d, optimizer=od, **options)]
    with caplog.at_level("INFO", logger="ets_hook"):
        for _ in range(20):
            gan_step(g, d, og, od)
            if all(h.trace is not None for h in hooks):
                break
        traces = [h.wait_for_trace(30) for h in hooks]
    for hook in hooks:
        hook.close()
    assert all(t is not None for t in traces), [h.capture_status for h in hooks]
    assert [t.capture.op_capture for t in traces] == [NativeOpCapture.name] * 2
    first, second = sorted(traces, key=lambda t: t.iterations[0].start_ns)
    assert first.iterations[-1].end_ns <= second.iterations[0].start_ns  # one after the other
    assert all(len(t.iterations) == 2 and t.iterations[0].ops for t in traces)
    assert sorted(h.skip_steps for h in hooks)[0] == DEFAULT_SKIP_STEPS  # the first window ...
    assert sorted(h.skip_steps for h in hooks)[1] > DEFAULT_SKIP_STEPS  # ... the second waited
    assert "internal error" not in caplog.text and "abandoned" not in caplog.text
    assert "waits for it" in caplog.text
    assert native_observer_holder() is None


def test_a_window_left_open_by_a_stopped_loop_gives_the_observer_to_the_next_hook(
    ops, caplog: pytest.LogCaptureFixture
) -> None:
    """A notebook cell raised inside its hook's window, and the next cell trains a new model
    with a new hook: the old window, which will never see another step, is abandoned (its
    observer no longer records every op of the process) and the new hook captures natively."""
    model, x = mlp(), torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, log_every=None)
    for _ in range(2):  # the window starts after step 0 and is open when the loop stops
        sgd_step(model, opt, x)
    assert ops.registered() and old.capture_status.startswith("capturing")
    new_model = mlp()
    new_opt = torch.optim.SGD(new_model.parameters(), lr=0.1)
    hook = ETSHook(new_model, optimizer=new_opt, capture_steps=2, skip_steps=1, log_every=None)
    with caplog.at_level("INFO", logger="ets_hook"):
        for _ in range(window_runner.STALE_HOLDER_STEPS + 4):
            sgd_step(new_model, new_opt, x)
        trace = hook.wait_for_trace(30)
    hook.close()
    assert old.capture_status.startswith("off") and "window abandoned" in old.capture_status
    assert hook.skip_steps == 1 + window_runner.STALE_HOLDER_STEPS
    assert trace is not None and trace.capture.op_capture == NativeOpCapture.name
    assert not ops.registered() and native_observer_holder() is None
    assert f"saw no step in {window_runner.STALE_HOLDER_STEPS} of this hook's" in caplog.text
    old.close()  # still closes cleanly afterwards


def test_a_window_that_waits_too_long_is_captured_by_the_profiler(ops, monkeypatch) -> None:
    monkeypatch.setattr(window_runner, "MAX_OBSERVER_WAIT_STEPS", 2)
    holder = NativeOpCapture(ops)  # another hook's window, not read in time
    holder.start(False)
    holder.stop()
    try:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None)
        for _ in range(7):
            sgd_step(model, opt, torch.randn(8, 16))
        hook.close()
        trace = hook.wait_for_trace(30)
    finally:
        holder.discard()
    assert hook.skip_steps == 3  # waited two steps, then started
    assert trace is not None and trace.capture.op_capture == ProfilerOpCapture.name
    assert "in use by another ETSHook" in hook.capture_status
    assert [it.step for it in trace.iterations] == [3, 4]


# ---------------------------------------------------------------------------------------------
# Build and fallback


def test_the_cache_key_follows_torch_and_sources(tmp_path: Path, monkeypatch) -> None:
    plan = native_ops.build_plan()
    assert plan.torch_version == torch.__version__
    assert plan.output.name.startswith("_ops") and torch.__version__ in plan.output.parent.name
    assert "-DNDEBUG" in plan.command
    assert native_ops.build_plan() == plan  # the same inputs: the same key and folder
    with monkeypatch.context() as patched:
        patched.setattr(torch, "__version__", "2.2.0")
        other_torch = native_ops.build_plan()
    assert other_torch.torch_version == "2.2.0"
    assert '-DETS_TORCH_VERSION="2.2.0"' in other_torch.command
    assert other_torch.key != plan.key and other_torch.output.parent != plan.output.parent
    # the sources count by content, not by where they are
    copy = tmp_path / "src"
    shutil.copytree(native_ops.source_dir(), copy)
    monkeypatch.setattr(native_ops, "source_dir", lambda: copy)
    assert native_ops.build_plan().key == plan.key
    header = copy / "string_table.h"
    header.write_text(header.read_text() + "\n// edited\n")
    edited = native_ops.build_plan()
    assert edited.key != plan.key and edited.output.parent != plan.output.parent
    monkeypatch.setenv("ETS_HOOK_CACHE_DIR", str(tmp_path))
    assert native_ops.build_plan().output.parent.parent == tmp_path


@pytest.mark.parametrize("mode", ["auto", "native"])
def test_a_module_built_for_another_torch_is_not_loaded_and_the_profiler_captures(
    ops, mode: str, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The cached module records the torch it was built against (``TORCH_VERSION``); one that
    records another torch than the running one is refused, with one log line naming why, and
    the profiler captures the window."""
    built_for_other = ModuleType(native_ops.MODULE_NAME)
    built_for_other.TORCH_VERSION = "2.2.0"  # type: ignore[attr-defined]
    monkeypatch.setattr(native_ops, "_module", None)  # not loaded yet in this process
    monkeypatch.setattr(native_ops, "_failure", None)
    monkeypatch.setattr(native_ops, "_import", lambda path: built_for_other)
    reason = f"built for torch 2.2.0, running {torch.__version__}"
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("INFO", logger="ets_hook"):
        hook = ETSHook(
            model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None, op_capture=mode
        )
        for _ in range(4):
            sgd_step(model, opt, torch.randn(8, 16))
        hook.close()
        trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert trace.capture.op_capture == ProfilerOpCapture.name
    assert [it.step for it in trace.iterations] == [1, 2]
    assert all(sum(op.name == "aten::linear" for op in it.ops) == 2 for it in trace.iterations)
    assert f"ops: {ProfilerOpCapture.name} (native observer: {reason})" in hook.capture_status
    assert native_ops.unavailable_reason() == reason
    lines = [r.getMessage() for r in caplog.records if "native op observer" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0], lines


FALLBACK = textwrap.dedent(
    """
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    from ets_hook import ETSHook
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, op_capture=sys.argv[1])
    for _ in range(4):
        opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
    hook.close()
    trace = hook.wait_for_trace(30)
    print("STATUS", hook.capture_status)
    print("OPS", trace.capture.op_capture, len(trace.iterations[0].ops))
    """
)


@pytest.mark.parametrize("mode", ["auto", "native"])
def test_without_a_compiler_the_profiler_captures_and_says_why(tmp_path: Path, mode: str) -> None:
    env = {**os.environ, "ETS_HOOK_CACHE_DIR": str(tmp_path / "empty"), "CXX": "no-such-cxx"}
    env["PATH"] = "/nonexistent"  # no g++ either
    run = subprocess.run(
        [sys.executable, "-c", FALLBACK, mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "STATUS done: ops: torch kineto cpu profiler (native observer: " in run.stdout
    assert "no C++ compiler" in run.stdout
    ops_line = next(line for line in run.stdout.splitlines() if line.startswith("OPS"))
    assert ops_line.startswith("OPS torch kineto cpu profiler") and int(ops_line.split()[-1]) > 0
    assert sum("native op observer unavailable" in line for line in run.stdout.splitlines()) == 1


def test_the_observer_can_be_switched_off(tmp_path: Path) -> None:
    env = {**os.environ, "ETS_HOOK_NATIVE_OPS": "0"}
    run = subprocess.run(
        [sys.executable, "-c", FALLBACK, "auto"], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "disabled by ETS_HOOK_NATIVE_OPS" in run.stdout


def test_the_window_measures_its_own_slowdown_from_the_ops_it_records() -> None:
    from ets_hook import ETSHook
    from ets_hook.capture.window import measured_capture_ratio

    # 1000 ops in a 2 ms step at 0.4-0.9 µs per op: 20-45% of the step is capture.
    lo, hi = measured_capture_ratio([0.002, 0.0021, 0.0019], [1000, 1000, 1000], (0.4, 0.9))
    assert lo == pytest.approx(1 / (1 - 0.2)) and hi == pytest.approx(1 / (1 - 0.45))
    assert measured_capture_ratio([], [], (0.4, 0.9)) is None
    capped = measured_capture_ratio([0.001], [10**6], (0.4, 0.9))  # capture capped at 80%
    assert capped == pytest.approx((5.0, 5.0))

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, op_capture="native")
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    assert len(hook._window_ops) == 3 and all(n > 20 for n in hook._window_ops)
    ratio = hook._forecaster.prior.capture_ratio
    # The measured slowdown (>= 1) times the prior's early range (0.95-1.05 plus the excess):
    # its low end dips under 1 when capture is a small share of the step (a slow sanitizer
    # build: 0.9988 once).
    assert ratio != NativeOpCapture.cpu_costs["capture_ratio"]
    assert 0.95 <= ratio[0] < ratio[1] and ratio[1] > 1.05
    # ... and the decode's one-off cost after it, from the same op counts
    spike = hook._forecaster.prior.capture_spike_steps
    assert spike != NativeOpCapture.cpu_costs["capture_spike_steps"] and 0.0 < spike[0] < spike[1]
    hook.close()


def test_the_decode_cost_after_the_window_scales_with_its_ops_over_the_step() -> None:
    from ets_hook.capture.ops import DecodeCost
    from ets_hook.capture.window import measured_spike_steps

    per_op = DecodeCost(fixed_s=(0.0, 0.0), us_per_op=(4.0, 25.0))
    # 2000 ops per step x 5 steps at 4-25 µs per op, steady step 4 ms / 1.25 = 3.2 ms
    lo, hi = measured_spike_steps([0.004] * 3, [2000] * 3, 5, (1.0, 1.5), per_op)
    assert lo == pytest.approx(10_000 * 4e-6 / 0.0032)
    assert hi == pytest.approx(10_000 * 25e-6 / 0.0032)
    # the same ops on a 25x longer step: 25x fewer steps
    long_lo, _ = measured_spike_steps([0.1] * 3, [2000] * 3, 5, (1.0, 1.5), per_op)
    assert long_lo == pytest.approx(lo / 25)
    # a fixed part (the trace model's set-up) is paid once, whatever the window's ops
    fixed = DecodeCost(fixed_s=(0.002, 0.020), us_per_op=(4.0, 25.0))
    f_lo, f_hi = measured_spike_steps([0.004] * 3, [2000] * 3, 5, (1.0, 1.5), fixed)
    assert f_lo == pytest.approx(lo + 0.002 / 0.0032)
    assert f_hi == pytest.approx(hi + 0.020 / 0.0032)
    assert measured_spike_steps([], [], 5, (1.0, 1.5), per_op) is None
    assert measured_spike_steps([0.0], [10], 5, (1.0, 1.5), per_op) is None
    assert measured_spike_steps([0.01], [10], 0, (1.0, 1.5), per_op) is None
