"""ETSHook on a real GPU with torch.compile (CUDA graphs included) and bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from ets_hook import ETSHook
from ets_hook.cli.zoo import workloads

pytestmark = pytest.mark.requires_cuda


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_model_keeps_kernel_capture_and_compile_out_of_the_window(mode: str) -> None:
    """Kernels still reach our CUPTI collector when inductor replays CUDA graphs, and the
    compile steps (CUDA-graph recording included) are warm-up, outside the window."""
    job = workloads()["resnet-w16-x2-b32-s32"].build("cuda")
    compiled = torch.compile(job.model, mode=mode)
    batches = job.batches()
    hook = ETSHook(compiled, optimizer=job.optimizer, total_steps=30, capture_steps=3)
    for _ in range(30):
        x, y = next(batches)
        job.optimizer.zero_grad(set_to_none=True)
        job.loss_fn(compiled(x), y).backward()
        job.optimizer.step()
    torch.cuda.synchronize()
    hook.close()
    trace = hook.wait_for_trace(120)
    assert trace is not None, hook.capture_status
    assert hook.kernel_capture_status.startswith("on"), hook.kernel_capture_status
    phases = {p.name: p for p in hook.prediction.phases}
    assert phases["compile"].spent_s > 0
    assert hook.skip_steps >= 2 and trace.iterations[0].step >= hook.skip_steps
    for iteration in trace.iterations:
        assert sum(1 for k in iteration.kernels if k.kind.value == "kernel") >= 5


def test_bf16_autocast_job_keeps_dtypes_and_predicts() -> None:
    job = workloads()["transformer-d128-l4-b16-t64"].build("cuda")
    batches = job.batches()
    scaler = torch.amp.GradScaler("cuda")
    hook = ETSHook(job.model, job.optimizer, total_steps=40, capture_steps=3, grad_scaler=scaler)
    for _ in range(40):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = job.loss(next(batches))
        job.optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(job.optimizer)
        scaler.update()
    torch.cuda.synchronize()
    hook.close()
    assert hook.steps_completed == 40
    trace = hook.wait_for_trace(120)
    assert trace is not None
    dtypes = {d for it in trace.iterations for op in it.ops for d in op.input_dtypes}
    assert any("BFloat16" in d or "bfloat16" in d for d in dtypes), sorted(dtypes)[:20]
    assert hook.prediction.total_s is not None
