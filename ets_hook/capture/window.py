"""The capture window's mechanics: which op capture runs, the kernel collector, and turning what
the window recorded into a ``Trace``. ``WindowRunner`` (``capture.window_runner``) decides
*when*; this module does the *how*.

- ``choose_op_capture``: the native observer when it is loaded (``op_capture`` "auto" or
  "native"), else the torch profiler, unless another profiler owns the session (back off).
- ``start_kernel_collector``: our CUPTI collector (GPU), or why it is off.
- ``build_window_trace``: ops (+ kernels) of a finished window -> ``Trace`` (decode thread).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ..trace.decode import KernelLinkCounts, StepBounds, attach_kernels, build_iterations
from ..trace.events import CaptureInfo, DeviceInfo, HostInfo, Trace
from ..trace.names import INPUT_ANNOTATION_PREFIX
from . import native_ops
from .ops import DecodeCost, NativeOpCapture, ProfilerOpCapture, other_profiler_active

logger = logging.getLogger("ets_hook")


class WindowState:
    """Where a hook's capture window stands (``ETSHook.capture_status``)."""

    WAITING = "waiting"
    CAPTURING = "capturing"
    DECODING = "decoding"
    DONE = "done"
    OFF = "off"


#: ``ETSHook(record_shapes=...)``: input shapes for the window's first step, every step, none.
RecordShapes = Literal["first", "all", "none"]
#: ``ETSHook(op_capture=...)``: the native observer where it loads, it only, or torch.profiler.
OpCapture = Literal["auto", "native", "profiler"]
RECORD_SHAPES_MODES: tuple[str, ...] = get_args(RecordShapes)
OP_CAPTURE_MODES: tuple[str, ...] = get_args(OpCapture)

#: ``ETSHook(capture_steps=None)``: the window's most steps; it ends earlier when its predicted
#: cost would pass ``CAPTURE_BUDGET_SHARE`` of the job's predicted total (``window_budget``).
MAX_ADAPTIVE_CAPTURE_STEPS = 5
#: ``ETSHook(skip_steps=None)``: steps timed before the window starts (then raised while steps
#: compile). Three, so that the step-3 prediction rests on two steps the capture never touched:
#: with the window at the second step (1, before), steps 2 and 3 were the window's and its
#: decode's, whose cost in a fresh process's first window runs 2-4x what the window measures
#: per op (``benchmarks/accuracy.py``, 26 jobs, with the second-step prior: step-3 error median
#: 8.5-15% -> 6-8%; see benchmarks/RESULTS.md,
#: *The window after three clean steps*).
DEFAULT_SKIP_STEPS = 3
#: The capture's predicted cost (window + decode), at most this share of the job's total.
CAPTURE_BUDGET_SHARE = 0.01


class WindowBudget:
    """What the adaptive window does after a captured step (``window_budget``)."""

    CONTINUE = "continue"  # capture one more step
    FINISH = "finish"  # end the window now and decode what it holds
    DROP = "drop"  # even one step's decode is over budget: drop the ops, decode nothing


def check_window_settings(
    capture_steps: Any, skip_steps: Any, op_capture: Any, record_shapes: Any
) -> None:
    """Check ``ETSHook``'s window arguments.

    Raises:
        ValueError: ``capture_steps`` or ``skip_steps`` not an int >= 0 (bools rejected);
            ``op_capture`` not in ``OP_CAPTURE_MODES``; ``record_shapes`` not in
            ``RECORD_SHAPES_MODES``. The message names the argument and the value.
    """
    for name, value in (("capture_steps", capture_steps), ("skip_steps", skip_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if op_capture not in OP_CAPTURE_MODES:
        raise ValueError(f"op_capture must be one of {OP_CAPTURE_MODES}, got {op_capture!r}")
    if record_shapes not in RECORD_SHAPES_MODES:
        raise ValueError(
            f"record_shapes must be one of {RECORD_SHAPES_MODES}, got {record_shapes!r}"
        )


@dataclass(frozen=True, slots=True)
class OpCaptureChoice:
    """What ``choose_op_capture`` decided.

    Attributes:
        ops: the capture to start; None when op capture must back off.
        note: for ``capture_status``: which path runs (and why not the native one), or why it
            backed off.
    """

    ops: NativeOpCapture | ProfilerOpCapture | None
    note: str


def measured_capture_ratio(
    step_s: Sequence[float], ops_per_step: Sequence[int], us_per_op: tuple[float, float]
) -> tuple[float, float] | None:
    """This job's window slowdown (window step / the same step without capture), from what the
    window measured: the median window step and the median ops it recorded per step, at the
    observer's per-op cost range.

    Args:
        step_s: the window's step times so far, seconds.
        ops_per_step: ops recorded in each of those steps.
        us_per_op: (low, high) wall time the capture adds per op, µs.

    Returns:
        ``(low, high)`` ratios (>= 1), or None without a step. The capture's share of a step is
        capped at 80% (a step cannot be mostly capture unless the cost range is wrong).
    """
    if not step_s or not ops_per_step:
        return None
    step = statistics.median(step_s)
    ops = statistics.median(ops_per_step)
    if not step > 0:
        return None
    share_lo, share_hi = (min(0.8, ops * us * 1e-6 / step) for us in us_per_op)
    return 1.0 / (1.0 - share_lo), 1.0 / (1.0 - share_hi)


def measured_spike_steps(
    step_s: Sequence[float],
    ops_per_step: Sequence[int],
    capture_steps: int,
    capture_ratio: tuple[float, float],
    decode: DecodeCost,
) -> tuple[float, float] | None:
    """The one-off cost after this job's window (its decode), in steady steps, from what the
    window measured: the decode's cost range for the ops the whole window will have recorded
    (the median window step's count x ``capture_steps``), over the steady step (the median
    window step over the midpoint of ``capture_ratio``).

    Args:
        step_s: the window's step times so far, seconds.
        ops_per_step: ops recorded in each of those steps.
        capture_steps: steps in the whole window, >= 1.
        capture_ratio: the window's slowdown range (``measured_capture_ratio``).
        decode: the training-thread time the decode costs (``NativeOpCapture.decode_costs``).

    Returns:
        ``(low, high)`` steady steps, or None without a step, an op or a positive step time.
    """
    if not step_s or not ops_per_step or capture_steps < 1:
        return None
    ops = statistics.median(ops_per_step) * capture_steps
    steady_s = statistics.median(step_s) / (0.5 * (capture_ratio[0] + capture_ratio[1]))
    if not (ops > 0 and steady_s > 0):
        return None
    low_s, high_s = decode.range_s(ops)
    return low_s / steady_s, high_s / steady_s


def window_budget(
    step_s: Sequence[float],
    ops_per_step: Sequence[int],
    us_per_op: tuple[float, float],
    next_us_per_op: tuple[float, float],
    decode: DecodeCost,
    job_steps: int,
    budget_share: float = CAPTURE_BUDGET_SHARE,
) -> str:
    """Whether the adaptive window goes on after its latest step, from what it measured.

    The capture's predicted cost after ``k`` steps is what the window added in them (their ops
    at ``us_per_op``) plus the decode of every op recorded (``decode``: its fixed part once,
    its part per op), all at the midpoints of the ranges; the budget is ``budget_share`` of the
    job's predicted total (its steps this process runs x the steady step: the median window
    step over the midpoint of the measured slowdown, ``measured_capture_ratio``).

    Args:
        step_s: the window's step times so far, seconds (>= 1 step).
        ops_per_step: ops recorded in each of those steps.
        us_per_op: (low, high) wall time the capture added per op in those steps, µs.
        next_us_per_op: the same for the next step (no shapes after the first with
            ``record_shapes="first"``).
        decode: the training-thread time the decode costs (``NativeOpCapture.decode_costs``).
        job_steps: optimizer steps this process runs in all, >= 1.
        budget_share: the capture's cost at most this share of the job's predicted total.

    Returns:
        ``WindowBudget.CONTINUE`` while one more step stays within budget;
        ``WindowBudget.FINISH`` when it would not (decode the steps captured);
        ``WindowBudget.DROP`` when the first step's own decode is already over budget (a job
        too short for its capture to pay off: keep timing steps, decode nothing).
    """
    ratio = measured_capture_ratio(step_s, ops_per_step, us_per_op)
    if ratio is None or job_steps < 1:
        return WindowBudget.CONTINUE
    steady_s = statistics.median(step_s) / (0.5 * (ratio[0] + ratio[1]))
    budget_s = budget_share * job_steps * steady_s
    window_s = 0.5 * (us_per_op[0] + us_per_op[1]) * 1e-6
    next_s = 0.5 * (next_us_per_op[0] + next_us_per_op[1]) * 1e-6
    recorded = sum(ops_per_step)
    decode_s = decode.midpoint_s(recorded)
    if len(ops_per_step) == 1 and decode_s > budget_s:
        return WindowBudget.DROP
    spent_s = recorded * window_s + decode_s
    one_more_s = decode.midpoint_s(recorded + statistics.median(ops_per_step)) - decode_s
    one_more_s += statistics.median(ops_per_step) * next_s
    return WindowBudget.CONTINUE if spent_s + one_more_s <= budget_s else WindowBudget.FINISH


def choose_op_capture(mode: str, *, observer_busy: bool = False) -> OpCaptureChoice:
    """The op capture for this window (logs the fallback or the back-off once).

    Args:
        mode: ``"auto"``, ``"native"`` or ``"profiler"`` (``ETSHook(op_capture=)``).
        observer_busy: the native observer holds another hook's capture
            (``capture.ops.native_observer_holder``): the profiler path runs instead.

    Returns:
        The choice: the native observer if loaded, free (and not ``"profiler"``); else the
        torch profiler, unless another profiler session is active (then ``ops`` is None).
    """
    module = native_ops.load() if mode != "profiler" else None
    if module is not None and not observer_busy:
        ops = NativeOpCapture(module)
        return OpCaptureChoice(ops, f"ops: {ops.name}")
    busy = other_profiler_active()
    if busy is not None:
        note = f"op capture backed off: {busy}"
        logger.warning("%s; timing steps only", note)
        return OpCaptureChoice(None, note)
    profiler = ProfilerOpCapture()
    note = f"ops: {profiler.name}"
    if mode != "profiler":
        reason = (
            "in use by another ETSHook in this process"
            if module is not None
            else native_ops.unavailable_reason() or "not loaded"
        )
        note += f" (native observer: {reason})"
        logger.info(
            "native op observer unavailable (%s); the torch profiler captures this window",
            reason,
        )
    return OpCaptureChoice(profiler, note)


def start_kernel_collector() -> tuple[Any, str]:
    """Start our CUPTI activity collector.

    Returns:
        ``(collector, status)``: the running ``KernelCollector`` and ``"on: ..."``, or None and
        ``"off: <reason>"`` (extension missing, no CUPTI, ...). Never raises.
    """
    try:
        from .cupti import KernelCollector
    except Exception as exc:  # extension missing or broken: ops are still captured
        return None, f"off: native extension unavailable ({exc})"
    collector = KernelCollector()
    status = collector.start()
    if status.available:
        return collector, "on: CUPTI activity collector"
    collector.close()
    logger.info("kernel capture unavailable: %s", status.reason)
    return None, f"off: {status.reason}"


@dataclass(frozen=True, slots=True)
class WindowFacts:
    """What a trace records about the job besides the window's events.

    Attributes:
        skip_steps, capture_steps, record_shapes: the hook's window settings.
        device, host: machine facts (resolved before training started).
        torch_version, ets_hook_version: versions to record.
        step_times_s: the job's step times so far.
        rank, world_size: the process's place in a distributed job.
        metadata: free-form facts (model name, partial steps).
    """

    skip_steps: int
    capture_steps: int
    record_shapes: str
    device: DeviceInfo
    host: HostInfo
    torch_version: str
    ets_hook_version: str
    step_times_s: Sequence[float]
    rank: int = 0
    world_size: int = 1
    metadata: Mapping[str, Any] = field(default_factory=dict)


def build_window_trace(
    ops: NativeOpCapture | ProfilerOpCapture | None,
    bounds: Sequence[StepBounds],
    facts: WindowFacts,
    *,
    collector: Any = None,
    kernel_status: str = "not requested",
    window_end_event: Any = None,
) -> Trace:
    """Read the window's ops (and kernels) and build its trace. Slow: off the training thread.

    Args:
        ops: the stopped op capture (None: no ops).
        bounds: the window's timed steps.
        facts: everything else the trace records.
        collector: the stopped kernel collector, or None; it is drained and closed here.
        kernel_status: ``kernel_capture_status`` so far; the linked share is appended, and
            how many kernels were linked by external correlation id and by launch time.
        window_end_event: a CUDA event recorded at the window's end: waited for (this thread
            only) before the collector is flushed.

    Returns:
        The trace; ``trace.capture.kernel_capture`` holds the final kernel status.
    """
    raws = ops.read() if ops is not None else []
    shapes_step = facts.skip_steps if facts.record_shapes == "first" and bounds else None
    positions: dict[int, tuple[int, int]] = {}
    iterations = build_iterations(raws, bounds, shapes_source_step=shapes_step, positions=positions)
    dropped = 0
    if collector is not None:
        from .gpu_records import decode_activity, ops_by_correlation  # the collector loaded _C

        if window_end_event is not None:
            window_end_event.synchronize()  # this thread only: the window's kernels ran
        records, clock_offset_ns, dropped = collector.collect()
        collector.close()
        activity = decode_activity(records, clock_offset_ns=clock_offset_ns)
        # Ops of the native observer pushed their handle as external correlation id.
        op_of_handle = {raws[i].handle: at for i, at in positions.items() if raws[i].handle}
        links = KernelLinkCounts()
        correlated = attach_kernels(
            iterations,
            activity.kernels,
            activity.launches,
            ops_by_correlation(activity.external_ids, op_of_handle),
            links,
        )
        kernel_status += (
            f"; {100 * correlated:.1f}% of kernels linked to an op ({links.describe()})"
        )
    return Trace(
        iterations=iterations,
        device=facts.device,
        host=facts.host,
        capture=CaptureInfo(
            skip_steps=facts.skip_steps,
            capture_steps=facts.capture_steps,
            op_capture=ops.name if ops is not None else "",
            kernel_capture=kernel_status,
            shapes_recorded=facts.record_shapes,
            dropped_records=dropped + (ops.dropped if ops is not None else 0),
        ),
        torch_version=facts.torch_version,
        ets_hook_version=facts.ets_hook_version,
        step_times_s=list(facts.step_times_s),
        rank=facts.rank,
        world_size=facts.world_size,
        metadata={
            **facts.metadata,
            # The DataLoader iterators' __next__ the window saw (in any process thread).
            "dataloader_batches": sum(raw.name.startswith(INPUT_ANNOTATION_PREFIX) for raw in raws),
        },
    )
