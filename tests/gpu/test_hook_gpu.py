"""ETSHook on a real GPU: kernels captured through our CUPTI collector and linked to ops."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.cli.zoo import workloads

pytestmark = pytest.mark.requires_cuda


@pytest.mark.parametrize("op_capture", ["native", "profiler"])
@pytest.mark.parametrize("name", ["resnet-w16-x2-b32-s32", "transformer-d128-l4-b16-t64"])
def test_kernels_in_a_captured_step_are_linked_to_ops(name, op_capture):
    """On the native path kernels link through the external ids each op pushed (>= 99% of
    them: the launch-time fallback, which also links nearly all, must not be what does it); on
    the profiler path through launch times."""
    job = workloads()[name].build("cuda")
    batches = job.batches()
    hook = ETSHook(
        job.model, optimizer=job.optimizer, total_steps=12, capture_steps=3, op_capture=op_capture
    )
    for _ in range(12):
        job.train_step(next(batches))
    torch.cuda.synchronize()
    hook.close()
    trace = hook.wait_for_trace(60)
    assert trace is not None, hook.capture_status
    assert hook.kernel_capture_status.startswith("on"), hook.kernel_capture_status
    assert trace.device.kind == "cuda" and trace.device.name
    assert op_capture in trace.capture.op_capture
    for iteration in trace.iterations:
        kernels = [k for k in iteration.kernels if k.kind.value == "kernel"]
        assert len(kernels) >= 10
        linked = sum(1 for k in kernels if k.op_index >= 0)
        assert linked / len(kernels) >= 0.99, (iteration.step, linked, len(kernels))
        for kernel in kernels:
            assert kernel.duration_ns > 0
            # On the host clock: within the step, allowing the device to lag the host by 1 s.
            assert iteration.start_ns - 10**6 <= kernel.start_ns <= iteration.end_ns + 10**9
        top = [op for op in iteration.top_level_ops() if op.kernel_count > 0]
        assert top and all(op.kernel_duration_ns > 0 for op in top)
    found = re.search(
        r"(\d+) by external correlation id, (\d+) by launch time, (\d+) unlinked",
        hook.kernel_capture_status,
    )
    assert found is not None, hook.kernel_capture_status
    by_id, by_launch, unlinked = map(int, found.groups())
    filed = by_id + by_launch + unlinked
    assert filed >= 10 * len(trace.iterations), hook.kernel_capture_status
    if op_capture == "native":
        assert by_id >= 0.99 * filed, hook.kernel_capture_status
    else:  # the profiler pushes no ids of ours: the launch times link them
        assert by_id == 0 and by_launch > 0, hook.kernel_capture_status
    prediction = hook.prediction
    assert prediction is not None and prediction.iteration_s > 0


def test_device_step_times_feed_the_measured_estimate():
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")
    hook = ETSHook(model, optimizer=opt, total_steps=40, capture_steps=2)
    for _ in range(40):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    hook.close()
    prediction = hook.prediction
    assert prediction.measured_steps >= 20
    assert prediction.total_s > 0


def test_backs_off_under_a_cuda_torch_profiler():
    model = nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=0)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            opt.step()
        hook.close()
    assert "another torch profiler" in hook.capture_status
    assert any(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
