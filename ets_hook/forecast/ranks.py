"""The job-level forecast of a multi-process job: it ends when its slowest rank ends.

Each rank sends a ``RankForecast`` (its own prediction, in absolute wall-clock terms, and what
its captured steps spent on compute and input) at a few agreed steps; rank 0 combines them with
``aggregate_ranks`` into one ``JobView`` that every rank then applies to its own predictions
(``Forecaster.set_job_view``). This module is pure: the exchange itself lives in
``ets_hook.distributed``.

Forecasts arrive from other processes, so ``RankForecast.from_json`` / ``JobView.from_json``
check every field and bound the size: anything else is a ``ValueError``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from ..trace.breakdown import STRAGGLER_EXCESS, find_straggler
from .prediction import BUSY_FOREIGN_CPU

#: Largest encoded ``RankForecast`` / ``JobView`` accepted, bytes (per rank: ~300).
MAX_FORECAST_BYTES = 4096
MAX_VIEW_BYTES = 4096 + 512 * 65536


@dataclass(frozen=True, slots=True)
class RankForecast:
    """One rank's forecast as of an exchange.

    Attributes:
        rank: the rank.
        step: its completed global steps.
        start_wall_s: Unix time of its hook's creation.
        finish_wall_s: its predicted end of the last step, Unix time; None when the job length
            is unknown.
        finish_ci_s: half-width of its interval of ``finish_wall_s``, seconds; None alike.
        iteration_s: its predicted steady step time, seconds.
        compute_s: compute per captured step (median, ``trace.breakdown``); None before its
            trace is decoded.
        data_wait_s: data wait per captured step (median); None alike.
        busy_s: compute + data wait per captured step (median of the sums); None alike.
        busy_se_s: the standard error of ``busy_s``; None alike, and for one captured step
            (unknown: then no straggler is named).
        host: its host name.
        host_foreign_cpu: share of its host's CPU (0..1) other processes used around its
            capture window (``Prediction.capture_host_foreign_cpu``); None when unknown.
    """

    rank: int
    step: int
    start_wall_s: float
    finish_wall_s: float | None
    finish_ci_s: float | None
    iteration_s: float
    compute_s: float | None = None
    data_wait_s: float | None = None
    busy_s: float | None = None
    busy_se_s: float | None = None
    host: str = ""
    host_foreign_cpu: float | None = None

    def to_json(self) -> bytes:
        """The forecast as compact JSON bytes (what goes into the store)."""
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_dict(cls, data: Any) -> RankForecast:
        """Check and build a forecast from its dict form.

        Raises:
            ValueError: naming the field that is missing, of the wrong type or out of range.
        """
        if not isinstance(data, dict):
            raise ValueError(f"rank forecast must be an object, got {type(data).__name__}")
        return cls(
            rank=_int(data, "rank"),
            step=_int(data, "step"),
            start_wall_s=_float(data, "start_wall_s"),
            finish_wall_s=_float(data, "finish_wall_s", optional=True),
            finish_ci_s=_float(data, "finish_ci_s", optional=True),
            iteration_s=_float(data, "iteration_s"),
            compute_s=_float(data, "compute_s", optional=True),
            data_wait_s=_float(data, "data_wait_s", optional=True),
            busy_s=_float(data, "busy_s", optional=True),
            busy_se_s=_float(data, "busy_se_s", optional=True),
            host=_str(data, "host"),
            host_foreign_cpu=_float(data, "host_foreign_cpu", optional=True),
        )

    @classmethod
    def from_json(cls, raw: bytes) -> RankForecast:
        """Parse ``to_json``'s bytes.

        Raises:
            ValueError: not JSON, over ``MAX_FORECAST_BYTES``, or a bad field.
        """
        return cls.from_dict(_loads(raw, MAX_FORECAST_BYTES, "rank forecast"))


@dataclass(frozen=True, slots=True)
class JobView:
    """The job-level forecast that every rank applies: the same object on every rank.

    Attributes:
        exchange: the exchange's number (0 first).
        step: the global step at which the ranks sent their forecasts.
        world_size: processes in the job.
        ranks: every rank's forecast, sorted by rank.
        slowest_rank: the rank the job's end waits for: the rank predicted to finish last or,
            when the ranks' predicted ends agree within their intervals (ranks in lock step,
            as under DDP, where the differences are estimation noise), the straggler if there
            is one. None when no rank's end is known.
        finish_wall_s: the job's predicted end, Unix time: the latest rank's end or, for ranks
            in lock step, the median of their ends (the maximum of N noisy estimates of one
            end would be biased late, more so the more ranks). None when no end is known.
        lockstep: the ranks' predicted ends agree within their intervals.
        start_wall_s: the earliest hook creation among the ranks, Unix time.
        straggler_rank: the rank whose compute + data wait per step is ``STRAGGLER_EXCESS``
            or more above the fastest rank's; None when there is none or it is unknown.
        straggler_ratio: that rank's compute + data wait over the fastest rank's; None alike.
    """

    exchange: int
    step: int
    world_size: int
    ranks: tuple[RankForecast, ...]
    slowest_rank: int | None
    finish_wall_s: float | None
    start_wall_s: float
    lockstep: bool = False
    straggler_rank: int | None = None
    straggler_ratio: float | None = None

    @property
    def total_s(self) -> float | None:
        """The job's predicted wall time from its first hook's creation to its end."""
        if self.finish_wall_s is None:
            return None
        return self.finish_wall_s - self.start_wall_s

    @property
    def straggler_host_foreign_cpu(self) -> float | None:
        """Other processes' share of the straggler's host CPU around its capture window (its
        forecast's ``host_foreign_cpu``), where it is ``BUSY_FOREIGN_CPU`` or more: the host
        was busy enough that the straggler's slower compute may be the host's, not the
        rank's. None without a straggler, with a host less busy, or unknown."""
        if self.straggler_rank is None:
            return None
        straggler = self.forecast_of(self.straggler_rank)
        share = straggler.host_foreign_cpu if straggler is not None else None
        return share if share is not None and share >= BUSY_FOREIGN_CPU else None

    def forecast_of(self, rank: int) -> RankForecast | None:
        """The forecast rank ``rank`` sent, or None."""
        for forecast in self.ranks:
            if forecast.rank == rank:
                return forecast
        return None

    def to_json(self) -> bytes:
        """The view as compact JSON bytes."""
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JobView:
        """Parse ``to_json``'s bytes.

        Raises:
            ValueError: not JSON, over ``MAX_VIEW_BYTES``, or a bad field.
        """
        data = _loads(raw, MAX_VIEW_BYTES, "job view")
        if not isinstance(data, dict):
            raise ValueError(f"job view must be an object, got {type(data).__name__}")
        ranks = data.get("ranks")
        if not isinstance(ranks, list):
            raise ValueError("job view field 'ranks' must be a list")
        return cls(
            exchange=_int(data, "exchange"),
            step=_int(data, "step"),
            world_size=_int(data, "world_size", minimum=1),
            ranks=tuple(RankForecast.from_dict(r) for r in ranks),
            slowest_rank=_int(data, "slowest_rank", optional=True),
            finish_wall_s=_float(data, "finish_wall_s", optional=True),
            start_wall_s=_float(data, "start_wall_s"),
            lockstep=_bool(data, "lockstep"),
            straggler_rank=_int(data, "straggler_rank", optional=True),
            straggler_ratio=_float(data, "straggler_ratio", optional=True),
        )


def aggregate_ranks(
    forecasts: list[RankForecast],
    *,
    exchange: int,
    world_size: int,
    straggler_excess: float = STRAGGLER_EXCESS,
) -> JobView:
    """Combine every rank's forecast into the job's: the job ends when its slowest rank ends.

    Deterministic: the same forecasts in any order give the same view.

    Args:
        forecasts: one forecast per rank (non-empty; duplicates of a rank: the last wins).
        exchange: the exchange's number.
        world_size: processes in the job (>= 1).
        straggler_excess: the straggler margin over the fastest rank's compute + data wait.

    Returns:
        The job view; ``step`` is the lowest step among the forecasts.

    Raises:
        ValueError: ``forecasts`` is empty or ``world_size`` < 1.
    """
    if not forecasts:
        raise ValueError("aggregate_ranks needs at least one rank's forecast")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    by_rank = {f.rank: f for f in forecasts}
    ranks = tuple(by_rank[r] for r in sorted(by_rank))
    busy = {f.rank: f.busy_s for f in ranks if f.busy_s is not None}
    busy_se = {f.rank: f.busy_se_s for f in ranks}  # None: one captured step, unknown
    straggler = (
        find_straggler(busy, straggler_excess, busy_se_s_by_rank=busy_se)
        if len(busy) == len(ranks)
        else None
    )
    finishing = [f for f in ranks if f.finish_wall_s is not None]
    slowest_rank = finish_wall_s = None
    lockstep = False
    if finishing:
        latest = max(finishing, key=lambda f: (f.finish_wall_s, -f.rank))
        ends = [f.finish_wall_s for f in finishing]
        median_end = statistics.median(ends)
        halves = [f.finish_ci_s for f in finishing if f.finish_ci_s is not None]
        pooled_half = statistics.median(halves) if len(halves) == len(finishing) else 0.0
        lockstep = len(finishing) > 1 and latest.finish_wall_s - median_end <= pooled_half
        if lockstep:
            finish_wall_s = median_end
            slowest_rank = straggler[0] if straggler is not None else latest.rank
        else:
            finish_wall_s, slowest_rank = latest.finish_wall_s, latest.rank
    return JobView(
        exchange=exchange,
        step=min(f.step for f in ranks),
        world_size=world_size,
        ranks=ranks,
        slowest_rank=slowest_rank,
        finish_wall_s=finish_wall_s,
        start_wall_s=min(f.start_wall_s for f in ranks),
        lockstep=lockstep,
        straggler_rank=straggler[0] if straggler is not None else None,
        straggler_ratio=straggler[1] if straggler is not None else None,
    )


# --------------------------------------------------------------------------------------------
# Field checks for data from other processes


def _loads(raw: bytes, limit: int, what: str) -> Any:
    if len(raw) > limit:
        raise ValueError(f"{what} of {len(raw)} bytes (limit {limit})")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not a JSON document: {exc}") from None


def _int(data: dict[str, Any], name: str, *, minimum: int = 0, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < 2**53:
        raise ValueError(f"field {name!r} must be an int >= {minimum}, got {value!r}")
    return value


def _float(data: dict[str, Any], name: str, *, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"field {name!r} must be a finite number, got {value!r}")
    try:
        number = float(value)  # an int beyond the float range: OverflowError
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"field {name!r} must be a finite number, got {str(value)[:40]!r}")
    return number


def _bool(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"field {name!r} must be true or false, got {value!r}")
    return value


def _str(data: dict[str, Any], name: str) -> str:
    value = data.get(name, "")
    if not isinstance(value, str) or len(value) > 256:
        raise ValueError(f"field {name!r} must be a string of <= 256 characters")
    return value
