"""The adaptive capture window (``ETSHook(capture_steps=None)``, the default): the budget rule,
and what the hook does with it on real loops (native observer, CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.capture import native_ops
from ets_hook.capture import window_runner as runner_module
from ets_hook.capture.ops import DecodeCost, NativeOpCapture
from ets_hook.capture.window import (
    CAPTURE_BUDGET_SHARE,
    MAX_ADAPTIVE_CAPTURE_STEPS,
    WindowBudget,
    window_budget,
)

# A window step of 10 ms with 1,000 ops at 0.5 µs each: 5% of it is capture (ratio 1/0.95),
# so the steady step is 9.5 ms; the decode costs 4-25 µs per op (midpoint 14.5), nothing fixed.
STEP_S, OPS, US = 0.010, 1000, (0.5, 0.5)
DECODE = DecodeCost(fixed_s=(0.0, 0.0), us_per_op=(4.0, 25.0))
STEADY_S = STEP_S * 0.95
PER_OP_S = (0.5 + 14.5) * 1e-6  # window + decode, per recorded op


def budget_s(job_steps: int) -> float:
    return CAPTURE_BUDGET_SHARE * job_steps * STEADY_S


def verdict(steps: int, job_steps: int) -> str:
    return window_budget([STEP_S] * steps, [OPS] * steps, US, US, DECODE, job_steps)


def test_a_long_job_captures_on() -> None:
    assert budget_s(100_000) > 6 * OPS * PER_OP_S
    assert verdict(1, 100_000) == verdict(4, 100_000) == WindowBudget.CONTINUE


@pytest.mark.parametrize("job_steps", [400, 450])
def test_the_window_ends_when_one_more_step_would_pass_the_budget(job_steps: int) -> None:
    # Two steps fit in 1% of these jobs, three do not.
    assert 2 * OPS * PER_OP_S <= budget_s(job_steps) < 3 * OPS * PER_OP_S
    assert verdict(1, job_steps) == WindowBudget.CONTINUE
    assert verdict(2, job_steps) == WindowBudget.FINISH


def test_a_job_too_short_for_one_steps_decode_drops_the_capture() -> None:
    assert budget_s(100) < OPS * 14.5e-6
    assert verdict(1, 100) == WindowBudget.DROP
    # One step's decode fits, a second step does not: decode the one step.
    assert OPS * 14.5e-6 <= budget_s(200) < 2 * OPS * PER_OP_S
    assert verdict(1, 200) == WindowBudget.FINISH


def test_the_next_steps_cost_counts_without_shapes() -> None:
    # With shapes on the first step only, the next step is cheaper in the window.
    dear, cheap = (2.0, 2.0), (0.5, 0.5)
    # The window step is 20% capture: steady 8 ms, budget 32 ms; one step spent 16.5 ms, one
    # more costs 16.5 ms with shapes (over) or 15 ms without (within).
    job = 400
    assert window_budget([STEP_S], [OPS], dear, dear, DECODE, job) == WindowBudget.FINISH
    assert window_budget([STEP_S], [OPS], dear, cheap, DECODE, job) == WindowBudget.CONTINUE


def test_the_decodes_fixed_cost_counts_once() -> None:
    # 20 ms for any decode, nothing per op: window steps add 0.5 ms each (1,000 ops x 0.5 µs).
    fixed = DecodeCost(fixed_s=(0.010, 0.030), us_per_op=(0.0, 0.0))
    # A budget of 25 ms (about 263 steady steps): the decode and up to 10 window steps fit.
    job = round(0.025 / (CAPTURE_BUDGET_SHARE * STEADY_S))
    assert window_budget([STEP_S] * 4, [OPS] * 4, US, US, fixed, job) == WindowBudget.CONTINUE
    # Under 20 ms of budget even the first step's decode does not fit: nothing is decoded.
    short = round(0.019 / (CAPTURE_BUDGET_SHARE * STEADY_S))
    assert window_budget([STEP_S], [OPS], US, US, fixed, short) == WindowBudget.DROP
    # The per-op prior alone would have kept it (1,000 ops x 14.5 µs = 14.5 ms).
    assert window_budget([STEP_S], [OPS], US, US, DECODE, short) != WindowBudget.DROP


def test_the_learned_models_decode_costs_more_than_the_others() -> None:
    with_model, without = NativeOpCapture.decode_costs[True], NativeOpCapture.decode_costs[False]
    for ops in (100, 1_000, 20_000):
        assert with_model.midpoint_s(ops) > without.midpoint_s(ops)
        low, high = with_model.range_s(ops)
        assert 0 <= low < with_model.midpoint_s(ops) < high


def test_no_measurement_no_verdict() -> None:
    assert window_budget([], [], US, US, DECODE, 10) == WindowBudget.CONTINUE


# ---------------------------------------------------------------------------------------------
# On the hook

needs_native = pytest.mark.skipif(
    native_ops.load(build_if_missing=True) is None, reason="native observer unavailable"
)


def tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def run(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()


@needs_native
def test_a_long_job_gets_the_whole_window() -> None:
    model, opt = tiny()
    hook = ETSHook(model, optimizer=opt, total_steps=10**9, op_capture="native", log_every=None)
    run(model, opt, 8)
    trace = hook.wait_for_trace(60)
    assert trace is not None and hook.capture_status.startswith("done")
    assert hook.capture_steps == MAX_ADAPTIVE_CAPTURE_STEPS
    assert len(trace.iterations) == MAX_ADAPTIVE_CAPTURE_STEPS
    # Its predicted cost: every op recorded at the window's per-op cost, and the decode of
    # them with the learned trace model (the default estimator on the CPU).
    ops = sum(len(it.ops) for it in trace.iterations)
    decode = NativeOpCapture.decode_costs[True].range_s(ops)
    low = ops * NativeOpCapture.us_per_op[False][0] * 1e-6 + decode[0]
    high = ops * NativeOpCapture.us_per_op[True][1] * 1e-6 + decode[1]
    assert hook.capture_cost_s is not None
    assert low <= hook.capture_cost_s <= high
    hook.close()


@needs_native
def test_without_the_trace_model_the_decode_is_priced_lower() -> None:
    costs = {}
    for estimator in ("auto", None):
        model, opt = tiny()
        hook = ETSHook(
            model,
            optimizer=opt,
            total_steps=10**9,
            capture_steps=2,
            op_capture="native",
            log_every=None,
            trace_estimator=estimator,
        )
        run(model, opt, 6)
        assert hook.wait_for_trace(60) is not None
        costs[estimator] = hook.capture_cost_s
        hook.close()
    assert costs["auto"] is not None and costs[None] is not None
    assert costs[None] < costs["auto"]


def over_budget() -> dict[bool, DecodeCost]:
    """A decode of 1 s per op: over 1% of any job of 20 steps, whatever this machine's speed."""
    cost = DecodeCost(fixed_s=(0.0, 0.0), us_per_op=(1e6, 1e6))
    return {True: cost, False: cost}


@needs_native
def test_a_short_job_keeps_timing_steps_and_decodes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(NativeOpCapture, "decode_costs", over_budget())
    model, opt = tiny()
    hook = ETSHook(model, optimizer=opt, total_steps=20, op_capture="native", log_every=None)
    run(model, opt, 4)
    status = hook.capture_status
    assert status.startswith("off") and "capture dropped" in status
    assert hook.trace is None and hook.wait_for_trace(1) is None
    assert hook.capture_steps == 1
    assert not native_ops.load().registered()  # the callback is gone
    cost = hook.capture_cost_s  # the window step only: nothing is decoded (1 s per op)
    assert cost is not None and 0 < cost < 1.0
    run(model, opt, 4)
    prediction = hook.prediction
    assert prediction is not None and prediction.total_steps == 20
    assert prediction.iteration_s > 0
    hook.close()


@needs_native
def test_a_short_job_asked_for_its_trace_file_writes_its_first_step(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(NativeOpCapture, "decode_costs", over_budget())
    model, opt = tiny()
    path = tmp_path / "short.ets"
    hook = ETSHook(
        model, optimizer=opt, total_steps=20, op_capture="native", log_every=None, trace_path=path
    )
    run(model, opt, 4)
    trace = hook.wait_for_trace(60)
    assert trace is not None and hook.capture_status.startswith("done")
    assert hook.capture_steps == 1 and len(trace.iterations) == 1
    assert path.is_file()
    hook.close()


@needs_native
def test_an_explicit_window_is_not_adapted() -> None:
    model, opt = tiny()
    hook = ETSHook(
        model, optimizer=opt, total_steps=20, capture_steps=3, op_capture="native", log_every=None
    )
    run(model, opt, 6)
    trace = hook.wait_for_trace(60)
    assert trace is not None and len(trace.iterations) == 3
    hook.close()


@needs_native
def test_a_window_ended_by_the_budget_decodes_the_steps_it_holds(monkeypatch) -> None:
    calls: list[int] = []

    def finish_after_two(step_s, ops_per_step, *args, **kwargs) -> str:
        calls.append(len(ops_per_step))
        return WindowBudget.FINISH if len(ops_per_step) >= 2 else WindowBudget.CONTINUE

    monkeypatch.setattr(runner_module, "window_budget", finish_after_two)
    model, opt = tiny()
    hook = ETSHook(model, optimizer=opt, total_steps=1000, op_capture="native", log_every=None)
    run(model, opt, 6)
    trace = hook.wait_for_trace(60)
    assert calls == [1, 2]
    assert trace is not None and len(trace.iterations) == 2
    assert hook.capture_steps == 2
    assert trace.capture.capture_steps == 2
    hook.close()
