"""Where a step's time goes on one rank: own compute, waiting for input, and the rest.

Under data parallelism every rank's wall step time is the same: a fast rank waits inside the
gradient all-reduce for the slowest. Comparing ranks therefore needs what each rank does besides
waiting. Per captured step:

- ``data_wait``: from the step's start (the previous step's end) to its first op that is not
  input work: fetching the next batch in the training process (a ``DataLoader`` iterator, a slow
  input pipeline, a ``sleep``). The ops of a ``Dataset`` or ``collate_fn`` run in this process
  (``num_workers=0``: inside the iterator's ``enumerate(DataLoader)#`` annotation, decoded as
  ``Phase.INPUT``) count as data wait, not compute.
- ``compute``: on GPU steps (kernels captured) the union of the non-communication kernels'
  intervals; otherwise the union of the outermost ops' intervals, less the collective ops in
  them (``trace.names.is_collective``).
- ``other``: the rest of the step: waiting inside collectives, Python between ops, the
  optimizer's Python code.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .events import IterationTrace, Phase, Trace
from .names import is_collective
from .summary import printable

#: A rank counts as a straggler when its compute + data wait per step is at least this much
#: above the fastest rank's (0.10: 10% above) ...
STRAGGLER_EXCESS = 0.10
#: ... and the gap is this many standard errors of the two medians apart (noise between steps
#: must not name a rank: a busy machine easily moves a few captured steps by 10%).
STRAGGLER_Z = 2.0


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """One captured step split into its parts, seconds.

    Attributes:
        step: the step number.
        wall_s: the step's wall time.
        compute_s: this rank's own work (see the module docstring).
        data_wait_s: step start to its first op.
        collective_s: time inside collective ops (launches on CPU; the kernels on GPU).
        other_s: ``wall_s - compute_s - data_wait_s``, at least 0.
    """

    step: int
    wall_s: float
    compute_s: float
    data_wait_s: float
    collective_s: float
    other_s: float


@dataclass(frozen=True, slots=True)
class RankBreakdown:
    """One rank's captured steps summarised by their medians, seconds.

    Attributes:
        rank: the trace's rank.
        steps: captured steps summarised.
        wall_s, compute_s, data_wait_s, collective_s, other_s: medians over those steps.
        busy_s: the median of each step's compute + data wait: what the rank spends per step
            that the others may have to wait for (one noisy step moves it less than the sum
            of two medians).
        busy_se_s: the standard error of ``busy_s`` (1.4826 x the median absolute deviation
            of the steps' values over the square root of their count); None for one step
            (unknown: one step says nothing of the noise between steps).
    """

    rank: int
    steps: int
    wall_s: float
    compute_s: float
    data_wait_s: float
    collective_s: float
    other_s: float
    busy_s: float
    busy_se_s: float | None = None


def _union_s(intervals: Iterable[tuple[int, int]]) -> float:
    """Total length of the union of ``(start_ns, end_ns)`` intervals, in seconds."""
    total_ns = 0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total_ns += current_end - current_start
            current_start, current_end = start, end
        elif end > current_end:
            current_end = end
    if current_end is not None:
        total_ns += current_end - current_start
    return total_ns / 1e9


def breakdown_iteration(iteration: IterationTrace) -> StepBreakdown:
    """Split one captured step into compute, data wait, collectives and the rest.

    Args:
        iteration: a decoded iteration (op and kernel times on one clock, ns).

    Returns:
        Its breakdown; a step without ops has all its time in ``data_wait_s``.
    """
    wall_ns = max(iteration.end_ns - iteration.start_ns, 0)
    wall_s = wall_ns / 1e9
    # The input pipeline's ops in this process (Phase.INPUT) are part of the data wait.
    ops = [op for op in iteration.ops if op.phase is not Phase.INPUT]
    if not ops:
        return StepBreakdown(iteration.step, wall_s, 0.0, wall_s, 0.0, 0.0)
    first_start = min(op.start_ns for op in ops)
    data_wait_s = min(max(first_start - iteration.start_ns, 0), wall_ns) / 1e9
    collective_spans = [
        (op.start_ns, op.start_ns + op.duration_ns) for op in ops if is_collective(op.name)
    ]
    device_work = [k for k in iteration.kernels if not k.communication and k.duration_ns > 0]
    if device_work:
        compute_s = _union_s((k.start_ns, k.start_ns + k.duration_ns) for k in device_work)
        collective_s = _union_s(
            (k.start_ns, k.start_ns + k.duration_ns) for k in iteration.kernels if k.communication
        )
    else:
        # Outermost ops less the collectives, as sets of instants: nested, overlapping or on
        # other threads, each instant counts once.
        top_spans = [(op.start_ns, op.start_ns + op.duration_ns) for op in ops if op.depth == 0]
        collective_s = _union_s(collective_spans)
        compute_s = max(_union_s(top_spans + collective_spans) - collective_s, 0.0)
    compute_s = min(compute_s, max(wall_s - data_wait_s, 0.0))
    other_s = max(wall_s - compute_s - data_wait_s, 0.0)
    return StepBreakdown(iteration.step, wall_s, compute_s, data_wait_s, collective_s, other_s)


def rank_breakdown(trace: Trace, leave_out: Collection[int] = ()) -> RankBreakdown | None:
    """The medians of a trace's step breakdowns.

    Args:
        trace: one rank's trace.
        leave_out: step numbers not summarised (e.g. ``metadata["partial_steps"]``, captured
            from inside the step: no data wait seen).

    Returns:
        The summary, or None when no iteration is left.
    """
    steps = [breakdown_iteration(it) for it in trace.iterations if it.step not in leave_out]
    if not steps:
        return None

    def median(values: Iterable[float]) -> float:
        return float(statistics.median(values))

    busy = [s.compute_s + s.data_wait_s for s in steps]
    busy_median = median(busy)
    mad = median(abs(b - busy_median) for b in busy)

    return RankBreakdown(
        rank=trace.rank,
        steps=len(steps),
        wall_s=median(s.wall_s for s in steps),
        compute_s=median(s.compute_s for s in steps),
        data_wait_s=median(s.data_wait_s for s in steps),
        collective_s=median(s.collective_s for s in steps),
        other_s=median(s.other_s for s in steps),
        busy_s=busy_median,
        busy_se_s=1.4826 * mad / len(busy) ** 0.5 if len(busy) > 1 else None,
    )


def find_straggler(
    busy_s_by_rank: dict[int, float],
    excess: float = STRAGGLER_EXCESS,
    busy_se_s_by_rank: Mapping[int, float | None] | None = None,
    z: float = STRAGGLER_Z,
) -> tuple[int, float] | None:
    """The rank whose compute + data wait per step is the highest, if it is clearly above the
    fastest rank's.

    Args:
        busy_s_by_rank: compute + data wait per step of each rank, seconds.
        excess: the relative margin over the fastest rank (0.10: 10%).
        busy_se_s_by_rank: the standard error of each rank's value; with it, the gap must
            also be ``z`` standard errors of the difference (ranks missing count as 0; None:
            unknown, a rank summarised from one step: no rank is named against it or as it).
        z: see ``busy_se_s_by_rank``.

    Returns:
        ``(rank, ratio to the fastest)``; None with fewer than two ranks, a fastest rank at 0,
        or no rank that far above it. Ties go to the lowest rank.
    """
    finite = {r: v for r, v in busy_s_by_rank.items() if v == v and v >= 0.0}
    if len(finite) < 2:
        return None
    fastest_rank = min(finite, key=lambda r: (finite[r], r))
    slowest_rank = min(finite, key=lambda r: (-finite[r], r))
    fastest = finite[fastest_rank]
    if fastest <= 0.0:
        return None
    ratio = finite[slowest_rank] / fastest
    if ratio < 1.0 + excess:
        return None
    if busy_se_s_by_rank is not None:
        se_slow = busy_se_s_by_rank.get(slowest_rank, 0.0)
        se_fast = busy_se_s_by_rank.get(fastest_rank, 0.0)
        if se_slow is None or se_fast is None:
            return None  # a single captured step: the noise between steps is unknown
        if finite[slowest_rank] - fastest < z * (se_slow**2 + se_fast**2) ** 0.5:
            return None
    return slowest_rank, ratio


def format_rank_table(breakdowns: Sequence[RankBreakdown], hosts: Sequence[str] = ()) -> str:
    """The per-rank table ``ets-hook info`` prints for several ranks' traces.

    Args:
        breakdowns: one summary per rank.
        hosts: each rank's host name, in the same order (optional).

    Returns:
        Multi-line text (no trailing newline): a header, one row per rank sorted by rank with
        its medians in ms and its compute + data wait relative to the fastest rank's, then a
        line naming a straggler when there is one.
    """
    rows = sorted(zip(breakdowns, list(hosts) + [""] * len(breakdowns)), key=lambda r: r[0].rank)
    fastest = min((b.busy_s for b, _ in rows), default=0.0)
    lines = [
        f"{'rank':>5} {'host':<16} {'steps':>5} {'step ms':>9} {'compute ms':>10}"
        f" {'data ms':>9} {'coll ms':>9} {'other ms':>9} {'busy vs fastest':>16}"
    ]
    for b, host in rows:
        relative = f"{(b.busy_s / fastest - 1) * 100:+.1f}%" if fastest > 0 else "-"
        lines.append(
            f"{b.rank:>5} {printable(host, limit=16):<16} {b.steps:>5} {b.wall_s * 1e3:>9.3f}"
            f" {b.compute_s * 1e3:>10.3f} {b.data_wait_s * 1e3:>9.3f}"
            f" {b.collective_s * 1e3:>9.3f} {b.other_s * 1e3:>9.3f} {relative:>16}"
        )
    found = find_straggler(
        {b.rank: b.busy_s for b, _ in rows},
        busy_se_s_by_rank={b.rank: b.busy_se_s for b, _ in rows},
    )
    if found is not None:
        rank, ratio = found
        lines.append(
            f"straggler: rank {rank} (compute + data wait {ratio:.2f}x the fastest rank's;"
            " the others wait for it in collectives)"
        )
    return "\n".join(lines)
