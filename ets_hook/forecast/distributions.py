"""Normal and Student-t quantiles for the intervals (pure Python: scipy is not a dependency)."""

from __future__ import annotations

import functools
import math
from statistics import NormalDist


@functools.lru_cache(maxsize=64)
def normal_quantile(p: float) -> float:
    """Standard normal quantile at probability ``p`` (cached: callers use a handful of levels).

    Raises:
        ValueError: ``p`` not in (0, 1) (``statistics.StatisticsError``).
    """
    return NormalDist().inv_cdf(p)


def normal_cdf(x: float) -> float:
    """Standard normal cumulative probability at ``x`` (``erfc``-based: accurate in the tails)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction of the regularised incomplete beta function (modified Lentz).
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """CDF of Student's t at ``t`` with ``df`` degrees of freedom.

    Args:
        t: the point.
        df: degrees of freedom, > 0, not necessarily integer (not checked).

    Returns:
        ``P(T <= t)``.
    """
    tail = 0.5 * _betainc(0.5 * df, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def _t_pdf(t: float, df: float) -> float:
    log_c = math.lgamma(0.5 * (df + 1.0)) - math.lgamma(0.5 * df) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - 0.5 * (df + 1.0) * math.log1p(t * t / df))


@functools.lru_cache(maxsize=4096)
def _t_quantile_cached(p: float, df: float) -> float:
    # p > 0.5. Start from the Cornish-Fisher expansion (exact as df -> inf), then Newton on the
    # CDF; the t CDF is smooth and unimodal-density, so a handful of steps reach 1e-12.
    z = normal_quantile(p)
    z2 = z * z
    t = z + z * (z2 + 1.0) / (4.0 * df) + z * ((5.0 * z2 + 16.0) * z2 + 3.0) / (96.0 * df * df)
    if df <= 1.0:
        t = max(t, math.tan(math.pi * (p - 0.5)))  # Cauchy (df = 1); heavier tails below
    for _ in range(50):
        step = (student_t_cdf(t, df) - p) / _t_pdf(t, df)
        t_next = t - step
        if t_next <= 0.0:
            t_next = 0.5 * t
        if abs(t_next - t) < 1e-12 * max(1.0, t):
            return t_next
        t = t_next
    return t


def student_t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t for real ``df`` > 0 (df above 1e6 uses the normal).

    ``df`` is rounded (to 0.05 below 10, to 0.5 below 100, to an integer above) to key a
    cache: the effective sample size behind ``df`` moves a little with every step, and an
    uncached quantile costs ~0.1 ms (a prediction read is otherwise ~0.1 ms).

    Args:
        p: probability, in (0, 1).
        df: degrees of freedom, > 0.

    Returns:
        ``t`` with ``P(T <= t) = p`` for the rounded ``df``.

    Raises:
        ValueError: ``p`` not in (0, 1) or ``df`` not > 0.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    # Quantise df for the cache: a 0.05-df change moves a 95% quantile by < 0.1% for df >= 1,
    # rounding to 0.5 moves it by < 0.4% for df >= 10 (the interval widths do not need more).
    if df < 10.0:
        key = round(df * 20.0) / 20.0
    elif df < 100.0:
        key = round(df * 2.0) / 2.0
    else:
        key = float(round(df))
    key = max(key, 0.05)
    if key > 1e6:
        q = normal_quantile(max(p, 1.0 - p))
    else:
        q = _t_quantile_cached(max(p, 1.0 - p), key)
    return q if p > 0.5 else -q
