"""Step-row selection: which ops of an iteration form its ETS sequence, and their direction.

The ETS sequence (``ets_rows``) is an iteration's depth-0 ops in start order: forward ATen ops,
backward autograd nodes, optimizer ops, other work on the training threads; profiler annotations
(``trace.names``), the input pipeline's ops (``Phase.INPUT``) and phase-less ops of non-training
threads are excluded (``_RowFilter``).
"""

from __future__ import annotations

from ..trace.events import IterationTrace, OpEvent, Phase
from ..trace.names import NON_ROW_PREFIXES, is_backward_name


class _RowFilter:
    """Decides, op by op in start order, which ops are rows (local, so streaming can use it).

    A row is a depth-0 op that is not a profiler annotation and either carries a training phase
    (forward / backward / optimizer) or runs on a thread that has carried one earlier in the
    iteration (work such as gradient clipping after backward on the training thread). Phase-less
    ops on other threads (a pin-memory thread, a logger) are excluded, except before any phase
    op was seen (traces without phases keep all depth-0 ops).
    """

    def __init__(self) -> None:
        self.training_threads: set[int] = set()

    def __call__(self, op: OpEvent) -> bool:
        if op.depth != 0 or op.phase is Phase.INPUT or op.name.startswith(NON_ROW_PREFIXES):
            return False
        if op.phase is not Phase.OTHER or is_backward_name(op.name):
            self.training_threads.add(op.thread)
            return True
        return not self.training_threads or op.thread in self.training_threads


def ets_rows(iteration: IterationTrace) -> list[int]:
    """Indices (into ``iteration.ops``) of the ops forming the ETS sequence, in start order.

    Args:
        iteration: a decoded or imported iteration (ops in start order).

    Returns:
        The row indices; empty when no op qualifies.
    """
    is_row = _RowFilter()
    # Nested ops (most of them) are never rows: test depth here, not in a call per op.
    return [i for i, op in enumerate(iteration.ops) if op.depth == 0 and is_row(op)]


def op_direction(op: OpEvent) -> str | None:
    """The ETS direction of an op: its phase, or "backward" for a backward-named op.

    Args:
        op: any op.

    Returns:
        ``"forward"``, ``"backward"``, ``"optimizer"``, or None for an op outside the three
        phases. An autograd node name (``ets.flops.is_backward_name``) counts as backward
        unless the op's phase is forward.
    """
    if op.phase is Phase.FORWARD:
        return "forward"
    if op.phase is Phase.BACKWARD or is_backward_name(op.name):
        return "backward"
    if op.phase is Phase.OPTIMIZER:
        return "optimizer"
    return None
