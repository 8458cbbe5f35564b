"""CUPTI collection on a real GPU: a small model's training step, compared with torch.profiler.

Run with ``pytest -m requires_cuda tests/gpu`` (benchmarks/gpu_check.sh does). Order matters: the
torch.profiler comparison runs last, because Kineto keeps a CUPTI subscriber for the rest of the
process once it has traced CUDA, and our collector refuses to start next to another subscriber.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ets_hook.capture import cupti
from ets_hook.capture.cupti import KernelCollector, RecordKind
from ets_hook.capture.gpu_records import decode_activity
from ets_hook.trace.events import KernelKind

pytestmark = pytest.mark.requires_cuda

torch = pytest.importorskip("torch")


class Job:
    """A small conv + MLP classifier trained with SGD: a few dozen kernels per step."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        torch.backends.cudnn.benchmark = False
        self.device = torch.device("cuda")
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(16 * 16, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 10),
        ).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.x = torch.randn(32, 3, 32, 32, device=self.device)
        self.y = torch.randint(0, 10, (32,), device=self.device)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()

    def warm_up(self, steps: int = 5) -> None:
        for _ in range(steps):
            self.step()
        torch.cuda.synchronize()


@pytest.fixture(scope="module")
def job() -> Job:
    j = Job()
    j.warm_up()
    return j


def captured_step(
    job: Job, steps: int = 1
) -> tuple[np.ndarray, KernelCollector, list[tuple[int, int]]]:
    collector = KernelCollector()
    status = collector.start()
    assert status.available, f"{status.code}: {status.reason}"
    job.warm_up(2)  # the first steps after enabling CUPTI carry its attach cost
    collector.flush()
    collector.drain()  # discard the warm-up records
    bounds = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.time_ns()
        job.step()
        torch.cuda.synchronize()
        bounds.append((start, time.time_ns()))
    collector.stop()
    records = collector.drain()
    assert collector.dropped == 0, collector.stats()
    collector.close()
    return records, collector, bounds


def test_cupti_is_available(job: Job) -> None:
    status = cupti.cupti_status()
    assert status.available, f"{status.code}: {status.reason}"
    info = cupti._C._testing.cupti_info()
    assert int(info["runtime_version"]) > 0
    assert Path(str(info["library_path"])).name.startswith("libcupti.so")


def test_training_step_kernels_have_sane_timestamps_names_and_launches(job: Job) -> None:
    records, collector, bounds = captured_step(job)
    offset = collector.clock_offset_ns
    assert offset is not None
    activity = decode_activity(records, clock_offset_ns=offset)
    kernels = [k for k in activity.kernels if k.kind is KernelKind.KERNEL]
    assert len(kernels) >= 10
    assert activity.invalid == 0
    (start, end) = bounds[0]
    slack_ns = 2_000_000  # clock-offset measurement and timer granularity
    for k in kernels:
        assert start - slack_ns <= k.start_ns <= k.end_ns <= end + slack_ns, k
        assert 0 <= k.duration_ns < 1_000_000_000
        assert k.name, k  # resolved
        assert all(g >= 1 for g in k.grid) and all(b >= 1 for b in k.block), k
        assert k.device == torch.cuda.current_device()
    still_mangled = [k.name for k in kernels if k.name.startswith("_Z")]
    assert len(still_mangled) <= len(kernels) // 10, still_mangled
    names = " ".join(k.name for k in kernels).lower()
    assert "at::native" in names  # ReLU / SGD / loss kernels
    assert any(s in names for s in ("gemm", "gemv", "cutlass", "matmul", "xmma")), names[:2000]
    # every kernel was launched by this thread through a runtime call that precedes it
    launches = {
        int(c): (int(t), int(s))
        for c, t, s in activity.launches[["correlation_id", "thread_id", "start_ns"]].tolist()
    }
    me = threading.get_native_id()
    for k in kernels:
        thread_id, launch_ns = launches[k.correlation_id]
        assert thread_id == me
        assert launch_ns <= k.start_ns + slack_ns
    assert kernels == sorted(kernels, key=lambda k: k.start_ns)
    runtime = activity.launches[activity.launches["kind"] == RecordKind.RUNTIME]
    assert cupti._C._testing.cupti_callback_name(int(runtime["cbid"][0])).startswith("cuda")


def test_external_ids_tag_the_kernels_an_op_launches(job: Job) -> None:
    collector = KernelCollector()
    assert collector.start().available
    a = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    assert cupti.push_external_id(4242)
    b = a @ a
    assert cupti.pop_external_id() == 4242
    c = b.relu()
    torch.cuda.synchronize()
    collector.stop()
    records = collector.drain()
    collector.close()
    activity = decode_activity(records)
    tagged = set(
        activity.external_ids["correlation_id"][
            activity.external_ids["external_id"] == 4242
        ].tolist()
    )
    assert tagged
    matmul = [k for k in activity.kernels if k.correlation_id in tagged]
    assert matmul and all(k.kind is KernelKind.KERNEL for k in matmul)
    assert not any("relu" in k.name.lower() for k in matmul)  # launched after the pop
    del c


def test_kernel_count_of_one_step_matches_torch_profiler(job: Job, tmp_path: Path) -> None:
    # ours first (see module docstring), then torch.profiler on the identical step
    records, _, _ = captured_step(job)
    ours = int(np.count_nonzero(records["kind"] == RecordKind.KERNEL))

    job.warm_up(2)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        job.step()
        torch.cuda.synchronize()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    categories = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    theirs = categories["kernel"]
    assert theirs > 0, categories
    assert ours == theirs, f"ets-hook {ours} kernels, torch.profiler {theirs} ({categories})"
