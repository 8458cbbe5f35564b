"""Collect our own ETS dataset on this machine: early traces with steady-state targets.

Every zoo workload (ten-plus architecture families, several sizes) runs at several batch sizes
through ``ETSHook`` exactly as a user's job would: the hook captures steps [1, 6) (the early
window the predictor sees at run time). Later in the same job, once warm-up is long over, a
second hook captures steps [S, S + 5): the steady-state window whose per-op times are the
targets. Each job is saved as one ``.ets`` file holding both windows:

- ``trace.iterations``: early steps first, then the steady steps;
- ``trace.metadata``: ``early_steps``, ``steady_steps``, ``steady_step_s`` (median wall time of
  the steps after warm-up, outside both windows), ``step_times_s`` (every step), workload facts
  (family, batch size, parameters), and the machine.

Usage::

    python benchmarks/collect.py --out results/dataset [--steps 60] [--batch-scales 0.5,1,2]
    ets-hook train results/dataset/*.ets -o model.npz      # then train on it
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ets_hook import ETSHook
from ets_hook.cli.zoo import Workload, workloads
from ets_hook.trace.events import Trace
from ets_hook.trace.io import save_trace

EARLY_SKIP, WINDOW = 1, 5


def collect_one(
    workload: Workload, steps: int, device: str, seed: int, op_capture: str = "auto"
) -> Trace:
    """Run one job; return its early + steady trace with targets in the metadata."""
    steady_start = max(EARLY_SKIP + WINDOW + 10, steps - WINDOW - 5)
    job = workload.build(device, seed=seed)
    batches = job.batches()
    early_hook = ETSHook(
        job.model,
        optimizer=job.optimizer,
        total_steps=steps,
        skip_steps=EARLY_SKIP,
        capture_steps=WINDOW,
        log_every=None,
        deadline=False,
        op_capture=op_capture,
    )
    steady_hook: ETSHook | None = None
    for step in range(steps):
        if step == steady_start:
            steady_hook = ETSHook(
                job.model,
                optimizer=job.optimizer,
                skip_steps=0,
                capture_steps=WINDOW,
                log_every=None,
                deadline=False,
                trace_estimator=None,
                op_capture=op_capture,
            )
        job.train_step(next(batches))
    early_hook.close()
    assert steady_hook is not None
    steady_hook.close()
    early, steady = early_hook.wait_for_trace(120), steady_hook.wait_for_trace(120)
    if early is None or steady is None:
        raise RuntimeError(
            f"{workload.name}: capture failed ({early_hook.capture_status}; "
            f"{steady_hook.capture_status})"
        )
    times = early_hook.step_times_s
    windows = set(range(EARLY_SKIP, EARLY_SKIP + WINDOW)) | set(
        range(steady_start, steady_start + WINDOW)
    )
    settled = [t for i, t in enumerate(times) if i >= steps // 3 and i not in windows]
    # The steady hook counts its own steps from 0: shift them to the job's step numbers.
    for iteration in steady.iterations:
        iteration.step += steady_start
    model = job.model
    early.iterations += steady.iterations
    early.metadata.update(
        {
            "source": "benchmarks/collect.py",
            "workload": workload.name,
            "family": workload.family,
            "batch_size": workload.batch_size,
            "workload_params": dict(workload.params),
            "parameters": sum(p.numel() for p in model.parameters()),
            "optimizer": workload.optimizer,
            "seed": seed,
            "early_steps": [it.step for it in early.iterations if it.step < steady_start],
            "steady_steps": [it.step for it in steady.iterations],
            "steady_step_s": statistics.median(settled),
            "step_times_s": list(times),
            "machine": platform.node(),
            "op_capture": early.capture.op_capture,
        }
    )
    return early


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/dataset", help="output directory")
    parser.add_argument("--steps", type=int, default=60, help="steps per job (default 60)")
    parser.add_argument("--batch-scales", default="0.5,1,2", help="batch-size multipliers")
    parser.add_argument("--workloads", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per configuration")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--op-capture", default="native", choices=("native", "profiler"), help="hook setting"
    )
    args = parser.parse_args(argv)
    if args.steps < 2 * (EARLY_SKIP + WINDOW) + 15:
        parser.error(f"--steps must be >= {2 * (EARLY_SKIP + WINDOW) + 15}, got {args.steps}")
    zoo = workloads()
    names = [n for n in args.workloads.split(",") if n] or list(zoo)
    unknown = [n for n in names if n not in zoo]
    if unknown:
        parser.error(f"unknown workloads {unknown}")
    scales = [float(s) for s in args.batch_scales.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Jobs already listed in an existing index stay listed unless collected again.
    index_path = out / "index.json"
    index: list[dict[str, Any]] = []
    if index_path.is_file():
        index = json.loads(index_path.read_text()).get("jobs", [])
    started = time.perf_counter()
    for name in names:
        for scale in scales:
            workload = zoo[name].with_batch_size(max(1, round(zoo[name].batch_size * scale)))
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                trace = collect_one(workload, args.steps, args.device, seed, args.op_capture)
                path = out / f"{workload.name}.s{seed}.ets"
                save_trace(trace, path)
                meta = trace.metadata
                index = [job for job in index if job["file"] != path.name]
                index.append(
                    {
                        "file": path.name,
                        "workload": workload.name,
                        "family": workload.family,
                        "batch_size": workload.batch_size,
                        "steady_step_s": meta["steady_step_s"],
                        "ops_per_step": len(trace.iterations[0].ops),
                    }
                )
                print(
                    f"{path.name:48} {1e3 * meta['steady_step_s']:9.2f} ms/step  "
                    f"{len(trace.iterations[0].ops):6} ops  ({time.perf_counter() - t0:.0f}s)"
                )
                sys.stdout.flush()
    index_path.write_text(
        json.dumps(
            {
                "machine": {
                    "host": platform.node(),
                    "cores": os.cpu_count(),
                    "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(),
                },
                "steps": args.steps,
                "jobs": index,
            },
            indent=1,
        )
    )
    print(f"{len(index)} traces in {out} ({time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
