"""Per-step cost of the forecasting and reporting layer (what the hook adds after capture).

Drives a ``Forecaster`` exactly as the hook does, on a simulated clock that advances by
``--step-ms`` per step (so time-based throttles fire as they would in a real job of that step
time), and measures the real CPU time per ``on_step_end`` call, including the amortised lazy
prediction refreshes and every default reporter (log line, status file with fsync, callback,
deadline guard). The cost of the bare loop (a no-op call with the same arguments) is subtracted.

Scenarios (median over ``--repeats`` runs, ns per step):
- ``hot_path``: no reporters, nobody reads ``prediction``: the floor.
- ``default_reporters``: ``build_reporters`` defaults + status file + callback + deadline guard.
- ``default_reporters_early``: the same, first 1,000 steps only (dense early predictions).
- ``read_every_step``: ``prediction`` read after every step (as the accuracy benchmark does);
  not a default, shown for scale.

Usage: python benchmarks/forecast_cost.py [--steps 200000] [--step-ms 0.8] [--repeats 5] [--json]
Budget (issue 3): <= 1% of a 0.8 ms step, i.e. <~ 5 us/step for default settings.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.builder import build_reporters


def _noop(step_index: int, duration_s: float, now_s: float) -> None:
    pass


def _loop(on_step: Callable[[int, float, float], None], steps: int, step_s: float) -> int:
    """Real ns spent driving ``on_step`` through ``steps`` simulated steps."""
    durations = [step_s * (1.0 + 0.05 * ((i * 7919) % 17 - 8) / 8) for i in range(steps)]
    now = 0.0
    t0 = time.perf_counter_ns()
    for i in range(steps):
        d = durations[i]
        now += d
        on_step(i, d, now)
    return time.perf_counter_ns() - t0


def _reading(forecaster: Forecaster) -> Callable[[int, float, float], None]:
    def step(i: int, d: float, now: float) -> None:
        forecaster.on_step_end(i, d, now)
        _ = forecaster.prediction

    return step


def measure(steps: int, step_s: float, repeats: int) -> dict[str, float]:
    log = logging.getLogger("ets_hook")
    log.setLevel(logging.INFO)
    sink = logging.StreamHandler(io.StringIO())
    log.addHandler(sink)
    log.propagate = False
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        status = Path(tmp) / "status.json"

        def forecaster(reporting: bool) -> Forecaster:
            reporters = (
                build_reporters(
                    status_path=status, on_prediction=lambda p: None, deadline=1e9, environ={}
                )
                if reporting
                else []
            )
            return Forecaster(
                JobModel(total_steps=steps * 2), start_s=0.0, reports=ReportDispatcher(reporters)
            )

        scenarios: dict[str, tuple[Callable[[], Callable], int]] = {
            "hot_path": (lambda: forecaster(False).on_step_end, steps),
            "default_reporters": (lambda: forecaster(True).on_step_end, steps),
            "default_reporters_early": (lambda: forecaster(True).on_step_end, 1000),
            "read_every_step": (lambda: _reading(forecaster(False)), min(steps, 20_000)),
        }
        for _ in range(repeats):
            for name, (make, n) in scenarios.items():
                baseline = _loop(_noop, n, step_s)
                cost = _loop(make(), n, step_s)
                results.setdefault(name, []).append(max(cost - baseline, 0) / n)
    log.removeHandler(sink)
    log.propagate = True
    return {name: statistics.median(v) for name, v in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--step-ms", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    if args.steps < 1000 or args.repeats < 1 or args.step_ms <= 0:
        parser.error("need --steps >= 1000, --repeats >= 1, --step-ms > 0")
    step_s = args.step_ms / 1e3
    ns = measure(args.steps, step_s, args.repeats)
    budget_ns = 0.01 * step_s * 1e9
    report = {
        "steps": args.steps,
        "step_ms": args.step_ms,
        "repeats": args.repeats,
        "ns_per_step": {k: round(v, 1) for k, v in ns.items()},
        "overhead_pct_of_step": {k: round(100 * v / (step_s * 1e9), 3) for k, v in ns.items()},
        "budget_ns_1pct": round(budget_ns, 1),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"forecast cost per step ({args.steps} steps of {args.step_ms} ms, median of "
        f"{args.repeats}); 1% budget = {budget_ns:.0f} ns"
    )
    for name, value in ns.items():
        pct = 100 * value / (step_s * 1e9)
        print(f"  {name:26s} {value:9.0f} ns/step  ({pct:.3f}% of a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
