"""The DataLoader workers' pace as a floor under the steady step time.

A loop fed by ``W`` worker processes cannot step faster, on average, than they produce batches:
with ``P_w`` the time worker ``w`` takes per batch while busy, the workers together deliver one
batch every ``1 / sum_w(1 / P_w)`` seconds, and an optimizer step uses ``grad_accum`` of them.
Early on the loop does not feel it: the workers have prefetched batches (``prefetch_factor`` each),
so its first steps run at the model's pace and a step-time estimate from them alone is too low by
as much as the workers are slower (2-4x on a loader-bound job). ``capture.batch_clock`` records
when each worker finished each batch and its CPU time then; ``supply_from_worker_clocks`` turns
those into the workers' period (between their wall-clock pace and a CPU-time bound where they
are short of cores), and ``bound_by_supply`` makes a step-time estimate the expected maximum of
it and that period.

A worker is busy while the loop is faster than the workers (it always has prefetch requests
queued), so its gaps between finishes are its production times; once the loop is the slower
side the workers wait for requests and their gaps stretch to ``W`` steps of the loop, which puts
the period at the step time itself. The step waits for the slower side: ``bound_by_supply``
takes the expected maximum of the two uncertain paces. Gaps above ``OUTLIER_RATIO`` x the worker's
median (a worker restarted at an epoch boundary, a blocked worker) are left out.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from .distributions import normal_cdf, normal_quantile
from .prediction import SOURCE_INPUT
from .stats import DEFAULT_LEVEL, Estimate

#: A workers' pace this many combined standard deviations below the loop's leaves it alone.
CLEAR_OF_SUPPLY = 3.0
#: A worker's gap above this multiple of its median gap is not production time.
OUTLIER_RATIO = 3.0
#: Production gaps (all workers) needed before the period is estimated.
MIN_GAPS = 2
#: Relative 95% half-width floor: the workers' pace while the loop also computes (early, when
#: it is measured) differs from their pace once the loop mostly waits for them (CPU shared).
REL_CI_FLOOR = 0.10


@dataclass(frozen=True, slots=True)
class SupplyEstimate:
    """The workers' combined time per batch.

    Attributes:
        period_s: seconds per batch, all workers together.
        ci_s: half-width of its interval at the level it was estimated at.
        gaps: production gaps it rests on.
        workers: workers it covers.
        wall_period_s: the period from the workers' wall-clock gaps alone.
        cpu_period_s: the lower bound from their CPU time per batch; None without CPU times
            or where the workers were not short of cores (then ``period_s`` is the wall one).
    """

    period_s: float
    ci_s: float
    gaps: int
    workers: int
    wall_period_s: float
    cpu_period_s: float | None = None


def _combined_period(per_worker: Sequence[float | None]) -> float:
    """1 / sum of the workers' rates; a worker without gaps at the others' mean time."""
    known = [p for p in per_worker if p is not None]
    fill = sum(known) / len(known)
    return 1.0 / sum(1.0 / (p if p is not None else fill) for p in per_worker)


def supply_from_worker_clocks(
    finish_times_s: Sequence[Sequence[float]],
    cpu_times_s: Sequence[Sequence[float]] | None = None,
    *,
    cores: int | None = None,
    main_threads: int = 1,
    level: float = DEFAULT_LEVEL,
) -> SupplyEstimate | None:
    """The workers' combined period per batch from their batch finish (and CPU) times.

    The wall-clock gaps give the pace the workers kept while they were measured: early in the
    job, when the training process computes flat out and ets-hook's capture runs too. Where the
    workers are short of cores (``workers + main_threads + 1 > cores``: the training process's
    threads and one for ets-hook's window) they then ran slower than they will once the loop
    mostly waits for them. A lower bound: no worker delivers faster than its CPU time per batch
    plus the part of its gap that waiting for a core cannot explain (I/O, sleeps: with every
    thread runnable a worker still gets ``cores / threads`` of a core), and no set of workers
    faster than the cores allow. The steady pace lies between: the estimate is the geometric
    mean of the two, its interval spanning both (an I/O-bound worker's two nearly agree). With
    cores to spare the wall-clock pace stands.

    Args:
        finish_times_s: per worker, its batch finish times in order (seconds, any clock shared
            within a worker); workers without two times get the others' mean production time.
        cpu_times_s: per worker, its CPU time at the same finishes (``time.process_time``);
            None: wall-clock gaps only.
        cores: CPUs the job may use; None: unknown (wall-clock gaps only).
        main_threads: threads of the training process that compute (torch's intra-op threads
            on a CPU job, 1 where an accelerator computes).
        level: confidence level of the interval, in (0, 1).

    Returns:
        The estimate; None before ``MIN_GAPS`` production gaps exist or without workers.

    Raises:
        ValueError: ``level`` outside (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    workers = len(finish_times_s)
    wall: list[float | None] = []
    cpu: list[float | None] = []
    relative: list[float] = []
    for w, times in enumerate(finish_times_s):
        cpus = cpu_times_s[w] if cpu_times_s is not None and w < len(cpu_times_s) else ()
        pairs = [
            (b - a, (cpus[i + 1] - cpus[i]) if i + 1 < len(cpus) else math.nan)
            for i, (a, b) in enumerate(pairwise(times))
            if b > a
        ]
        if not pairs:
            wall.append(None)
            cpu.append(None)
            continue
        median = statistics.median(g for g, _ in pairs)
        kept = [(g, c) for g, c in pairs if g <= OUTLIER_RATIO * median]
        mean = sum(g for g, _ in kept) / len(kept)
        wall.append(mean)
        relative += [g / mean - 1.0 for g, _ in kept]
        cpu_gaps = [c for _, c in kept if c >= 0.0]  # NaN and a restart's negative gap fail
        cpu.append(sum(cpu_gaps) / len(cpu_gaps) if cpu_gaps else None)
    if not workers or len(relative) < MIN_GAPS:
        return None
    wall_period_s = _combined_period(wall)
    sd = statistics.stdev(relative) if len(relative) > 1 else 1.0
    z = normal_quantile(0.5 + level / 2)
    floor = REL_CI_FLOOR * z / normal_quantile(0.975)
    rel_ci = math.hypot(z * sd / math.sqrt(len(relative)), floor)
    short_of_cores = cores is not None and workers + main_threads + 1 > cores
    known_cpu = [c for c in cpu if c is not None]
    if not short_of_cores or not known_cpu or min(known_cpu) <= 0.0:
        return SupplyEstimate(
            wall_period_s, rel_ci * wall_period_s, len(relative), workers, wall_period_s
        )
    assert cores is not None
    # A worker's gap is I/O (or other waiting) + CPU / its share of a core; with every thread
    # runnable the share is at least cores / threads, so contention explains at most
    # cpu x (1 / share - 1) of the gap: the rest stays once the workers have the cores.
    inflation = (workers + main_threads + 1) / cores - 1.0
    fastest = [
        None if w is None or c is None else max(c, w - c * inflation)
        for w, c in zip(wall, cpu, strict=True)
    ]
    mean_cpu_s = sum(known_cpu) / len(known_cpu)
    cpu_period_s = min(max(_combined_period(fastest), mean_cpu_s / cores), wall_period_s)
    period_s = math.sqrt(wall_period_s * cpu_period_s)
    # [cpu, wall] read as a 95% range around the geometric mean (its wider, upper side).
    spread_s = (wall_period_s - period_s) * z / normal_quantile(0.975)
    ci_s = math.hypot(rel_ci * period_s, spread_s)
    return SupplyEstimate(period_s, ci_s, len(relative), workers, wall_period_s, cpu_period_s)


def supply_from_loaders(
    readings: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[float]] | None]],
    *,
    cores: int | None = None,
    main_threads: int = 1,
    level: float = DEFAULT_LEVEL,
) -> SupplyEstimate | None:
    """The pace of several loaders that each deliver a batch per step (Lightning's combined
    train loaders): the slowest one's (``supply_from_worker_clocks`` per loader).

    Each loader's workers compete for the cores with the training process's threads and with
    the other loaders' workers. A loader without an estimate yet leaves the others' slowest
    one, a floor all the same.

    Args:
        readings: per loader, its workers' ``(finish_times_s, cpu_times_s)``.
        cores, main_threads, level: as for ``supply_from_worker_clocks``.

    Returns:
        The slowest loader's estimate; None while no loader has one.

    Raises:
        ValueError: ``level`` outside (0, 1).
    """
    workers = [len(finish) for finish, _ in readings]
    supplies = [
        supply_from_worker_clocks(
            finish,
            cpu,
            cores=cores,
            main_threads=main_threads + sum(workers) - count,
            level=level,
        )
        for (finish, cpu), count in zip(readings, workers, strict=True)
    ]
    return max(
        (supply for supply in supplies if supply is not None),
        key=lambda supply: supply.period_s,
        default=None,
    )


def bound_by_supply(
    estimate: Estimate, supply: SupplyEstimate | None, batches_per_step: int = 1
) -> Estimate:
    """The expected step time when a step waits for the slower of the loop and its workers.

    The step takes ``max(loop, workers)``; both are uncertain (normal, their half-widths at
    ``estimate.level``), so the result is the mean and spread of that maximum (Clark's moments
    of the maximum of two normal variables): the larger estimate where the two are far apart,
    and above both where they are close (as a queue between two equal rates also makes it).

    Args:
        estimate: the step-time estimate (measured, trace or fused).
        supply: the workers' period (at ``estimate``'s level); None: no bound.
        batches_per_step: batches one optimizer step takes (gradient accumulation), >= 1.

    Returns:
        ``estimate`` unchanged without a supply or when the workers' pace is below it by more
        than ``CLEAR_OF_SUPPLY`` combined standard deviations; else the maximum's mean and
        half-width, with source ``SOURCE_INPUT`` where the workers' pace is the larger one, and
        ``estimate``'s noise, median and counts.

    Raises:
        ValueError: ``batches_per_step`` < 1.
    """
    if batches_per_step < 1:
        raise ValueError(f"batches_per_step must be >= 1, got {batches_per_step}")
    if supply is None:
        return estimate
    z = normal_quantile(0.5 + estimate.level / 2)
    mu_loop, sd_loop = estimate.iteration_s, max(estimate.ci_s, 0.0) / z
    mu_in, sd_in = batches_per_step * supply.period_s, batches_per_step * supply.ci_s / z
    theta = math.hypot(sd_loop, sd_in)
    if theta <= 0.0:
        return (
            estimate
            if mu_loop >= mu_in
            else dataclasses.replace(estimate, iteration_s=mu_in, source=SOURCE_INPUT)
        )
    alpha = (mu_loop - mu_in) / theta
    if alpha > CLEAR_OF_SUPPLY:
        return estimate
    p_loop, p_in = normal_cdf(alpha), normal_cdf(-alpha)
    density = math.exp(-0.5 * alpha * alpha) / math.sqrt(2.0 * math.pi)
    mean = mu_loop * p_loop + mu_in * p_in + theta * density
    second = (
        (mu_loop**2 + sd_loop**2) * p_loop
        + (mu_in**2 + sd_in**2) * p_in
        + (mu_loop + mu_in) * theta * density
    )
    sd = math.sqrt(max(second - mean * mean, 0.0))
    return dataclasses.replace(
        estimate,
        iteration_s=mean,
        ci_s=z * sd,
        source=SOURCE_INPUT if mu_in > mu_loop else estimate.source,
    )
