"""Decoding raw profiler events into iterations: nesting, phases, shapes, kernels, targets."""

from __future__ import annotations

import itertools

import numpy as np

from ets_hook.trace.decode import RawOp, StepBounds, attach_kernels, build_iterations
from ets_hook.trace.events import KernelEvent, Phase

USER = 7


def raw(name, start, duration, thread=1, scope=0, shapes=(), dtypes=(), seq=-1):
    return RawOp(name, start, duration, thread, seq, scope, shapes, dtypes)


def one_step(base: int, thread_bwd: int = 1, shapes: bool = True):
    """One training step starting at `base`: forward, backward (maybe on another thread), SGD."""
    s = ((4, 8), (8, 8)) if shapes else ()
    d = ("float", "float") if shapes else ()
    return [
        raw("aten::linear", base + 10, 50, shapes=s, dtypes=d, seq=1),
        raw("aten::t", base + 12, 5, shapes=((8, 8),) if shapes else ()),
        raw("aten::addmm", base + 20, 30),
        raw("aten::relu", base + 70, 10),
        raw("aten::sum", base + 85, 5),
        raw("autograd::engine::evaluate_function: SumBackward0", base + 100, 20, thread_bwd),
        raw("SumBackward0", base + 102, 15, thread_bwd, scope=1),
        raw("aten::expand", base + 105, 5, thread_bwd),
        raw("autograd::engine::evaluate_function: AddmmBackward0", base + 130, 40, thread_bwd),
        raw("aten::mm", base + 135, 20, thread_bwd),
        raw("aten::norm", base + 180, 5),  # gradient clipping: between backward and optimizer
        raw("Optimizer.step#SGD.step", base + 190, 40, scope=USER),
        raw("aten::add_", base + 195, 10),
        raw("aten::add_", base + 210, 10),
    ]


def test_phases_depth_and_parents():
    (iteration,) = build_iterations(one_step(0), [StepBounds(3, 0, 250)])
    names = [(op.name, op.phase, op.depth) for op in iteration.ops]
    assert "Optimizer.step#SGD.step" not in [n for n, _, _ in names], "annotations are not ops"
    assert names[:5] == [
        ("aten::linear", Phase.FORWARD, 0),
        ("aten::t", Phase.FORWARD, 1),
        ("aten::addmm", Phase.FORWARD, 1),
        ("aten::relu", Phase.FORWARD, 0),
        ("aten::sum", Phase.FORWARD, 0),
    ]
    by_name = {op.name: op for op in iteration.ops}
    assert by_name["SumBackward0"].phase is Phase.BACKWARD
    assert by_name["aten::mm"].phase is Phase.BACKWARD
    assert by_name["aten::mm"].depth == 1
    assert iteration.ops[by_name["aten::mm"].parent].name.endswith("AddmmBackward0")
    assert by_name["aten::norm"].phase is Phase.OTHER
    adds = [op for op in iteration.ops if op.name == "aten::add_"]
    assert [op.phase for op in adds] == [Phase.OPTIMIZER] * 2
    assert [op.depth for op in adds] == [0, 0], "annotation parents do not add depth"
    for index, op in enumerate(iteration.ops):
        assert op.parent < index


def test_a_step_inside_an_optimizer_closure_keeps_its_forward_and_backward():
    # Lightning's automatic optimization (and LBFGS): optimizer.step(closure) runs the forward
    # and the backward inside the optimizer's annotation; only what follows is the optimizer's.
    step = one_step(0)
    closure = [raw("Optimizer.step#AdamW.step", 5, 240, scope=USER)]
    closure += [r for r in step if not r.name.startswith("Optimizer.step")]
    (iteration,) = build_iterations(closure, [StepBounds(0, 0, 250)])
    phases = [(op.name, op.phase) for op in iteration.ops if op.depth == 0]
    assert phases == [
        ("aten::linear", Phase.FORWARD),
        ("aten::relu", Phase.FORWARD),
        ("aten::sum", Phase.FORWARD),
        ("autograd::engine::evaluate_function: SumBackward0", Phase.BACKWARD),
        ("autograd::engine::evaluate_function: AddmmBackward0", Phase.BACKWARD),
        ("aten::norm", Phase.OPTIMIZER),  # after the backward, inside the annotation
        ("aten::add_", Phase.OPTIMIZER),
        ("aten::add_", Phase.OPTIMIZER),
    ]
    by_name = {op.name: op.phase for op in iteration.ops}
    assert by_name["aten::mm"] is Phase.BACKWARD and by_name["aten::t"] is Phase.FORWARD
    # The same step outside a closure: unchanged.
    (plain,) = build_iterations(step, [StepBounds(0, 0, 250)])
    assert [op.phase for op in plain.ops if op.name == "aten::add_"] == [Phase.OPTIMIZER] * 2


def test_backward_on_another_thread_is_backward_and_forward_thread_detected():
    (iteration,) = build_iterations(one_step(0, thread_bwd=5), [StepBounds(0, 0, 250)])
    backward = [op for op in iteration.ops if op.thread == 5]
    assert backward and all(op.phase is Phase.BACKWARD for op in backward)
    assert iteration.ops[0].phase is Phase.FORWARD


def test_ops_split_by_step_and_children_follow_their_root():
    raws = one_step(0) + one_step(300)
    # A child that starts after the boundary still belongs to its root's step.
    raws.append(raw("aten::straggler", 240, 5))
    raws[0] = raw("aten::linear", 10, 50)
    iterations = build_iterations(raws, [StepBounds(1, 0, 300), StepBounds(2, 300, 600)])
    assert [it.step for it in iterations] == [1, 2]
    assert len(iterations[0].ops) == len(iterations[1].ops) + 1
    assert all(300 <= op.start_ns < 600 for op in iterations[1].ops if op.depth == 0)


def test_events_outside_steps_are_dropped():
    iterations = build_iterations(one_step(1000), [StepBounds(0, 0, 500)])
    assert iterations[0].ops == []


def test_shapes_copied_from_the_shapes_step_by_alignment():
    raws = one_step(0, shapes=True) + one_step(300, shapes=False)
    iterations = build_iterations(
        raws, [StepBounds(1, 0, 300), StepBounds(2, 300, 600)], shapes_source_step=1
    )
    first, second = iterations
    assert second.ops[0].input_shapes == ((4, 8), (8, 8))
    assert second.ops[1].input_shapes == ((8, 8),)
    assert [op.input_shapes for op in first.ops] == [op.input_shapes for op in second.ops]


def test_host_gaps_chain_top_level_ops_and_end_at_step_end():
    (iteration,) = build_iterations(one_step(0), [StepBounds(0, 0, 250)])
    top = [op for op in iteration.ops if op.depth == 0 and op.thread == 1]
    for op, following in itertools.pairwise(top):
        assert op.gap_ns == max(0, following.start_ns - op.end_ns)
    assert top[-1].gap_ns == 250 - top[-1].end_ns
    assert all(op.gap_ns == -1 for op in iteration.ops if op.depth > 0)


def _launches(rows):
    dtype = [("correlation_id", "<u8"), ("thread_id", "<u8"), ("start_ns", "<i8")]
    return np.array(rows, dtype=dtype)


def test_kernels_join_innermost_op_through_launch_and_thread_vote():
    iterations = build_iterations(one_step(0, thread_bwd=5), [StepBounds(0, 0, 250)])
    # Host OS thread 9001 is the forward thread (profiler thread 1), 9002 the backward one (5).
    launches = _launches(
        [(1, 9001, 25), (2, 9001, 75), (3, 9002, 140), (4, 9001, 200), (5, 9002, 9999)]
    )
    kernels = [
        KernelEvent("gemm", 30, 10, correlation_id=1),
        KernelEvent("relu", 80, 4, correlation_id=2),
        KernelEvent("gemm_bwd", 145, 12, correlation_id=3),
        KernelEvent("sgd", 205, 3, correlation_id=4),
        KernelEvent("orphan", 100, 1, correlation_id=77),
    ]
    fraction = attach_kernels(iterations, kernels, launches)
    ops = iterations[0].ops
    linked = {k.name: ops[k.op_index].name if k.op_index >= 0 else None for k in kernels}
    assert linked == {
        "gemm": "aten::addmm",
        "relu": "aten::relu",
        "gemm_bwd": "aten::mm",
        "sgd": "aten::add_",
        "orphan": None,
    }
    assert fraction == 4 / 5
    assert [k.start_ns for k in iterations[0].kernels] == sorted(k.start_ns for k in kernels)


def test_device_targets_sum_subtree_kernels_and_gap_to_next_op():
    iterations = build_iterations(one_step(0), [StepBounds(0, 0, 250)])
    launches = _launches([(1, 1, 25), (2, 1, 26), (3, 1, 75)])
    kernels = [
        KernelEvent("a", 30, 10, correlation_id=1),
        KernelEvent("b", 45, 5, correlation_id=2),
        KernelEvent("c", 60, 4, correlation_id=3),
    ]
    attach_kernels(iterations, kernels, launches)
    ops = iterations[0].ops
    linear = ops[0]
    relu = next(op for op in ops if op.name == "aten::relu")
    assert (linear.kernel_duration_ns, linear.kernel_count) == (15, 2)
    assert linear.gap_ns == 60 - 50  # relu's first kernel starts 10 ns after linear's last ends
    assert (relu.kernel_duration_ns, relu.kernel_count) == (4, 1)
    assert relu.gap_ns == 250 - 64  # the last kernel-launching op: gap to the step's end
    no_kernels = next(op for op in ops if op.name == "aten::sum")
    assert (no_kernels.kernel_duration_ns, no_kernels.gap_ns) == (0, -1)


def test_ops_inside_the_dataloader_iterator_are_input_work_not_rows():
    from ets_hook.ets.rows import ets_rows

    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    raws = [
        raw(loader, 2, 8, scope=USER),
        raw("aten::randn", 3, 2),
        raw("aten::stack", 6, 3),
        raw("aten::empty", 7, 1),  # nested in stack: input work too
        *one_step(0)[:5],  # the forward starts at 10
    ]
    (iteration,) = build_iterations(raws, [StepBounds(0, 0, 100)])
    phases = {op.name: op.phase for op in iteration.ops}
    assert loader not in phases, "the annotation itself is not an op"
    assert [phases[n] for n in ("aten::randn", "aten::stack", "aten::empty")] == [Phase.INPUT] * 3
    assert phases["aten::linear"] is Phase.FORWARD
    rows = [iteration.ops[i].name for i in ets_rows(iteration)]
    assert rows == ["aten::linear", "aten::relu", "aten::sum"]
