"""How busy the machine is with other work: CPU used by other processes, and CPU steal.

Step times on a shared machine move with other processes' load (a burst of a few steps or a
lasting shift, ``forecast.contention``) and, on virtual machines, with the time the hypervisor
gives to other guests (steal). Neither shows in the training loop itself. ``HostLoadSampler``
reads both from ``psutil`` at step boundaries, at most once per ``interval_s``: the machine's CPU
times (``psutil.cpu_times``: user, system, ..., steal; ``guest`` is already inside ``user`` on
Linux) and this process's own (``psutil.Process().cpu_times``). Between two samples:

- ``foreign_cpu``: the machine's busy CPU time less this process's, over the elapsed time x
  the logical CPUs: the share of the whole machine that other processes used (0..1);
- ``steal``: the machine's steal time over the same: the share the hypervisor took (0..1).

Each sample costs two ``/proc`` reads (tens of µs), so once a second is nothing to a training
loop. Where ``psutil`` cannot read them (another OS, a sandbox) the sampler turns itself off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Seconds between two samples, at least.
DEFAULT_INTERVAL_S = 1.0
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


def _psutil_readers() -> tuple[Callable[[], Any], Callable[[], Any], int] | None:
    try:
        import psutil

        process = psutil.Process()
        readers = (psutil.cpu_times, process.cpu_times, psutil.cpu_count() or 1)
        readers[0]()
        readers[1]()
    except Exception:  # no psutil support here: the sampler stays off
        return None
    return readers


def _busy_s(times: Any) -> tuple[float, float]:
    fields = times._asdict()
    busy = sum(v for k, v in fields.items() if k not in _NOT_BUSY)
    return busy, fields.get("steal", 0.0)


def _own_s(times: Any) -> float:
    return float(times.user + times.system)


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
    ) -> None:
        """Set the sampler up and take its first sample.

        Args:
            interval_s: seconds between samples, > 0.
            machine_times: returns the machine's CPU times (``psutil.cpu_times()``-like:
                ``_asdict()`` with ``idle`` and optionally ``steal``); None: psutil's.
            process_times: returns this process's CPU times (``user``, ``system``); None:
                psutil's.
            cpus: logical CPUs; None: psutil's count.
            clock: monotonic seconds.

        Raises:
            ValueError: ``interval_s`` is not a number > 0.
        """
        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"interval_s must be a number > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.latest: HostLoad | None = None
        self._clock = clock
        if machine_times is None or process_times is None:
            readers = _psutil_readers()
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
        try:
            now = self._read()
        except Exception:
            self.enabled = False
            return None
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
