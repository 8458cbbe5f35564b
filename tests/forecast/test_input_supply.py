"""The DataLoader workers' pace as a floor under the step time (``forecast.input_supply``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from ets_hook.forecast.distributions import normal_quantile
from ets_hook.forecast.input_supply import (
    MIN_GAPS,
    OUTLIER_RATIO,
    bound_by_supply,
    supply_from_loaders,
    supply_from_worker_clocks,
)
from ets_hook.forecast.prediction import SOURCE_INPUT
from ets_hook.forecast.stats import Estimate


def times_every(period_s: float, n: int, start_s: float = 0.0) -> list[float]:
    return [start_s + i * period_s for i in range(n)]


def test_two_workers_at_20_ms_a_batch_deliver_one_every_10_ms() -> None:
    supply = supply_from_worker_clocks([times_every(0.020, 6), times_every(0.020, 6, 0.005)])
    assert supply is not None
    assert supply.period_s == pytest.approx(0.010)
    assert supply.workers == 2 and supply.gaps == 10
    # Regular gaps: only the floor for the early-vs-steady pace difference remains.
    assert supply.ci_s == pytest.approx(0.10 * 0.010, rel=1e-6)


def test_unequal_workers_add_their_rates() -> None:
    supply = supply_from_worker_clocks([times_every(0.010, 5), times_every(0.030, 5)])
    assert supply is not None
    assert supply.period_s == pytest.approx(1.0 / (1 / 0.010 + 1 / 0.030))


def test_a_restart_or_a_blocked_worker_is_not_production_time() -> None:
    # A 400 ms gap (workers restarted at an epoch boundary) among 20 ms ones is left out.
    times = times_every(0.020, 5) + times_every(0.020, 5, 0.08 + 0.4)
    assert OUTLIER_RATIO * 0.020 < 0.4
    supply = supply_from_worker_clocks([times])
    assert supply is not None
    assert supply.period_s == pytest.approx(0.020)
    assert supply.gaps == 8


def test_a_worker_without_gaps_counts_at_the_others_pace() -> None:
    supply = supply_from_worker_clocks([times_every(0.020, 5), [1.0], []])
    assert supply is not None
    assert supply.period_s == pytest.approx(0.020 / 3)
    assert supply.workers == 3


def test_no_estimate_before_enough_gaps() -> None:
    assert supply_from_worker_clocks([]) is None
    assert supply_from_worker_clocks([times_every(0.02, MIN_GAPS)]) is None  # MIN_GAPS - 1 gaps
    assert supply_from_worker_clocks([times_every(0.02, MIN_GAPS + 1)]) is not None
    with pytest.raises(ValueError, match="level"):
        supply_from_worker_clocks([times_every(0.02, 9)], level=1.0)


def test_spread_gaps_widen_the_interval() -> None:
    regular = supply_from_worker_clocks([times_every(0.020, 11)])
    jittered = [0.0]
    for i in range(10):
        jittered.append(jittered[-1] + (0.012 if i % 2 else 0.028))
    spread = supply_from_worker_clocks([jittered])
    assert regular is not None and spread is not None
    assert spread.period_s == pytest.approx(regular.period_s)
    assert spread.ci_s > 2 * regular.ci_s


def test_workers_short_of_cores_lie_between_their_cpu_and_wall_pace() -> None:
    # Two workers on two cores beside the training process: 24 ms a batch by the wall clock
    # while everything competed, 14 ms of CPU each. Once the loop mostly waits, they run faster
    # than 24 ms but never faster than their CPU work: 7 ms (all) <= period <= 12 ms.
    wall = [times_every(0.024, 6), times_every(0.024, 6, 0.012)]
    cpu = [times_every(0.014, 6), times_every(0.014, 6)]
    supply = supply_from_worker_clocks(wall, cpu, cores=2, main_threads=1)
    assert supply is not None
    assert supply.wall_period_s == pytest.approx(0.012)
    assert supply.cpu_period_s == pytest.approx(0.007)
    assert supply.period_s == pytest.approx(math.sqrt(0.012 * 0.007))
    # The interval spans both ends.
    assert supply.period_s - supply.ci_s <= 0.007 + 1e-9
    assert supply.period_s + supply.ci_s >= 0.012 - 1e-9
    # More workers than cores: the cores bound the CPU pace (4 x 14 ms over 2 cores).
    four = supply_from_worker_clocks([times_every(0.040, 6)] * 4, cpu * 2, cores=2)
    assert four is not None and four.wall_period_s == pytest.approx(0.010)
    assert four.cpu_period_s == pytest.approx(0.014 / 2)


def test_contention_cannot_explain_a_mostly_idle_workers_gap() -> None:
    # One worker sleeping 30 ms a batch on 1 ms of CPU, beside a training process on two
    # cores: at most 1 ms x (4 threads / 2 cores - 1) of its gap is waiting for a core.
    wall = [times_every(0.030, 8)]
    cpu = [times_every(0.001, 8)]
    supply = supply_from_worker_clocks(wall, cpu, cores=2, main_threads=2)
    assert supply is not None
    assert supply.cpu_period_s == pytest.approx(0.030 - 0.001)
    assert 0.029 < supply.period_s < 0.030


def test_with_cores_to_spare_the_wall_pace_stands() -> None:
    # Workers waiting on I/O (little CPU), on a machine with cores for all: their wall-clock
    # pace is the one the loop will see.
    wall = [times_every(0.024, 6), times_every(0.024, 6, 0.012)]
    cpu = [times_every(0.001, 6), times_every(0.001, 6)]
    supply = supply_from_worker_clocks(wall, cpu, cores=16, main_threads=1)
    assert supply is not None
    assert supply.period_s == pytest.approx(0.012)
    assert supply.cpu_period_s is None
    # Short of cores but without CPU times (or with unknown cores): the wall pace too.
    assert supply_from_worker_clocks(wall, None, cores=2).period_s == pytest.approx(0.012)
    assert supply_from_worker_clocks(wall, cpu).period_s == pytest.approx(0.012)


def test_a_restarted_workers_cpu_clock_is_not_a_negative_batch() -> None:
    # A non-persistent worker restarts (CPU time from ~0 again) after its fourth batch, fast
    # enough that the wall gap is kept: that CPU gap is left out, the others count.
    wall = [times_every(0.020, 8)]
    cpu = [[0.5, 0.51, 0.52, 0.53, 0.001, 0.011, 0.021, 0.031]]
    supply = supply_from_worker_clocks(wall, cpu, cores=1)
    assert supply is not None and supply.cpu_period_s == pytest.approx(0.010)


def estimate(iteration_s: float, ci_s: float) -> Estimate:
    return Estimate(iteration_s, ci_s, "measured", noise_sd_s=0.001, median_s=iteration_s)


def test_a_step_faster_than_its_workers_is_lifted_to_their_pace() -> None:
    supply = supply_from_worker_clocks([times_every(0.020, 9), times_every(0.020, 9)])
    assert supply is not None
    lifted = bound_by_supply(estimate(0.004, 0.0004), supply)
    assert lifted.source == SOURCE_INPUT
    assert lifted.iteration_s == pytest.approx(0.010, rel=1e-6)  # far apart: the workers'
    assert lifted.ci_s == pytest.approx(supply.ci_s, rel=1e-3)
    assert lifted.noise_sd_s == 0.001  # the steps' own noise is kept
    # Gradient accumulation: a step takes two batches.
    two = bound_by_supply(estimate(0.004, 0.0004), supply, 2)
    assert two.iteration_s == pytest.approx(0.020, rel=1e-6)


def test_workers_clearly_faster_than_the_loop_leave_it_alone() -> None:
    # A loop slower than its workers makes them wait for requests; their pace then reads as
    # at most the loop's own. Far below it, nothing moves; unknown, nothing either.
    supply = supply_from_worker_clocks([times_every(0.010, 9), times_every(0.010, 9)])
    assert supply is not None
    slow = estimate(0.010, 0.0005)
    assert bound_by_supply(slow, supply) is slow
    assert bound_by_supply(slow, None) is slow
    with pytest.raises(ValueError, match="batches_per_step"):
        bound_by_supply(slow, supply, 0)


def test_the_expected_maximum_matches_a_simulation_of_it() -> None:
    # The workers' pace a little above the loop's: the mean and spread of the maximum of the
    # two normal paces, checked against a simulation of that maximum.
    supply = supply_from_worker_clocks([times_every(0.020, 9), times_every(0.020, 9)])
    assert supply is not None
    result = bound_by_supply(estimate(0.0085, 0.001), supply)
    assert result.source == SOURCE_INPUT
    z = normal_quantile(0.975)
    draws = np.random.default_rng(0).standard_normal((2, 400_000))
    loop = 0.0085 + 0.001 / z * draws[0]
    maxima = np.maximum(loop, supply.period_s + supply.ci_s / z * draws[1])
    assert result.iteration_s == pytest.approx(maxima.mean(), rel=2e-3)
    assert result.ci_s == pytest.approx(z * maxima.std(), rel=2e-2)


def test_close_paces_give_the_expected_maximum() -> None:
    # Equal means: the expected maximum of two normals, mu + theta / sqrt(2 pi) (Clark).
    supply = supply_from_worker_clocks([times_every(0.020, 9), times_every(0.020, 9)])
    assert supply is not None
    same = estimate(0.010, supply.ci_s)
    result = bound_by_supply(same, supply)
    theta = math.hypot(same.ci_s, supply.ci_s) / normal_quantile(0.975)
    assert result.iteration_s == pytest.approx(0.010 + theta / math.sqrt(2 * math.pi))
    assert 0 < result.ci_s < same.ci_s  # the maximum of two is tighter than either
    # Monotone in the workers' pace, never below either point.
    paces = [bound_by_supply(estimate(0.010, 0.001), dataclasses.replace(supply, period_s=p))
             for p in (0.006, 0.009, 0.010, 0.011, 0.014)]  # fmt: skip
    values = [r.iteration_s for r in paces]
    assert values == sorted(values)
    assert all(v >= max(0.010, p) - 1e-12 for v, p in
               zip(values, (0.006, 0.009, 0.010, 0.011, 0.014), strict=True))  # fmt: skip
    # Zero widths: the plain maximum.
    exact = dataclasses.replace(supply, ci_s=0.0)
    assert bound_by_supply(estimate(0.004, 0.0), exact).iteration_s == pytest.approx(0.010)


def test_of_several_loaders_the_slowest_paces_and_all_their_workers_share_the_cores() -> None:
    """Loader A (1 worker, a batch every 20 ms of wall time, 10 ms of it CPU) alone has cores to
    spare (1 worker + 1 computing thread + 1 < 4 cores): its wall-clock pace stands. Beside
    loader B's two busy workers it is short of cores, so part of its gap is contention: its
    steady pace lies below 20 ms. B itself is fast; A stays the slowest either way."""
    a = ([times_every(0.020, 9)], [times_every(0.010, 9)])
    b = ([times_every(0.004, 9), times_every(0.004, 9, 0.002)],
         [times_every(0.004, 9), times_every(0.004, 9)])  # fmt: skip
    alone = supply_from_loaders([a], cores=4, main_threads=1)
    assert alone == supply_from_worker_clocks(*a, cores=4, main_threads=1)
    assert alone is not None and alone.period_s == pytest.approx(0.020)
    both = supply_from_loaders([a, b], cores=4, main_threads=1)
    assert both is not None and both.workers == 1  # A's estimate
    assert 0.010 <= both.period_s < 0.020
    assert both == supply_from_worker_clocks(*a, cores=4, main_threads=3)
    assert supply_from_loaders([b, ([[0.0]], [[]])], cores=4) is not None  # one not yet read
    assert supply_from_loaders([([[0.0]], [[]])]) is None
