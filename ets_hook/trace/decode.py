"""Decode raw capture into iterations: nesting, phases, shapes, kernel ↔ op links, ETS targets.

Pure functions over plain data (``RawOp`` rows, ``KernelEvent``s, a launch table, step bounds);
they run off the training thread and are tested on synthetic inputs.

Rules (documented in the README's trace-format section):
- An annotation (``record_function`` scope, ``Optimizer.step#...``) is not an op; an op inside an
  ``Optimizer.*`` annotation is ``optimizer``.
- An autograd node (``autograd::engine::evaluate_function: ...``) and everything inside it is
  ``backward``; ops on the training thread before the iteration's last backward node are
  ``forward``; the rest (gradient clipping, logging, ...) is ``other``.
- An op belongs to the iteration whose [start, end) holds the start of its outermost enclosing
  event on its thread (an annotation counts); ops outside every step are dropped.
- A kernel belongs to the innermost op, on the launching thread, whose interval holds its runtime
  launch call (joined by CUPTI correlation id); host thread ids are matched to profiler thread ids
  by which assignment contains the most launches.
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .events import IterationTrace, KernelEvent, OpEvent, Phase
from .names import (
    INPUT_ANNOTATION_PREFIX,
    OPTIMIZER_ANNOTATION_PREFIX,
    is_annotation,
    is_autograd_node,
)


@dataclass(slots=True)
class StepBounds:
    """A timed training step on the trace clock.

    Attributes:
        step: the step's number.
        start_ns: step start, ns.
        end_ns: step end, ns (exclusive).
        own_ns: ets-hook's own work on the training thread inside the step (reads of
            ``hook.prediction`` between boundaries), ns: most often before the step's first
            op, so the iteration starts that much later, at most at its first op (not step
            time, as in the hook's step times).
    """

    step: int
    start_ns: int
    end_ns: int
    own_ns: int = 0


@dataclass(slots=True)
class RawOp:
    """One operator event as the op capture reads it back, before any interpretation.

    Attributes:
        name: the event's name as recorded.
        start_ns: start on the trace clock, int ns.
        duration_ns: duration, ns.
        thread: the recording thread (the native observer: its OS thread id; the profiler:
            its own thread id).
        sequence_nr: autograd sequence number; -1: none.
        scope: the ``RecordScope`` value (``trace.names``).
        input_shapes: one shape per positional argument; empty when not recorded.
        input_dtypes: the arguments' dtype strings; empty when not recorded.
        handle: the op's unique id, pushed as CUPTI external correlation id by the native
            observer (ties kernels to it); 0 when unknown.
    """

    name: str
    start_ns: int
    duration_ns: int
    thread: int
    sequence_nr: int
    scope: int
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    handle: int = 0


def _classify(
    raws: Sequence[RawOp],
) -> tuple[list[bool], list[bool], list[bool], list[bool]]:
    """Per event: annotation, autograd node, optimizer annotation, DataLoader annotation
    (decided once per name)."""
    kinds: dict[tuple[str, int], tuple[bool, bool, bool, bool]] = {}
    annotation: list[bool] = []
    autograd: list[bool] = []
    optimizer: list[bool] = []
    loader: list[bool] = []
    for raw in raws:
        key = (raw.name, raw.scope)
        kind = kinds.get(key)
        if kind is None:
            is_ann = is_annotation(raw.name, raw.scope)
            kind = kinds[key] = (
                is_ann,
                is_autograd_node(raw.name, raw.scope),
                is_ann and raw.name.startswith(OPTIMIZER_ANNOTATION_PREFIX),
                raw.name.startswith(INPUT_ANNOTATION_PREFIX),
            )
        annotation.append(kind[0])
        autograd.append(kind[1])
        optimizer.append(kind[2])
        loader.append(kind[3])
    return annotation, autograd, optimizer, loader


def _nest(
    starts: Sequence[int], ends: Sequence[int], threads: Sequence[int], order: Sequence[int]
) -> list[int]:
    """Parent index of each event on its own thread, -1 for outermost.

    ``order`` lists every event by (start, longest first); an event's parent is the latest
    event of its thread before it in that order that has not ended when it starts.
    """
    parents = [-1] * len(starts)
    stacks: dict[int, list[int]] = defaultdict(list)
    for index in order:
        stack = stacks[threads[index]]
        start = starts[index]
        while stack and ends[stack[-1]] <= start:
            stack.pop()
        if stack:
            parents[index] = stack[-1]
        stack.append(index)
    return parents


def _training_thread(
    threads: Sequence[int], parents: list[int], annotation: list[bool], autograd: list[bool]
) -> int:
    """The thread that runs the forward: most outermost non-autograd, non-annotation events."""
    counts: Counter[int] = Counter(
        thread
        for thread, parent, is_ann, is_node in zip(threads, parents, annotation, autograd)
        if parent == -1 and not is_node and not is_ann
    )
    if not counts:
        counts = Counter(threads)
    return counts.most_common(1)[0][0] if counts else 0


def _fill_shapes(target: list[OpEvent], source: list[OpEvent]) -> None:
    """Copy shapes/dtypes onto ``target`` ops from the aligned ops of ``source`` (same names)."""
    target_names = [op.name for op in target]
    source_names = [op.name for op in source]
    if target_names == source_names:  # the usual case: same ops, same order
        blocks = [difflib.Match(0, 0, len(target))]
    else:
        matcher = difflib.SequenceMatcher(None, source_names, target_names, autojunk=False)
        blocks = matcher.get_matching_blocks()
    for block in blocks:
        for offset in range(block.size):
            src, dst = source[block.a + offset], target[block.b + offset]
            if not dst.input_shapes and src.input_shapes:
                dst.input_shapes = src.input_shapes
                dst.input_dtypes = src.input_dtypes


def build_iterations(
    raws: Sequence[RawOp],
    bounds: Sequence[StepBounds],
    *,
    shapes_source_step: int | None = None,
    positions: dict[int, tuple[int, int]] | None = None,
) -> list[IterationTrace]:
    """Split raw profiler events into iterations of ``OpEvent``s with phase, depth and parent.

    Args:
        raws: the raw events of every thread, in any order.
        bounds: the timed steps, in any order.
        shapes_source_step: the step whose ops carry recorded shapes; the ops of the other
            iterations that lack shapes get them copied by op-name alignment
            (``record_shapes="first"``). None (or a step not in ``bounds``): no copying.
        positions: when given, filled with ``raw index -> (iteration index, op index)`` for
            every raw event that became an op of the returned iterations.

    Returns:
        One ``IterationTrace`` per bound, sorted by start, without kernels: its ops in start
        order (annotations and events outside every step dropped) with host gaps filled
        (``fill_host_gaps``).
    """
    starts_ns = [raw.start_ns for raw in raws]
    durations_ns = [raw.duration_ns for raw in raws]
    ends_ns = [start + duration for start, duration in zip(starts_ns, durations_ns)]
    threads = [raw.thread for raw in raws]
    order = sorted(range(len(raws)), key=lambda i: (starts_ns[i], -durations_ns[i]))
    parents = _nest(starts_ns, ends_ns, threads, order)
    annotation, autograd, optimizer_annotation, loader_annotation = _classify(raws)
    training_thread = _training_thread(threads, parents, annotation, autograd)
    ordered_bounds = sorted(bounds, key=lambda b: b.start_ns)
    starts = [b.start_ns for b in ordered_bounds]

    # Resolve, per event in start order (a parent always comes before its children): its root
    # (outermost ancestor), annotation facts and autograd ancestry.
    roots = list(range(len(raws)))
    in_optimizer = optimizer_annotation[:]
    in_backward = autograd[:]
    in_input = loader_annotation[:]
    op_parent = [-1] * len(raws)  # nearest non-annotation ancestor
    depth = [0] * len(raws)
    for index in order:
        parent = parents[index]
        if parent >= 0:
            roots[index] = roots[parent]
            if in_optimizer[parent]:
                in_optimizer[index] = True
            if in_backward[parent]:
                in_backward[index] = True
            if in_input[parent]:
                in_input[index] = True
            if annotation[parent]:
                op_parent[index] = op_parent[parent]
                depth[index] = depth[parent]
            else:
                op_parent[index] = parent
                depth[index] = depth[parent] + 1

    members: list[list[int]] = [[] for _ in ordered_bounds]
    for index in order:
        if annotation[index]:
            continue
        root_start = starts_ns[roots[index]]
        slot = bisect.bisect_right(starts, root_start) - 1
        if slot < 0 or root_start >= ordered_bounds[slot].end_ns:
            continue  # outside every timed step (before the window, in a marked phase gap)
        members[slot].append(index)

    iterations: list[IterationTrace] = []
    for slot, (bound, indices) in enumerate(zip(ordered_bounds, members)):
        last_backward_start = max((starts_ns[i] for i in indices if in_backward[i]), default=None)
        # A closure: the step's forward and backward run inside ``optimizer.step(closure)``
        # (Lightning's automatic optimization, LBFGS). Only what follows its last backward is
        # the optimizer's; before, the usual rules apply.
        closure_until = (
            last_backward_start
            if any(in_backward[i] and in_optimizer[i] for i in indices)
            else None
        )
        local = {raw_index: k for k, raw_index in enumerate(indices)}
        ops: list[OpEvent] = []
        append = ops.append
        for k, raw_index in enumerate(indices):
            raw = raws[raw_index]
            if in_backward[raw_index]:
                phase = Phase.BACKWARD
            elif in_optimizer[raw_index] and (
                closure_until is None or raw.start_ns > closure_until
            ):
                phase = Phase.OPTIMIZER
            elif in_input[raw_index]:
                phase = Phase.INPUT
            elif raw.thread == training_thread and (
                last_backward_start is None or raw.start_ns < last_backward_start
            ):
                phase = Phase.FORWARD
            else:
                phase = Phase.OTHER
            # Positional: OpEvent(name, start_ns, duration_ns, thread, phase, depth, parent,
            # sequence_nr, input_shapes, input_dtypes); keywords cost a third more per op.
            append(
                OpEvent(
                    raw.name,
                    raw.start_ns,
                    raw.duration_ns,
                    raw.thread,
                    phase,
                    depth[raw_index],
                    local.get(op_parent[raw_index], -1),
                    raw.sequence_nr,
                    raw.input_shapes,
                    raw.input_dtypes,
                )
            )
            if positions is not None:
                positions[raw_index] = (slot, k)
        start_ns = bound.start_ns
        if bound.own_ns > 0:  # the hook's own reads: out of the lead-in, never past an op
            first_op_ns = starts_ns[indices[0]] if indices else bound.end_ns  # start order
            start_ns = max(start_ns, min(start_ns + bound.own_ns, first_op_ns, bound.end_ns))
        iterations.append(
            IterationTrace(step=bound.step, start_ns=start_ns, end_ns=bound.end_ns, ops=ops)
        )

    if shapes_source_step is not None:
        source = next((it for it in iterations if it.step == shapes_source_step), None)
        if source is not None:
            for iteration in iterations:
                if iteration is not source:
                    _fill_shapes(iteration.ops, source.ops)
    for iteration in iterations:
        fill_host_gaps(iteration)
    return iterations


def fill_host_gaps(iteration: IterationTrace) -> None:
    """Set the CPU ETS gap of each outermost op: ns to the next outermost op of its thread.

    The last op of a thread gets the time to the iteration's end. Negative gaps clip to 0.

    Args:
        iteration: modified in place: ``gap_ns`` of every ``depth == 0`` op is overwritten.
    """
    by_thread: dict[int, list[OpEvent]] = defaultdict(list)
    for op in iteration.top_level_ops():
        by_thread[op.thread].append(op)
    for ops in by_thread.values():
        for op, following in zip(ops, [*ops[1:], None]):
            next_start = following.start_ns if following is not None else iteration.end_ns
            op.gap_ns = max(0, next_start - op.end_ns)


# ---------------------------------------------------------------------------------------------
# Kernels


def _innermost_op(starts: list[int], ops: list[OpEvent], indices: list[int], time_ns: int) -> int:
    """Index (into the iteration's ops) of the innermost op of one thread containing time_ns."""
    position = bisect.bisect_right(starts, time_ns) - 1
    if position < 0:
        return -1
    candidate = indices[position]
    while candidate >= 0:
        op = ops[candidate]
        if op.start_ns <= time_ns <= op.end_ns:
            return candidate
        candidate = op.parent
    return -1


@dataclass(slots=True)
class KernelLinkCounts:
    """How ``attach_kernels`` linked the kernels it filed under an iteration (dropped ones,
    outside every iteration, are not counted).

    Attributes:
        by_external_id: linked to the op whose handle their launch carried as CUPTI external
            correlation id (the native observer's path: exact).
        by_launch_time: linked to the innermost op holding their launch call on the launching
            thread (the fallback: the profiler path, or a launch without an external id).
        unlinked: filed under an iteration with no op (``op_index = -1``).
    """

    by_external_id: int = 0
    by_launch_time: int = 0
    unlinked: int = 0

    @property
    def filed(self) -> int:
        """Kernels filed under an iteration, linked or not."""
        return self.by_external_id + self.by_launch_time + self.unlinked

    def describe(self) -> str:
        """One phrase for a status line: ``N by external correlation id, M by launch time, K
        unlinked``."""
        return (
            f"{self.by_external_id} by external correlation id, "
            f"{self.by_launch_time} by launch time, {self.unlinked} unlinked"
        )


def attach_kernels(
    iterations: list[IterationTrace],
    kernels: Sequence[KernelEvent],
    launches: np.ndarray,
    op_by_correlation: Mapping[int, tuple[int, int]] | None = None,
    link_counts: KernelLinkCounts | None = None,
) -> float:
    """Link kernels to ops, file them under iterations and fill the GPU ETS targets.

    A kernel whose CUPTI correlation id is in ``op_by_correlation`` (the op that pushed the
    external correlation id its launch carried) is filed under that op. Any other kernel is
    filed under the iteration holding its launch call, linked to the innermost op holding the
    launch on the launching thread, or, when its launch cannot be found (or lies outside every
    step), under the iteration holding its own start, with ``op_index = -1``. Kernels in no
    iteration are dropped. Each iteration's kernels end up sorted by start and
    ``fill_device_targets`` runs on every iteration.

    Args:
        iterations: from ``build_iterations`` (sorted by start); modified in place.
        kernels: the GPU records; the filed ones get their ``op_index`` set.
        launches: structured array with ``correlation_id``, ``thread_id`` (host OS thread) and
            ``start_ns`` (already on the trace clock) of the runtime launch calls.
        op_by_correlation: CUPTI correlation id -> (index into ``iterations``, op index), from
            the external correlation records; None: link by launch time only.
        link_counts: when given, the counts of this call's filed kernels by how they were
            linked are added to it.

    Returns:
        The fraction of the filed kernels linked to an op; 1.0 when none was filed.

    Raises:
        ValueError: ``launches`` lacks one of the three fields.
    """
    launch_by_corr: dict[int, tuple[int, int]] = {
        int(c): (int(t), int(s))
        for c, t, s in zip(launches["correlation_id"], launches["thread_id"], launches["start_ns"])
    }
    # Per iteration and profiler thread: ops sorted by start, for containment queries.
    thread_tables: list[dict[int, tuple[list[int], list[int]]]] = []
    for iteration in iterations:
        table: dict[int, tuple[list[int], list[int]]] = {}
        for index, op in enumerate(iteration.ops):  # ops are in start order
            starts, indices = table.setdefault(op.thread, ([], []))
            starts.append(op.start_ns)
            indices.append(index)
        thread_tables.append(table)
    iteration_starts = [it.start_ns for it in iterations]

    def locate(time_ns: int) -> int:
        slot = bisect.bisect_right(iteration_starts, time_ns) - 1
        if slot < 0 or time_ns >= iterations[slot].end_ns:
            return -1
        return slot

    # Vote: which profiler thread contains the launches of each host OS thread.
    votes: Counter[tuple[int, int]] = Counter()
    for os_thread, start_ns in launch_by_corr.values():
        slot = locate(start_ns)
        if slot < 0:
            continue
        for profiler_thread, (starts, indices) in thread_tables[slot].items():
            if _innermost_op(starts, iterations[slot].ops, indices, start_ns) >= 0:
                votes[(os_thread, profiler_thread)] += 1
    thread_map: dict[int, int] = {}
    for (os_thread, profiler_thread), _count in votes.most_common():
        thread_map.setdefault(os_thread, profiler_thread)

    counts = KernelLinkCounts()
    exact = op_by_correlation or {}
    for kernel in kernels:
        launch = launch_by_corr.get(kernel.correlation_id)
        slot, op_index = exact.get(kernel.correlation_id, (-1, -1))
        by_external_id = slot >= 0
        if not by_external_id and launch is not None:
            os_thread, start_ns = launch
            slot = locate(start_ns)
            profiler_thread = thread_map.get(os_thread)
            if slot >= 0 and profiler_thread in thread_tables[slot]:
                starts, indices = thread_tables[slot][profiler_thread]
                op_index = _innermost_op(starts, iterations[slot].ops, indices, start_ns)
        if slot < 0:
            slot = locate(kernel.start_ns)
        if slot < 0:
            continue
        kernel.op_index = op_index
        if op_index < 0:
            counts.unlinked += 1
        elif by_external_id:
            counts.by_external_id += 1
        else:
            counts.by_launch_time += 1
        iterations[slot].kernels.append(kernel)
    for iteration in iterations:
        iteration.kernels.sort(key=lambda k: k.start_ns)
        fill_device_targets(iteration)
    if link_counts is not None:
        link_counts.by_external_id += counts.by_external_id
        link_counts.by_launch_time += counts.by_launch_time
        link_counts.unlinked += counts.unlinked
    total = sum(len(it.kernels) for it in iterations)
    linked = counts.by_external_id + counts.by_launch_time
    return linked / total if total else 1.0


def fill_device_targets(iteration: IterationTrace) -> None:
    """Set the GPU ETS targets of outermost ops: summed kernel time and device gap.

    ``kernel_duration_ns``/``kernel_count`` cover the op's whole subtree (0 when it launched
    nothing). ``gap_ns`` is the time from the op's last kernel end to the first kernel start of
    the next kernel-launching outermost op (by first kernel start; the last one: to the
    iteration's end), clipped at 0; outermost ops without kernels get ``gap_ns = -1``.

    Args:
        iteration: modified in place. Nothing changes when it has no kernels: its ops keep
            their host gaps and unknown (-1) kernel times.
    """
    if not iteration.kernels:
        return
    ops = iteration.ops
    root = list(range(len(ops)))
    for index, op in enumerate(ops):
        if op.parent >= 0:
            root[index] = root[op.parent]
    first_start: dict[int, int] = {}
    last_end: dict[int, int] = {}
    for op in ops:
        if op.depth == 0:
            op.kernel_duration_ns, op.kernel_count, op.gap_ns = 0, 0, -1
    for kernel in iteration.kernels:
        if kernel.op_index < 0:
            continue
        top = root[kernel.op_index]
        op = ops[top]
        op.kernel_duration_ns += kernel.duration_ns
        op.kernel_count += 1
        first_start[top] = min(first_start.get(top, kernel.start_ns), kernel.start_ns)
        last_end[top] = max(last_end.get(top, kernel.end_ns), kernel.end_ns)
    launching = sorted(first_start, key=lambda i: first_start[i])
    for current, following in zip(launching, [*launching[1:], None]):
        if following is None:
            ops[current].gap_ns = max(0, iteration.end_ns - last_end[current])
        else:
            ops[current].gap_ns = max(0, first_start[following] - last_end[current])
