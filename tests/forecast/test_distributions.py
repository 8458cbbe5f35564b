"""Normal and Student-t quantiles against tables and each other."""

from __future__ import annotations

import pytest

from ets_hook.forecast.distributions import normal_quantile, student_t_cdf, student_t_quantile


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281), (30, 2.0423)],
)
def test_student_t_quantile_matches_tables(df: float, expected: float) -> None:
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert student_t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_student_t_quantile_inverts_cdf_and_tends_to_normal() -> None:
    for df in (0.7, 1.5, 4.2, 17.0, 250.0):
        for p in (0.6, 0.9, 0.995):
            assert student_t_cdf(student_t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)
    assert student_t_quantile(0.975, 1e7) == pytest.approx(normal_quantile(0.975), abs=1e-6)
    with pytest.raises(ValueError, match="df must be > 0"):
        student_t_quantile(0.975, 0)
    with pytest.raises(ValueError, match="p must be in"):
        student_t_quantile(1.0, 3)
