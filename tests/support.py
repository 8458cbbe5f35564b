"""Helpers shared by test modules (importable because pytest puts ``tests/`` on the path)."""

from __future__ import annotations

from pathlib import Path

from ets_hook.trace.events import (
    CaptureInfo,
    DeviceInfo,
    IterationTrace,
    KernelEvent,
    KernelKind,
    OpEvent,
    Phase,
    Trace,
)

#: ``../shared/data`` beside the checkout: third-party data that optional tests read by path.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def sample_trace() -> Trace:
    ops = [
        OpEvent(
            "aten::linear",
            1_000,
            500,
            thread=1,
            phase=Phase.FORWARD,
            input_shapes=((32, 64), (128, 64), (128,)),
            input_dtypes=("float",) * 3,
            sequence_nr=7,
            gap_ns=20,
        ),
        OpEvent(
            "aten::addmm",
            1_100,
            300,
            thread=1,
            phase=Phase.FORWARD,
            depth=1,
            parent=0,
            input_shapes=((128,), (32, 64), (64, 128)),
            input_dtypes=("float",) * 3,
        ),
        OpEvent(
            "autograd::engine::evaluate_function: AddmmBackward0",
            2_000,
            900,
            thread=2,
            phase=Phase.BACKWARD,
            kernel_duration_ns=400,
            kernel_count=2,
            gap_ns=0,
        ),
        OpEvent(
            "aten::add_",
            3_000,
            50,
            thread=1,
            phase=Phase.OPTIMIZER,
            flops=128,
            bytes_moved=1024,
            params=(1, 2, 3),
        ),
    ]
    kernels = [
        KernelEvent(
            "volta_sgemm_128x64_nn",
            1_200,
            250,
            device=0,
            stream=7,
            correlation_id=11,
            op_index=1,
            grid=(4, 2, 1),
            block=(256, 1, 1),
        ),
        KernelEvent(
            "Memcpy HtoD",
            1_500,
            30,
            kind=KernelKind.MEMCPY,
            stream=7,
            correlation_id=12,
            bytes=4096,
        ),
        KernelEvent(
            "ncclDevKernel_AllReduce",
            2_100,
            700,
            stream=9,
            correlation_id=13,
            op_index=2,
            communication=True,
        ),
    ]
    iterations = [
        IterationTrace(step=1, start_ns=900, end_ns=3_200, ops=ops, kernels=kernels),
        IterationTrace(step=2, start_ns=3_200, end_ns=5_000),
    ]
    return Trace(
        iterations=iterations,
        device=DeviceInfo(kind="cuda", name="Test GPU", index=0, uuid="GPU-1234"),
        capture=CaptureInfo(skip_steps=1, capture_steps=2, op_capture="test", dropped_records=3),
        torch_version="2.13.0",
        ets_hook_version="0.1.0",
        step_times_s=[0.5, 0.25, 0.24],
        rank=1,
        world_size=2,
        metadata={"model": "MLP", "batch_size": 32, "tags": ["a", "b"]},
    )
