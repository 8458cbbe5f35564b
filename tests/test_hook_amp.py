"""ETSHook under mixed precision on CPU: bf16/fp16 autocast, GradScaler's skipped steps counted,
the low-precision dtypes kept in the trace."""

from __future__ import annotations

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
