"""The hook's kernel path end to end on a CPU: a fake libcupti delivers activity records.

A custom op stands in for a CUDA op: inside it (so inside its profiler interval, on the training
thread) it queues a synthetic CUPTI buffer with a runtime launch record stamped "now" and the
kernel that launch produced. The hook must start our collector, drain and decode the records
after the window, and link each kernel to the op that launched it.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch
from torch import nn

from ets_hook import _C, ETSHook
from ets_hook.capture import cupti

T = _C._testing
pytestmark = pytest.mark.skipif(not T.CUPTI_COMPILED, reason="built without CUPTI headers")
CBID_LAUNCH_KERNEL = 211
_correlation = iter(range(1, 10**6))


@torch.library.custom_op("ets_test::fake_gpu_op", mutates_args=())
def fake_gpu_op(x: torch.Tensor) -> torch.Tensor:
    corr = next(_correlation)
    now_ns = time.time_ns()  # the fake CUPTI clock is the host's real-time clock
    T.queue_activity_buffer(
        T.build_activity_buffer(
            [
                {"kind": "runtime", "cbid": CBID_LAUNCH_KERNEL, "start": now_ns,
                 "end": now_ns + 2_000, "threadId": threading.get_native_id(),
                 "correlationId": corr},
                {"kind": "concurrent_kernel", "name": "fake_kernel", "start": now_ns + 5_000,
                 "end": now_ns + 25_000, "streamId": 7, "correlationId": corr},
            ]
        )
    )  # fmt: skip
    return x * 2


@fake_gpu_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    pass


def _backward(ctx, grad):
    return grad * 2


fake_gpu_op.register_autograd(_backward, setup_context=_setup_context)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return fake_gpu_op(self.linear(x))


def link_counts(kernel_status: str) -> tuple[int, int, int]:
    """Kernels linked by external correlation id, by launch time, and unlinked, as the
    kernel capture status reports them after the decode."""
    found = re.search(
        r"(\d+) by external correlation id, (\d+) by launch time, (\d+) unlinked", kernel_status
    )
    assert found is not None, kernel_status
    by_id, by_launch, unlinked = map(int, found.groups())
    return by_id, by_launch, unlinked


@pytest.fixture
def fake_cupti(monkeypatch):
    for var, _ in cupti._ENV_CLIENTS:
        monkeypatch.delenv(var, raising=False)
    T.reset_cupti()
    T.install_fake_cupti()
    yield
    if cupti._active is not None:
        cupti._active.close()
    T.reset_cupti()


def test_kernels_are_captured_and_linked_to_the_launching_op(fake_cupti):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=3, skip_steps=1, capture_kernels=True)
    for _ in range(6):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    hook.close()
    trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert hook.kernel_capture_status.startswith("on: CUPTI"), hook.kernel_capture_status
    assert "100.0% of kernels linked" in hook.kernel_capture_status
    # no external correlation record in the fake buffers: the launch-time fallback linked them
    assert link_counts(hook.kernel_capture_status) == (0, 3, 0)
    assert [it.step for it in trace.iterations] == [1, 2, 3]
    for iteration in trace.iterations:
        assert len(iteration.kernels) == 1, "one launch per step inside the window, none outside"
        (kernel,) = iteration.kernels
        op = iteration.ops[kernel.op_index]
        chain = [op]
        while chain[-1].parent >= 0:
            chain.append(iteration.ops[chain[-1].parent])
        top = chain[-1]
        # Innermost op holding the launch (the custom op's autograd wrapper), inside the op.
        assert "fake_gpu_op" in op.name and top.name == "ets_test::fake_gpu_op"
        assert kernel.name == "fake_kernel" and kernel.stream == 7
        assert op.start_ns <= kernel.start_ns - 5_000 <= op.end_ns  # launch inside the op
        assert top.kernel_duration_ns == 20_000 and top.kernel_count == 1
    assert cupti._active is None, "the collector is closed after the window"


_stacks: list[list[int]] = []


@torch.library.custom_op("ets_test::fake_gpu_op_ext", mutates_args=())
def fake_gpu_op_ext(x: torch.Tensor) -> torch.Tensor:
    """Launches with a runtime record stamped 10 s ago (no op holds it: linking by launch time
    fails) and the external correlation record CUPTI would emit for the id pushed last."""
    corr = next(_correlation)
    stack = T.fake_external_stack()
    _stacks.append(stack)
    now_ns = time.time_ns()
    records = [
        {"kind": "runtime", "cbid": CBID_LAUNCH_KERNEL, "start": now_ns - 10**10,
         "end": now_ns - 10**10 + 2_000, "threadId": threading.get_native_id(),
         "correlationId": corr},
        {"kind": "concurrent_kernel", "name": "fake_kernel", "start": now_ns + 5_000,
         "end": now_ns + 25_000, "streamId": 7, "correlationId": corr},
    ]  # fmt: skip
    if stack:
        records.append(
            {"kind": "external_correlation", "externalKind": cupti.EXTERNAL_CORRELATION_KIND,
             "externalId": stack[-1], "correlationId": corr}
        )  # fmt: skip
    T.queue_activity_buffer(T.build_activity_buffer(records))
    return x * 2


@fake_gpu_op_ext.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


fake_gpu_op_ext.register_autograd(_backward, setup_context=_setup_context)


def test_native_ops_push_their_ids_and_kernels_link_through_them(fake_cupti):
    """The native observer pushes each op's handle as CUPTI external correlation id (popped at
    its end) and the decode links a kernel to the op its launch was correlated with."""
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, capture_steps=2, skip_steps=1, capture_kernels=True)
    _stacks.clear()
    for _ in range(4):
        opt.zero_grad()
        fake_gpu_op_ext(model(torch.randn(4, 8))).sum().backward()
        opt.step()
    hook.close()
    trace = hook.wait_for_trace(30)
    assert trace is not None, hook.capture_status
    assert trace.capture.op_capture == "native RecordFunction observer"
    # ids pushed only inside the window (steps 1 and 2), every push popped again
    assert [bool(s) for s in _stacks] == [False, True, True, False]
    assert T.fake_external_stack() == []
    assert "100.0% of kernels linked" in hook.kernel_capture_status
    # every kernel through the id its launch carried, none through the launch-time fallback
    assert link_counts(hook.kernel_capture_status) == (2, 0, 0)
    for iteration in trace.iterations:
        (kernel,) = iteration.kernels
        op = iteration.ops[kernel.op_index]
        assert "fake_gpu_op_ext" in op.name
        assert op.start_ns <= kernel.start_ns <= op.end_ns + 30_000
