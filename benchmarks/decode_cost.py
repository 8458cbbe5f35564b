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

Usage::

    python benchmarks/decode_cost.py [--workloads mlp-w128-d2-b32,gpt-d64-l2-b8-t64] [--repeats 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from ets_hook import ETSHook
from ets_hook.capture import native_ops
from ets_hook.capture import ops as ops_module
from ets_hook.capture import window as window_module
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp-w128-d2-b32,gpt-d64-l2-b8-t64")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
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
