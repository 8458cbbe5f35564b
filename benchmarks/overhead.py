"""Per-step overhead of ets-hook, measured side by side with no hook and with torch.profiler.

For each workload the same training loop runs in interleaved blocks (so drift and noise from the
machine hit every mode alike):

- ``none``:            no hook at all;
- ``capture``:         ets-hook's capture window with default settings (skip_steps=1,
                       capture_steps=5, shapes recorded for every op). Reported two ways:
                       ``capture_steady``, the window steps with no profiler switch in them (the
                       3rd and 4th: the per-step cost of being observed), and ``window_cost``, the
                       whole extra time of steps 0-5 of a fresh hook (enable, shapes switch,
                       final disable and hand-off to the decode thread included);
- ``decode``:          the steps that run while the background thread decodes the window (it
                       shares the GIL and the cores with training); ``decode_cost`` is their
                       extra time over ``none``, ``capture_cost`` = ``window_cost`` +
                       ``decode_cost``: everything the capture costs the job;
- ``after``:           steps after the window, once decoding has finished (the hook still times
                       every step and updates its forecast);
- ``torch_profiler``:  5 steps inside ``torch.profiler.profile(record_shapes=True)`` with CPU
                       activities: per step (``torch_profiler``, steps 2-4 of the block) and the
                       block's whole extra time (context enter and exit included).

Per-step wall time is taken by the loop itself around the whole step (forward, backward,
optimizer step, hook.step()). Reported: medians per mode and ratios to ``none``; the capture
cost relative to torch.profiler's, per step and per 5-step capture. Usage::

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
from ets_hook.cli.zoo import workloads

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


def _steps_while_decoding(
    job: Any, batches: Any, hook: ETSHook, limit: int = 100_000
) -> list[float]:
    """Timed steps from the window's end until the decode thread has finished."""
    times: list[float] = []
    while hook.capture_status.startswith("decoding") and len(times) < limit:
        times += _timed_steps(job, batches, 1, hook)
    return times


def measure(name: str, repeats: int, device: str, after_steps: int) -> dict[str, Any]:
    job = workloads()[name].build(device)
    batches = job.batches()
    _timed_steps(job, batches, 10, None)  # warm-up: allocator, lazy init, first-step effects
    samples: dict[str, list[float]] = {
        "none": [],
        "capture_steady": [],
        "after": [],
        "torch_profiler": [],
    }
    window_totals: list[float] = []  # steps 0-5 of a fresh hook
    decode_blocks: list[list[float]] = []  # steps run while the window was being decoded
    profiler_totals: list[float] = []  # enter + 5 steps + exit
    for _ in range(repeats):
        samples["none"] += _timed_steps(job, batches, after_steps, None)

        hook = ETSHook(
            job.model, optimizer=job.optimizer, capture_steps=WINDOW, skip_steps=1, log_every=None
        )
        step0 = _timed_steps(job, batches, 1, hook)  # the profiler is enabled at its end
        in_window = _timed_steps(job, batches, WINDOW, hook)
        samples["capture_steady"] += in_window[2:4]
        window_totals.append(sum(step0) + sum(in_window))
        decode_blocks.append(_steps_while_decoding(job, batches, hook))
        hook.wait_for_trace(120)
        samples["after"] += _timed_steps(job, batches, after_steps, hook)
        hook.close()

        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        )
        _sync(job.device)
        started = time.perf_counter_ns()
        with profiler:
            profiled = _timed_steps(job, batches, WINDOW, None)
        _sync(job.device)
        profiler_totals.append((time.perf_counter_ns() - started) / 1e9)
        samples["torch_profiler"] += profiled[1:4]

    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    base = medians["none"]
    overhead = {mode: medians[mode] / base - 1.0 for mode in medians}
    window_cost_s = statistics.median(window_totals) - (WINDOW + 1) * base
    decode_cost_s = statistics.median(sum(block) - len(block) * base for block in decode_blocks)
    capture_cost_s = statistics.median(
        total + sum(block) - (WINDOW + 1 + len(block)) * base
        for total, block in zip(window_totals, decode_blocks)
    )
    profiler_cost_s = statistics.median(profiler_totals) - WINDOW * base
    tp = overhead["torch_profiler"]
    return {
        "workload": name,
        "steps_per_mode": {mode: len(values) for mode, values in samples.items()},
        "median_step_ms": {mode: 1e3 * value for mode, value in medians.items()},
        "overhead": overhead,
        "window_cost_ms": 1e3 * window_cost_s,
        "decode_steps": statistics.median(len(block) for block in decode_blocks),
        "decode_cost_ms": 1e3 * decode_cost_s,
        "capture_cost_ms": 1e3 * capture_cost_s,
        "torch_profiler_cost_ms": 1e3 * profiler_cost_s,
        "capture_vs_torch_profiler_per_step": overhead["capture_steady"] / tp if tp > 0 else None,
        "capture_vs_torch_profiler_per_window": (
            window_cost_s / profiler_cost_s if profiler_cost_s > 0 else None
        ),
        "capture_with_decode_vs_torch_profiler": (
            capture_cost_s / profiler_cost_s if profiler_cost_s > 0 else None
        ),
    }


def hook_cost_per_step_us(blocks: int = 20, steps: int = 2000) -> dict[str, float]:
    """What the hook adds to one training step after its window, isolated from the model.

    A one-element parameter and SGD make ``forward + backward + optimizer.step()`` a few
    microseconds; blocks of steps without and with a hook (window already over) alternate, and
    the difference of the medians of per-block means is the hook's own cost per step: its
    root-module pre-forward call, optimizer post-hook and O(1) step bookkeeping.
    """
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.ones(1, 1)

    def block() -> float:
        start = time.perf_counter_ns()
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
        return (time.perf_counter_ns() - start) / steps / 1e3

    for _ in range(3):
        block()  # warm-up
    without, with_hook = [], []
    for _ in range(blocks):
        without.append(block())
        hook = ETSHook(model, optimizer=opt, capture_steps=1, skip_steps=0, log_every=None)
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
        hook.wait_for_trace(60)
        with_hook.append(block())
        hook.close()
    base, hooked = statistics.median(without), statistics.median(with_hook)
    return {"step_us_without": base, "step_us_with": hooked, "hook_us": hooked - base}


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
    parser.add_argument(
        "--after-steps", type=int, default=20, help="steps per block for none / after"
    )
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.after_steps < 1:
        parser.error(f"--after-steps must be >= 1, got {args.after_steps}")
    results = []
    print(f"machine: {machine()}")
    print(
        f"{'workload':30} {'none ms':>8} {'after':>7} {'in-window':>9} {'torch.prof':>10} "
        f"{'ratio':>6} {'window ms':>9} {'t.prof ms':>9} {'ratio':>6} {'decode ms':>9} "
        f"{'(steps)':>7} {'all ms':>8}"
    )
    for name in args.workloads.split(","):
        r = measure(name, args.repeats, args.device, args.after_steps)
        results.append(r)
        o = r["overhead"]
        per_step, per_window = (
            r["capture_vs_torch_profiler_per_step"],
            r["capture_vs_torch_profiler_per_window"],
        )
        print(
            f"{name:30} {r['median_step_ms']['none']:8.2f} {100 * o['after']:+6.1f}%"
            f" {100 * o['capture_steady']:+8.1f}% {100 * o['torch_profiler']:+9.1f}%"
            f" {per_step if per_step is None else f'{per_step:6.2f}'}"
            f" {r['window_cost_ms']:9.1f} {r['torch_profiler_cost_ms']:9.1f}"
            f" {per_window if per_window is None else f'{per_window:6.2f}'}"
            f" {r['decode_cost_ms']:9.1f} {r['decode_steps']:7.0f} {r['capture_cost_ms']:8.1f}"
        )
        sys.stdout.flush()
    cost = hook_cost_per_step_us()
    print(
        f"hook cost per step after the window (isolated): {cost['hook_us']:.1f} us "
        f"(tiny step {cost['step_us_without']:.1f} us -> {cost['step_us_with']:.1f} us)"
    )
    for r in results:
        r["hook_cost_fraction"] = cost["hook_us"] / (1e3 * r["median_step_ms"]["none"])
        print(f"  = {100 * r['hook_cost_fraction']:.3f}% of a {r['workload']} step")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"machine": machine(), "results": results, "hook_cost_per_step": cost},
                handle,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
