"""forecast.ranks: the job view of several ranks' forecasts, and the JSON that carries them
between processes (checked field by field: it comes from other processes)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
from typing import Any

import pytest

from ets_hook.forecast.ranks import (
    MAX_FORECAST_BYTES,
    MAX_VIEW_BYTES,
    JobView,
    RankForecast,
    aggregate_ranks,
)
from ets_hook.trace.breakdown import find_straggler

START = 1_700_000_000.0


def rf(
    rank: int,
    finish: float | None = 1000.0,
    ci: float | None = 10.0,
    busy: float | None = 0.1,
    **kw: Any,
) -> RankForecast:
    fields: dict[str, Any] = {
        "rank": rank,
        "step": 100 + rank,
        "start_wall_s": START + rank,
        "finish_wall_s": START + finish if finish is not None else None,
        "finish_ci_s": ci,
        "iteration_s": 0.25 + 0.01 * rank,
        "compute_s": busy * 0.8 if busy is not None else None,
        "data_wait_s": busy * 0.2 if busy is not None else None,
        "busy_s": busy,
        "busy_se_s": 0.0 if busy is not None else None,  # several steps alike
        "host": f"node-{rank}",
    }
    fields.update(kw)
    return RankForecast(**fields)


# --------------------------------------------------------------------------------------------
# aggregate_ranks


def test_the_same_forecasts_in_any_order_give_the_same_view() -> None:
    forecasts = [rf(0, 1000), rf(1, 1003, busy=0.15), rf(2, 998), rf(3, 1200, ci=5.0)]
    views = {
        aggregate_ranks(list(p), exchange=2, world_size=4)
        for p in itertools.permutations(forecasts)
    }
    assert len(views) == 1
    view = views.pop()
    assert [f.rank for f in view.ranks] == [0, 1, 2, 3]
    assert view.exchange == 2 and view.world_size == 4
    assert view.step == min(f.step for f in forecasts)
    assert view.start_wall_s == min(f.start_wall_s for f in forecasts)


def test_ranks_in_lock_step_give_the_median_end() -> None:
    forecasts = [rf(0, 1000), rf(1, 1004), rf(2, 1001)]  # within each other's 10 s intervals
    view = aggregate_ranks(forecasts, exchange=0, world_size=3)
    ends = [f.finish_wall_s for f in forecasts]
    assert view.lockstep
    assert view.finish_wall_s == pytest.approx(statistics.median(ends))  # type: ignore[type-var]
    assert view.finish_wall_s < max(ends)  # type: ignore[operator,type-var]
    assert view.slowest_rank == 1  # no straggler: the latest end's rank
    assert view.straggler_rank is None and view.straggler_ratio is None
    assert view.total_s == pytest.approx(view.finish_wall_s - view.start_wall_s)  # type: ignore[operator]


def test_a_clearly_later_rank_sets_the_job_end() -> None:
    forecasts = [rf(0, 1000), rf(1, 1001), rf(2, 1200, busy=0.3)]
    view = aggregate_ranks(forecasts, exchange=0, world_size=3)
    assert not view.lockstep
    assert view.finish_wall_s == forecasts[2].finish_wall_s
    assert view.slowest_rank == 2
    assert view.straggler_rank == 2


def test_the_straggler_is_the_slowest_rank_of_ranks_in_lock_step() -> None:
    # Rank 2's end is the latest by noise; rank 1 does the most work per step.
    forecasts = [rf(0, 1000), rf(1, 1000.5, busy=0.15), rf(2, 1002)]
    view = aggregate_ranks(forecasts, exchange=0, world_size=3)
    assert view.lockstep
    expected = find_straggler({f.rank: f.busy_s for f in forecasts})  # type: ignore[misc]
    assert expected is not None and expected[0] == 1
    assert (view.straggler_rank, view.straggler_ratio) == expected
    assert view.slowest_rank == 1


def test_out_of_lock_step_the_latest_end_wins_over_the_straggler() -> None:
    forecasts = [rf(0, 1000, busy=0.2), rf(1, 1500, ci=1.0), rf(2, 1001)]
    view = aggregate_ranks(forecasts, exchange=0, world_size=3)
    assert not view.lockstep
    assert view.straggler_rank == 0
    assert view.slowest_rank == 1


def test_unknown_ci_makes_only_equal_ends_lock_step() -> None:
    assert aggregate_ranks([rf(0, 1000, ci=None), rf(1, 1000)], exchange=0, world_size=2).lockstep
    view = aggregate_ranks([rf(0, 1000, ci=None), rf(1, 1000.5)], exchange=0, world_size=2)
    assert not view.lockstep
    assert view.slowest_rank == 1 and view.finish_wall_s == START + 1000.5


def test_unknown_ends() -> None:
    view = aggregate_ranks([rf(0, None, None), rf(1, None, None)], exchange=0, world_size=2)
    assert view.finish_wall_s is None and view.slowest_rank is None and view.total_s is None
    assert not view.lockstep
    # Only the known ends count, and one end alone is never "lock step".
    view = aggregate_ranks([rf(0, None, None), rf(1, 900)], exchange=0, world_size=2)
    assert (view.slowest_rank, view.finish_wall_s, view.lockstep) == (1, START + 900, False)


def test_a_rank_without_a_breakdown_means_no_straggler() -> None:
    forecasts = [rf(0, busy=0.1), rf(1, busy=0.5), rf(2, busy=None)]
    view = aggregate_ranks(forecasts, exchange=0, world_size=3)
    assert view.straggler_rank is None and view.straggler_ratio is None
    with_all = aggregate_ranks(forecasts[:2], exchange=0, world_size=3)
    assert with_all.straggler_rank == 1  # the same two ranks alone do have one


def test_a_gap_within_the_ranks_noise_names_no_straggler() -> None:
    # Rank 1 is 50% above rank 0, but their step-to-step noise is as large as the gap.
    noisy = [rf(0, busy=0.1, busy_se_s=0.05), rf(1, busy=0.15, busy_se_s=0.05), rf(2, 1002)]
    view = aggregate_ranks(noisy, exchange=0, world_size=3)
    assert view.straggler_rank is None and view.straggler_ratio is None
    assert view.slowest_rank == 2 and view.lockstep  # the latest end, as without a straggler
    quiet = [dataclasses.replace(f, busy_se_s=0.001) for f in noisy]
    assert aggregate_ranks(quiet, exchange=0, world_size=3).straggler_rank == 1
    # None: one captured step (a short job's window): the noise is unknown, no rank is named.
    unknown = [dataclasses.replace(f, busy_se_s=None) for f in quiet]
    assert aggregate_ranks(unknown, exchange=0, world_size=3).straggler_rank is None
    one_unknown = [quiet[0], dataclasses.replace(quiet[1], busy_se_s=None), quiet[2]]
    assert aggregate_ranks(one_unknown, exchange=0, world_size=3).straggler_rank is None


def test_a_duplicate_rank_keeps_the_last_forecast() -> None:
    view = aggregate_ranks([rf(0, 1000), rf(1, 1000), rf(0, 2000)], exchange=0, world_size=2)
    assert len(view.ranks) == 2
    assert view.forecast_of(0).finish_wall_s == START + 2000  # type: ignore[union-attr]
    assert view.forecast_of(5) is None


def test_aggregate_refuses_nothing_to_aggregate() -> None:
    with pytest.raises(ValueError, match="at least one"):
        aggregate_ranks([], exchange=0, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        aggregate_ranks([rf(0)], exchange=0, world_size=0)


def test_a_straggler_on_a_busy_host_is_said_to_be_on_one() -> None:
    """Identical ranks on a loaded 2-core machine were named stragglers in 7 of 15 runs: the
    view says when the straggler's host was busy with other processes during its capture."""
    quiet, busy = 0.05, 0.7
    for share, expected in ((busy, busy), (quiet, None), (None, None), (0.25, 0.25)):
        view = aggregate_ranks(
            [rf(0, 1000, host_foreign_cpu=quiet), rf(1, 1000, busy=0.28, host_foreign_cpu=share)],
            exchange=0,
            world_size=2,
        )
        assert view.straggler_rank == 1
        assert view.straggler_host_foreign_cpu == expected, share
        assert JobView.from_json(view.to_json()).straggler_host_foreign_cpu == expected
    # Only the straggler's host counts; and without a straggler there is nothing to qualify.
    other_busy = [rf(0, 1000, host_foreign_cpu=busy), rf(1, 1000, busy=0.28)]
    assert aggregate_ranks(other_busy, exchange=0, world_size=2).straggler_host_foreign_cpu is None
    alike = [rf(0, 1000, host_foreign_cpu=busy), rf(1, 1000, host_foreign_cpu=busy)]
    view = aggregate_ranks(alike, exchange=0, world_size=2)
    assert view.straggler_rank is None and view.straggler_host_foreign_cpu is None


# --------------------------------------------------------------------------------------------
# JSON round trips


def test_rank_forecast_round_trip() -> None:
    for forecast in (
        rf(3, 1234.5678, busy=0.123456789, busy_se_s=0.0123, host_foreign_cpu=0.7),
        rf(0, None, None, busy=None, host=""),
    ):
        raw = forecast.to_json()
        assert isinstance(raw, bytes) and len(raw) <= MAX_FORECAST_BYTES
        assert RankForecast.from_json(raw) == forecast


def test_job_view_round_trip() -> None:
    forecasts = [rf(0, 1000), rf(1, 1000.5, busy=0.15), rf(2, 1002, ci=None, busy=0.1)]
    for view in (
        aggregate_ranks(forecasts, exchange=4, world_size=3),
        aggregate_ranks([rf(0, None, None)], exchange=0, world_size=2),
    ):
        back = JobView.from_json(view.to_json())
        assert back == view
        assert back.total_s == view.total_s


def test_encoding_refuses_nan() -> None:
    with pytest.raises(ValueError):
        rf(0, iteration_s=float("nan")).to_json()


# --------------------------------------------------------------------------------------------
# Hostile input


def forecast_dict(**changes: Any) -> dict[str, Any]:
    data = dataclasses.asdict(rf(1))
    data.update(changes)
    return data


def encode(data: Any) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"{", b"\xff\xfe", b"[" * 4000, b'"text"', b"[]", b"null", b"42"],
    ids=["empty", "text", "truncated", "not-utf8", "deep", "string", "list", "null", "number"],
)
def test_not_a_forecast_object(raw: bytes) -> None:
    with pytest.raises(ValueError):
        RankForecast.from_json(raw)
    with pytest.raises(ValueError):
        JobView.from_json(raw)


INT_FIELDS = ("rank", "step")
REQUIRED_FLOATS = ("start_wall_s", "iteration_s")
OPTIONAL_FLOATS = (
    "finish_wall_s",
    "finish_ci_s",
    "compute_s",
    "data_wait_s",
    "busy_s",
    "busy_se_s",
    "host_foreign_cpu",
)


@pytest.mark.parametrize("name", INT_FIELDS + REQUIRED_FLOATS)
def test_a_missing_required_field_is_named(name: str) -> None:
    data = forecast_dict()
    del data[name]
    with pytest.raises(ValueError, match=repr(name)):
        RankForecast.from_json(encode(data))
    data[name] = None
    with pytest.raises(ValueError, match=repr(name)):
        RankForecast.from_json(encode(data))


def test_missing_optional_fields_take_their_defaults() -> None:
    data = forecast_dict()
    for name in (*OPTIONAL_FLOATS, "host"):
        del data[name]
    forecast = RankForecast.from_json(encode(data))
    assert all(getattr(forecast, name) is None for name in OPTIONAL_FLOATS)
    assert forecast.host == ""


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize(
    "value", [True, False, 1.0, "1", -1, 2**53, 10**30, [1], {"v": 1}], ids=repr
)
def test_bad_int_fields_are_named(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        RankForecast.from_json(encode(forecast_dict(**{name: value})))


@pytest.mark.parametrize("name", REQUIRED_FLOATS + OPTIONAL_FLOATS)
@pytest.mark.parametrize("value", [True, False, "1.5", [1.0], {"v": 1.0}], ids=repr)
def test_bad_number_fields_are_named(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        RankForecast.from_json(encode(forecast_dict(**{name: value})))


@pytest.mark.parametrize("name", REQUIRED_FLOATS + OPTIONAL_FLOATS)
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_named(name: str, literal: str) -> None:
    # Python's json reads NaN/Infinity literals (and 1e999 as inf) unless refused.
    raw = encode(forecast_dict(**{name: 0.5})).replace(
        f'"{name}": 0.5'.encode(), f'"{name}": {literal}'.encode()
    )
    assert literal.encode() in raw
    with pytest.raises(ValueError, match=repr(name)):
        RankForecast.from_json(raw)


@pytest.mark.parametrize("name", ["start_wall_s", "finish_ci_s"])
def test_an_integer_beyond_the_float_range_is_named(name: str) -> None:
    raw = encode(forecast_dict(**{name: 10**400}))
    assert len(raw) <= MAX_FORECAST_BYTES
    with pytest.raises(ValueError, match=repr(name)):
        RankForecast.from_json(raw)


def test_large_but_finite_numbers_are_accepted_as_floats() -> None:
    forecast = RankForecast.from_json(encode(forecast_dict(start_wall_s=10**20, rank=2**53 - 1)))
    assert forecast.start_wall_s == 1e20 and isinstance(forecast.start_wall_s, float)
    assert forecast.rank == 2**53 - 1


@pytest.mark.parametrize("host", [5, None, ["a"], "h" * 257])
def test_bad_host_is_named(host: Any) -> None:
    with pytest.raises(ValueError, match="'host'"):
        RankForecast.from_json(encode(forecast_dict(host=host)))
    assert RankForecast.from_json(encode(forecast_dict(host="h" * 256))).host == "h" * 256


def test_oversize_documents_are_refused_before_parsing() -> None:
    big = forecast_dict(padding="x" * MAX_FORECAST_BYTES)
    with pytest.raises(ValueError, match="bytes"):
        RankForecast.from_json(encode(big))
    with pytest.raises(ValueError, match="bytes"):
        RankForecast.from_json(b" " * (MAX_FORECAST_BYTES + 1))
    with pytest.raises(ValueError, match="bytes"):
        JobView.from_json(b" " * (MAX_VIEW_BYTES + 1))
    # Unknown extra fields within the limit are ignored.
    small = forecast_dict(padding="x" * 100)
    assert RankForecast.from_json(encode(small)) == rf(1)


def view_dict(**changes: Any) -> dict[str, Any]:
    view = aggregate_ranks([rf(0), rf(1, busy=0.2)], exchange=1, world_size=2)
    data = json.loads(view.to_json())
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("exchange", -1),
        ("exchange", None),
        ("exchange", True),
        ("step", "3"),
        ("world_size", 0),
        ("world_size", 2.0),
        ("slowest_rank", -2),
        ("slowest_rank", False),
        ("finish_wall_s", "soon"),
        ("start_wall_s", None),
        ("lockstep", 1),
        ("lockstep", "true"),
        ("straggler_rank", 1.5),
        ("straggler_ratio", True),
        ("ranks", {"0": {}}),
        ("ranks", None),
    ],
)
def test_bad_view_fields_are_named(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        JobView.from_json(encode(view_dict(**{name: value})))


@pytest.mark.parametrize("name", ["exchange", "step", "world_size", "start_wall_s", "ranks"])
def test_missing_view_fields_are_named(name: str) -> None:
    data = view_dict()
    del data[name]
    with pytest.raises(ValueError, match=repr(name)):
        JobView.from_json(encode(data))


def test_a_bad_rank_inside_a_view_is_named() -> None:
    data = view_dict()
    data["ranks"][1]["busy_s"] = "fast"
    with pytest.raises(ValueError, match="'busy_s'"):
        JobView.from_json(encode(data))
    data["ranks"][1] = [1, 2]
    with pytest.raises(ValueError, match="object"):
        JobView.from_json(encode(data))


def test_a_view_with_a_non_finite_ratio_is_refused() -> None:
    raw = encode(view_dict(straggler_ratio=2.0)).replace(
        b'"straggler_ratio": 2.0', b'"straggler_ratio": Infinity'
    )
    assert b"Infinity" in raw
    with pytest.raises(ValueError, match="'straggler_ratio'"):
        JobView.from_json(raw)
