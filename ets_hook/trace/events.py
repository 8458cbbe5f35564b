"""The trace model: what one captured (or imported) execution trace holds.

Contracts shared by every stage:
- Times in the trace are int nanoseconds on one clock per trace (Unix-epoch based for captured
  traces: the op profiler's clock; CUPTI timestamps are shifted onto it when decoded).
- ``IterationTrace.ops`` is in start order. ``parent`` indexes into that same list (or -1), and a
  parent always precedes its children, so ``depth == 0`` ops are the outermost ones of their
  thread: forward ATen ops, backward autograd nodes, optimizer ops. Profiler annotations such as
  ``Optimizer.step#SGD.step`` are not ops; they only decide ``phase``.
- ``KernelEvent.op_index`` indexes into the ops of the same iteration (or -1: not correlated).
- ``kernel_duration_ns`` / ``gap_ns`` on an op are derived values (the ETS targets), filled by
  the decoder or an importer: -1 means "not known", never 0.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int, ...]


class Phase(str, enum.Enum):
    """Which part of a training step an op belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"
    #: The input pipeline's work in the training process: ops inside the DataLoader iterator's
    #: ``enumerate(DataLoader)#...__next__`` (``Dataset.__getitem__``, ``collate_fn``,
    #: pin-memory copies with ``num_workers=0``). Not model work: never an ETS row.
    INPUT = "input"


class KernelKind(str, enum.Enum):
    """What a ``KernelEvent`` records: a kernel, a memcpy or a memset."""

    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"


@dataclass(slots=True)
class OpEvent:
    """One operator invocation on the host (an ATen op or an autograd node).

    Attributes:
        name: the op's name as recorded (``"aten::addmm"``) or as an importer names it.
        start_ns: host start on the trace clock, ns.
        duration_ns: host duration, ns.
        thread: profiler thread id.
        phase: the part of the training step it belongs to.
        depth: nesting depth among ops (annotations not counted); 0 = outermost.
        parent: index of the enclosing op in the same ``IterationTrace.ops``; -1: none.
        sequence_nr: autograd sequence number, tying a backward node to the forward op that
            created it; -1: none.
        input_shapes: one shape per positional argument (``()`` for a non-tensor); empty when
            shapes were not recorded.
        input_dtypes: the arguments' dtype strings, positional like ``input_shapes``.
        flops: FLOPs of the op; -1: compute from shapes when needed (``ets.flops``).
        bytes_moved: bytes read plus written; -1 as for ``flops``.
        params: shape/parameter ints as given by an importer (ETS CSV: 30 ints); empty for
            captured ops.
        kernel_duration_ns: ETS duration target: summed GPU time of the kernels of the op's
            subtree, ns; set on outermost ops only; -1: unknown.
        kernel_count: number of kernels summed into ``kernel_duration_ns``.
        gap_ns: ETS gap target, ns: the device gap after the op's kernels, or the host gap to
            the next outermost op of its thread when the iteration has no kernels
            (``trace.decode``); -1: unknown.
    """

    name: str
    start_ns: int
    duration_ns: int
    thread: int = 0
    phase: Phase = Phase.OTHER
    depth: int = 0
    parent: int = -1
    sequence_nr: int = -1
    input_shapes: tuple[Shape, ...] = ()
    input_dtypes: tuple[str, ...] = ()
    flops: int = -1
    bytes_moved: int = -1
    params: tuple[int, ...] = ()
    kernel_duration_ns: int = -1
    kernel_count: int = 0
    gap_ns: int = -1

    @property
    def end_ns(self) -> int:
        """Host end on the trace clock: ``start_ns + duration_ns`` (ns)."""
        return self.start_ns + self.duration_ns


@dataclass(slots=True)
class KernelEvent:
    """One GPU activity record: a kernel, a memcpy or a memset.

    Attributes:
        name: kernel name; for copies and sets a descriptive name (``"Memset"``, ...).
        start_ns: GPU start on the trace clock, ns.
        duration_ns: GPU duration, ns.
        kind: kernel, memcpy or memset.
        device: CUDA device index.
        stream: CUDA stream id.
        correlation_id: CUPTI correlation id joining the record to its runtime launch call.
        op_index: index of the launching op in the same iteration's ``ops``; -1: not correlated.
        grid: launch grid (x, y, z); zeros for memcpy/memset.
        block: launch block (x, y, z); zeros for memcpy/memset.
        bytes: bytes copied or set; 0 for kernels.
        communication: True for NCCL kernels, whose duration includes waiting for other ranks.
    """

    name: str
    start_ns: int
    duration_ns: int
    kind: KernelKind = KernelKind.KERNEL
    device: int = 0
    stream: int = 0
    correlation_id: int = 0
    op_index: int = -1
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    bytes: int = 0
    communication: bool = False

    @property
    def end_ns(self) -> int:
        """GPU end on the trace clock: ``start_ns + duration_ns`` (ns)."""
        return self.start_ns + self.duration_ns


@dataclass(slots=True)
class IterationTrace:
    """One training step: the boundaries measured by the hook and what ran inside them.

    Attributes:
        step: the step's number (captured: counted from 0 by the hook; ETS CSV: the file
            name's ``_<n>`` suffix).
        start_ns: step start on the trace clock, ns.
        end_ns: step end, ns; the step is ``[start_ns, end_ns)``.
        ops: the step's ops in start order (see the module docstring).
        kernels: the step's GPU records, by start time once decoded; empty for CPU and
            imported traces.
    """

    step: int
    start_ns: int
    end_ns: int
    ops: list[OpEvent] = field(default_factory=list)
    kernels: list[KernelEvent] = field(default_factory=list)

    @property
    def duration_ns(self) -> int:
        """Step wall time ``end_ns - start_ns`` (ns)."""
        return self.end_ns - self.start_ns

    def top_level_ops(self) -> Iterator[OpEvent]:
        """The outermost ops (``depth == 0``) in start order, as a lazy iterator over ``ops``."""
        return (op for op in self.ops if op.depth == 0)


@dataclass(slots=True)
class DeviceInfo:
    """The device the steps ran on; defaults ("", 0, -1) mean unknown.

    Attributes:
        kind: ``"cpu"`` or ``"cuda"``.
        name: device name (``"NVIDIA A100-SXM4-40GB"``); imported traces: e.g. ``"T4"``.
        index: CUDA device index; -1 for none.
        uuid: the GPU's UUID.
        total_memory_bytes: device memory, bytes.
        multiprocessor_count: number of SMs.
        compute_capability: ``"<major>.<minor>"``.
        driver_version: the NVIDIA driver version.
    """

    kind: str = "cpu"
    name: str = ""
    index: int = -1
    uuid: str = ""
    total_memory_bytes: int = 0
    multiprocessor_count: int = 0
    compute_capability: str = ""
    driver_version: str = ""


@dataclass(slots=True)
class HostInfo:
    """The host the steps ran on; "" and 0 mean unknown.

    Attributes:
        hostname: the machine's host name.
        cpu_model: CPU model name.
        physical_cores: physical CPU cores.
        logical_cores: logical CPUs.
        memory_bytes: host memory, bytes.
        torch_threads: ``torch.get_num_threads()`` at capture.
    """

    hostname: str = ""
    cpu_model: str = ""
    physical_cores: int = 0
    logical_cores: int = 0
    memory_bytes: int = 0
    torch_threads: int = 0


@dataclass(slots=True)
class CaptureInfo:
    """How the trace was captured; empty for imported traces.

    Attributes:
        skip_steps: steps timed but not captured before the capture window.
        capture_steps: steps in the capture window ``[skip_steps, skip_steps + capture_steps)``.
        op_capture: how ops were captured (free text).
        kernel_capture: kernel capture status (free text); says why kernels are absent when
            they are.
        shapes_recorded: the ``record_shapes`` mode: ``"first"``, ``"all"`` or ``"none"``.
        dropped_records: GPU activity records the collector lost.
    """

    skip_steps: int = 0
    capture_steps: int = 0
    op_capture: str = ""
    kernel_capture: str = ""
    shapes_recorded: str = ""
    dropped_records: int = 0


@dataclass(slots=True)
class Trace:
    """A captured or imported execution trace: a few iterations plus the facts around them.

    Attributes:
        iterations: the captured steps, in step order.
        device: the device the steps ran on.
        host: the host machine.
        capture: capture settings and status.
        torch_version: ``torch.__version__`` at capture; "" for imported traces.
        ets_hook_version: the ets-hook version that wrote the trace; "" for imported traces.
        step_times_s: wall time (s) of every step the hook timed up to the end of capture,
            step 0 first; empty for imported traces.
        rank: distributed rank of the process.
        world_size: number of distributed processes.
        metadata: free-form, msgpack-serialisable facts: model name, batch size, importer
            provenance, ...
    """

    iterations: list[IterationTrace] = field(default_factory=list)
    device: DeviceInfo = field(default_factory=DeviceInfo)
    host: HostInfo = field(default_factory=HostInfo)
    capture: CaptureInfo = field(default_factory=CaptureInfo)
    torch_version: str = ""
    ets_hook_version: str = ""
    step_times_s: list[float] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.iterations)
