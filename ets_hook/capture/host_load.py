"""How busy the machine is with other work: CPU used by other processes, and CPU steal.

Step times on a shared machine move with other processes' load (a burst of a few steps or a
lasting shift, ``forecast.contention``) and, on virtual machines, with the time the hypervisor
gives to other guests (steal). Neither shows in the training loop itself. ``HostLoadSampler``
reads both from ``psutil`` at step boundaries, at most once per ``interval_s``: the machine's CPU
times (``psutil.cpu_times``: user, system, ..., steal; ``guest`` is already inside ``user`` on
Linux) and the job's own: this process's and its descendants' (``ProcessTreeCpu``: the
DataLoader's worker processes, ``torch.compile``'s compile workers; a job with two busy
workers read as "other processes 90% CPU" before); in a multi-process job, the launcher's
whole tree (``include_siblings``: the parent -- ``torchrun``'s agent, ``mp.spawn``'s main
process, ``srun``'s step daemon -- and all its descendants), so that the other ranks on this
node are the job's too (before, every single-node DDP job read as "host busy"). Between two
samples:

- ``foreign_cpu``: the machine's busy CPU time less the job's, over the elapsed time x the
  logical CPUs: the share of the whole machine that other processes used (0..1);
- ``steal``: the machine's steal time over the same: the share the hypervisor took (0..1).

A sample reads ``/proc`` for the machine, this process and every process (to find the
descendants: ~0.5 ms with 70 processes); when that takes more than ``MAX_SAMPLE_COST_S``
the interval doubles (up to ``MAX_INTERVAL_S``), so sampling stays under 0.1% of the loop's
time on a crowded node. Where ``psutil`` cannot read them (another OS, a sandbox) the
sampler turns itself off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Seconds between two samples, at least.
DEFAULT_INTERVAL_S = 1.0
#: A sample that costs the training thread more CPU time than this (finding the descendants
#: on a crowded node) doubles the interval, up to ``MAX_INTERVAL_S``.
MAX_SAMPLE_COST_S = 0.001
MAX_INTERVAL_S = 30.0
# CPU-time fields that are not work (or are counted inside another field).
_NOT_BUSY = ("idle", "iowait", "steal", "guest", "guest_nice")


@dataclass(frozen=True, slots=True)
class HostLoad:
    """The machine's load from other work between two samples.

    Attributes:
        foreign_cpu: share of the machine's CPU used by other processes, 0..1.
        steal: share of the machine's CPU taken by the hypervisor (steal time), 0..1.
        interval_s: seconds the shares cover.
    """

    foreign_cpu: float
    steal: float
    interval_s: float


def _psutil_readers(
    include_siblings: bool = False,
) -> tuple[Callable[[], Any], Callable[[], Any], int] | None:
    try:
        import psutil

        process = psutil.Process()
        root = process
        if include_siblings:
            parent = process.parent()
            if parent is not None and parent.pid > 1:  # never all of init's processes
                root = parent
        readers = (psutil.cpu_times, ProcessTreeCpu(psutil, root), psutil.cpu_count() or 1)
        readers[0]()
        process.cpu_times()  # readable here (the descendants' scan waits for the first sample)
    except Exception:  # no psutil support here: the sampler stays off
        return None
    return readers


def _busy_s(times: Any) -> tuple[float, float]:
    fields = times._asdict()
    busy = sum(v for k, v in fields.items() if k not in _NOT_BUSY)
    return busy, fields.get("steal", 0.0)


def _own_s(times: Any) -> float:
    """CPU seconds from a reading: a number, or ``cpu_times``-like (``user`` + ``system``)."""
    if isinstance(times, (int, float)):
        return float(times)
    return float(times.user + times.system)


class ProcessTreeCpu:
    """CPU seconds a process and its descendants have used so far, as one running total.

    Each live process counts its own user + system time and its reaped children's
    (``children_user`` / ``children_system``); a descendant that ends moves from the live ones
    into its parent's reaped children, so the total runs on without a jump. A process that
    vanishes between listing and reading is skipped.
    """

    def __init__(self, psutil_module: Any, process: Any) -> None:
        """Set the reader up.

        Args:
            psutil_module: the ``psutil`` module (its ``Error`` is what a vanished process
                raises).
            process: the tree's root, a ``psutil.Process`` (this process, or its parent).
        """
        self._error = psutil_module.Error
        self._process = process

    def __call__(self) -> float:
        """The total now, seconds.

        Raises:
            Exception: reading this process's own times failed (the sampler turns off).
        """
        total = self._cpu_s(self._process)
        try:
            descendants = self._process.children(recursive=True)
        except self._error:
            return total
        for child in descendants:
            try:
                total += self._cpu_s(child)
            except self._error:
                continue  # ended since it was listed: its time is with its parent's children
        return total

    @staticmethod
    def _cpu_s(process: Any) -> float:
        times = process.cpu_times()
        return float(
            times.user
            + times.system
            + getattr(times, "children_user", 0.0)
            + getattr(times, "children_system", 0.0)
        )


class HostLoadSampler:
    """Samples ``HostLoad`` at most once per ``interval_s`` (module docs). Not thread-safe:
    one caller (the training thread's step boundary).

    Attributes:
        enabled: False when the CPU times cannot be read here.
        latest: the last complete ``HostLoad``, or None before two samples.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        machine_times: Callable[[], Any] | None = None,
        process_times: Callable[[], Any] | None = None,
        cpus: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        include_siblings: bool = False,
    ) -> None:
        """Set the sampler up and take its first sample.

        Args:
            interval_s: seconds between samples, > 0.
            machine_times: returns the machine's CPU times (``psutil.cpu_times()``-like:
                ``_asdict()`` with ``idle`` and optionally ``steal``); None: psutil's.
            process_times: returns the job's CPU seconds so far (a number), or this process's
                CPU times (``user``, ``system``); None: ``ProcessTreeCpu`` over psutil.
            cpus: logical CPUs; None: psutil's count.
            clock: monotonic seconds.
            include_siblings: with psutil's process times, count the parent's whole tree
                as the job (a multi-process job: the other ranks on this node).

        Raises:
            ValueError: ``interval_s`` is not a number > 0.
        """
        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"interval_s must be a number > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.latest: HostLoad | None = None
        self._clock = clock
        if machine_times is None or process_times is None:
            readers = _psutil_readers(include_siblings)
            if readers is None:
                self.enabled = False
                return
            machine_times = machine_times or readers[0]
            process_times = process_times or readers[1]
            cpus = cpus or readers[2]
        self._machine_times = machine_times
        self._process_times = process_times
        self._cpus = max(int(cpus or 1), 1)
        self.enabled = True
        self._last = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        busy, steal = _busy_s(self._machine_times())
        return self._clock(), busy, steal, _own_s(self._process_times())

    def sample(self) -> HostLoad | None:
        """A new ``HostLoad`` when ``interval_s`` has passed since the last sample, else None.
        Never raises: a failing read turns the sampler off.

        Returns:
            The load over the time since the previous sample, or None (too soon, or off).
        """
        if not self.enabled or self._clock() - self._last[0] < self.interval_s:
            return None
        started_s = time.thread_time()  # CPU time: a loaded machine's waits do not count
        try:
            now = self._read()
        except Exception:
            self.enabled = False
            return None
        if time.thread_time() - started_s > MAX_SAMPLE_COST_S:
            self.interval_s = min(2.0 * self.interval_s, max(MAX_INTERVAL_S, self.interval_s))
        (t0, busy0, steal0, own0), (t1, busy1, steal1, own1) = self._last, now
        self._last = now
        capacity = (t1 - t0) * self._cpus
        if capacity <= 0:
            return None
        foreign = max(0.0, (busy1 - busy0) - (own1 - own0)) / capacity
        load = HostLoad(
            foreign_cpu=min(foreign, 1.0),
            steal=min(max(steal1 - steal0, 0.0) / capacity, 1.0),
            interval_s=t1 - t0,
        )
        self.latest = load
        return load
