"""Accuracy of the early-stop forecast (``ets_hook.forecast.early_stop``) on synthetic curves.

Each scenario is a monitored loss evaluated every ``GAP`` steps up to ``--evals`` evaluations
(``max_steps = evals * GAP``), drawn from one of three families with random parameters:

- ``exp``: ``a + b·exp(-t/τ)`` (in the fitted families);
- ``power``: ``a + b·(t/GAP)^(-α)`` (in the fitted families);
- ``stretched``: ``a + b·exp(-(t/τ)^0.5)`` (not in them: a misspecified curve);

plus Gaussian observation noise with SD ``noise × b``. The true stopping step is where the patience
rule first fires on the whole noisy sequence (``max_steps`` when it never does). Scenarios whose
true stop comes before the largest number of evaluations in ``--seen`` are dropped (there is
nothing left to forecast), so every row is over the same scenarios.

For each number of evaluations seen, over all scenarios: the median and P90 absolute error of
``expected_stop_step`` in % of the true stopping step and in evaluations; the share of true
stops inside ``[earliest_stop_step, max_steps]`` (the reported range) and inside
``[earliest_stop_step, latest_stop_step]`` (the 10-90% band); and the median signed error in
evaluations (> 0: forecast too late).

Usage: python benchmarks/early_stop.py [--seeds 12] [--evals 200] [--seen 4,6,8,12,16,24]
       [--noise 0.002,0.01,0.03] [--patience 3,5,10] [--min-delta 0]
       [--families exp,power,stretched] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ets_hook.forecast.early_stop import EarlyStoppingRule, EarlyStopTracker

GAP = 50  # steps between evaluations
FAMILIES = ("exp", "power", "stretched")


def curve(family: str, steps: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A noiseless loss curve at ``steps`` and its total drop ``b``."""
    a, b = rng.uniform(0.2, 2.0), rng.uniform(0.5, 3.0)
    if family == "exp":
        tau = rng.uniform(8, 50) * GAP
        return a + b * np.exp(-steps / tau), b
    if family == "power":
        alpha = rng.uniform(0.4, 1.5)
        return a + b * (steps / GAP) ** (-alpha), b
    tau = rng.uniform(3, 20) * GAP
    return a + b * np.exp(-np.sqrt(steps / tau)), b


def true_stop(
    rule: EarlyStoppingRule, steps: np.ndarray, values: np.ndarray, max_steps: int
) -> int:
    tracker = EarlyStopTracker(rule, max_steps)
    for s, v in zip(steps, values):
        if tracker.observe(int(s), float(v)):
            return int(s)
    return max_steps


def run(args: argparse.Namespace) -> dict:
    seen = sorted(int(s) for s in args.seen.split(","))
    noises = [float(x) for x in args.noise.split(",")]
    patiences = [int(x) for x in args.patience.split(",")]
    max_steps = args.evals * GAP
    steps = GAP * np.arange(1, args.evals + 1)
    rows: dict[int, list[tuple[float, float, bool, bool, float]]] = {n: [] for n in seen}
    kept = dropped = never = 0
    t0 = time.perf_counter()
    forecasts = 0
    for family in args.families.split(","):
        for noise in noises:
            for patience in patiences:
                for seed in range(args.seeds):
                    rng = np.random.default_rng([seed, FAMILIES.index(family), patience])
                    clean, b = curve(family, steps, rng)
                    values = clean + rng.normal(0.0, noise * b, len(steps))
                    rule = EarlyStoppingRule(patience, min_delta=args.min_delta * b)
                    stop = true_stop(rule, steps, values, max_steps)
                    if stop <= seen[-1] * GAP:
                        dropped += 1
                        continue
                    kept += 1
                    never += stop == max_steps
                    for n in seen:
                        tracker = EarlyStopTracker(rule, max_steps)
                        for s, v in zip(steps[:n], values[:n]):
                            tracker.observe(int(s), float(v))
                        f = tracker.forecast()
                        forecasts += 1
                        assert f is not None and f.expected_stop_step <= max_steps
                        err = f.expected_stop_step - stop
                        rows[n].append(
                            (
                                abs(err) / stop * 100.0,
                                abs(err) / GAP,
                                f.earliest_stop_step <= stop <= max_steps,
                                f.earliest_stop_step <= stop <= f.latest_stop_step,
                                err / GAP,
                            )
                        )
    elapsed = time.perf_counter() - t0
    table = []
    for n in seen:
        r = np.asarray(rows[n], dtype=np.float64)
        table.append(
            {
                "seen": n,
                "scenarios": len(r),
                "median_err_pct": float(np.median(r[:, 0])),
                "p90_err_pct": float(np.quantile(r[:, 0], 0.9)),
                "median_err_evals": float(np.median(r[:, 1])),
                "p90_err_evals": float(np.quantile(r[:, 1], 0.9)),
                "in_range": float(r[:, 2].mean()),
                "in_band": float(r[:, 3].mean()),
                "median_signed_evals": float(np.median(r[:, 4])),
            }
        )
    return {
        "kept": kept,
        "dropped_stop_too_early": dropped,
        "never_fires": never,
        "forecast_ms": elapsed / max(forecasts, 1) * 1e3,
        "table": table,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--evals", type=int, default=200, help="evaluations up to max_steps")
    p.add_argument("--seen", default="4,6,8,12,16,24")
    p.add_argument("--noise", default="0.002,0.01,0.03", help="noise SD as a fraction of the drop")
    p.add_argument("--patience", default="3,5,10")
    p.add_argument("--min-delta", type=float, default=0.0, help="as a fraction of the drop")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    unknown = set(args.families.split(",")) - set(FAMILIES)
    if unknown:
        p.error(f"unknown families {sorted(unknown)}; choose from {FAMILIES}")
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"scenarios: {result['kept']} kept ({result['never_fires']} never fire), "
        f"{result['dropped_stop_too_early']} dropped (stop before the last --seen); "
        f"{result['forecast_ms']:.1f} ms/forecast"
    )
    head = (
        f"{'seen':>4} {'n':>4} {'med%':>7} {'p90%':>7} {'med ev':>7} {'p90 ev':>7} "
        f"{'bias ev':>8} {'in range':>9} {'in 10-90':>9}"
    )
    print(head)
    for row in result["table"]:
        print(
            f"{row['seen']:>4} {row['scenarios']:>4} {row['median_err_pct']:>7.1f} "
            f"{row['p90_err_pct']:>7.1f} {row['median_err_evals']:>7.1f} "
            f"{row['p90_err_evals']:>7.1f} {row['median_signed_evals']:>8.1f} "
            f"{row['in_range']:>9.0%} {row['in_band']:>9.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
