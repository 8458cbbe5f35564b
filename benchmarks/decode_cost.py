#!/usr/bin/env python
"""CPU time of each stage of the window's decode, on one captured window of a zoo workload.

The hook captures a 5-step window (native observer, shapes on every step, decode on the
training thread so nothing overlaps); the stages are then repeated on that window's data and
timed with ``time.thread_time`` (this thread's CPU time: steadier than wall time on a loaded
machine, though caches and frequency still move it):

- ``read``: the observer's records -> ``RawOp`` rows (pairing, names, input shapes);
- ``build_iterations``: nesting, phases, steps -> ``IterationTrace``s;
- ``estimate``: the default trace estimator (per-op medians + the shipped ETS model), its
  per-op cost cache cleared first, as in a job's first (only) decode.

To compare two versions of the package, run the script against each (``PYTHONPATH=<checkout>``)
in alternation and compare medians.

``--lost-time`` measures instead what the decode costs the training loop, against the prior
the hook prices it with (``NativeOpCapture.decode_costs`` for the window's ops): each
workload in a fresh process runs 40 steps with a hook (window of 5 after 2 steps, shapes on
the first; ``--estimator none`` without the trace model), and prints the decode's wall and CPU
time (the trace's ``metadata["decode"]``), the time the steps that ran beside it lost over the
median of steps 20-40, the prior's range and the ratio to its midpoint, then a least-squares
line of the loss against the ops. ``--repeats`` runs per workload, alternating.

Usage::

    python benchmarks/decode_cost.py [--workloads mlp-w128-d2-b32,gpt-d64-l2-b8-t64] [--repeats 40]
    python benchmarks/decode_cost.py --lost-time --repeats 3 --workloads \
        mlp-w128-d2-b32,gpt-d64-l2-b8-t64,resnet-w8-x1-b16-s32,transformer-d128-l4-b16-t64
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from ets_hook import ETSHook
from ets_hook.capture import native_ops
from ets_hook.capture import ops as ops_module
from ets_hook.capture import window as window_module
from ets_hook.capture.ops import NativeOpCapture
from ets_hook.cli.zoo import workloads
from ets_hook.ets import flops
from ets_hook.ets.blas import single_threaded_blas
from ets_hook.forecast.trace_estimators import default_trace_estimator


def capture_window(name: str) -> tuple[dict[str, Any], Any]:
    """One 5-step window of ``name``: the decode's inputs (kept) and the decoded trace."""
    job = workloads()[name].build("cpu", seed=0)
    batches = job.batches()
    for _ in range(10):
        job.train_step(next(batches))
    kept: dict[str, Any] = {}
    read_rows = ops_module._native_rows
    build = window_module.build_iterations

    def keep_rows(*args: Any) -> Any:
        kept["rows"] = args
        return read_rows(*args)

    def keep_build(raws: Any, bounds: Any, **kwargs: Any) -> Any:
        kept["build"] = (raws, bounds, {k: v for k, v in kwargs.items() if k != "positions"})
        return build(raws, bounds, **kwargs)

    ops_module._native_rows, window_module.build_iterations = keep_rows, keep_build
    try:
        hook = ETSHook(
            job.model,
            optimizer=job.optimizer,
            total_steps=1000,
            skip_steps=1,
            capture_steps=5,
            record_shapes="all",
            op_capture="native",
            decode_in_background=False,
            log_every=None,
        )
        for _ in range(8):
            job.train_step(next(batches))
            hook.step()
        trace = hook.trace
        hook.close()
    finally:
        ops_module._native_rows, window_module.build_iterations = read_rows, build
    if trace is None or "rows" not in kept:
        raise SystemExit(f"{name}: no native window was captured ({hook.capture_status})")
    kept["read"], kept["build_iterations"] = read_rows, build
    return kept, trace


def time_stages(stages: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Each stage ``repeats`` times, in rotated order; CPU seconds of this thread per call."""
    times: dict[str, list[float]] = {k: [] for k in stages}
    names = list(stages)
    for r in range(repeats):
        for key in names[r % len(names) :] + names[: r % len(names)]:
            start = time.thread_time()
            stages[key]()
            times[key].append(time.thread_time() - start)
    return times


def lost_time_run(name: str, estimator: str, steps: int = 40) -> dict[str, Any]:
    """One default hook's window on ``name`` in this (fresh) process: the decode's wall time
    (``trace.metadata["decode"]``) and what the steps beside it lost over the median of steps
    20-40."""
    job = workloads()[name].build("cpu", seed=0)
    batches = job.batches()
    for _ in range(10):
        job.train_step(next(batches))
    hook = ETSHook(
        job.model,
        optimizer=job.optimizer,
        capture_steps=5,
        skip_steps=2,
        log_every=None,
        trace_estimator="auto" if estimator == "learned" else None,
    )
    ends_ns, steps_ns = [], []
    for _ in range(steps):
        batch = next(batches)
        start = time.perf_counter_ns()
        job.train_step(batch)
        hook.step()
        ends_ns.append(time.perf_counter_ns())
        steps_ns.append(ends_ns[-1] - start)
    trace = hook.wait_for_trace(120)
    hook.close()
    if trace is None:
        raise SystemExit(f"{name}: no decoded window ({hook.capture_status})")
    decode = trace.metadata["decode"]
    window_end = 2 + 5 - 1  # the step whose end starts the decode
    decode_end = ends_ns[window_end] + decode["wall_s"] * 1e9
    steady_ns = statistics.median(steps_ns[20:])
    beside = [i for i in range(window_end + 1, steps) if ends_ns[i] - steps_ns[i] < decode_end]
    return {
        "workload": name,
        "ops": sum(len(it.ops) for it in trace.iterations),
        "steady_ms": steady_ns / 1e6,
        "decode_wall_s": decode["wall_s"],
        "decode_cpu_s": decode["cpu_s"],
        "lost_s": sum(steps_ns[i] - steady_ns for i in beside) / 1e9,
    }


def lost_time(names: list[str], repeats: int, estimator: str) -> int:
    """``--lost-time``: ``lost_time_run`` of each workload in fresh processes, alternating,
    beside the observer's decode prior for the window's ops; then the least-squares line of
    the lost time against the ops."""
    prior = NativeOpCapture.decode_costs[estimator == "learned"]
    print(
        f"{'workload':30} {'ops':>6} {'step ms':>8} {'decode wall ms':>14} {'cpu ms':>7} "
        f"{'lost ms':>8} {'prior ms':>14} {'lost/prior mid':>14}"
    )
    runs = []
    for _ in range(repeats):
        for name in names:
            child = subprocess.run(
                [sys.executable, __file__, "--lost-time-child", name, "--estimator", estimator],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            r = json.loads(child.stdout.strip().splitlines()[-1])
            runs.append(r)
            low_ms, high_ms = (1e3 * x for x in prior.range_s(r["ops"]))
            print(
                f"{name:30} {r['ops']:>6} {r['steady_ms']:>8.2f} "
                f"{1e3 * r['decode_wall_s']:>14.1f} {1e3 * r['decode_cpu_s']:>7.1f} "
                f"{1e3 * r['lost_s']:>8.1f} {low_ms:>6.1f}-{high_ms:<7.1f} "
                f"{r['lost_s'] / prior.midpoint_s(r['ops']):>14.2f}",
                flush=True,
            )
    ratios = [r["lost_s"] / prior.midpoint_s(r["ops"]) for r in runs]
    print(
        f"lost / the prior's midpoint: median {statistics.median(ratios):.2f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(runs)} runs"
    )
    if len({r["ops"] for r in runs}) > 1:
        fit = statistics.linear_regression(
            [r["ops"] for r in runs], [1e3 * r["lost_s"] for r in runs]
        )
        print(f"lost = {fit.intercept:.1f} ms + {1e3 * fit.slope:.2f} us/op (least squares)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp-w128-d2-b32,gpt-d64-l2-b8-t64")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument(
        "--lost-time", action="store_true", help="the steps' loss to the decode against the prior"
    )
    parser.add_argument(
        "--estimator",
        choices=("learned", "none"),
        default="learned",
        help="--lost-time's trace estimator: the shipped model, or none",
    )
    parser.add_argument("--lost-time-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.lost_time_child:
        torch.set_num_threads(1)
        print(json.dumps(lost_time_run(args.lost_time_child, args.estimator)))
        return 0
    if args.lost_time:
        return lost_time(args.workloads.split(","), args.repeats, args.estimator)
    if native_ops.load(build_if_missing=True) is None:
        print(f"native observer unavailable: {native_ops.unavailable_reason()}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    estimator = default_trace_estimator("cpu")
    assert estimator is not None
    print("stage CPU time per call, ms: median [min, max] over rounds")
    for name in args.workloads.split(","):
        kept, trace = capture_window(name)

        def estimate(trace: Any = trace) -> Any:
            flops._cached_op_cost.cache_clear()
            return estimator(trace)

        def read(kept: dict[str, Any] = kept) -> Any:
            return kept["read"](*kept["rows"])

        def build(kept: dict[str, Any] = kept) -> Any:
            raws, bounds, kwargs = kept["build"]
            return kept["build_iterations"](raws, bounds, positions={}, **kwargs)

        stages = {"read": read, "build_iterations": build, "estimate": estimate}
        with single_threaded_blas():
            times = time_stages(stages, args.repeats)
        ops = sum(len(it.ops) for it in trace.iterations)
        cells = "  ".join(
            f"{k} {1e3 * statistics.median(v):.2f} [{1e3 * min(v):.2f}, {1e3 * max(v):.2f}]"
            for k, v in times.items()
        )
        total = sum(statistics.median(v) for v in times.values())
        print(f"{name}: {ops} ops in 5 steps; {cells}; sum of medians {1e3 * total:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
