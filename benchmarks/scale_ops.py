"""Scale of the native op capture: a synthetic step with ~10^5 ops through the default window.

A model whose forward runs ``--ops-per-step / 6`` tiny additions (each is an ``aten::add`` in
the forward and, in the backward, an autograd node, its engine wrapper and the gradient
accumulation: about six events per addition) trains through
``ETSHook``'s default capture window (5 steps, shapes recorded) on the native observer with the
default per-thread buffer budget. Reported: ops per step seen in the trace, records dropped, the
buffer bytes the observer held, the time from the window's end until ``hook.trace`` is ready
(decode, on the background thread), and the trace file's size.

Usage::

    python benchmarks/scale_ops.py [--ops-per-step 100000] [--json results/scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.capture import native_ops


class ManyOps(nn.Module):
    """``count`` additions of a learnt scalar to a tiny tensor: op-bound by construction."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.count):
            x = x + self.bias
        return x.sum()


def run(ops_per_step: int, steps: int) -> dict[str, float | int | str]:
    module = native_ops.load(build_if_missing=True)
    if module is None:
        raise SystemExit(f"native observer unavailable: {native_ops.unavailable_reason()}")
    model = ManyOps(max(1, ops_per_step // 6))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "scale.ets"
        hook = ETSHook(
            model,
            optimizer=opt,
            total_steps=steps,
            capture_steps=5,
            trace_path=trace_path,
            log_every=None,
        )
        window_end_s = None
        step_s = []
        for step in range(steps):
            started = time.perf_counter()
            opt.zero_grad()
            model(torch.ones(4)).backward()
            opt.step()
            step_s.append(time.perf_counter() - started)
            if step == hook.skip_steps + hook.capture_steps - 1:
                window_end_s = time.perf_counter()
                held = module.allocated_bytes()
        trace = hook.wait_for_trace(600)
        ready_s = time.perf_counter()
        hook.close()
        if trace is None:
            raise SystemExit(f"no trace: {hook.capture_status}")
        size = trace_path.stat().st_size
    per_step = [len(it.ops) for it in trace.iterations]
    return {
        "ops_per_step_asked": ops_per_step,
        "ops_per_step_seen": min(per_step),
        "steps_in_window": len(per_step),
        "dropped_records": trace.capture.dropped_records,
        "observer_buffer_bytes": held,
        "window_step_s_median": sorted(step_s[1:6])[2],
        "steady_step_s_median": sorted(step_s[7:])[len(step_s[7:]) // 2],
        "decode_until_trace_ready_s": ready_s - (window_end_s or ready_s),
        "trace_file_bytes": size,
        "capture": trace.capture.op_capture,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops-per-step", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    result = run(args.ops_per_step, args.steps)
    result["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
    result["machine"] += f"torch {torch.__version__}, load {os.getloadavg()[0]:.2f}"
    for key, value in result.items():
        print(f"{key:>28}: {value}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
