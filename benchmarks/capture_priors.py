"""The capture's own cost, measured over a collected dataset: the numbers behind the forecaster's
capture priors (``forecast.stats.StepTimePrior.capture_ratio`` / ``capture_spike_steps``).

For every job of ``benchmarks/collect.py`` (steps 1-5 captured, the steady step time measured
later in the same job, outside every window): each window step's wall time / the steady step
time (``capture_ratio``), and the extra time of the step after the window (the capture's
teardown and the decode that starts then, on a shared GIL), in steady steps
(``capture_spike_steps``). Quantiles over all jobs are printed per op-capture path.

Usage::

    python benchmarks/capture_priors.py results/dataset-native [results/dataset-profiler ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ets_hook.trace.discovery import load_traces

WINDOW = (1, 6)  # steps [1, 6) are the window in collect.py
QUANTILES = (0.025, 0.1, 0.5, 0.9, 0.975)


def ratios(paths: list[Path]) -> dict[str, dict[str, list[float]]]:
    """Per op-capture path: window-step ratios and after-window spikes, one value per step/job."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trace in load_traces(paths):
        md = trace.metadata
        steady = float(md["steady_step_s"])
        times = [float(t) for t in md["step_times_s"]]
        if steady <= 0 or len(times) <= WINDOW[1] + 1:
            continue
        path = str(md.get("op_capture") or trace.capture.op_capture)
        out[path]["capture_ratio"] += [t / steady for t in times[WINDOW[0] : WINDOW[1]]]
        out[path]["capture_ratio_job_median"].append(
            statistics.median(times[WINDOW[0] : WINDOW[1]]) / steady
        )
        spike = sum(max(t - steady, 0.0) for t in times[WINDOW[1] : WINDOW[1] + 2]) / steady
        out[path]["capture_spike_steps"].append(spike)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="+", type=Path, help="folders of collect.py traces")
    parser.add_argument("--json", metavar="PATH", help="also write the quantiles as JSON")
    args = parser.parse_args(argv)
    table = {}
    for path, series in ratios(args.datasets).items():
        table[path] = {}
        for name, values in series.items():
            q = np.quantile(values, QUANTILES).round(3).tolist()
            table[path][name] = {"n": len(values), "quantiles": dict(zip(map(str, QUANTILES), q))}
            print(f"{path:34} {name:26} n={len(values):4}  q2.5/10/50/90/97.5 = {q}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
