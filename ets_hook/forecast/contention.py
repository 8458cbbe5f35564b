"""A noisy host's two signatures in a step-time series, told apart.

Another process on the machine shows up in a training job's step times in two ways:

- a **burst**: a few steps in a row (at most ``MAX_BURST_STEPS``) far above the rest, then back
  to normal — another process took the cores for a moment. It says little about the job's
  future rate: left out of the point estimate, its excess widens the interval (it may recur);
- a **lasting shift**: the level moves and stays there (at least ``MIN_SHIFT_STEPS`` steps after
  the change) — a neighbour that keeps running, a frequency change. From then on the job runs at
  the new level: the estimate restarts from the change.

Bursts that come back at a regular period are neither: they are the job's own **recurring
work** that the loop does not mark as a phase (an evaluation or a checkpoint every N steps in a
hand-written loop, a DataLoader whose workers start again each epoch). At least
``MIN_PERIODIC_BURSTS`` of them, evenly spaced (``PERIOD_TOLERANCE``, ``MIN_PERIOD_STEPS``),
alike in size (``MAX_EXCESS_RATIO``: another process's bursts vary, the job's own work repeats)
and still due (the next one no more than a period away), are part of the job's rate: their
excess, spread over the period, goes into the estimate instead of its interval (bursts before
the beat began stay contention). On seeded synthetic series, a noisy host's random bursts
(1-5% of the steps, 2-10x) showed a beat at some point in 1.5% of 400 series; an unmarked
evaluation every 10-60 steps was found in 89% of 200, at its third or fourth occurrence.

``split_contention`` finds all three in a series of step times; the measured estimator
(``forecast.stats.estimate_measured``) applies them. Pure numpy, deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: A step is far above the rest when its log time exceeds the series' median by this many
#: robust standard deviations (MAD x 1.4826, floored at ``MIN_NOISE_REL``).
BURST_Z = 6.0
#: Longest run of such steps that still counts as a burst; a longer run may be a shift.
MAX_BURST_STEPS = 5
#: Bursts are looked for from this many steps on (fewer: ``estimate_measured`` caps spikes).
MIN_BURST_SERIES = 8
#: A shift needs this many steps after the change (and half as many before it).
MIN_SHIFT_STEPS = 20
#: ... a level change of at least this much (relative) ...
MIN_SHIFT_REL = 0.10
#: ... standing this many standard errors out (autocorrelation accounted for); the maximum of
#: the statistic over all split points of a series without a shift stays below ~4.
SHIFT_Z = 6.0
#: Relative step-time noise assumed at least (a perfectly regular series has MAD 0).
MIN_NOISE_REL = 0.02
#: Bursts are the job's recurring work from this many evenly spaced ones on (two gaps agree:
#: another process's bursts rarely keep a beat)...
MIN_PERIODIC_BURSTS = 3
#: ... their starts' gaps within this share of their median gap (at least one step) ...
PERIOD_TOLERANCE = 0.05
#: ... and a period at least this many times the longest of them (else they are one slow level)
#: and at least ``MIN_PERIOD_STEPS`` (denser "bursts" are a level that straddles the burst
#: threshold, e.g. while a lasting shift is still a minority of the steps, not recurring work).
MIN_PERIOD_PER_BURST_STEP = 2
MIN_PERIOD_STEPS = 10
#: ... and alike in size: the largest excess at most this many times the smallest.
MAX_EXCESS_RATIO = 1.5
#: A beat is looked for among this many latest bursts at most.
MAX_BEAT_BURSTS = 64


def lag1(z: np.ndarray) -> float:
    """Lag-1 autocorrelation of ``z`` (0 for a constant series)."""
    c = z - z.mean()
    # einsum, not np.dot: a BLAS call can cost milliseconds when its threads compete for cores.
    den = float(np.einsum("i,i->", c, c))
    return float(np.einsum("i,i->", c[:-1], c[1:])) / den if den > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ContentionSplit:
    """What ``split_contention`` found in a series ``x``.

    Attributes:
        keep: boolean mask over ``x``: the steps the estimate rests on (after the last lasting
            shift, bursts left out).
        burst_steps: steps left out as bursts (among those after the shift).
        burst_excess_s: their time above the kept steps' median, per kept step: what the mean
            step would gain if bursts kept coming at the rate seen, seconds (>= 0).
        shift_index: index in ``x`` where the last lasting level starts, or None.
        burst_period_steps: the bursts' period when they are the job's recurring work (module
            docs), else None. Then ``burst_excess_s`` is their mean excess over the kept
            steps' median per occurrence, divided by the period: part of the job's step time.
        burst_excess_se_s: the standard error of that per-step excess (0.0 when not periodic).
        bursts: how many bursts (runs of burst steps) ``burst_excess_s`` stands for: all of
            them, or those of the beat when periodic.
        contention_excess_s: when periodic, the excess per kept step of the bursts before the
            beat began (contention: for the interval); else 0.0.
    """

    keep: np.ndarray
    burst_steps: int
    burst_excess_s: float
    shift_index: int | None
    burst_period_steps: int | None = None
    burst_excess_se_s: float = 0.0
    bursts: int = 0
    contention_excess_s: float = 0.0


def find_bursts(x: np.ndarray) -> np.ndarray:
    """Steps of ``x`` that belong to bursts: runs of at most ``MAX_BURST_STEPS`` consecutive
    steps far above the series' median (see ``BURST_Z``).

    Args:
        x: step times, seconds, > 0 (1-D).

    Returns:
        A boolean mask over ``x`` (all False below ``MIN_BURST_SERIES`` steps).
    """
    return _bursts(np.log(x))


def _bursts(logs: np.ndarray) -> np.ndarray:
    return _run_mask(_burst_runs(logs), len(logs))


def _run_mask(runs: list[tuple[int, int]], length: int) -> np.ndarray:
    """A boolean mask over ``length`` steps, True inside each ``(start, end)`` run."""
    mask = np.zeros(length, dtype=bool)
    for start, end in runs:
        mask[start:end] = True
    return mask


def _burst_runs(logs: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each burst in ``logs`` (log step times), in order."""
    if len(logs) < MIN_BURST_SERIES:
        return []
    centre = float(np.median(logs))
    scale = max(1.4826 * float(np.median(np.abs(logs - centre))), MIN_NOISE_REL)
    high = (logs - centre) / scale > BURST_Z
    # Runs of high steps, vectorised (a refresh may see 65,536 steps): starts and ends.
    edges = np.diff(np.concatenate(([0], high.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    short = ends - starts <= MAX_BURST_STEPS
    return [(int(a), int(b)) for a, b in zip(starts[short], ends[short])]


def burst_period(runs: list[tuple[int, int]], length: int) -> int | None:
    """The period of bursts that are the job's recurring work (module docs), or None.

    Args:
        runs: ``(start, end)`` of each burst, in order, as indices into a series of ``length``
            steps.
        length: the series' length (the next burst must be due within a period of its end).

    Returns:
        The median gap between burst starts, in steps, when at least ``MIN_PERIODIC_BURSTS``
        bursts start evenly spaced (every gap within ``PERIOD_TOLERANCE`` of it, at least one
        step), the period is at least ``MIN_PERIOD_STEPS`` and ``MIN_PERIOD_PER_BURST_STEP``
        times the longest burst, and no more than a period (plus the tolerance) has passed
        since the last one started; else None.
    """
    if len(runs) < MIN_PERIODIC_BURSTS:
        return None
    starts = np.array([start for start, _ in runs])
    gaps = np.diff(starts)
    period = float(np.median(gaps))
    tolerance = max(1.0, PERIOD_TOLERANCE * period)
    longest = max(end - start for start, end in runs)
    if (
        np.any(np.abs(gaps - period) > tolerance)
        or period < MIN_PERIOD_PER_BURST_STEP * longest
        or period < MIN_PERIOD_STEPS
    ):
        return None
    if length - int(starts[-1]) > period + tolerance:
        return None  # the beat stopped
    return round(period)


def _may_keep_a_beat(runs: list[tuple[int, int]]) -> bool:
    """A quick necessary condition for ``burst_period`` on any suffix of ``runs``: every beat
    ends with the last two gaps, both within the tolerance of its period, so they differ by
    at most twice that (taken a little wide here), and its period is long enough."""
    if len(runs) < MIN_PERIODIC_BURSTS:
        return False
    last, before = runs[-1][0] - runs[-2][0], runs[-2][0] - runs[-3][0]
    widest = max(last, before)
    if widest + 1 < MIN_PERIOD_STEPS:
        return False
    return abs(last - before) <= 2.0 * max(1.0, 1.2 * PERIOD_TOLERANCE * (widest + 1))


def _alike(excess_s: np.ndarray) -> bool:
    """Whether bursts' excess times are alike enough to be one recurring piece of work
    (largest at most ``MAX_EXCESS_RATIO`` times the smallest): another process's bursts
    vary in size, the job's own evaluation repeats its work."""
    low = float(excess_s.min())
    return low > 0.0 and float(excess_s.max()) <= MAX_EXCESS_RATIO * low


def _latest_beat(
    runs: list[tuple[int, int]], x: np.ndarray, centre: float
) -> tuple[int, int, np.ndarray] | None:
    """The longest evenly spaced run of alike bursts up to the last one, among the last
    ``MAX_BEAT_BURSTS`` (the latest bursts may keep a beat that earlier ones, a neighbour or
    the capture's decode, do not; a noisy host's thousands of bursts cost no more to search).

    Args:
        runs: the bursts' ``(start, end)`` step ranges, in order.
        x: the step times, seconds.
        centre: the kept steps' median, seconds: a burst's excess is its time above it.

    Returns:
        ``(index of its first burst in runs, period in steps, every burst's excess)``, or None
        (the excesses are not computed when ``_may_keep_a_beat`` rules a beat out).
    """
    if not _may_keep_a_beat(runs):
        return None
    excess_per_run = np.array([float(np.sum(x[start:end] - centre)) for start, end in runs])
    for first in range(max(0, len(runs) - MAX_BEAT_BURSTS), len(runs) - MIN_PERIODIC_BURSTS + 1):
        period = burst_period(runs[first:], len(x))
        if period is not None and _alike(excess_per_run[first:]):
            return first, period, excess_per_run
    return None


def find_level_shift(x: np.ndarray) -> int | None:
    """The index where ``x``'s last lasting level starts, if its level changed and stayed.

    A change point is the best split of the log step times (largest standardised difference of
    the two means), not at the latest point searched (the change could lie later: too few steps
    at the new level yet); it counts when at least ``MIN_SHIFT_STEPS`` steps follow it and
    ``MIN_SHIFT_STEPS // 2`` precede it, the levels differ by ``MIN_SHIFT_REL`` or more, and the
    difference is ``SHIFT_Z`` standard errors or more, the noise's scale and lag-1
    autocorrelation taken from the residuals around the two levels. The steps after a change
    are searched again, and so on: a slowdown that ended (fast, slow, fast again) is two
    changes, and the best single split of the whole series is often the first of them, which
    would keep the slow stretch in the last level.

    Args:
        x: step times, seconds, > 0 (1-D), bursts already left out.

    Returns:
        The index of the first step at the new level, or None.
    """
    return _level_shift(np.log(x))


def _level_shift(logs: np.ndarray) -> int | None:
    """The start of the last lasting level (``find_level_shift``), on log step times."""
    start = None
    while True:
        offset = 0 if start is None else start
        found = _best_split(logs[offset:])
        if found is None:
            return start
        split, counts = found
        if not counts:
            # The best split may leave a level that mixes two (fast, slow for a while, fast
            # again: the slow stretch and the recovery inflate the noise around one "level"
            # until no split counts). The steps after it, and after the best split of the
            # steps before it, are searched once more for a change that counts.
            heads = [split]
            before = _best_split(logs[offset : offset + split])
            if before is not None:
                heads.append(before[0])
            for head in heads:
                inner = _best_split(logs[offset + head :])
                if inner is not None and inner[1]:
                    split = head + inner[0]
                    break
            else:
                return start
        start = offset + split


def _best_split(logs: np.ndarray) -> tuple[int, bool] | None:
    """The best single change point of ``logs`` and whether it counts (``find_level_shift``);
    None where none can be searched (too few steps, the best at the latest point, a change
    below ``MIN_SHIFT_REL``)."""
    m = len(logs)
    before, after = MIN_SHIFT_STEPS // 2, MIN_SHIFT_STEPS
    if m < before + after:
        return None
    total = np.cumsum(logs)
    k = np.arange(before, m - after + 1)
    left = total[k - 1] / k
    right = (total[-1] - total[k - 1]) / (m - k)
    weight = np.sqrt(k * (m - k) / m)
    best = int(np.argmax(np.abs(right - left) * weight))
    if best == len(k) - 1 and len(k) > 1:
        return None  # the best split at the latest allowed point: the change may be later
    split = int(k[best])
    diff = float(right[best] - left[best])
    if abs(math.expm1(diff)) < MIN_SHIFT_REL:
        return None
    residual = np.concatenate([logs[:split] - left[best], logs[split:] - right[best]])
    sd = max(float(np.std(residual)), MIN_NOISE_REL)
    rho = min(max(lag1(residual), 0.0), 0.9)
    se = sd * math.sqrt((1 + rho) / (1 - rho)) / float(weight[best])
    return split, abs(diff) / se >= SHIFT_Z


def split_contention(x: np.ndarray) -> ContentionSplit:
    """Bursts and the last lasting shift of a step-time series (module docs).

    Args:
        x: step times, seconds, > 0 (1-D), warm-up already cut.

    Returns:
        The split; with nothing found — or a step time that is not finite and > 0 (no log
        scale for it) — every step kept and no excess.
    """
    if not np.all(np.isfinite(x) & (x > 0)):
        return ContentionSplit(np.ones(len(x), dtype=bool), 0, 0.0, None)
    logs = np.log(x)
    runs = _burst_runs(logs)
    burst = _run_mask(runs, len(x))
    calm = np.flatnonzero(~burst)
    shift = _level_shift(logs[calm]) if len(calm) else None
    shift_index = int(calm[shift]) if shift is not None else None
    keep = ~burst
    if shift_index is not None:
        keep[:shift_index] = False
    bursts_after = burst.copy()
    if shift_index is not None:
        bursts_after[:shift_index] = False
        runs = [(start, end) for start, end in runs if start >= shift_index]
    kept = x[keep]
    if not bursts_after.any() or not len(kept):
        return ContentionSplit(keep, int(bursts_after.sum()), 0.0, shift_index)
    centre = float(np.median(kept))
    beat = _latest_beat(runs, x, centre)
    if beat is None:
        excess = float(np.sum(x[bursts_after] - centre)) / len(kept)
        return ContentionSplit(
            keep, int(bursts_after.sum()), max(excess, 0.0), shift_index, bursts=len(runs)
        )
    first, period, excess_per_run = beat
    # The job's own recurring work: its mean excess per occurrence, spread over the period;
    # the bursts before the beat began stay contention.
    per_run = excess_per_run[first:]
    se = float(per_run.std(ddof=1)) / math.sqrt(len(per_run)) / period
    excess = max(float(per_run.mean()) / period, 0.0)
    before = float(excess_per_run[:first].sum())
    return ContentionSplit(
        keep,
        int(bursts_after.sum()),
        excess,
        shift_index,
        period,
        se,
        len(per_run),
        contention_excess_s=max(before / len(kept), 0.0),
    )


#: Steps in a row that must all sit off an estimate made from earlier steps before it is set
#: aside: one more than the longest burst.
OUTDATED_RUN_STEPS = MAX_BURST_STEPS + 1


def outdated_by_recent_steps(recent_s: np.ndarray, iteration_s: float, ci_s: float) -> bool:
    """Whether the latest steps say an estimate made from earlier ones no longer holds.

    The last ``OUTDATED_RUN_STEPS`` steps all above the estimate's interval (and at least
    ``MIN_SHIFT_REL`` above the estimate), or all below it: longer than a burst, so the start of
    a lasting shift (which ``split_contention`` confirms ``MIN_SHIFT_STEPS`` steps after the
    change), or an estimate that was off. A step as noisy as the estimate allows stays inside
    the band: six in a row on one side of it by chance is rarer than 1 in 1000 at a 20% CV.

    Args:
        recent_s: the latest step times, seconds, oldest first (only the last
            ``OUTDATED_RUN_STEPS`` are read).
        iteration_s: the estimate's mean step time, seconds.
        ci_s: the estimate's half-width, seconds.

    Returns:
        True when the latest ``OUTDATED_RUN_STEPS`` steps all lie outside the band; False with
        fewer steps, or when any lies inside it.
    """
    if len(recent_s) < OUTDATED_RUN_STEPS or not iteration_s > 0:
        return False
    # Six floats, on every prediction a loop reads: plain Python (numpy's calls cost ~20 us).
    last = [float(value) for value in recent_s[-OUTDATED_RUN_STEPS:]]
    band_s = max(ci_s, MIN_SHIFT_REL * iteration_s)
    high_s, low_s = iteration_s + band_s, iteration_s - band_s
    return all(value > high_s for value in last) or all(value < low_s for value in last)
