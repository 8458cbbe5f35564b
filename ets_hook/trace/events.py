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


class KernelKind(str, enum.Enum):
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"


@dataclass(slots=True)
class OpEvent:
    """One operator invocation on the host (an ATen op or an autograd node)."""

    name: str
    start_ns: int
    duration_ns: int
    thread: int = 0
    phase: Phase = Phase.OTHER
    depth: int = 0
    parent: int = -1
    # Autograd sequence number: ties a backward node to the forward op that created it (-1: none).
    sequence_nr: int = -1
    input_shapes: tuple[Shape, ...] = ()
    input_dtypes: tuple[str, ...] = ()
    # Per-op cost facts; -1 means "compute from shapes when needed".
    flops: int = -1
    bytes_moved: int = -1
    # Shape/parameter integers as given by an importer (ETS CSV: 30 ints); empty for captured ops.
    params: tuple[int, ...] = ()
    # Derived ETS targets (see module docstring); -1 = unknown.
    kernel_duration_ns: int = -1
    kernel_count: int = 0
    gap_ns: int = -1

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


@dataclass(slots=True)
class KernelEvent:
    """One GPU activity record: a kernel, a memcpy or a memset."""

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
    # NCCL kernels: their duration includes waiting for other ranks.
    communication: bool = False

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


@dataclass(slots=True)
class IterationTrace:
    """One training step: the boundaries measured by the hook and what ran inside them."""

    step: int
    start_ns: int
    end_ns: int
    ops: list[OpEvent] = field(default_factory=list)
    kernels: list[KernelEvent] = field(default_factory=list)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def top_level_ops(self) -> Iterator[OpEvent]:
        return (op for op in self.ops if op.depth == 0)


@dataclass(slots=True)
class DeviceInfo:
    """The device the steps ran on. ``kind`` is "cpu" or "cuda"."""

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
    hostname: str = ""
    cpu_model: str = ""
    physical_cores: int = 0
    logical_cores: int = 0
    memory_bytes: int = 0
    torch_threads: int = 0


@dataclass(slots=True)
class CaptureInfo:
    """How the trace was captured; ``kernel_capture`` says why kernels are absent when they are."""

    skip_steps: int = 0
    capture_steps: int = 0
    op_capture: str = ""
    kernel_capture: str = ""
    shapes_recorded: str = ""
    dropped_records: int = 0


@dataclass(slots=True)
class Trace:
    """A captured or imported execution trace: a few iterations plus the facts around them."""

    iterations: list[IterationTrace] = field(default_factory=list)
    device: DeviceInfo = field(default_factory=DeviceInfo)
    host: HostInfo = field(default_factory=HostInfo)
    capture: CaptureInfo = field(default_factory=CaptureInfo)
    torch_version: str = ""
    ets_hook_version: str = ""
    # Wall time of every step the hook timed up to the end of capture, step 0 first.
    step_times_s: list[float] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    # Free-form, msgpack-serialisable facts: model name, batch size, importer provenance, ...
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.iterations)
