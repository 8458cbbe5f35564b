"""A noisy host's two signatures in a step-time series, told apart.

Another process on the machine shows up in a training job's step times in two ways:

- a **burst**: a few steps in a row (at most ``MAX_BURST_STEPS``) far above the rest, then back
  to normal — another process took the cores for a moment. It says little about the job's
  future rate: left out of the point estimate, its excess widens the interval (it may recur);
- a **lasting shift**: the level moves and stays there (at least ``MIN_SHIFT_STEPS`` steps after
  the change) — a neighbour that keeps running, a frequency change. From then on the job runs at
  the new level: the estimate restarts from the change.

``split_contention`` finds both in a series of step times; the measured estimator
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
    """

    keep: np.ndarray
    burst_steps: int
    burst_excess_s: float
    shift_index: int | None


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
    burst = np.zeros(len(logs), dtype=bool)
    if len(logs) < MIN_BURST_SERIES:
        return burst
    centre = float(np.median(logs))
    scale = max(1.4826 * float(np.median(np.abs(logs - centre))), MIN_NOISE_REL)
    high = (logs - centre) / scale > BURST_Z
    # Runs of high steps, vectorised (a refresh may see 65,536 steps): starts and ends.
    edges = np.diff(np.concatenate(([0], high.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    short = ends - starts <= MAX_BURST_STEPS
    for start, end in zip(starts[short], ends[short]):
        burst[start:end] = True
    return burst


def find_level_shift(x: np.ndarray) -> int | None:
    """The index where ``x``'s last lasting level starts, if its level changed and stayed.

    One change point, the best split of the log step times (largest standardised difference of
    the two means), not at the latest point searched (the change could lie later: too few steps
    at the new level yet); it counts when at least ``MIN_SHIFT_STEPS`` steps follow it and
    ``MIN_SHIFT_STEPS // 2`` precede it, the levels differ by ``MIN_SHIFT_REL`` or more, and the
    difference is ``SHIFT_Z`` standard errors or more, the noise's scale and lag-1
    autocorrelation taken from the residuals around the two levels.

    Args:
        x: step times, seconds, > 0 (1-D), bursts already left out.

    Returns:
        The index of the first step at the new level, or None.
    """
    return _level_shift(np.log(x))


def _level_shift(logs: np.ndarray) -> int | None:
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
    return split if abs(diff) / se >= SHIFT_Z else None


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
    burst = _bursts(logs)
    calm = np.flatnonzero(~burst)
    shift = _level_shift(logs[calm]) if len(calm) else None
    shift_index = int(calm[shift]) if shift is not None else None
    keep = ~burst
    if shift_index is not None:
        keep[:shift_index] = False
    bursts_after = burst.copy()
    if shift_index is not None:
        bursts_after[:shift_index] = False
    kept = x[keep]
    excess = 0.0
    if bursts_after.any() and len(kept):
        excess = float(np.sum(x[bursts_after] - np.median(kept))) / len(kept)
    return ContentionSplit(keep, int(bursts_after.sum()), max(excess, 0.0), shift_index)
