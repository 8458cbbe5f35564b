"""ETSHook's lifetime: every exit path of the script, close() from any thread, a second hook on
the same model, ETS_HOOK_DISABLE, a user's profiler inside the window, argument checks."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support import log_lines
from test_hook import assert_detached, batch, tiny_mlp, train
from torch import nn

from ets_hook import ETSHook
from ets_hook import hook as hook_module
from ets_hook.capture import native_ops

# One script, every way it can end: raise at window step N, sys.exit, Ctrl-C, SIGTERM, the end
# of the main module without close(). The window is steps 1-5 (skip 1, capture 5): step 5 is
# its last.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, torch
    from ets_hook import ETSHook
    mode, at, op_capture, status = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    stop = []
    if mode == "graceful":  # the application's own handler: finish 5 more steps, then end
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if mode == "handler-exit":  # the application's own handler ends the job itself
        def leave(signum, frame):
            sys.exit(143)
        signal.signal(signal.SIGTERM, leave)
    if mode == "thread-first-sigterm":  # a hook made and closed on another thread first
        other = threading.Thread(target=lambda: ETSHook(
            torch.nn.Linear(2, 2), total_steps=1, capture_steps=0, log_every=None).close())
        other.start()
        other.join()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def make():
        return ETSHook(model, optimizer=opt, total_steps=50, skip_steps=1, capture_steps=5,
                       op_capture=op_capture, status_path=status, log_every=None,
                       trace_path=status + ".ets")

    def train(hook):
        for step in range(50):
            if stop and step == at + 5:
                break
            model(torch.randn(4, 8)).sum().backward()
            if step == at:  # inside window step `at`, before its optimizer step ends it
                assert hook.capture_status.startswith("capturing"), hook.capture_status
                if mode.endswith("raise"):
                    raise RuntimeError("the user's own bug")
                if mode == "exit":
                    sys.exit(3)
                if mode.endswith("ctrl-c"):
                    raise KeyboardInterrupt
                if mode.endswith(("sigterm", "graceful", "handler-exit")):
                    os.kill(os.getpid(), signal.SIGTERM)
                if mode == "end":
                    break
            opt.step()
            opt.zero_grad()

    if mode.startswith("with-"):  # the README's context-manager form
        with make() as hook:
            train(hook)
    elif mode == "thread-raise":  # the loop runs on a thread of its own, which dies
        hook = make()
        loop = threading.Thread(target=train, args=(hook,))
        loop.start()
        loop.join()
        print("capture:", hook.capture_status, file=sys.stderr)
    else:
        train(make())
    """
)

# (mode, window step, op capture) -> (exit code, traceback printed, status state, error)
CASES = {
    ("raise", 2, "profiler"): (1, True, "failed", "RuntimeError"),
    ("raise", 3, "profiler"): (1, True, "failed", "RuntimeError"),
    ("raise", 5, "profiler"): (1, True, "failed", "RuntimeError"),
    ("raise", 3, "native"): (1, True, "failed", "RuntimeError"),
    ("exit", 3, "profiler"): (3, False, "closed", None),
    ("ctrl-c", 3, "profiler"): (-signal.SIGINT, True, "interrupted", None),  # shell: 130
    ("sigterm", 3, "profiler"): (-signal.SIGTERM, False, "interrupted", None),
    ("sigterm", 3, "native"): (-signal.SIGTERM, False, "interrupted", None),
    # 5 more steps, then the end: stopped by the SIGTERM before its 50 steps
    ("graceful", 3, "native"): (0, False, "interrupted", None),
    ("handler-exit", 3, "native"): (143, False, "interrupted", None),
    ("end", 3, "profiler"): (0, False, "closed", None),
    ("end", 3, "native"): (0, False, "closed", None),
    ("with-raise", 3, "native"): (1, True, "failed", "RuntimeError"),
    ("with-ctrl-c", 3, "native"): (-signal.SIGINT, True, "interrupted", None),
    ("thread-raise", 3, "native"): (0, True, "failed", "RuntimeError"),  # the process goes on
    ("thread-first-sigterm", 3, "native"): (-signal.SIGTERM, False, "interrupted", None),
}
#: Modes that leave the window by closing the hook (the ``with`` block's end): the steps it
#: captured are decoded and written; every other way out of the window writes no trace.
TRACE_WRITTEN = ("graceful", "with-raise", "with-ctrl-c")


# Runs each case of CASES as its own process, forked from one interpreter that has imported
# torch, torch._dynamo (which the script's optimizer imports) and ets_hook -- ~5 s of a 6 s
# process here -- and done nothing else: no hook, no op, no thread. Each child is then a
# script from its first line on: its own argv and stderr (a file), SCRIPT run as __main__,
# and the interpreter's own exit after it (uncaught exceptions, SystemExit, signals, atexit)
# as for `python -c`.
# Prints one JSON object: case index -> exit code (negative: the signal, as subprocess says).
FORK_EACH_CASE = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch, torch._dynamo
    import ets_hook
    script, runs = sys.argv[1], json.loads(sys.argv[2])
    gc.freeze()  # the imports' objects: no child's collections copy their pages (1.6 -> 0.6 s)
    children = {}
    for index, (argv, stderr_path) in enumerate(runs):
        pid = os.fork()
        if pid == 0:
            err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 2)
            os.close(err)
            sys.argv = ["-c", *argv]
            del children, runs
            exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
            break  # the end of the child's main module: the interpreter exits as usual
        children[pid] = index
    else:
        codes = {}
        while children:
            pid, status = os.wait()
            codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
        print(json.dumps(codes))
    """
)


@pytest.fixture(scope="module")
def exit_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, tuple]:
    """Every case of CASES run at once (a process each), with its output and status file."""
    folder = tmp_path_factory.mktemp("exits")
    cases = list(CASES)
    statuses = [folder / ("-".join(map(str, case)) + ".json") for case in cases]
    runs = [
        ([case[0], str(case[1]), case[2], str(status)], f"{status}.stderr")
        for case, status in zip(cases, statuses, strict=True)
    ]
    parent = subprocess.run(
        [sys.executable, "-c", FORK_EACH_CASE, SCRIPT, json.dumps(runs)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert parent.returncode == 0, parent.stderr[-3000:]
    codes = json.loads(parent.stdout.strip().splitlines()[-1])
    results = {}
    for index, (case, status) in enumerate(zip(cases, statuses, strict=True)):
        err = Path(f"{status}.stderr").read_text()
        doc = json.loads(status.read_text()) if status.exists() else None
        results[case] = (codes[str(index)], err, doc, status)
    return results


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "-".join(map(str, c)))
def test_every_exit_path_closes_the_hook_before_torch_is_torn_down(exit_runs, case) -> None:
    code, traceback, state, error = CASES[case]
    returncode, stderr, doc, _ = exit_runs[case]
    assert returncode == code, stderr[-3000:]
    assert returncode != -signal.SIGSEGV and "Segmentation fault" not in stderr
    assert "Requested callback is not found" not in stderr
    assert ("Traceback (most recent call last)" in stderr) is traceback, stderr[-3000:]
    if case[0].endswith("raise"):
        assert "RuntimeError: the user's own bug" in stderr
    if case[0] == "thread-raise":  # the process goes on: its thread, not its exit, ended it
        assert "window cut short: the training thread died of RuntimeError" in stderr
    assert doc is not None, "the status file was never written"
    assert (doc["state"], doc["error"]) == (state, error)
    assert doc["prediction"]["step"] == case[1] + (5 if case[0] == "graceful" else 0)
    # Every other case ends inside the window: no trace, and one line says so.
    trace_written = Path(f"{exit_runs[case][3]}.ets").exists()
    assert trace_written is (case[0] in TRACE_WRITTEN)
    said = "no trace written to" in stderr and "inside the capture window" in stderr
    assert said is (case[0] not in TRACE_WRITTEN), stderr[-2000:]


# A notebook: cell 1 raises inside the hook's window; cell 2 goes on training with the same hook
# (as after fixing the bug); cell 3 closes it. Run by a real IPython shell.
NOTEBOOK_CELLS = [
    """
import torch
from ets_hook import ETSHook
from ets_hook.capture import native_ops
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
hook = ETSHook(model, optimizer=opt, total_steps=50, capture_steps=5, op_capture="native",
               log_every=None)
for step in range(3):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
assert hook.capture_status.startswith("capturing"), hook.capture_status
raise ValueError("a shape bug")
""",
    """
after_cell_1 = (native_ops.load().registered(), hook.capture_status)
for step in range(4):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
""",
    """
steps = hook.steps_completed
hook.close()
""",
]
# Runs cells (argv[1], JSON) in a real IPython shell, with ``STATUS`` = argv[2] in its namespace;
# prints each cell's success and error type, and each expression of argv[3] (JSON: name ->
# Python expression) evaluated in the shell's namespace after the last cell.
NOTEBOOK = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.user_ns["STATUS"] = sys.argv[2]
    results = [shell.run_cell(cell) for cell in json.loads(sys.argv[1])]
    report = {name: eval(expression, shell.user_ns) for name, expression in
              json.loads(sys.argv[3]).items()}
    print(json.dumps({
        "success": [r.success for r in results],
        "errors": [type(r.error_in_exec).__name__ if r.error_in_exec else None
                   for r in results],
        **report,
    }))
    """
)


def run_notebook(cells: list[str], report: dict[str, str], status: str = "") -> dict[str, Any]:
    """``NOTEBOOK`` in a fresh interpreter: its printed result."""
    run = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, json.dumps(cells), status, json.dumps(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_notebook_cell_that_raises_inside_the_window_stops_its_capture() -> None:
    """In IPython an exception ends the cell, not the process: the window the cell left open
    is abandoned after it (its observer would record every op of the later cells) and the same
    hook goes on timing steps in the next cell."""
    result = run_notebook(
        NOTEBOOK_CELLS,
        {
            "registered_after_cell_1": "after_cell_1[0]",
            "status_after_cell_1": "after_cell_1[1]",
            "steps": "steps",
            "status_at_end": "hook.capture_status",
        },
    )
    assert result["success"] == [False, True, True] and result["errors"][0] == "ValueError"
    assert result["registered_after_cell_1"] is False
    assert result["status_after_cell_1"].startswith("off")
    assert "window abandoned: the notebook cell raised ValueError" in result["status_after_cell_1"]
    assert result["steps"] == 7  # the same hook times the next cell's steps
    assert result["status_at_end"] == result["status_after_cell_1"]


# A notebook user: trains in cell 1, reads the output (cell 2), closes in cell 3; then trains a
# new hook and interrupts its cell (4), and re-runs the cell (5), which replaces it.
PAUSED_CELLS = [
    """
import json, logging, time, torch
from ets_hook import ETSHook
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("ets_hook").addHandler(Keep())
logging.getLogger("ets_hook").setLevel(logging.INFO)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
hook = ETSHook(model, optimizer=opt, total_steps=100, capture_steps=0, log_every=None)
for step in range(20):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
""",
    "time.sleep(1.3)",
    "hook.close()",
    """
second = ETSHook(model, optimizer=opt, total_steps=100, capture_steps=0, log_every=None,
                 status_path=STATUS)
for step in range(10):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
raise KeyboardInterrupt
""",
    """
third = ETSHook(model, optimizer=opt, total_steps=100, capture_steps=0, log_every=None)
state = json.load(open(STATUS))["state"]
model(torch.randn(4, 8)).sum().backward()
opt.step()
third.close()
""",
]


def test_a_notebook_pause_is_not_missed_steps_and_an_interrupted_cell_ends_interrupted(
    tmp_path: Path,
) -> None:
    """Time between cells is the user's: a close in a later cell is not warned about steps it
    did not count. A hook whose cell was interrupted, and that a re-run cell replaces, ends
    "interrupted" (not "closed", as a finished job would)."""
    result = run_notebook(
        PAUSED_CELLS, {"said": "said", "state": "state"}, status=str(tmp_path / "s.json")
    )
    assert result["success"] == [True, True, True, False, True]
    said = result["said"]
    assert not [m for m in said if "were not counted" in m], said
    assert result["state"] == "interrupted"  # the second hook's status file, once replaced


def test_hook_step_called_twice_per_step_counts_once() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(10):  # through the window and past it
        x, y = batch()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        hook.step()
        hook.step()  # e.g. once in the loop and once in a callback
    assert hook.steps_completed == 10
    # An iteration whose optimizer step was skipped (a forward, no step) still counts.
    for _ in range(3):
        x, y = batch()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        hook.step()
        hook.step()
    assert hook.steps_completed == 13
    hook.close()


def test_a_second_hook_on_the_same_model_replaces_the_first(caplog) -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = ETSHook(model, optimizer=opt, capture_steps=0, log_every=None)
    train(model, opt, first, 2)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        second = ETSHook(model, optimizer=opt, capture_steps=0, log_every=None)
    assert [m for m in log_lines(caplog) if "replaces the previous one" in m]
    train(model, opt, second, 3)
    assert (first.steps_completed, second.steps_completed) == (2, 3)
    assert len(model._forward_pre_hooks) == 1  # only the second hook's
    second.close()
    assert_detached(model)
    # A notebook cell re-run before training: the replaced hook says nothing of its zero steps.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        ETSHook(model, optimizer=opt, capture_steps=0, log_every=None)
        again = ETSHook(model, optimizer=opt, capture_steps=0, log_every=None)
    assert [m for m in log_lines(caplog) if "replaces the previous one" in m]
    assert not [m for m in log_lines(caplog) if "without a single training step" in m]
    again.close()
    # A hook on another model is left alone.
    other = tiny_mlp()
    third = ETSHook(other, capture_steps=0, log_every=None)
    fourth = ETSHook(model, capture_steps=0, log_every=None)
    assert not third._closed and not fourth._closed
    third.close()
    fourth.close()


def test_ets_hook_disable_turns_every_hook_into_a_no_op(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ETS_HOOK_DISABLE", "1")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    status = tmp_path / "eta.json"
    hook = ETSHook(model, optimizer=opt, total_steps=10, status_path=status, progress=False)
    assert_detached(model)  # nothing installed at all
    train(model, opt, hook, 4)
    with hook.phase("eval"):
        pass
    assert hook.steps_completed == 0 and hook.prediction is None
    assert hook.capture_status == "off: disabled by ETS_HOOK_DISABLE"
    assert hook.wait_for_trace(0.1) is None
    hook.close()
    assert not status.exists()
    # Arguments are still checked: a typo fails the same with the switch on.
    with pytest.raises(ValueError, match="capture_steps"):
        ETSHook(model, capture_steps=-1)
    monkeypatch.setenv("ETS_HOOK_DISABLE", "0")
    live = ETSHook(model, optimizer=opt, capture_steps=0, log_every=None)
    train(model, opt, live, 2)
    assert live.steps_completed == 2
    live.close()


def _close_from_another_thread(hook: ETSHook) -> None:
    thread = threading.Thread(target=hook.close)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()


def test_close_from_another_thread_removes_the_native_callback_before_returning() -> None:
    module = native_ops.load(build_if_missing=True)
    assert module is not None, native_ops.unavailable_reason()
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=5, skip_steps=1, op_capture="native")
    train(model, opt, hook, 3)
    assert hook.capture_status.startswith("capturing") and module.registered()
    _close_from_another_thread(hook)
    assert not module.registered()
    assert hook.capture_status.startswith(("decoding", "done"))
    assert "window cut short after 2 steps" in hook.capture_status
    trace = hook.wait_for_trace(60)
    assert trace is not None and len(trace.iterations) == 2
    _close_from_another_thread(hook)  # idempotent, from any thread
    hook.close()
    assert_detached(model)


def test_close_from_another_thread_on_the_profiler_path_ends_at_the_next_step() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=5, skip_steps=1, op_capture="profiler")
    train(model, opt, hook, 3)
    assert torch.autograd._profiler_enabled()
    _close_from_another_thread(hook)
    # Only the thread that started the session may end it: at its next hook call.
    train(model, opt, hook, 1)
    assert not torch.autograd._profiler_enabled()
    assert "window cut short" in hook.capture_status
    assert hook.wait_for_trace(60) is not None
    steps = hook.steps_completed
    train(model, opt, hook, 2)
    assert hook.steps_completed == steps  # closed: nothing counts any more
    assert_detached(model)


def test_a_user_profiler_opened_inside_the_window_keeps_its_trace(caplog) -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook = ETSHook(model, optimizer=opt, capture_steps=5, skip_steps=1, op_capture="profiler")
        train(model, opt, hook, 2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as user:
            train(model, opt, hook, 6)  # past the window's end
        train(model, opt, hook, 2)
    names = {event.name for event in user.events()}
    assert "aten::addmm" in names and "Optimizer.step#SGD.step" in names
    assert sum(e.name == "aten::addmm" for e in user.events()) >= 12  # 6 steps x 2 layers
    assert hook.capture_status.startswith("off:")
    assert "torch.profiler session was opened inside the capture window" in hook.capture_status
    assert len([m for m in log_lines(caplog) if "opened inside the capture" in m]) == 1
    assert hook.steps_completed == 10 and hook.prediction is not None
    hook.close()
    assert_detached(model)


def test_a_user_profiler_beside_the_native_window_both_traces_complete() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, op_capture="native")
    train(model, opt, hook, 2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as user:
        train(model, opt, hook, 4)
    trace = hook.wait_for_trace(60)
    assert trace is not None and [len(it.ops) > 20 for it in trace.iterations] == [True] * 3
    assert sum(e.name == "aten::addmm" for e in user.events()) >= 8
    hook.close()


def test_wait_for_trace_returns_at_once_when_capture_never_runs() -> None:
    model = tiny_mlp()
    hook = ETSHook(model, capture_steps=0, log_every=None)
    waited = threading.Event()

    def wait() -> None:
        hook.wait_for_trace()  # no timeout: must not block
        waited.set()

    threading.Thread(target=wait, daemon=True).start()
    assert waited.wait(10)
    hook.close()


@pytest.mark.parametrize("skip_steps", [1, 2])
def test_a_job_that_ends_before_a_window_step_says_so(tmp_path, caplog, skip_steps) -> None:
    """One step: the window never starts (from step 2), or starts after it but no window step
    ends (from step 1). Either way the status says why (not "waiting", nor "done" with an
    empty trace), and a trace file asked for is reported as not written."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trace = tmp_path / "t.ets"
    hook = ETSHook(
        model, optimizer=opt, total_steps=1, skip_steps=skip_steps, trace_path=trace,
        log_every=None,
    )  # fmt: skip
    x, y = batch()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook.close()
    assert hook.capture_status.startswith("off")
    assert (
        f"the job ended after 1 steps, before a window step (the window starts at step "
        f"{skip_steps})"
    ) in hook.capture_status
    assert hook.wait_for_trace(0) is None and not trace.exists()
    assert f"no trace written to {trace}" in caplog.text


def test_arguments_are_checked_at_construction(tmp_path) -> None:
    model = tiny_mlp()
    with pytest.raises(ValueError, match=r"initial_step \(20\) is past the job's end"):
        ETSHook(model, total_steps=10, initial_step=20)
    with pytest.raises(ValueError, match="trace_path's directory does not exist"):
        ETSHook(model, trace_path=tmp_path / "missing" / "run.ets")
    with pytest.raises(ValueError, match="trace_path is a directory"):
        ETSHook(model, trace_path=tmp_path)
    with pytest.raises(ValueError, match=r"only field is \{rank\}"):
        ETSHook(model, trace_path=str(tmp_path / "run-{rank}-{host}.ets"))
    if Path("/proc/self").is_dir():  # a folder that takes no new file, even for root
        with pytest.raises(ValueError, match=r"trace_path cannot be written: /proc/run\.ets"):
            ETSHook(model, trace_path="/proc/run.ets")
        with pytest.raises(ValueError, match=r"status_path cannot be written: /proc/eta\.json"):
            ETSHook(model, status_path="/proc/eta.json")
    assert list(tmp_path.iterdir()) == []  # nothing created by the checks
    with pytest.raises(ValueError, match="deadline_policy must be one of"):
        ETSHook(model, deadline=False, deadline_policy="sometimes")
    with pytest.raises(ValueError, match="optimizer must be"):
        ETSHook(model, optimizer=42)
    hook = ETSHook(model, total_steps=10, initial_step=10, capture_steps=0)  # already done
    hook.close()


def test_a_job_resumed_at_its_end_is_not_told_it_never_trained(caplog) -> None:
    """A re-run from the last checkpoint (``initial_step == total_steps``): the loop runs no
    step, which is right; the close says so, not that the hook was misused."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        hook = ETSHook(model, optimizer=opt, total_steps=40, initial_step=40, log_every=None)
        hook.close()
    lines = log_lines(caplog)
    assert not [m for m in lines if "without a single training step" in m], lines
    assert "closed with nothing left to run: the job resumed at step 40 of 40" in lines


def test_the_progress_bar_says_done_at_the_last_step() -> None:
    tqdm = pytest.importorskip("tqdm")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with open(os.devnull, "w") as sink:
        bar = tqdm.tqdm(total=12, file=sink)
        hook = ETSHook(model, optimizer=opt, total_steps=12, progress=bar, capture_steps=0)
        train(model, opt, hook, 12)
        hook.close()
        assert bar.postfix.endswith("· done"), bar.postfix
        assert "ETA" not in bar.postfix
        bar.close()


def test_status_file_mode_follows_the_umask(tmp_path) -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = os.umask(0o022)
    try:
        hook = ETSHook(
            model,
            optimizer=opt,
            capture_steps=2,
            status_path=tmp_path / "eta.json",
            trace_path=tmp_path / "run.ets",
        )
        train(model, opt, hook, 4)
        hook.close()
    finally:
        os.umask(old)
    for name in ("eta.json", "run.ets"):
        assert (Path(tmp_path / name).stat().st_mode & 0o777) == 0o644, name


@pytest.mark.parametrize("capture_steps", [0, None])
def test_the_job_runs_bare_after_the_windows_steps_even_without_a_window(
    capture_steps: int | None,
) -> None:
    """The step detector's module hook (a forward pre-hook on the model) goes after the
    capture window; with capture_steps=0 it stayed for the whole job (~1 µs a forward)."""
    from ets_hook.hook import BARE_AFTER_STEP

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, opt, total_steps=100, capture_steps=capture_steps, log_every=None)
    installed = []
    for _ in range(BARE_AFTER_STEP + 3):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        installed.append(len(model._forward_pre_hooks))
    hook.close()
    assert installed[0] == 1 and installed[-1] == 0
    assert hook.steps_completed == BARE_AFTER_STEP + 3


def test_the_status_file_shows_the_predictions_the_log_prints(tmp_path) -> None:
    """The status file is rewritten after local steps 1, 3 and 5 (the log's early lines), not
    only at the first step and then every 5 s: ``ets-hook watch`` shows the step-3 and step-5
    answers as the log does."""
    status = tmp_path / "eta.json"
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, total_steps=100, status_path=status, capture_steps=0,
        log_every=None,
    )  # fmt: skip
    shown = {}
    for step in range(1, 6):
        train(model, opt, hook, 1, call_step=False)
        shown[step] = json.loads(status.read_text())["prediction"]["step"]
    hook.close()
    assert (shown[1], shown[3], shown[5]) == (1, 3, 5)


@pytest.mark.parametrize(
    ("outcome", "error", "line"),
    [
        ("closed", None, "finished at step 5 after "),
        ("failed", "RuntimeError", "failed at step 5 after "),
        ("interrupted", None, "interrupted at step 5 after "),
    ],
)
def test_the_last_log_line_says_how_the_job_ended(
    outcome: str, error: str | None, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop that raised does not end with "finished at step 5": the last line says the job
    failed (and with what) or was interrupted there."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=100, capture_steps=0, verbose=False)
    train(model, opt, hook, 5, call_step=False)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        hook.close_at_exit(outcome, error)
    last = log_lines(caplog)[-1]
    assert last.startswith(line), last
    assert last.endswith(" (RuntimeError)") is (outcome == "failed")
    assert (outcome == "closed") is ("finished" in " ".join(log_lines(caplog)))


class _NoSlots:
    __slots__ = ()

    def update(self) -> None:
        pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, r"device must be a device of type cpu/cuda/mps/xpu .*got 'tpu'"),
        ({"device": "meta"}, r"device must be of type cpu/cuda/mps/xpu, got 'meta'"),
        ({"device": 99}, r"device=99: an int names a CUDA device \(cuda:99\)"),
        ({"device": 1.5}, r"device must be a device string .*got 1\.5"),
        ({"device": True}, r"device must be a device string .*got True"),
        ({"grad_scaler": "OPTIMIZER"}, r"grad_scaler must be a torch\.amp\.GradScaler .*got a "
         r"SGD \(an optimizer: pass it as optimizer=\)"),
        ({"grad_scaler": _NoSlots()}, r"grad_scaler must accept attributes"),
        ({"log_every": -1}, r"log_every must be an int >= 1 .*0 or None .*got -1"),
        ({"log_every": 2.5}, r"log_every must be .*got 2\.5"),
        ({"epochs": 2, "total_steps": None}, r"epochs=2 needs the length of an epoch: pass "
         r"steps_per_epoch= .*dataloader="),
        # The whole value is named, not its first item or a dump of its weights.
        ({"optimizer": "adam"}, r"optimizer must be a torch\.optim\.Optimizer.*got 'adam'$"),
        ({"optimizer": "MODEL"}, r"optimizer must be .*got a Sequential model \(pass its "
         r"optimizer\)$"),
        ({"optimizer": "PARAMETERS"}, r"optimizer must be .*got a generator \(parameters; pass "
         r"the optimizer\)$"),
        ({"optimizer": {"lr": 0.1}}, r"optimizer must be .*got \{'lr': 0\.1\}$"),
        ({"optimizer": []}, r"optimizer must hold at least one optimizer, got an empty list"),
        ({"phase_every": "eval"}, r"phase_every must be a mapping of phase name to period in "
         r"steps, e\.g\. \{'eval': 100\}, got 'eval'"),
        ({"progress": "yes"}, r"progress must be True, False, None or a tqdm bar .*got 'yes'"),
        ({"capture_kernels": "yes"}, r"capture_kernels must be True, False or None .*got 'yes'"),
        ({"capture_kernels": 0}, r"capture_kernels must be True, False or None .*got 0"),
    ],
)  # fmt: skip
def test_bad_constructor_arguments_are_value_errors_naming_them(kwargs: dict, message: str) -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"total_steps": 10, "optimizer": opt, **kwargs}
    if kwargs.get("grad_scaler") == "OPTIMIZER":
        kwargs["grad_scaler"] = opt
    if kwargs["optimizer"] in ("MODEL", "PARAMETERS"):
        kwargs["optimizer"] = model if kwargs["optimizer"] == "MODEL" else model.parameters()
    with pytest.raises(ValueError, match=message) as raised:
        ETSHook(model, **kwargs)
    assert "batches_per_epoch" not in str(raised.value)  # an argument ETSHook does not take


@pytest.mark.parametrize("timeout_s", ["x", -1, float("nan"), True])
def test_a_bad_wait_limit_is_a_value_error_and_close_still_works(timeout_s: Any) -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=10, capture_steps=2, log_every=None)
    train(model, opt, hook, 4)
    with pytest.raises(ValueError, match=r"timeout_s must be a number of seconds >= 0 or None"):
        hook.wait_for_trace(timeout_s)
    with pytest.raises(ValueError, match=r"timeout_s must be a number of seconds >= 0 or None"):
        hook.close(timeout_s)
    assert not hook.closed  # nothing was closed by the bad call
    hook.close(np.float32(30))
    assert hook.closed and hook.wait_for_trace(None) is not None


def test_a_deadline_already_past_warns_and_the_job_still_runs(caplog) -> None:
    """A job restarted after its deadline must start: one warning at creation, then the
    guard reports the miss at the first step (as a warning here: ``on_deadline="warn"``)."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook = ETSHook(model, optimizer=opt, total_steps=10, deadline=datetime(2020, 1, 1))
        train(model, opt, hook, 3)
        hook.close()
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        re.search(
            r"deadline=datetime\.datetime\(2020, 1, 1, 0, 0\) has already passed "
            r"\(\d+d\d\dh ago, naive = local time\)",
            line,
        )
        for line in lines
    ), lines
    assert hook.steps_completed == 3
    assert any("deadline" in line and "passed" in line and "before start" in line for line in lines)


def test_a_cuda_device_without_cuda_is_a_value_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda:0': cuda is not available"):
        ETSHook(tiny_mlp(), total_steps=10, device="cuda:0")
    with pytest.raises(ValueError, match=r"device=0: an int names a CUDA device \(cuda:0\); "):
        ETSHook(tiny_mlp(), total_steps=10, device=0)


def test_good_values_of_the_checked_arguments_are_accepted() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for kwargs in (
        {"device": "cpu", "log_every": 0},
        {"device": torch.device("cpu"), "log_every": None, "grad_scaler": scaler},
        {"deadline": datetime.now() + timedelta(hours=1), "epochs": 2, "steps_per_epoch": 5},
    ):
        hook = ETSHook(model, optimizer=opt, capture_steps=0, **kwargs)
        assert hook.total_steps == (10 if "epochs" in kwargs else None)
        hook.close()


def test_closing_without_a_single_step_says_how_steps_end(caplog) -> None:
    """An inference loop (eval mode, no_grad) with no optimizer and no hook.step() times
    nothing: one warning at close says what ends a step, instead of a silent null prediction."""
    model = tiny_mlp()
    hook = ETSHook(model, total_steps=10, capture_steps=0, log_every=None)
    with torch.no_grad():
        model.eval()
        for _ in range(5):
            model(batch()[0])
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook.close()
    said = [
        r.getMessage() for r in caplog.records if "without a single training step" in r.getMessage()
    ]
    assert len(said) == 1 and "hook.step() per batch" in said[0]
    assert hook.prediction is None
    # With hook.step() per batch, the same loop is timed, and nothing is said.
    caplog.clear()
    hook = ETSHook(model, total_steps=10, capture_steps=0, log_every=None)
    with torch.no_grad():
        for _ in range(3):
            model(batch()[0])
            hook.step()
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook.close()
    assert hook.steps_completed == 3
    assert not [r for r in caplog.records if "without a single" in r.getMessage()]


FORKS = textwrap.dedent(
    """
    import json, multiprocessing, os, signal, sys, time
    import torch
    from torch import nn
    from ets_hook import ETSHook

    status = sys.argv[1]
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=40, status_path=status, log_every=None)

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()

    def state():
        with open(status) as f:
            data = json.load(f)
        return data["state"], data["pid"], data["prediction"]["step"]

    train(6)
    print("parent", os.getpid(), flush=True)
    seen = [state()]
    child = os.fork()
    if child == 0:  # trains on the parent's hook, then ends through sys.exit (atexit runs)
        train(10)
        sys.exit(0)
    os.waitpid(child, 0)
    seen.append(state())
    ctx = multiprocessing.get_context("fork")
    worker = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    worker.start()
    time.sleep(0.5)
    worker.terminate()  # SIGTERM: the handler inherited from the parent runs in the worker
    worker.join()
    seen.append(state())
    train(4)
    print("steps", hook.steps_completed, flush=True)
    hook.close()
    seen.append(state())
    print("seen", json.dumps(seen), flush=True)
    """
)


def test_a_forked_process_never_closes_or_writes_the_parents_hook(tmp_path) -> None:
    """A forked child that trains on the inherited hook and exits, and a fork worker ended by
    SIGTERM: neither counts a step, closes the parent's hook or writes its status file."""
    status = tmp_path / "eta.json"
    run = subprocess.run(
        [sys.executable, "-c", FORKS, str(status)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    parent = int(lines["parent"])
    seen = json.loads(lines["seen"])
    assert int(lines["steps"]) == 10
    assert seen[:3] == [["running", parent, seen[0][2]]] * 3
    assert seen[3] == ["closed", parent, 10]  # its 10 steps, none of the child's
    assert "interrupted" not in run.stderr and "finished at step 16" not in run.stderr


def test_closing_without_a_step_when_only_a_part_of_the_model_trained_says_so(caplog) -> None:
    """No optimizer, a manual update, and the loop calls ``model.net`` (never the model): no
    step can be seen; the warning names that, not an inference loop."""
    model = nn.Sequential()
    model.add_module("net", tiny_mlp())
    hook = ETSHook(model, total_steps=10, capture_steps=0, log_every=None)
    for _ in range(3):
        x, y = batch()
        nn.functional.cross_entropy(model.net(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook.close()
    said = [
        r.getMessage() for r in caplog.records if "without a single training step" in r.getMessage()
    ]
    assert len(said) == 1 and "never the model itself" in said[0]
    assert "pass optimizer=" in said[0]


def _warnings_of(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ets_hook" and r.levelno >= logging.WARNING and needle in r.getMessage()
    ]


@pytest.mark.parametrize("new_stage", [False, True])
def test_steps_of_an_optimizer_made_after_the_hook_are_named_at_close(
    new_stage: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fine-tuning recipe: a new optimizer when the backbone is unfrozen. Its steps are not
    # counted (Limitations); at close the hook says so instead of a silent "finished".
    monkeypatch.setattr(hook_module, "UNSEEN_STEPS_MIN_S", 0.05)
    model = tiny_mlp()
    first = torch.optim.SGD(model.parameters(), lr=0.01)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    hook = ETSHook(model, optimizer=first, total_steps=60, capture_steps=0, log_every=None)
    train(model, first, hook, 10, call_step=False)
    second = torch.optim.SGD(model.parameters(), lr=0.001) if new_stage else first
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:
        train(model, second, hook, 1, call_step=False)
    hook.close()
    said = _warnings_of(caplog, "optimizer made after the hook")
    if new_stage:
        assert hook.steps_completed == 10
        assert len(said) == 1 and "closed at step 10 of 60" in said[0], said
    else:
        assert hook.steps_completed > 10 and said == []


def test_anomaly_detection_in_the_early_steps_is_named(caplog: pytest.LogCaptureFixture) -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    caplog.set_level(logging.WARNING, logger="ets_hook")
    hook = ETSHook(model, optimizer=opt, total_steps=20, capture_steps=0, log_every=None)
    train(model, opt, hook, 2, call_step=False)
    assert _warnings_of(caplog, "anomaly detection") == []
    with torch.autograd.set_detect_anomaly(True):
        train(model, opt, hook, 3, call_step=False)
    train(model, opt, hook, 3, call_step=False)
    hook.close()
    assert len(_warnings_of(caplog, "anomaly detection is on")) == 1
