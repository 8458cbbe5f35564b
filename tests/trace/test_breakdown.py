"""trace.breakdown: per-step compute / data wait / collective / other, per-rank medians,
the straggler rule and the per-rank table."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from ets_hook.trace.breakdown import (
    STRAGGLER_EXCESS,
    STRAGGLER_Z,
    RankBreakdown,
    breakdown_iteration,
    find_straggler,
    format_rank_table,
    rank_breakdown,
)
from ets_hook.trace.events import IterationTrace, KernelEvent, KernelKind, OpEvent, Trace
from ets_hook.trace.names import COLLECTIVE_PREFIXES, is_collective

MS = 1_000_000  # ns
T0 = 1_700_000_000 * 10**9  # a Unix-epoch-like clock, as captured traces have


def op(name: str, start_ms: float, dur_ms: float, **kw: int) -> OpEvent:
    return OpEvent(name, T0 + int(start_ms * MS), int(dur_ms * MS), **kw)


def kernel(start_ms: float, dur_ms: float, *, comm: bool = False, **kw: object) -> KernelEvent:
    name = "ncclDevKernel_AllReduce" if comm else "sgemm"
    return KernelEvent(name, T0 + int(start_ms * MS), int(dur_ms * MS), communication=comm, **kw)  # type: ignore[arg-type]


def step(
    ops: list[OpEvent], wall_ms: float, kernels: list[KernelEvent] | None = None, n: int = 0
) -> IterationTrace:
    return IterationTrace(n, T0, T0 + int(wall_ms * MS), ops=ops, kernels=kernels or [])


def assert_consistent(b: object) -> None:
    """Parts are >= 0 and compute + data wait + other cover the wall time."""
    for name in ("compute_s", "data_wait_s", "collective_s", "other_s"):
        assert getattr(b, name) >= 0.0, name
    assert b.compute_s + b.data_wait_s + b.other_s == pytest.approx(b.wall_s, abs=1e-12)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# names.is_collective


@pytest.mark.parametrize(
    "name",
    [
        "c10d::allreduce_",
        "c10d:broadcast",
        "gloo:all_reduce",
        "nccl:all_reduce",
        "record_param_comms",
        "mpi:barrier",
        "ucc:allgather",
    ],
)
def test_collective_names(name: str) -> None:
    assert is_collective(name)
    assert name.startswith(COLLECTIVE_PREFIXES)


@pytest.mark.parametrize(
    "name", ["aten::mm", "aten::c10d_allreduce", "Optimizer.step#SGD.step", "", "ncc", "nccl"]
)
def test_other_names_are_not_collectives(name: str) -> None:
    assert not is_collective(name)


# --------------------------------------------------------------------------------------------
# breakdown_iteration: CPU (ops only)


def test_data_wait_is_the_gap_from_step_start_to_the_first_op() -> None:
    b = breakdown_iteration(
        step([op("aten::mm", 30, 40), op("aten::add", 75, 5)], wall_ms=100, n=7)
    )
    assert b.step == 7
    assert b.wall_s == pytest.approx(0.100)
    assert b.data_wait_s == pytest.approx(0.030)
    assert b.compute_s == pytest.approx(0.045)
    assert b.collective_s == 0.0
    assert b.other_s == pytest.approx(0.100 - 0.030 - 0.045)
    assert_consistent(b)


def test_the_first_op_decides_data_wait_even_when_listed_later() -> None:
    # ``ops`` is in start order by contract, but the earliest start is what counts.
    b = breakdown_iteration(step([op("aten::mm", 50, 10), op("aten::add", 20, 10)], wall_ms=100))
    assert b.data_wait_s == pytest.approx(0.020)


def test_an_op_before_the_step_start_means_no_data_wait() -> None:
    b = breakdown_iteration(step([op("aten::mm", -5, 20)], wall_ms=50))
    assert b.data_wait_s == 0.0
    assert_consistent(b)


def test_overlapping_top_level_ops_are_counted_once() -> None:
    ops = [
        op("aten::mm", 10, 40, thread=1),  # [10, 50]
        op("aten::conv2d", 30, 40, thread=2),  # [30, 70]
        op("aten::add", 80, 10, thread=1),  # [80, 90]
    ]
    b = breakdown_iteration(step(ops, wall_ms=100))
    assert b.compute_s == pytest.approx((70 - 10 + 10) / 1e3)
    assert_consistent(b)


def test_nested_ops_are_inside_their_parent() -> None:
    ops = [
        op("aten::linear", 10, 40),
        op("aten::addmm", 12, 30, depth=1, parent=0),
        op("aten::t", 43, 5, depth=1, parent=0),
    ]
    b = breakdown_iteration(step(ops, wall_ms=100))
    assert b.compute_s == pytest.approx(0.040)


def test_a_top_level_collective_is_subtracted_from_compute() -> None:
    ops = [op("aten::mm", 0, 40), op("c10d::allreduce_", 40, 30), op("aten::add_", 70, 10)]
    b = breakdown_iteration(step(ops, wall_ms=100))
    assert b.collective_s == pytest.approx(0.030)
    assert b.compute_s == pytest.approx(0.050)
    assert b.other_s == pytest.approx(0.050)
    assert_consistent(b)


def test_a_nested_collective_is_subtracted_from_its_parent() -> None:
    ops = [
        op("autograd::engine::evaluate_function: AddmmBackward0", 0, 60),
        op("aten::mm", 5, 10, depth=1, parent=0),
        op("c10d::allreduce_", 20, 25, depth=1, parent=0),
    ]
    b = breakdown_iteration(step(ops, wall_ms=80))
    assert b.collective_s == pytest.approx(0.025)
    assert b.compute_s == pytest.approx(0.060 - 0.025)
    assert_consistent(b)


def test_a_collective_inside_a_collective_is_counted_once() -> None:
    ops = [
        op("c10d::allreduce_", 0, 30),
        op("record_param_comms", 2, 20, depth=1, parent=0),
        op("gloo:all_reduce", 3, 15, depth=2, parent=1),
        op("aten::mm", 30, 20),
    ]
    b = breakdown_iteration(step(ops, wall_ms=50))
    assert b.collective_s == pytest.approx(0.030)
    assert b.compute_s == pytest.approx(0.020)


def test_collectives_overlapping_on_two_threads_are_counted_once() -> None:
    ops = [
        op("aten::mm", 0, 50, thread=1),
        op("c10d::allreduce_", 50, 50, thread=2),
        op("c10d::broadcast_", 50, 50, thread=3),
    ]
    b = breakdown_iteration(step(ops, wall_ms=100))
    assert b.collective_s == pytest.approx(0.050)
    assert b.compute_s == pytest.approx(0.050)


def test_a_collective_two_levels_inside_a_collective_is_counted_once() -> None:
    ops = [
        op("c10d::allreduce_", 0, 50),
        op("aten::div_", 10, 20, depth=1, parent=0),
        op("record_param_comms", 12, 10, depth=2, parent=1),
        op("aten::mm", 50, 50),
    ]
    b = breakdown_iteration(step(ops, wall_ms=100))
    assert b.collective_s == pytest.approx(0.050)
    assert b.compute_s == pytest.approx(0.050)


def test_an_empty_step_is_all_data_wait() -> None:
    b = breakdown_iteration(step([], wall_ms=25, n=3))
    assert (b.step, b.wall_s, b.data_wait_s) == (3, pytest.approx(0.025), pytest.approx(0.025))
    assert b.compute_s == b.collective_s == b.other_s == 0.0
    reversed_step = IterationTrace(0, T0 + 10, T0)  # end before start: no negative time
    b = breakdown_iteration(reversed_step)
    assert b.wall_s == b.data_wait_s == 0.0


def test_compute_never_exceeds_the_step_after_its_data_wait() -> None:
    # An op running past the step's end (clock skew, a step boundary mid-op).
    b = breakdown_iteration(step([op("aten::mm", 20, 200)], wall_ms=100))
    assert b.data_wait_s == pytest.approx(0.020)
    assert b.compute_s == pytest.approx(0.080)
    assert b.other_s == pytest.approx(0.0, abs=1e-12)
    assert_consistent(b)


# --------------------------------------------------------------------------------------------
# breakdown_iteration: GPU (kernels captured)


def test_kernels_give_compute_as_a_union_without_communication_kernels() -> None:
    ops = [op("aten::mm", 10, 5), op("c10d::allreduce_", 20, 2)]
    kernels = [
        kernel(12, 10),  # [12, 22]
        kernel(18, 10, stream=2),  # [18, 28]: overlaps the first
        kernel(30, 4, kind=KernelKind.MEMCPY),  # copies are device work too
        kernel(28, 30, comm=True),  # [28, 58]: excluded from compute
        kernel(40, 10, comm=True, stream=3),  # [40, 50]: inside the first comm kernel
        kernel(60, 0),  # zero length: nothing
    ]
    b = breakdown_iteration(step(ops, wall_ms=100, kernels=kernels))
    assert b.data_wait_s == pytest.approx(0.010)
    assert b.compute_s == pytest.approx((28 - 12 + 4) / 1e3)
    assert b.collective_s == pytest.approx(0.030)
    assert_consistent(b)


def test_only_communication_kernels_fall_back_to_the_ops() -> None:
    ops = [op("aten::mm", 0, 40), op("c10d::allreduce_", 40, 20)]
    b = breakdown_iteration(step(ops, wall_ms=100, kernels=[kernel(45, 10, comm=True)]))
    assert b.compute_s == pytest.approx(0.040)
    assert b.collective_s == pytest.approx(0.020)


# --------------------------------------------------------------------------------------------
# rank_breakdown


def simple_step(n: int, wait_ms: float, compute_ms: float, wall_ms: float) -> IterationTrace:
    return step([op("aten::mm", wait_ms, compute_ms)], wall_ms=wall_ms, n=n)


def test_rank_breakdown_is_the_median_of_each_part_and_busy_the_median_of_sums() -> None:
    # (data wait, compute, wall) in ms: sums 2, 12, 12 -> busy 12 ms, while the medians of
    # the parts (2 and 2) would add up to 4 ms.
    parts = [(1, 1, 10), (10, 2, 20), (2, 10, 15)]
    trace = Trace(iterations=[simple_step(i, *p) for i, p in enumerate(parts)], rank=3)
    r = rank_breakdown(trace)
    assert r is not None
    steps = [breakdown_iteration(it) for it in trace.iterations]
    assert (r.rank, r.steps) == (3, 3)
    for name in ("wall_s", "compute_s", "data_wait_s", "collective_s", "other_s"):
        assert getattr(r, name) == pytest.approx(statistics.median(getattr(s, name) for s in steps))
    assert r.busy_s == pytest.approx(statistics.median(s.compute_s + s.data_wait_s for s in steps))
    assert r.busy_s == pytest.approx(0.012)
    assert r.busy_s > r.compute_s + r.data_wait_s


def test_rank_breakdown_of_an_empty_trace_is_none() -> None:
    assert rank_breakdown(Trace()) is None


def test_busy_standard_error_is_the_scaled_mad_over_root_n() -> None:
    parts = [(1, 1, 10), (10, 2, 20), (2, 10, 15), (0, 4, 8), (3, 3, 9)]
    trace = Trace(iterations=[simple_step(i, *p) for i, p in enumerate(parts)])
    r = rank_breakdown(trace)
    assert r is not None
    busy = [s.compute_s + s.data_wait_s for s in map(breakdown_iteration, trace.iterations)]
    mad = statistics.median(abs(b - statistics.median(busy)) for b in busy)
    assert mad > 0
    assert r.busy_se_s == pytest.approx(1.4826 * mad / len(busy) ** 0.5)
    steady = Trace(iterations=[simple_step(i, 2, 5, 10) for i in range(4)])
    assert rank_breakdown(steady).busy_se_s == pytest.approx(0.0, abs=1e-12)  # type: ignore[union-attr]
    one = Trace(iterations=[simple_step(0, 2, 5, 10)])
    assert rank_breakdown(one).busy_se_s is None  # type: ignore[union-attr]  # unknown


# --------------------------------------------------------------------------------------------
# find_straggler


def test_straggler_threshold_is_inclusive_at_exactly_the_excess() -> None:
    base = 1.0
    at = base * (1.0 + STRAGGLER_EXCESS)
    assert find_straggler({0: base, 1: at}) == (1, pytest.approx(at / base))
    assert find_straggler({0: base, 1: at * (1 - 1e-9)}) is None
    assert find_straggler({0: 0.5, 1: 0.625}, excess=0.25) == (1, 1.25)
    assert find_straggler({0: 0.5, 1: 0.624}, excess=0.25) is None


def test_the_slowest_rank_is_named_with_its_ratio_to_the_fastest() -> None:
    busy = {0: 0.20, 1: 0.21, 2: 0.30, 3: 0.25}
    rank, ratio = find_straggler(busy)  # type: ignore[misc]
    assert rank == max(busy, key=busy.__getitem__)
    assert ratio == pytest.approx(busy[rank] / min(busy.values()))


def test_straggler_ties_go_to_the_lowest_rank() -> None:
    assert find_straggler({5: 0.1, 3: 0.3, 1: 0.3, 4: 0.3})[0] == 1  # type: ignore[index]


@pytest.mark.parametrize(
    "busy",
    [{}, {0: 0.5}, {0: 0.0, 1: 0.5}, {0: 0.1, 1: 0.105}, {0: float("nan"), 1: 0.3}],
    ids=["none", "one-rank", "fastest-zero", "within-margin", "nan-leaves-one"],
)
def test_no_straggler(busy: dict[int, float]) -> None:
    assert find_straggler(busy) is None


def test_noisy_ranks_need_a_gap_of_z_standard_errors() -> None:
    # Binary-exact values: standard errors 3/32 and 4/32 give a difference's error of 5/32.
    se_fast, se_slow = 3 / 32, 4 / 32
    gap = STRAGGLER_Z * 5 / 32
    busy = {0: 1.0, 1: 1.0 + gap}
    assert busy[1] - busy[0] == gap
    # The gap is exactly z standard errors of the difference: still a straggler.
    exact = {0: se_fast, 1: se_slow}
    assert find_straggler(busy, busy_se_s_by_rank=exact) == (1, pytest.approx(busy[1]))
    noisier = {0: se_fast * 1.01, 1: se_slow * 1.01}
    assert find_straggler(busy, busy_se_s_by_rank=noisier) is None
    # Only the slowest and the fastest rank's errors count; missing ranks count as 0.
    quiet = {0: 0.0, 1: 0.0, 2: 10.0}
    assert find_straggler({**busy, 2: 1.2}, busy_se_s_by_rank=quiet) == (1, busy[1])
    assert find_straggler(busy, busy_se_s_by_rank={}) == (1, busy[1])
    assert find_straggler(busy, busy_se_s_by_rank={1: gap / STRAGGLER_Z * 1.01}) is None
    # A custom z: with z=0 any ratio above the excess counts.
    assert find_straggler(busy, busy_se_s_by_rank={0: 1.0, 1: 1.0}, z=0.0) is not None


def test_unusable_values_are_ignored() -> None:
    assert find_straggler({0: float("nan"), 1: -1.0, 2: 0.1, 3: 0.2}) == (3, pytest.approx(2.0))


# --------------------------------------------------------------------------------------------
# format_rank_table


def rb(rank: int, busy_s: float, steps: int = 4) -> RankBreakdown:
    return RankBreakdown(
        rank, steps, 0.5, busy_s * 0.75, busy_s * 0.25, 0.1, 0.5 - busy_s, busy_s, busy_se_s=0.0
    )


def test_rank_table_rows_are_sorted_by_rank_and_name_the_straggler() -> None:
    breakdowns = [rb(2, 0.30), rb(0, 0.20), rb(1, 0.21)]
    text = format_rank_table(breakdowns, hosts=["node-c", "node-a", "node-b"])
    lines = text.splitlines()
    assert len(lines) == 1 + 3 + 1
    assert "rank" in lines[0] and "host" in lines[0]
    rows = [line.split() for line in lines[1:4]]
    assert [row[0] for row in rows] == ["0", "1", "2"]
    assert [row[1] for row in rows] == ["node-a", "node-b", "node-c"]  # hosts follow their rank
    assert rows[0][-1] == "+0.0%"
    assert rows[2][-1] == f"{(0.30 / 0.20 - 1) * 100:+.1f}%"
    assert lines[-1].startswith("straggler: rank 2 ")
    assert f"{0.30 / 0.20:.2f}x" in lines[-1]
    assert not text.endswith("\n")


def test_rank_table_without_a_straggler_or_hosts() -> None:
    text = format_rank_table([rb(1, 0.200), rb(0, 0.205)])
    lines = text.splitlines()
    assert len(lines) == 3
    assert "straggler" not in text
    assert [line.split()[0] for line in lines[1:]] == ["0", "1"]


def test_rank_table_names_no_straggler_within_the_noise() -> None:
    noisy = [dataclasses.replace(rb(0, 0.20), busy_se_s=0.05), rb(1, 0.30)]
    text = format_rank_table(noisy)
    assert "straggler" not in text
    assert "straggler: rank 1 " in format_rank_table([rb(0, 0.20), rb(1, 0.30)])


def test_rank_table_with_a_zero_fastest_rank_shows_no_ratio() -> None:
    lines = format_rank_table([rb(0, 0.0), rb(1, 0.2)]).splitlines()
    assert [line.split()[-1] for line in lines[1:]] == ["-", "-"]
    assert len(lines) == 3


def test_rank_table_of_no_ranks_is_the_header() -> None:
    assert len(format_rank_table([]).splitlines()) == 1


def test_input_ops_in_this_process_are_data_wait_not_compute() -> None:
    from ets_hook.trace.events import Phase

    b = breakdown_iteration(
        step(
            [
                op("aten::stack", 5, 20, phase=Phase.INPUT),  # collate_fn, num_workers=0
                op("aten::mm", 30, 40),
                op("aten::add", 75, 5),
            ],
            wall_ms=100,
        )
    )
    assert b.data_wait_s == pytest.approx(0.030)
    assert b.compute_s == pytest.approx(0.045)
    assert_consistent(b)
    only_input = breakdown_iteration(step([op("aten::stack", 5, 20, phase=Phase.INPUT)], 50))
    assert only_input.data_wait_s == pytest.approx(0.050) and only_input.compute_s == 0.0


def test_ranks_summarised_from_one_step_name_no_straggler() -> None:
    """A short job's window captures one step: its noise is unknown, and rank 0's own
    reporting alone moved it 2x in a 2-rank trial of identical ranks (flagged in 4 of 4 runs)."""
    one_step = [
        dataclasses.replace(rb(0, 0.20, steps=1), busy_se_s=None),
        dataclasses.replace(rb(1, 0.40, steps=1), busy_se_s=None),
    ]
    assert find_straggler({0: 0.20, 1: 0.40}, busy_se_s_by_rank={0: None, 1: None}) is None
    assert find_straggler({0: 0.20, 1: 0.40}, busy_se_s_by_rank={0: 0.0, 1: None}) is None
    assert find_straggler({0: 0.20, 1: 0.40}, busy_se_s_by_rank={0: 0.0, 1: 0.0}) == (1, 2.0)
    assert "straggler" not in format_rank_table(one_step)
