"""ETSHook under mixed precision on CPU: bf16/fp16 autocast, GradScaler's skipped steps counted,
the low-precision dtypes kept in the trace."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from ets_hook import ETSHook

STEPS = 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


@pytest.mark.parametrize(
    ("dtype", "dtype_name"), [(torch.bfloat16, "c10::BFloat16"), (torch.float16, "c10::Half")]
)
def test_autocast_job_counts_every_step_and_keeps_dtypes(
    dtype: torch.dtype, dtype_name: str
) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # A scale far too large for fp16: its first optimizer steps are skipped (inf gradients).
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    hook = ETSHook(
        model,
        optimizer,
        total_steps=STEPS,
        capture_steps=3,
        log_every=None,
        grad_scaler=scaler,
        decode_in_background=False,
    )
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    skipped = 0
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.get_scale() < scale
    hook.close()
    if dtype is torch.float16:
        assert skipped >= 3  # the scaler skipped optimizer steps ...
    assert hook.steps_completed == STEPS  # ... which still count as training steps
    trace = hook.trace
    assert trace is not None and len(trace.iterations) == 3
    linear_dtypes = {
        op.input_dtypes[0]
        for it in trace.iterations
        for op in it.ops
        if op.name == "aten::addmm" and op.input_dtypes
    }
    assert dtype_name in linear_dtypes  # the matrix products ran in low precision
    prediction = hook.prediction
    assert prediction is not None and prediction.total_s is not None and prediction.total_s > 0


class NativeScaler:
    """timm's ``timm.utils.NativeScaler`` as it is written: backward, unscale, clip and step
    through the ``GradScaler`` it holds in ``_scaler``; it has no ``update()`` of its own."""

    state_dict_key = "amp_scaler"

    def __init__(self) -> None:
        self._scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)

    def __call__(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self._scaler.scale(loss).backward()
        self._scaler.step(optimizer)
        self._scaler.update()


def test_a_loss_scaler_wrapper_stands_for_the_grad_scaler_it_holds() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_scaler = NativeScaler()
    hook = ETSHook(
        model,
        optimizer,
        total_steps=STEPS,
        capture_steps=0,
        log_every=None,
        grad_scaler=loss_scaler,
    )
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss_scaler(loss, optimizer)  # the first steps are skipped: inf gradients at 2**40
    hook.close()
    assert loss_scaler._scaler.get_scale() < 2.0**40  # it did skip steps ...
    assert hook.steps_completed == STEPS  # ... which count, through its GradScaler's update()
    assert "update" not in vars(loss_scaler._scaler)  # unwrapped again at close
    with pytest.raises(ValueError, match=r"or a wrapper holding one in _scaler or scaler"):
        ETSHook(model, optimizer, grad_scaler=object())


@pytest.mark.parametrize("scaler_given", [False, True])
def test_float16_steps_a_scaler_skipped_unseen_are_named_at_close(
    scaler_given: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Without grad_scaler=, the optimizer steps a GradScaler skipped are no steps: the job
    ends short of its length, and the close note says why (under float16 autocast)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)  # its first ~5 steps overflow
    options = {"grad_scaler": scaler} if scaler_given else {}
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        hook = ETSHook(
            model, optimizer, total_steps=STEPS, capture_steps=0, log_every=None, **options
        )
        x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
        for _ in range(STEPS):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        hook.close()
    notes = [r.getMessage() for r in caplog.records if "finished at step" in r.getMessage()]
    if scaler_given:
        assert hook.steps_completed == STEPS and not notes
    else:
        assert 0 < hook.steps_completed < STEPS and len(notes) == 1
        assert "a GradScaler skipped" in notes[0] and "grad_scaler=" in notes[0]


@pytest.mark.parametrize("autocast", [True, False])
def test_autocast_seen_at_the_first_forward_selects_the_low_precision_prior(autocast: bool) -> None:
    from ets_hook.forecast.stats import StepTimePrior

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(model, optimizer, total_steps=10, capture_steps=0, log_every=None)
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    first = hook.prediction
    hook.close()
    assert first is not None and first.source == "prior"
    first_s = hook.step_times_s[0]
    prior = StepTimePrior().for_low_precision() if autocast else StepTimePrior()
    expected = 0.5 * sum(prior.first_step_range_s(first_s))
    assert first.iteration_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_measured_window_ratio_carries_the_early_bias_where_the_prior_says_so(device: str) -> None:
    from ets_hook.forecast.forecaster import Forecaster
    from ets_hook.forecast.stats import StepTimePrior

    prior = StepTimePrior.for_device(device)
    plain, low = Forecaster(start_s=0.0, prior=prior), Forecaster(start_s=0.0, prior=prior)
    low.set_low_precision()
    low.set_low_precision()  # idempotent
    for forecaster in (plain, low):
        forecaster.set_capture_window(1, 6, capture_ratio=(1.05, 1.07), measured=True)
        # Window steps are early steps, whatever the precision: widened by the early range on
        # the CPU (measured there); the CUDA prior says nothing of the kind.
        lo, hi = prior.early_ratio if device == "cpu" else (1.0, 1.0)
        assert forecaster.prior.capture_ratio == pytest.approx((1.05 * lo, 1.07 * hi))
        assert forecaster.prior.early_ratio == prior.early_ratio
        # With the window's step time known, the early excess (seconds per step) joins in.
        forecaster.set_capture_window(
            1, 6, capture_ratio=(1.05, 1.07), measured=True, window_step_s=0.004
        )
        lo, hi = prior.early_ratio_at(0.004) if device == "cpu" else (1.0, 1.0)
        assert forecaster.prior.capture_ratio == pytest.approx((1.05 * lo, 1.07 * hi))
    # A prior's range (the profiler path's) already includes the warm-up: not widened again.
    low.set_capture_window(1, 6, capture_ratio=(1.0, 1.5))
    assert low.prior.capture_ratio == (1.0, 1.5)


def test_low_precision_prior_changes_only_the_first_step_excess() -> None:
    from ets_hook.forecast.stats import LOW_PRECISION_FIRST_STEP_EXTRA_S, StepTimePrior

    cpu = StepTimePrior.for_device("cpu")
    low = cpu.for_low_precision()
    low_s, high_s = cpu.first_step_excess_s
    assert low.first_step_excess_s == (low_s, high_s + LOW_PRECISION_FIRST_STEP_EXTRA_S)
    restored = dataclasses.replace(low, first_step_excess_s=cpu.first_step_excess_s)
    assert restored == cpu


def test_a_long_low_precision_first_step_is_not_read_as_a_short_steady_state() -> None:
    """A trial's bf16 job on an avx2-only CPU (bf16 emulated): a 290.8 ms first step, a
    246.7 ms steady state. The excess-based range holds it and its midpoint is within 5%;
    the ratio-based prior used before (2-9.5x) predicted 91 ms, its range 31-145 ms."""
    from ets_hook.forecast.stats import StepTimePrior

    low, high = StepTimePrior.for_device("cpu").for_low_precision().first_step_range_s(0.2908)
    assert low <= 0.2467 <= high
    assert 0.5 * (low + high) == pytest.approx(0.2467, rel=0.05)
    cuda = StepTimePrior.for_device("cuda")
    assert cuda.for_low_precision() == cuda  # not measured on GPUs: unchanged
