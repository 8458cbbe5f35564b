"""Per-step overhead of ets-hook, measured side by side with no hook and with torch.profiler.

For each workload the same training loop runs in interleaved blocks (so drift and noise from the
machine hit every mode alike):

- ``none``:            no hook at all;
- ``capture``:         steps inside ets-hook's capture window (a fresh hook per block, default
                       settings: skip_steps=1, capture_steps=5; the profiler enable/disable and the
                       shapes switch land inside these steps and are counted);
- ``after``:           steps after the window, once decoding has finished (the hook still times
                       every step and updates its forecast);
- ``torch_profiler``:  the same number of steps inside ``torch.profiler.profile(record_shapes=True)``
                       with CPU activities (context enter/exit outside the timed steps).

Per-step wall time is taken by the loop itself around the whole step (forward, backward,
optimizer step, hook.step()). Reported: median per mode, ratios to ``none``, and how ets-hook's
capture overhead compares with torch.profiler's. Usage::

    python benchmarks/overhead.py [--workloads a,b] [--repeats 12] [--json out.json] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

from ets_hook import ETSHook
from ets_hook.zoo import workloads

DEFAULT_WORKLOADS = (
    "mlp-w128-d2-b32",
    "gpt-d64-l2-b8-t64",
    "resnet-w8-x1-b16-s32",
    "transformer-d128-l4-b16-t64",
)
WINDOW = 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed_steps(job: Any, batches: Any, count: int, hook: ETSHook | None) -> list[float]:
    times = []
    for _ in range(count):
        batch = next(batches)
        _sync(job.device)
        start = time.perf_counter_ns()
        job.train_step(batch)
        if hook is not None:
            hook.step()
        _sync(job.device)
        times.append((time.perf_counter_ns() - start) / 1e9)
    return times


def measure(name: str, repeats: int, device: str) -> dict[str, Any]:
    job = workloads()[name].build(device)
    batches = job.batches()
    _timed_steps(job, batches, 10, None)  # warm-up: allocator, lazy init, first-step effects
    samples: dict[str, list[float]] = {"none": [], "capture": [], "after": [], "torch_profiler": []}
    window_means: list[float] = []
    for _ in range(repeats):
        samples["none"] += _timed_steps(job, batches, WINDOW, None)

        hook = ETSHook(job.model, optimizer=job.optimizer, capture_steps=WINDOW, skip_steps=1)
        _timed_steps(job, batches, 1, hook)  # step 0: before the window
        in_window = _timed_steps(job, batches, WINDOW, hook)
        samples["capture"] += in_window
        window_means.append(statistics.fmean(in_window))
        hook.wait_for_trace(120)
        samples["after"] += _timed_steps(job, batches, WINDOW, hook)
        hook.close()

        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        )
        with profiler:
            samples["torch_profiler"] += _timed_steps(job, batches, WINDOW, None)

    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    base = medians["none"]
    overhead = {mode: medians[mode] / base - 1.0 for mode in medians}
    tp = overhead["torch_profiler"]
    return {
        "workload": name,
        "steps_per_mode": {mode: len(values) for mode, values in samples.items()},
        "median_step_ms": {mode: 1e3 * value for mode, value in medians.items()},
        "overhead": overhead,
        "capture_window_mean_overhead": statistics.median(window_means) / base - 1.0,
        "capture_vs_torch_profiler": (overhead["capture"] / tp) if tp > 0 else None,
    }


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--repeats", type=int, default=12, help="blocks per mode (default 12)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    results = []
    print(f"machine: {machine()}")
    header = (
        f"{'workload':32} {'none ms':>8} {'capture':>9} {'window':>9} {'after':>8} "
        f"{'torch.prof':>10} {'capture/tp':>10}"
    )
    print(header)
    for name in args.workloads.split(","):
        result = measure(name, args.repeats, args.device)
        results.append(result)
        o = result["overhead"]
        ratio = result["capture_vs_torch_profiler"]
        print(
            f"{name:32} {result['median_step_ms']['none']:8.2f} {100 * o['capture']:+8.1f}%"
            f" {100 * result['capture_window_mean_overhead']:+8.1f}% {100 * o['after']:+7.1f}%"
            f" {100 * o['torch_profiler']:+9.1f}% {ratio if ratio is None else f'{ratio:10.2f}'}"
        )
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": machine(), "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
