"""ETSHook on real training loops: step counting, capture window, phases, detach, fallbacks."""

from __future__ import annotations

import logging
import statistics
import time

import pytest
import torch
from torch import nn

from ets_hook import ETSHook, Phase
from ets_hook.capture.window import DEFAULT_SKIP_STEPS
from ets_hook.forecast.early_stop import EarlyStopTracker
from ets_hook.trace.io import load_trace


def tiny_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(n: int = 8):
    return torch.randn(n, 16), torch.randint(0, 4, (n,))


def train(model, opt, hook, steps, *, call_step=True):
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if call_step:
            hook.step()


def assert_detached(model: nn.Module) -> None:
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks
        assert not module._backward_hooks
    assert not torch.autograd._profiler_enabled()


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.lstm(self.emb(x))
        return self.head(out[:, -1])


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(dim=1))


MODELS = {
    "mlp": (tiny_mlp, lambda: torch.randn(8, 16)),
    "cnn": (CNN, lambda: torch.randn(4, 3, 8, 8)),
    "lstm": (LSTMNet, lambda: torch.randint(0, 50, (4, 6))),
    "transformer": (Encoder, lambda: torch.randint(0, 50, (4, 6))),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("give_optimizer", [True, False])
def test_real_loops_capture_the_window(name, give_optimizer, tmp_path):
    make_model, make_input = MODELS[name]
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    hook = ETSHook(
        model,
        optimizer=opt if give_optimizer else None,
        total_steps=8,
        capture_steps=3,
        skip_steps=2,
        trace_path=tmp_path / "trace.ets",
    )
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(8):
        opt.zero_grad()
        loss_fn(model(make_input()), torch.randint(0, 4, (make_input().shape[0],))).backward()
        opt.step()
    hook.close()
    assert hook.steps_completed == 8
    assert len(hook.step_times_s) == 8
    trace = hook.trace
    assert trace is not None, hook.capture_status
    assert [it.step for it in trace.iterations] == [2, 3, 4]
    for iteration in trace.iterations:
        phases = {op.phase for op in iteration.top_level_ops()}
        assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= phases
        assert all(
            iteration.start_ns <= op.start_ns < iteration.end_ns for op in iteration.top_level_ops()
        )
        assert iteration.ops[0].input_shapes, "shapes recorded or copied in every step"
    assert_detached(model)
    assert load_trace(tmp_path / "trace.ets") == trace


def test_explicit_step_is_absorbed_and_never_double_counts():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=0)
    train(model, opt, hook, 6, call_step=True)
    assert hook.steps_completed == 6
    hook.close()


def test_explicit_step_only_loop_without_optimizer_object():
    model = tiny_mlp()
    hook = ETSHook(model, capture_steps=2, skip_steps=1)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(5):
        x, y = batch()
        loss = loss_fn(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= 0.1 * g
        hook.step()
    hook.close()
    assert hook.steps_completed == 5
    assert [it.step for it in hook.wait_for_trace(10).iterations] == [1, 2]


def test_forward_marks_steps_when_nothing_else_does():
    model = tiny_mlp()
    hook = ETSHook(model, capture_steps=0)
    for _ in range(5):
        x, _ = batch()
        model(x).sum().backward()
    # Steps run forward-to-forward: five forwards end four steps; the fifth ends at close.
    assert hook.steps_completed == 4
    hook.close()
    assert hook.steps_completed == 5


def test_the_default_window_starts_after_three_clean_steps():
    """``skip_steps=None`` is ``DEFAULT_SKIP_STEPS`` (3) unless steps compile: the steps the
    step-3 prediction rests on (2 and 3) run without capture, and so does their decode."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, log_every=None)
    train(model, opt, hook, 2)
    waiting = hook.capture_status
    train(model, opt, hook, 1)
    started = hook.capture_status  # opened at the end of step 3, for step 4
    train(model, opt, hook, 3)
    hook.close()
    assert waiting.startswith("waiting") and started.startswith("capturing")
    trace = hook.wait_for_trace(30)
    assert hook.skip_steps == DEFAULT_SKIP_STEPS == 3
    assert trace is not None and [it.step for it in trace.iterations] == [3, 4]


def test_gradient_accumulation_counts_optimizer_steps():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1)
    loss_fn = nn.CrossEntropyLoss()
    for _step in range(5):
        for _micro in range(4):
            x, y = batch()
            (loss_fn(model(x), y) / 4).backward()
        opt.step()
        opt.zero_grad()
    hook.close()
    assert hook.steps_completed == 5
    trace = hook.wait_for_trace(10)
    forwards = [op for op in trace.iterations[0].top_level_ops() if op.name == "aten::linear"]
    assert len(forwards) == 4 * 2  # two linears per micro-batch, four micro-batches


def test_declared_accumulation_without_the_optimizer_counts_optimizer_steps():
    """``grad_accum_steps`` given, the optimizer not: the micro-batches before the first
    optimizer step (when forwards still mark steps) are not steps either."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, total_steps=5, grad_accum_steps=4, capture_steps=0, log_every=None)
    for _step in range(5):
        for _micro in range(4):
            x, y = batch()
            (nn.functional.cross_entropy(model(x), y) / 4).backward()
        opt.step()
        opt.zero_grad()
    assert hook.prediction is not None and hook.prediction.eta_s == 0.0
    hook.close()
    assert hook.steps_completed == 5


def test_optimizer_not_given_uses_any_optimizer_and_direct_forward_calls():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, capture_steps=0)
    for _ in range(4):
        x, y = batch()
        opt.zero_grad()
        nn.functional.cross_entropy(model.forward(x), y).backward()  # no module hooks fire
        opt.step()
    hook.close()
    assert hook.steps_completed == 4


def test_step_zero_starts_at_a_submodules_first_forward_when_the_model_is_never_called():
    """A LightningModule whose ``training_step`` calls ``self.net(x)``: the hook is on the
    module, whose own forward never runs. Step 0 starts at the first training forward of the
    part it calls, not at the hook's creation (the setup before it is no step time)."""
    import time

    class Module(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_mlp()

    model = Module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=6, capture_steps=0, log_every=None)
    setup_s = 0.3
    time.sleep(setup_s)  # e.g. a framework's set-up between the callback and the first batch
    train(model.net, opt, hook, 4, call_step=False)
    assert hook.steps_completed == 4
    assert hook.step_times_s[0] < setup_s
    hook.close()
    assert_detached(model)


def test_a_loop_without_an_optimizer_counts_its_last_step_at_close():
    """Training forwards mark the steps (a manual update, no torch optimizer): a step ends at
    the next forward, so the last one ends at close; the final prediction counts it."""
    model = tiny_mlp()
    hook = ETSHook(model, total_steps=5, capture_steps=0, log_every=None)
    for _ in range(5):
        x, y = batch()
        nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    assert hook.steps_completed == 4
    hook.close()
    assert hook.steps_completed == 5
    assert hook.prediction.step == 5 and hook.prediction.total_steps == 5


def test_a_window_step_with_a_marked_phase_is_no_iteration_of_the_trace():
    """An evaluation inside the capture window (``hook.phase``): the step it fell in is not in
    the trace (its ops would be the model's evaluation ops; a trial's trace step had 171 forward
    ops for 11 and read 6.5x the step time); the other window steps are."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, skip_steps=1, capture_steps=4, log_every=None)
    for step in range(8):
        if step == 3:  # inside window step 3 (steps 1-4)
            with hook.phase("eval"), torch.no_grad():
                model.eval()
                for _ in range(20):
                    model(batch()[0])
                model.train()
        train(model, opt, hook, 1, call_step=False)
    trace = hook.wait_for_trace(60)
    hook.close()
    assert trace is not None
    assert [it.step for it in trace.iterations] == [1, 2, 4]
    forwards = [sum(op.name == "aten::addmm" for op in it.ops) for it in trace.iterations]
    assert forwards == [2, 2, 2]


def test_two_optimizers_make_one_step_per_iteration():
    model = tiny_mlp()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters(), lr=0.1)
    for given in ([first, second], None):
        hook = ETSHook(model, optimizer=given, capture_steps=0)
        for _ in range(5):
            x, y = batch()
            first.zero_grad()
            second.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            first.step()
            second.step()
        hook.close()
        assert hook.steps_completed == 5, given


def _overflowing_scaler_loop(hook, model, opt, scaler, steps, overflow_at, call_step):
    for step in range(steps):
        x, y = batch()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if step == overflow_at:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)  # skips opt.step() when gradients are not finite
        scaler.update()
        if call_step:
            hook.step()


def test_grad_scaler_skipped_step_still_counts():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    hook = ETSHook(model, optimizer=opt, grad_scaler=scaler, capture_steps=0)
    _overflowing_scaler_loop(hook, model, opt, scaler, 6, overflow_at=2, call_step=False)
    hook.close()
    assert hook.steps_completed == 6
    assert "update" not in vars(scaler), "the scaler's update is restored on close"


def test_skipped_optimizer_step_counts_when_hook_step_is_called():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    hook = ETSHook(model, optimizer=opt, capture_steps=0)
    _overflowing_scaler_loop(hook, model, opt, scaler, 6, overflow_at=3, call_step=True)
    hook.close()
    assert hook.steps_completed == 6


def test_lbfgs_closure_forwards_do_not_count():
    model = tiny_mlp()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = batch()
    forwards = []
    model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    for given in (opt, None):
        forwards.clear()
        hook = ETSHook(model, optimizer=given, capture_steps=2, skip_steps=1)

        def closure():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss

        for _ in range(4):
            opt.step(closure)
        hook.close()
        assert len(forwards) > 4
        assert hook.steps_completed == 4, given


def test_eval_phase_and_no_grad_forwards_are_not_steps():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, capture_steps=0)  # forward / any-optimizer detection
    for step in range(6):
        x, y = batch()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step % 2 == 1:
            with hook.phase("eval"):
                model.eval()
                with torch.no_grad():
                    for _ in range(3):
                        model(x)
                model.train()
    hook.close()
    assert hook.steps_completed == 6


def test_phase_time_is_excluded_from_step_times():
    import time

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=0)
    for step in range(4):
        if step == 2:
            with hook.phase("checkpoint"):
                time.sleep(0.2)
        train(model, opt, hook, 1, call_step=False)
    hook.close()
    assert max(hook.step_times_s) < 0.2


def test_begin_and_end_phase_unpaired_calls_as_frameworks_make_them():
    import time

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=0, log_every=None)
    train(model, opt, hook, 2, call_step=False)
    hook.begin_phase("eval")
    hook.begin_phase("inner")  # nested: counted once, under the outer name
    train(model, opt, hook, 1, call_step=False)  # optimizer steps inside a phase never count
    time.sleep(0.2)
    hook.end_phase()
    hook.end_phase()
    hook.end_phase()  # nothing open: ignored
    train(model, opt, hook, 2, call_step=False)
    assert hook.steps_completed == 4
    assert max(hook.step_times_s) < 0.2
    phases = {p.name: p for p in hook.prediction.phases}
    assert set(phases) == {"eval"} and phases["eval"].spent_s >= 0.2
    with pytest.raises(ValueError, match="phase name"):
        hook.begin_phase("")
    hook.close()


def test_evaluations_are_priced_from_the_eval_dataloader_until_measured():
    from torch.utils.data import DataLoader, TensorDataset

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8)
    eval_loader = DataLoader(TensorDataset(torch.randn(48, 8)), batch_size=16)  # 3 batches
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=40,
        capture_steps=0,
        log_every=None,
        dataloader=train_loader,
        eval_dataloader=eval_loader,
        eval_every=10,
    )
    train(model, opt, hook, 4, call_step=False)
    prediction = hook.prediction
    evaluation = {p.name: p for p in prediction.phases}["eval"]
    # 3 batches of twice the training batch, a forward (a third of a step) each: 2 steps.
    assert evaluation.cost_source == "prior"
    assert evaluation.mean_s == pytest.approx(2 * prediction.iteration_s)
    assert evaluation.remaining == 4  # after steps 10, 20, 30, 40 (the last: the job's end)
    # A phase priced by hand, in seconds, with its period.
    hook.expect_phase_cost("eval", seconds=0.5, rel_ci=0.2)
    evaluation = {p.name: p for p in hook.prediction.phases}["eval"]
    assert evaluation.mean_s == pytest.approx(0.5) and evaluation.mean_ci_s == pytest.approx(0.1)
    with pytest.raises(ValueError, match="seconds"):
        hook.expect_phase_cost("eval", seconds=-1.0)
    with pytest.raises(ValueError, match="phase name"):
        hook.expect_phase_cost("", seconds=1.0)
    hook.close()
    with pytest.raises(ValueError, match="eval_dataloader"):
        ETSHook(model, eval_dataloader=(b for b in eval_loader))


def test_an_eval_dataloader_without_a_period_says_none_is_expected_yet(caplog):
    from torch.utils.data import DataLoader, TensorDataset

    model = tiny_mlp()
    eval_loader = DataLoader(TensorDataset(torch.randn(48, 8)), batch_size=16)
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        ETSHook(model, total_steps=40, capture_steps=0, eval_dataloader=eval_loader).close()
        ETSHook(
            model, total_steps=40, capture_steps=0, eval_dataloader=eval_loader, eval_every=10
        ).close()
    said = [r.getMessage() for r in caplog.records if "eval_dataloader=" in r.getMessage()]
    assert len(said) == 1 and "pass eval_every=" in said[0]  # the first hook only


def test_checkpoints_are_priced_from_the_state_they_write_until_measured():
    from ets_hook.capture.sysinfo import training_state_bytes
    from ets_hook.forecast.job import CHECKPOINT_FIXED_S, CHECKPOINT_WRITE_BYTES_PER_S

    model = tiny_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert training_state_bytes(model, [opt]) == params_bytes  # no optimizer state yet
    hook = ETSHook(
        model, optimizer=opt, total_steps=40, capture_steps=0, log_every=None, checkpoint_every=10
    )
    train(model, opt, hook, 3, call_step=False)
    checkpoint = {p.name: p for p in hook.prediction.phases}["checkpoint"]
    # Read after the first optimizer step: the parameters and Adam's two moments.
    state_bytes = training_state_bytes(model, [opt])
    assert state_bytes >= 3 * params_bytes
    assert checkpoint.cost_source == "prior" and checkpoint.remaining == 4  # 10, ..., 40
    assert checkpoint.mean_s == pytest.approx(
        CHECKPOINT_FIXED_S + state_bytes / CHECKPOINT_WRITE_BYTES_PER_S
    )
    hook.close()
    # A price given by hand wins, also before the first step.
    hook = ETSHook(
        model, optimizer=opt, total_steps=40, capture_steps=0, log_every=None, checkpoint_every=10
    )
    hook.expect_phase_cost("checkpoint", seconds=2.0)
    train(model, opt, hook, 3, call_step=False)
    checkpoint = {p.name: p for p in hook.prediction.phases}["checkpoint"]
    assert checkpoint.mean_s == pytest.approx(2.0)
    hook.close()
    # Without a period nothing is priced: a phase is only projected once it has one.
    hook = ETSHook(model, optimizer=opt, total_steps=40, capture_steps=0, log_every=None)
    train(model, opt, hook, 3, call_step=False)
    assert hook.prediction.phases == ()
    hook.close()


def test_bad_arguments_name_the_value():
    model = tiny_mlp()
    with pytest.raises(ValueError, match="capture_steps"):
        ETSHook(model, capture_steps=-1)
    with pytest.raises(ValueError, match="skip_steps"):
        ETSHook(model, skip_steps=-2)
    with pytest.raises(ValueError, match="total_steps"):
        ETSHook(model, total_steps=0)
    with pytest.raises(ValueError, match="record_shapes"):
        ETSHook(model, record_shapes="some")
    with pytest.raises(ValueError, match="checkpoint_files must be an int >= 1, got 0"):
        ETSHook(model, checkpoint_files=0)
    with pytest.raises(ValueError, match="checkpoint_in_memory must be a bool, got 'yes'"):
        ETSHook(model, checkpoint_in_memory="yes")
    with pytest.raises(ValueError, match="optimizer"):
        ETSHook(model, optimizer="adam")
    with pytest.raises(ValueError, match="model"):
        ETSHook("not a model")
    assert_detached(model)


@pytest.mark.parametrize("where", ["build_iterations", "start", "boundary"])
def test_internal_failure_never_reaches_the_training_loop(where, monkeypatch, caplog):
    import ets_hook.capture.window as window_module
    import ets_hook.capture.window_runner as runner_module

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure")

    if where == "build_iterations":
        monkeypatch.setattr(window_module, "build_iterations", boom)
    elif where == "start":
        monkeypatch.setattr(runner_module.NativeOpCapture, "start", boom)
        monkeypatch.setattr(runner_module.ProfilerOpCapture, "start", boom)
    else:
        monkeypatch.setattr(runner_module.StepBounds, "__init__", boom)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1)
        train(model, opt, hook, 6)
        hook.close()
    assert hook.steps_completed == 6, "the hook keeps timing steps"
    assert hook.trace is None
    assert "failed" in hook.capture_status
    warnings = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(warnings) == 1, "logged exactly once"
    assert_detached(model)


def test_setup_failures_at_creation_never_raise(monkeypatch):
    """Machine facts and the trace model are gathered when the hook is created; if that fails
    the hook is still created, decodes the window (retrying the facts) and keeps its measured
    estimate."""
    import ets_hook.capture.window_runner as runner_module

    calls = {"host": 0}
    real_host_info = runner_module.host_info

    def flaky_host_info():
        calls["host"] += 1
        if calls["host"] == 1:
            raise OSError("psutil unavailable right now")
        return real_host_info()

    def broken_model(device_type):
        raise RuntimeError("model file unreadable")

    monkeypatch.setattr(runner_module, "host_info", flaky_host_info)  # the decode's retry
    monkeypatch.setattr("ets_hook.capture.sysinfo.host_info", flaky_host_info)  # at creation
    monkeypatch.setattr("ets_hook.forecast.trace_estimators.default_trace_estimator", broken_model)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, log_every=None)
    train(model, opt, hook, 6)
    trace = hook.wait_for_trace(60)
    hook.close()
    assert trace is not None and trace.host.logical_cores > 0
    assert calls["host"] == 2  # failed at creation, gathered again by the decode
    prediction = hook.prediction
    assert prediction is not None and prediction.trace_iteration_s is None
    assert prediction.measured_iteration_s is not None


def test_profiler_path_backs_off_when_torch_profiler_is_running(caplog):
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with caplog.at_level(logging.WARNING, logger="ets_hook"):
            hook = ETSHook(
                model, optimizer=opt, capture_steps=2, skip_steps=0, op_capture="profiler"
            )
            train(model, opt, hook, 4)
            hook.close()
        assert torch.autograd._profiler_enabled(), "the user's profiler is untouched"
    assert any(e.name == "aten::linear" for e in prof.events())
    assert hook.steps_completed == 4
    assert "another torch profiler" in hook.capture_status
    assert hook.trace is None
    assert any("another torch profiler" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("op_capture", ["native", "profiler"])
def test_record_shapes_modes(op_capture):
    for mode in ("first", "all", "none"):
        model = tiny_mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = ETSHook(
            model,
            optimizer=opt,
            capture_steps=3,
            skip_steps=1,
            record_shapes=mode,
            op_capture=op_capture,
        )
        train(model, opt, hook, 5)
        hook.close()
        trace = hook.wait_for_trace(10)
        assert [it.step for it in trace.iterations] == [1, 2, 3]
        linears = [op for it in trace.iterations for op in it.ops if op.name == "aten::linear"]
        has_shapes = {bool(op.input_shapes) for op in linears}
        assert has_shapes == ({False} if mode == "none" else {True}), mode
        # The profiler must stop and restart between steps to drop shapes (the next step is
        # then captured from its first forward on); the native observer swaps its callback.
        expected_partial = [2] if mode == "first" and op_capture == "profiler" else []
        assert trace.metadata["partial_steps"] == expected_partial
        assert op_capture in trace.capture.op_capture


def test_close_removes_every_hook_and_context_manager():
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ETSHook(model, optimizer=opt, capture_steps=5, skip_steps=0) as hook:
        train(model, opt, hook, 2)  # window cut short by close()
    assert_detached(model)
    assert not opt._optimizer_step_post_hooks and not opt._optimizer_step_pre_hooks
    trace = hook.wait_for_trace(10)
    assert [it.step for it in trace.iterations] == [0, 1]
    assert "cut short" in hook.capture_status


def test_rank_placeholder_in_trace_path(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, capture_steps=1, skip_steps=0, trace_path=tmp_path / "run.ets"
    )
    train(model, opt, hook, 2)
    hook.close()
    assert (tmp_path / "run.rank3.ets").exists()
    assert load_trace(tmp_path / "run.rank3.ets").rank == 3


def test_prediction_api_status_file_and_callbacks_on_a_real_loop(tmp_path):
    import json

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    status = tmp_path / "status.json"
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=12,
        capture_steps=3,
        status_path=status,
        on_prediction=seen.append,
        deadline=False,
    )
    assert hook.prediction is None
    train(model, opt, hook, 1)
    first = hook.prediction
    assert first is not None and first.step == 1 and first.remaining_steps == 11
    assert first.iteration_s > 0 and first.total_s >= first.elapsed_s
    train(model, opt, hook, 11)
    hook.close()
    final = hook.prediction
    assert final.step == 12 and final.remaining_steps == 0 and final.eta_s == 0
    assert seen and all(p.step <= 12 for p in seen)
    payload = json.loads(status.read_text())
    assert payload["prediction"]["step"] == 12
    assert json.loads(final.to_json())["total_steps"] == 12


def test_default_trace_estimate_on_cpu_is_the_shipped_ets_model():
    """With trace_estimator="auto", the decoded window feeds the shipped early → steady model
    and its estimate enters the prediction; after the window a few clean steps follow."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, total_steps=100, skip_steps=1, capture_steps=5, deadline=False,
        log_every=None,
    )  # fmt: skip
    train(model, opt, hook, 7)
    assert hook.wait_for_trace(60) is not None
    train(model, opt, hook, 5)
    p = hook.prediction
    hook.close()
    assert p.trace_iteration_s is not None and p.trace_iteration_s > 0
    assert p.trace_ci_s is not None and p.trace_ci_s > 0
    # the capture-window steps (1-5) and the decode-time steps were dropped as perturbed
    assert p.warmup_steps >= 6


def test_deadline_raise_reaches_the_training_loop_once():
    from ets_hook.errors import DeadlineExceededError

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=10**7, deadline=1.0, on_deadline="raise")
    raised = 0
    for _ in range(6):
        try:
            train(model, opt, hook, 1)
        except DeadlineExceededError:
            raised += 1
    hook.close()
    assert raised == 1
    assert hook.steps_completed == 6


def test_decode_leaves_the_interpreter_switch_interval_alone(monkeypatch):
    """Capture and decode never change sys.setswitchinterval (an earlier version lowered it
    while decoding and once left it lowered: 10-50% on every later step)."""
    import sys

    calls: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", calls.append)
    before = sys.getswitchinterval()
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, skip_steps=1, capture_steps=2, deadline=False, log_every=None
    )
    train(model, opt, hook, 4)
    assert hook.wait_for_trace(60) is not None
    hook.close()
    assert calls == []
    assert sys.getswitchinterval() == before


class _ForwardingOptimizer(torch.optim.Optimizer):
    """Like Accelerate's AcceleratedOptimizer: an Optimizer subclass that skips Optimizer's
    __init__, holds the optimizer and forwards step()."""

    def __init__(self, optimizer):  # no super().__init__(), as Accelerate does
        self.optimizer = optimizer

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


def test_optimizer_wrappers_are_unwrapped_and_their_steps_seen():
    model = tiny_mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = _ForwardingOptimizer(_ForwardingOptimizer(inner))  # two levels
    hook = ETSHook(model, optimizer=wrapped, capture_steps=0, log_every=None)
    train(model, wrapped, hook, 5, call_step=False)
    assert hook.steps_completed == 5
    hook.close()
    with pytest.raises(ValueError, match="wrapper holding one in optimizer or _optimizer"):
        ETSHook(model, optimizer=object())


def test_an_error_in_the_step_detector_never_reaches_the_loop(monkeypatch, caplog):
    """The optimizer post-hook runs inside the user's opt.step(): a failure of the hook's own
    step bookkeeping there is logged once and the loop goes on (a Fabric optimizer wrapper
    once raised StopIteration there)."""
    from ets_hook.capture import steps as steps_module

    def broken(self, optimizer):
        raise StopIteration("the detector's own bug")

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=5, capture_steps=0, log_every=None)
    monkeypatch.setattr(steps_module.StepDetector, "_optimizer_stepped", broken)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        train(model, opt, hook, 5, call_step=False)  # would raise from opt.step() before
    hook.close()
    errors = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(errors) == 1 and "the detector's own bug" in errors[0].getMessage()


def test_dashboards_selected_by_hook_options(tmp_path):
    pytest.importorskip("tensorboardX")
    parser = pytest.importorskip("prometheus_client.parser")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=8,
        capture_steps=0,
        log_every=None,
        tensorboard_dir=tmp_path / "tb",
        prometheus_textfile=tmp_path / "ets.prom",
    )
    train(model, opt, hook, 8)
    hook.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    families = {f.name: f for f in parser.text_string_to_metric_families(
        (tmp_path / "ets.prom").read_text()
    )}  # fmt: skip
    states = {s.labels["state"]: s.value for s in families["ets_hook_state"].samples}
    assert states["closed"] == 1.0 and states["running"] == 0.0
    assert families["ets_hook_step"].samples[0].value == 8
    with pytest.raises(ValueError, match="prometheus"):
        ETSHook(model, prometheus_port=80_000)


def _fake_perf_counter(monkeypatch) -> list[int]:
    """``time.perf_counter_ns`` in the hook and its step clock reads ``clock_ns[0]`` (returned):
    the test moves time on."""
    import types

    import ets_hook.capture.step_clock as step_clock_module
    import ets_hook.hook as hook_module

    clock_ns = [0]
    fake_time = types.SimpleNamespace(
        **{name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    )
    fake_time.perf_counter_ns = lambda: clock_ns[0]
    monkeypatch.setattr(hook_module, "time", fake_time)
    monkeypatch.setattr(step_clock_module, "time", fake_time)
    return clock_ns


def test_the_hooks_own_work_on_the_training_thread_is_not_step_time(monkeypatch) -> None:
    """Reporters and callbacks run at a step boundary and prediction reads between boundaries
    are ets-hook's time, not the step's: early on they cost a few 0.1 ms, later ~25 µs, so
    left in they would make the first steps look slower than the steady state. A fake clock
    makes it exact: the loop's own work is 10 ms a step; the callback "takes" 5 s, each read
    3 s; a read inside a phase is the phase's time, taken out once. Neither counts as the
    loop's per-step overhead (projected over the remaining steps)."""
    from ets_hook.forecast.forecaster import Forecaster

    clock_ns = _fake_perf_counter(monkeypatch)
    real_prediction = Forecaster.prediction

    def costly_prediction(self):
        clock_ns[0] += 3_000_000_000
        return real_prediction.fget(self)

    monkeypatch.setattr(Forecaster, "prediction", property(costly_prediction))
    predictions = []

    def slow_callback(prediction) -> None:
        clock_ns[0] += 5_000_000_000
        predictions.append(prediction)

    hook = ETSHook(
        nn.Linear(4, 2),
        total_steps=20,
        capture_steps=0,
        log_every=None,
        deadline=False,
        on_prediction=slow_callback,
    )
    for step in range(6):
        clock_ns[0] += 10_000_000  # the training step's own work
        hook.step()
        assert hook.prediction is not None  # a read by the training loop: 3 s
        if step == 2:
            with hook.phase("eval"):
                clock_ns[0] += 1_000_000_000
                assert hook.prediction is not None
    assert predictions  # the callback ran (and took its 5 s) at some boundaries
    assert hook.step_times_s == [pytest.approx(0.01, abs=1e-12)] * 6
    last = hook.prediction
    hook.close()
    assert last is not None and last.step == 6
    # Nor is it the loop's per-step overhead, which would be projected over the remaining steps.
    assert last.overhead_per_step_s == pytest.approx(0.0, abs=1e-9)


def test_steps_run_while_the_window_is_decoded_stay_out_of_the_measured_estimate(
    monkeypatch,
) -> None:
    """The decode shares the cores and the GIL with training: until it is done, every step is
    perturbed (a 3-5x step must not become "the steady state" three steps after the window),
    however long the decode takes."""
    import threading

    import ets_hook.capture.window_runner as runner_module

    release = threading.Event()
    real_build = runner_module.build_window_trace

    def slow_build(*args, **kwargs):
        release.wait(60)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(runner_module, "build_window_trace", slow_build)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model, optimizer, total_steps=40, skip_steps=1, capture_steps=2, log_every=None,
        deadline=False,
    )  # fmt: skip

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()

    for _ in range(3):  # step 1 skipped, steps 2-3 captured: the decode starts
        step()
    assert hook.capture_status.startswith("decoding")
    for done in range(4, 12):
        step()
        assert hook._forecaster._perturbed_end == done + 1  # this step and the next
    release.set()
    assert hook.wait_for_trace(60) is not None
    step()
    hook.close()
    # the decode thread set the end it saw (>= the window's end + 1); later steps count again
    assert 4 <= hook._forecaster._perturbed_end <= 13


def test_numpy_numbers_are_accepted_where_python_numbers_are():
    """A length computed with numpy (``np.int64``) means what the int means; a float where an
    int is expected, or a bool, is still refused."""
    import numpy as np

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, total_steps=np.int64(6), capture_steps=np.int64(2),
        skip_steps=np.int32(1), grad_accum_steps=np.int64(1), eval_every=np.int64(3),
        checkpoint_files=np.int64(1), initial_step=np.int64(0), log_every=np.int64(2),
        deadline=np.float32(3600.0), phase_every={"log": np.int64(2)}, log_ranks=None,
    )  # fmt: skip
    assert (hook.total_steps, hook.capture_steps, hook.skip_steps) == (6, 2, 1)
    assert type(hook.total_steps) is int
    hook.expect_phase_cost("eval", seconds=np.float32(2.0), train_steps=np.int64(3))
    train(model, opt, hook, 6)
    last = hook.prediction
    assert last is not None and last.remaining_steps == 0 and last.total_steps == 6
    # What is left is the evaluation due after step 6 (eval_every=3), at its price.
    assert last.eta_s == pytest.approx(last.remaining_phase_s)
    assert last.remaining_phase_s == pytest.approx(2.0 + 3 * last.iteration_s)
    hook.close()
    for bad in ({"total_steps": np.float64(6.0)}, {"total_steps": np.bool_(True)},
                {"capture_steps": np.float32(2.0)}):  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(bad))):
            ETSHook(tiny_mlp(), **bad)


@pytest.mark.parametrize("device_given", [False, True])
def test_a_model_moved_after_the_hook_was_created_is_named_in_a_warning(
    device_given: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """``hook = ETSHook(model)`` then ``model.to(device)``: the hook's settings are the first
    device's; one warning at the first training forward says so and what to do (not when the
    device was given explicitly). ``meta`` stands in for an accelerator here (``device=``
    names the CPU: ``meta`` is no training device to give)."""
    model = nn.Linear(4, 2)
    hook = ETSHook(model, capture_steps=0, log_every=None, device="cpu" if device_given else None)
    model.to("meta")
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        model(torch.empty(2, 4, device="meta"))
        model(torch.empty(2, 4, device="meta"))
    hook.close()
    warnings = [r.getMessage() for r in caplog.records if "moved to" in r.getMessage()]
    if device_given:
        assert warnings == []
    else:
        assert len(warnings) == 1
        assert "moved to meta after this ETSHook was created on cpu" in warnings[0]
        assert "create the hook after model.to(device), or pass device=" in warnings[0]


#: What the patched early-stopping curve fit takes: far more than a tiny MLP's step.
SLOW_FIT_S = 0.05


def test_report_metric_time_is_not_step_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``report_metric`` runs the early-stopping curve fit on the training thread: the hook's
    own work, left out of the step times as its other work is (else every evaluation made a
    step look slower: "every 10 steps a step runs ... longer")."""
    fit = EarlyStopTracker._forecast

    def slow_fit(tracker: EarlyStopTracker) -> object:
        time.sleep(SLOW_FIT_S)
        return fit(tracker)

    monkeypatch.setattr(EarlyStopTracker, "_forecast", slow_fit)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 6
    hook = ETSHook(
        model, optimizer=opt, total_steps=100, early_stopping=(3, 0.0, "min"),
        capture_steps=0, log_every=None,
    )  # fmt: skip
    started_s = time.perf_counter()
    train_s = []  # the loop's own time per step: on a loaded machine a step can take 70 ms
    for step in range(steps):
        train_started_s = time.perf_counter()
        train(model, opt, hook, 1, call_step=False)
        train_s.append(time.perf_counter() - train_started_s)
        hook.report_metric("val_loss", 1.0 + 1.0 / (step + 1))
    wall_per_step_s = (time.perf_counter() - started_s) / steps
    step_times_s = hook.step_times_s[1:]  # each after a report_metric
    prediction = hook.prediction
    hook.close()
    assert wall_per_step_s > SLOW_FIT_S  # the fits ran, between the steps
    assert len(step_times_s) == steps - 1
    # Each step is its training, not the fit before it: below training + half a fit.
    excess_s = [step_s - trained_s for step_s, trained_s in zip(step_times_s, train_s[1:])]
    assert statistics.median(excess_s) < SLOW_FIT_S / 2, (step_times_s, train_s)
    assert prediction is not None
    assert prediction.iteration_s < statistics.median(train_s[1:]) + SLOW_FIT_S / 2


@pytest.mark.parametrize("initial_step", [0, 4])
def test_the_overrun_note_names_the_first_step_past_the_length(
    initial_step: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop that runs past ``total_steps=10`` is named at step 11 (global), not at the next
    step some reporter happens to look at the prediction (15 with ``log_every=5``)."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, total_steps=10, initial_step=initial_step, log_every=5,
        verbose=False, capture_steps=0,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        train(model, opt, hook, 20 - initial_step, call_step=False)
    hook.close()
    notes = [
        r.getMessage() for r in caplog.records if "ran past the job's length" in r.getMessage()
    ]
    assert len(notes) == 1
    assert "(step 11, total_steps=10" in notes[0]


def test_the_hooks_own_work_at_a_boundary_is_in_no_captured_step() -> None:
    """A reporter that takes long at each step boundary (here a callback sleeping 30 ms) runs
    before the next step's first op: the window's steps begin after it, so it is not in their
    lead-in (which the trace estimate scales with the ops)."""
    import time

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    slow_s = 0.03
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=20,
        skip_steps=1,
        capture_steps=3,
        op_capture="native",
        decode_in_background=False,
        log_every=None,
        on_prediction=lambda prediction: time.sleep(slow_s),
    )
    train(model, opt, hook, 6)
    trace = hook.trace
    hook.close()
    assert trace is not None and len(trace.iterations) == 3, hook.capture_status
    for iteration in trace.iterations:
        first_op_ns = min(op.start_ns for op in iteration.ops)
        assert first_op_ns - iteration.start_ns < slow_s / 3 * 1e9, iteration.step


def test_prediction_reads_inside_the_window_stay_out_of_the_traces_steps(monkeypatch) -> None:
    """A loop that reads ``hook.prediction`` after every optimizer step (to log it): the read
    is the hook's own time, out of the step times and, in the window, out of the trace's step
    spans and lead-ins too (before: a 43% high trace estimate and a false input wait)."""
    import time as time_module

    from ets_hook.forecast.forecaster import Forecaster

    read_s = 0.02
    real_prediction = Forecaster.prediction

    def slow_prediction(self):
        time_module.sleep(read_s)
        return real_prediction.fget(self)

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model,
        opt,
        total_steps=100,
        skip_steps=1,
        capture_steps=3,
        log_every=None,
        deadline=False,
        decode_in_background=False,
    )
    monkeypatch.setattr(Forecaster, "prediction", property(slow_prediction))
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(6):
        x, y = batch()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        assert hook.prediction is not None  # the loop's read: 20 ms, after the boundary
    monkeypatch.setattr(Forecaster, "prediction", real_prediction)
    trace = hook.trace
    hook.close()
    assert trace is not None and [it.step for it in trace.iterations] == [1, 2, 3]
    for iteration in trace.iterations:
        span_s = (iteration.end_ns - iteration.start_ns) / 1e9
        lead_in_s = (iteration.ops[0].start_ns - iteration.start_ns) / 1e9
        assert span_s < hook.step_times_s[iteration.step] + 0.5 * read_s
        assert lead_in_s < 0.5 * read_s


def test_the_constructors_own_work_is_not_in_the_first_step(monkeypatch) -> None:
    """Step 0 starts when the constructor returns: its own work (tens of ms for a process's
    first hook: the trace model, the step detector, the window) is in no step. A fake clock:
    building the step detector "takes" 2 s, each step of an inference loop (no training
    forward: nothing restarts step 0) 10 ms."""
    import ets_hook.hook as hook_module

    clock_ns = _fake_perf_counter(monkeypatch)
    real_detector = hook_module.StepDetector

    def slow_detector(*args, **kwargs):
        clock_ns[0] += 2_000_000_000
        return real_detector(*args, **kwargs)

    monkeypatch.setattr(hook_module, "StepDetector", slow_detector)
    model = nn.Linear(4, 2)
    hook = ETSHook(model, total_steps=5, capture_steps=0, log_every=None, deadline=False)
    with torch.no_grad():
        for _ in range(5):
            model(torch.randn(2, 4))
            clock_ns[0] += 10_000_000
            hook.step()
    hook.close()
    assert hook.step_times_s == pytest.approx([0.01] * 5)


def test_an_inference_loop_with_optimizer_given_is_told_to_drop_it(caplog) -> None:
    """``hook.step()`` in a no-grad loop with ``optimizer=`` given ends no step (a step is an
    optimizer step then): the closing warning says so and what to do instead."""
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=5, capture_steps=0, log_every=None)
    with caplog.at_level(logging.WARNING, logger="ets_hook"), torch.no_grad():
        for _ in range(5):
            model(torch.randn(2, 4))
            hook.step()
        hook.close()
    assert hook.steps_completed == 0
    [warning] = [r.getMessage() for r in caplog.records if "without a single" in r.getMessage()]
    assert "hook.step() was called 5 times" in warning
    assert "without optimizer=" in warning


def _accumulating_loop(model, opt, loader, epochs: int, accumulation: int) -> None:
    """Steps the optimizer once per ``accumulation`` batches (and at an epoch's end)."""
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            loss_fn(model(x), y).backward()
            if (i + 1) % accumulation == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()


def test_a_job_closed_short_of_its_length_says_so_and_a_whole_one_does_not(caplog):
    """``total_steps=epochs * len(loader)`` kept after adding gradient accumulation: every ETA
    was 4x too long, and the job ended at a quarter of its length (before: "finished at step
    22" and nothing else). A note at close, never a warning: a loop that breaks early on
    purpose looks the same. Nothing where the job ran its length."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(42 * 2, 16), torch.randint(0, 4, (84,)))
    loader = torch.utils.data.DataLoader(data, batch_size=2)  # 42 batches
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        short = ETSHook(
            model, optimizer=opt, total_steps=2 * len(loader), grad_accum_steps=4,
            dataloader=loader, capture_steps=0, log_every=None,
        )  # fmt: skip
        _accumulating_loop(model, opt, loader, epochs=2, accumulation=4)
        short.close()
        whole = ETSHook(
            model, optimizer=opt, epochs=2, dataloader=loader, grad_accum_steps=4,
            capture_steps=0, log_every=None,
        )  # fmt: skip
        _accumulating_loop(model, opt, loader, epochs=2, accumulation=4)
        whole.close()
    assert short.steps_completed == whole.steps_completed == 22
    notes = [r for r in caplog.records if "steps it was given" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    assert notes[0].getMessage().startswith("finished at step 22 of the 84 steps it was given")
    assert "grad_accum_steps=4" in notes[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_boolean_switches_are_checked(tmp_path):
    model = tiny_mlp()
    for bad in ("no", None, 1):
        with pytest.raises(
            ValueError, match=f"decode_in_background must be True or False, got {bad!r}"
        ):
            ETSHook(model, decode_in_background=bad)


def test_a_total_past_the_calendar_has_no_finish_time_but_a_prediction():
    """``total_steps=10**15``: years past what a date can hold. Before, building the finish
    time raised and the forecaster turned every reporter off (``hook.prediction`` None)."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=10**15, capture_steps=0, log_every=None)
    train(model, opt, hook, 6, call_step=False)
    prediction = hook.prediction
    hook.close()
    assert prediction is not None and prediction.step == 6
    assert prediction.total_s is not None and prediction.total_s > 1e9
    assert prediction.finish_time is None
    assert "ETA" in str(prediction)


def test_a_trace_path_that_cannot_be_written_keeps_the_capture(tmp_path, caplog):
    """The trace's folder removed after the hook was made: the write fails, said with the
    path; the trace and its estimate stay in use (before: "internal error, continuing as a
    step timer only" and a failed capture status, while the trace was used)."""
    import shutil

    folder = tmp_path / "traces"
    folder.mkdir()
    path = folder / "job.ets"
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, total_steps=20, skip_steps=1, capture_steps=2,
        trace_path=path, log_every=None, decode_in_background=False,
    )  # fmt: skip
    shutil.rmtree(folder)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        train(model, opt, hook, 6, call_step=False)
        trace = hook.wait_for_trace(60)
        status = hook.capture_status
        hook.close()
    messages = [r.getMessage() for r in caplog.records]
    assert trace is not None
    assert "failed" not in status and not [m for m in messages if "internal error" in m]
    said = [m for m in messages if "could not write the trace" in m]
    assert len(said) == 1 and str(path) in said[0]
    assert not path.exists()
