"""A noisy host's bursts and lasting shifts, on deterministic synthetic step-time series."""

from __future__ import annotations

import numpy as np
import pytest

from ets_hook.forecast.contention import (
    MAX_BURST_STEPS,
    MIN_SHIFT_STEPS,
    OUTDATED_RUN_STEPS,
    find_bursts,
    find_level_shift,
    outdated_by_recent_steps,
    split_contention,
)
from ets_hook.forecast.stats import estimate_measured

MU = 0.010  # steady step, seconds


def steady(seed: int, n: int, cv: float = 0.05, rho: float = 0.5) -> np.ndarray:
    """AR(1) multiplicative noise around MU."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n) * cv * np.sqrt(1 - rho * rho)
    z = np.empty(n)
    z[0] = e[0] / np.sqrt(1 - rho * rho)
    for i in range(1, n):
        z[i] = rho * z[i - 1] + e[i]
    return MU * np.exp(z)


@pytest.mark.parametrize("seed", range(5))
def test_a_plain_noisy_series_has_neither(seed: int) -> None:
    x = steady(seed, 300)
    split = split_contention(x)
    assert split.shift_index is None and split.burst_steps == 0 and split.keep.all()


def test_false_shifts_are_rare_on_autocorrelated_noise() -> None:
    found = sum(
        find_level_shift(steady(100 + s, 200, cv=0.10, rho=0.6)) is not None for s in range(200)
    )
    assert found <= 4  # <= 2% of 200 series


def test_a_burst_widens_the_interval_without_moving_the_estimate() -> None:
    x = steady(7, 200)
    clean = estimate_measured(x.copy())
    x[120:123] *= 10.0  # another process takes the cores for three steps
    mask = find_bursts(x)
    assert np.flatnonzero(mask).tolist() == [120, 121, 122]
    hit = estimate_measured(x)
    assert clean is not None and hit is not None
    assert hit.iteration_s == pytest.approx(clean.iteration_s, rel=0.02)
    # the plain mean would have moved by ~13%; the interval reaches out to it instead
    assert hit.ci_s > clean.ci_s
    assert hit.ci_s >= split_contention(x[1:]).burst_excess_s > 0.1 * MU
    assert hit.iteration_s + hit.ci_s >= 0.99 * float(np.mean(x[1:]))


def test_a_lasting_shift_moves_the_estimate_to_the_new_level() -> None:
    x = steady(8, 200)
    x[160:] *= 1.5  # a neighbour keeps running: 40 steps at 1.5x so far
    split = split_contention(x)
    assert split.shift_index is not None and abs(split.shift_index - 160) <= 2
    est = estimate_measured(x)
    assert est is not None
    assert est.iteration_s == pytest.approx(1.5 * MU, rel=0.04)
    assert est.level_shifted
    assert not estimate_measured(steady(8, 200)).level_shifted  # type: ignore[union-attr]


@pytest.mark.parametrize("after", [100, 250, 400, 600, 1200, 2200])
def test_a_short_slowdown_that_ended_long_ago_leaves_the_level_after_it(after: int) -> None:
    """400 fast, 400 at 2.7x, then fast again (a re-trial's case): before, once the recovery
    outlasted ~250 steps, no single split counted (the slow stretch and the recovery, taken
    as one level, inflate its noise) and the step time went back to the job's mean."""
    x = steady(22, 800 + after, cv=0.02)
    x[400:800] *= 2.7
    assert find_level_shift(x) == pytest.approx(800, abs=3)
    est = estimate_measured(x)
    assert est is not None and est.iteration_s == pytest.approx(MU, rel=0.05)


@pytest.mark.parametrize("recovered", [200, 400, 1000, 2000])
def test_a_slowdown_that_ended_leaves_the_level_after_it(recovered: int) -> None:
    """Fast, 2x slower for 2000 steps (a neighbour's job), fast again: the last level is the
    recovered one. Before, the best single split was the slowdown's start, and from ~400 steps
    after the recovery the estimate was the mean of slow and fast steps (16.7 ms at 400, 13.4
    at 1000 against 10)."""
    x = steady(21, 4000 + recovered, cv=0.03)
    x[2000:4000] *= 2.0
    assert find_level_shift(x) == pytest.approx(4000, abs=3)
    est = estimate_measured(x)
    assert est is not None and est.level_shifted
    assert est.iteration_s == pytest.approx(MU, rel=0.05)


def test_a_raised_level_too_short_to_be_lasting_is_a_burst_not_a_shift() -> None:
    x = steady(9, 200)
    x[-MAX_BURST_STEPS + 1 :] *= 1.6  # the last four steps
    split = split_contention(x)
    assert split.shift_index is None
    assert split.burst_steps == MAX_BURST_STEPS - 1
    est = estimate_measured(x)
    base = estimate_measured(x[: -MAX_BURST_STEPS + 1])
    assert est is not None and base is not None
    assert est.iteration_s == pytest.approx(base.iteration_s, rel=0.02)


def test_a_level_change_needs_enough_steps_after_it() -> None:
    x = steady(10, 200)
    x[-(MIN_SHIFT_STEPS - 5) :] *= 1.5  # 15 steps: more than a burst, fewer than a shift
    assert find_level_shift(x) is None
    x = steady(10, 200)
    x[-(MIN_SHIFT_STEPS + 5) :] *= 1.5
    assert find_level_shift(x) is not None


def test_a_small_change_is_not_a_shift() -> None:
    x = steady(11, 400, cv=0.01, rho=0.0)
    x[200:] *= 1.05  # clearly significant, but under MIN_SHIFT_REL
    assert find_level_shift(x) is None


def test_zero_or_non_finite_step_times_leave_the_series_alone() -> None:
    x = steady(12, 60)
    x[30] = 0.0  # a step whose whole time was the hook's own work
    split = split_contention(x)
    assert split.keep.all() and split.shift_index is None and split.burst_excess_s == 0.0
    x[30] = np.nan
    assert split_contention(x).keep.all()


def with_evaluations(x: np.ndarray, every: int, cost_s: float, first: int) -> np.ndarray:
    """``x`` with an unmarked evaluation (``cost_s`` more) in the step after every ``every``-th
    step from ``first`` on, as a hand-written loop that evaluates without ``hook.phase`` has."""
    y = x.copy()
    y[first::every] += cost_s
    return y


def test_bursts_at_a_steady_beat_are_the_jobs_own_work_spread_over_the_period() -> None:
    x = with_evaluations(steady(13, 200), every=25, cost_s=8 * MU, first=25)
    split = split_contention(x)
    assert split.burst_period_steps == 25 and split.bursts == 7
    assert split.burst_excess_s == pytest.approx(8 * MU / 25, rel=0.1)
    est = estimate_measured(x)
    clean = estimate_measured(steady(13, 200))
    assert est is not None and clean is not None
    # The mean step now carries the evaluations' share (+0.32 MU), not the calm steps' mean.
    assert est.iteration_s == pytest.approx(clean.iteration_s + 8 * MU / 25, rel=0.02)


def test_two_bursts_are_not_yet_a_beat() -> None:
    x = with_evaluations(steady(14, 70), every=25, cost_s=8 * MU, first=25)  # steps 25, 50
    split = split_contention(x)
    assert split.bursts == 2 and split.burst_period_steps is None
    est, clean = estimate_measured(x), estimate_measured(steady(14, 70))
    assert est is not None and clean is not None
    assert est.iteration_s == pytest.approx(clean.iteration_s, rel=0.02)  # left out, as before


def test_unevenly_spaced_bursts_are_contention() -> None:
    x = steady(15, 200)
    for start in (30, 52, 95, 120, 171):  # gaps 22, 43, 25, 51: another process, no beat
        x[start] *= 9.0
    split = split_contention(x)
    assert split.bursts == 5 and split.burst_period_steps is None
    est, clean = estimate_measured(x), estimate_measured(steady(15, 200))
    assert est is not None and clean is not None
    assert est.iteration_s == pytest.approx(clean.iteration_s, rel=0.02)


def test_a_beat_that_stopped_is_not_projected() -> None:
    x = steady(16, 200)
    x[[25, 50, 75]] += 8 * MU  # three evenly spaced, then none for 125 steps
    assert split_contention(x).burst_period_steps is None


def test_a_beat_with_a_jittered_step_still_counts() -> None:
    x = steady(17, 200)
    x[[40, 80, 121, 160]] += 8 * MU  # every 40 steps, one a step late
    assert split_contention(x).burst_period_steps == 40


def test_a_beat_after_a_lone_burst_is_still_found() -> None:
    """A neighbour's burst (or the capture's decode) early on, then an evaluation every 25
    steps: the beat is the evaluations'; the lone burst stays contention (interval)."""
    x = with_evaluations(steady(18, 200), every=25, cost_s=8 * MU, first=25)
    x[6] *= 9.0
    split = split_contention(x)
    assert split.burst_period_steps == 25 and split.bursts == 7
    assert split.contention_excess_s == pytest.approx(8 * MU / split.keep.sum(), rel=0.15)
    est, clean = estimate_measured(x), estimate_measured(steady(18, 200))
    assert est is not None and clean is not None
    assert est.iteration_s == pytest.approx(clean.iteration_s + 8 * MU / 25, rel=0.02)


def test_a_level_straddling_the_burst_threshold_is_not_a_beat() -> None:
    """A lasting slowdown to 2x, while still a minority of the steps: noise splits the new
    level into short runs above the threshold, a few steps apart. Not recurring work."""
    rng = np.random.default_rng(0)
    base = np.where(np.arange(600) < 300, 0.5, 1.0)
    y = base * (1.0 + 0.03 * rng.standard_normal(600))
    assert all(split_contention(y[1:n]).burst_period_steps is None for n in range(300, 600))


def _noisy_host(seed: int) -> np.ndarray:
    """Another process's bursts at random: 1-5% of the steps, 1-3 steps long, 2-10x."""
    rng = np.random.default_rng(1000 + seed)
    x = steady(1000 + seed, 300, cv=rng.uniform(0.03, 0.12), rho=rng.uniform(0.0, 0.7))
    i = 10
    while True:
        i += int(rng.exponential(1 / rng.choice([0.01, 0.02, 0.05])))
        if i >= 300:
            return x
        length = int(rng.integers(1, 4))
        x[i : i + length] *= rng.uniform(2, 10)
        i += length


def test_a_noisy_hosts_random_bursts_rarely_keep_a_beat() -> None:
    beats = sum(
        any(split_contention(x[:n]).burst_period_steps is not None for n in range(20, 301, 10))
        for x in map(_noisy_host, range(100))
    )
    assert beats <= 4  # 1.5% of 400 such series when measured; 13.5% without the size rule


def test_an_unmarked_evaluation_with_some_jitter_is_found() -> None:
    found = 0
    for seed in range(40):
        rng = np.random.default_rng(5000 + seed)
        x = steady(5000 + seed, 300, cv=rng.uniform(0.03, 0.12), rho=rng.uniform(0.0, 0.7))
        every, cost_s = int(rng.integers(10, 60)), rng.uniform(1, 20) * MU
        for i in range(every, 300, every):
            x[i] += cost_s * (1 + 0.1 * rng.standard_normal())
        found += split_contention(x).burst_period_steps == every
    assert found >= 32  # 80%: the smallest evaluations hide in the noise


def test_the_beat_search_is_bounded_on_a_long_noisy_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """65,536 steps with thousands of bursts (a refresh of a long job on a noisy host): the
    beat is looked for among the latest MAX_BEAT_BURSTS only (it was a search over every
    suffix: ~0.3 s a refresh)."""
    from ets_hook.forecast import contention

    rng = np.random.default_rng(2)
    x = steady(19, 65_536, cv=0.05, rho=0.3)
    x[rng.choice(65_000, 3000, replace=False)] *= rng.uniform(2, 10, 3000)
    x[[65_100, 65_200, 65_300]] *= 3.0  # the last three evenly spaced: the search runs
    calls = []
    real = contention.burst_period

    def counted(runs: list[tuple[int, int]], length: int) -> int | None:
        calls.append(len(runs))
        return real(runs, length)

    monkeypatch.setattr(contention, "burst_period", counted)
    split = contention.split_contention(x)
    assert split.bursts > 2000
    assert 0 < len(calls) <= contention.MAX_BEAT_BURSTS
    assert max(calls) <= contention.MAX_BEAT_BURSTS


def test_an_estimate_is_outdated_only_by_a_run_longer_than_a_burst() -> None:
    assert OUTDATED_RUN_STEPS == MAX_BURST_STEPS + 1
    x = steady(11, 60)
    # Steps as noisy as the job's own: never outdated, at any point of the series.
    assert not any(outdated_by_recent_steps(x[: i + 1], MU, 0.02 * MU) for i in range(len(x)))
    # A burst (the longest there is), then back: not outdated at any point.
    burst = x.copy()
    burst[30 : 30 + MAX_BURST_STEPS] *= 10.0
    assert not any(
        outdated_by_recent_steps(burst[: i + 1], MU, 0.02 * MU) for i in range(len(burst))
    )
    # A level that moved by 10x (or halved) and stayed: outdated from the sixth step on.
    for factor in (10.0, 0.5):
        moved = x.copy()
        moved[30:] *= factor
        flags = [outdated_by_recent_steps(moved[: i + 1], MU, 0.02 * MU) for i in range(len(x))]
        assert flags.index(True) == 30 + OUTDATED_RUN_STEPS - 1
    # Within the estimate's interval (or within MIN_SHIFT_REL of it): not outdated.
    assert not outdated_by_recent_steps(np.full(10, 1.3 * MU), MU, 0.35 * MU)
    assert not outdated_by_recent_steps(np.full(10, 1.08 * MU), MU, 0.0)
    assert outdated_by_recent_steps(np.full(10, 1.12 * MU), MU, 0.0)
    assert not outdated_by_recent_steps(np.full(OUTDATED_RUN_STEPS - 1, 5 * MU), MU, 0.0)
