"""When each DataLoader worker finishes each batch: the input pipeline's own rate, measured.

A ``DataLoader`` with worker processes prefetches ``prefetch_factor`` batches per worker, so a
training loop faster than its workers does not wait in its first steps: the batches are ready.
Its early step times are the model's; only once the prefetched batches are used up does the loop
run at the workers' pace, often several times slower. No step time can show that rate before
then; the workers' own clocks can.

``BatchClock.attach`` wraps the loader's ``collate_fn`` (public and settable; the iterator hands
it to every worker it starts) with ``TimedCollate``: inside a worker, after each batch is
collated, the worker writes ``time.monotonic()`` and its own CPU time (``time.process_time()``)
into its own slots of shared memory (one writer per slot: no lock), and at its first batch when
its process started (``process_start_s``). Each worker's consecutive
finish times are its batch production times while it is busy; the CPU times are what a batch
costs it whatever else competes for the cores (the training process, ets-hook's own capture).
The wrapper is picklable while a worker process is spawned (``spawn`` and
``forkserver`` contexts) and inherited under ``fork``; in the training process itself (a loader
without workers, or a worker-less iterator) it records nothing. It stops recording after
``SLOTS_PER_WORKER`` batches per worker (the window's early steps are what it is for) and never
raises from its own bookkeeping: the user's ``collate_fn`` is called exactly as before.

Interpretation (the rate, and what it bounds) lives in ``forecast.input_supply``.
"""

from __future__ import annotations

import logging
import os
import time
from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawArray
from typing import Any

import torch.utils.data

logger = logging.getLogger(__name__)

#: Finish times kept per worker (ids above ``MAX_WORKERS - 1`` are not recorded).
SLOTS_PER_WORKER = 64
#: Workers whose batches are timed.
MAX_WORKERS = 32


def process_start_s() -> float:
    """When this process started, on ``time.monotonic()``'s clock, seconds.

    On Linux from ``/proc/self/stat`` (the start in clock ticks since boot, 10 ms apart, against
    ``CLOCK_BOOTTIME``): a process that waited (for a core, for files) before it ran still
    started then. Elsewhere now minus its CPU time (``time.process_time()``, which starts at 0
    with the process): a later start than the true one wherever it waited.

    Returns:
        The start; never later than now. Never raises.
    """
    now_s = time.monotonic()
    try:
        with open("/proc/self/stat", "rb") as stat:
            # Fields after the command name (which may hold spaces and parentheses): the 22nd
            # field of the file, starttime, is the 20th of these.
            fields = stat.read().rsplit(b")", 1)[1].split()
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return now_s - max(age_s, 0.0)
    except Exception:  # not Linux, no /proc: the CPU time's later bound
        return now_s - time.process_time()


class TimedCollate:
    """A ``collate_fn`` that calls the user's and, inside a worker, records when it finished.

    Attributes:
        collate_fn: the wrapped callable (the loader's original ``collate_fn``).
        clock: the ``BatchClock`` that reads what it records (None in a worker process).
    """

    def __init__(
        self,
        collate_fn: Any,
        times: Any,
        cpu_times: Any,
        counts: Any,
        workers: int,
        process_starts: Any = None,
    ) -> None:
        """Wrap ``collate_fn``.

        Args:
            collate_fn: the loader's ``collate_fn``.
            times: shared ``double`` array of ``workers * SLOTS_PER_WORKER`` finish times.
            cpu_times: shared ``double`` array alike, the worker's CPU time at each finish.
            counts: shared ``int`` array of ``workers`` counts.
            workers: worker ids recorded: ``0 .. workers - 1``.
            process_starts: shared ``double`` array of ``workers`` process starts
                (``process_start_s``), written with each worker's first recorded batch;
                None: not recorded.
        """
        self.collate_fn = collate_fn
        self._times = times
        self._cpu_times = cpu_times
        self._counts = counts
        self._workers = workers
        self._process_starts = process_starts
        self.clock: BatchClock | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled while a worker process is spawned: the whole clock (its shared arrays may
        # travel then). Any other pickle or copy (``copy.deepcopy(loader)``, a loader saved
        # with the model) gets the user's ``collate_fn`` alone: shared memory cannot be stored.
        if get_spawning_popen() is not None:
            return (
                TimedCollate,
                (
                    self.collate_fn,
                    self._times,
                    self._cpu_times,
                    self._counts,
                    self._workers,
                    self._process_starts,
                ),
            )
        return (_untimed, (self.collate_fn,))

    def __call__(self, batch: Any) -> Any:
        out = self.collate_fn(batch)
        try:
            info = torch.utils.data.get_worker_info()
            if info is not None and 0 <= info.id < self._workers:
                n = self._counts[info.id]
                if n < SLOTS_PER_WORKER:
                    slot = info.id * SLOTS_PER_WORKER + n
                    self._times[slot] = time.monotonic()
                    self._cpu_times[slot] = time.process_time()
                    if n == 0 and self._process_starts is not None:
                        self._process_starts[info.id] = process_start_s()
                    self._counts[info.id] = n + 1
        except Exception:  # never the user's batch's problem
            pass
        return out


def _untimed(collate_fn: Any) -> Any:
    """A ``TimedCollate`` copied outside a worker's spawning: the user's ``collate_fn``."""
    return collate_fn


class BatchClock:
    """The finish times of the batches a loader's workers produced (module docs).

    Attributes:
        loader: the ``DataLoader`` it was attached to (``detach`` also restores loaders made
            from it that carry the same wrapper: a framework's copy for a distributed sampler).
        num_workers: the loader's ``num_workers``.
        workers: the workers recorded (the first ``MAX_WORKERS``).
    """

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:
        """Prefer ``attach``, which checks the loader first.

        Args:
            loader: a ``DataLoader`` with ``num_workers > 0``.
        """
        self.loader = loader
        self.num_workers = int(loader.num_workers)
        self.workers = min(self.num_workers, MAX_WORKERS)
        self._times = RawArray("d", self.workers * SLOTS_PER_WORKER)
        self._cpu_times = RawArray("d", self.workers * SLOTS_PER_WORKER)
        self._counts = RawArray("i", self.workers)
        self._process_starts = RawArray("d", self.workers)
        self._reading: tuple[list[list[float]], list[list[float]]] = ([], [])
        self._reading_counts: list[int] | None = None  # the counts ``_reading`` was made at
        self._original = loader.collate_fn
        self._wrapper = TimedCollate(
            self._original,
            self._times,
            self._cpu_times,
            self._counts,
            self.workers,
            self._process_starts,
        )
        self._wrapper.clock = self
        self._loaders = [loader]  # every loader found carrying the wrapper
        loader.collate_fn = self._wrapper

    @classmethod
    def attach(cls, loader: Any) -> BatchClock | None:
        """Time ``loader``'s worker batches from its next ``iter()`` on.

        Args:
            loader: anything (the hook's ``dataloader`` argument); an adapter that iterates
                another loader (Accelerate's ``DataLoaderShard``: ``base_dataloader``) is timed
                through that one.

        Returns:
            The clock; the clock already attached where the loader's ``collate_fn`` is timed
            (attached earlier, e.g. by a framework callback before the loader's first
            ``iter()``: both read the same batches); None when there is nothing to time or it
            cannot be done: not a ``torch.utils.data.DataLoader``, no worker processes, or
            persistent workers already started (their iterator exists: it holds the old
            ``collate_fn``). Never raises.
        """
        try:
            loader = _iterated_loader(loader)
            if not isinstance(loader, torch.utils.data.DataLoader):
                return None
            workers = loader.num_workers
            if not isinstance(workers, int) or workers < 1:
                return None
            if isinstance(loader.collate_fn, TimedCollate):  # attached before: read that one
                clock = loader.collate_fn.clock
                if clock is not None and all(known is not loader for known in clock._loaders):
                    clock._loaders.append(loader)  # a copy of the loader: given back too
                return clock
            if getattr(loader, "_iterator", None) is not None:
                return None
            return cls(loader)
        except Exception as exc:  # a loader subclass that refuses the attribute, no shm, ...
            logger.debug("DataLoader batch clock not attached: %r", exc)
            return None

    @staticmethod
    def attached_to(loader: Any) -> BatchClock | None:
        """The clock whose wrapper ``loader`` (or the loader it adapts) collates with.

        Returns:
            That clock; None for an untimed loader or anything else. Never raises.
        """
        try:
            collate = getattr(_iterated_loader(loader), "collate_fn", None)
            return collate.clock if isinstance(collate, TimedCollate) else None
        except Exception:  # an adapter whose attributes raise: not timed by us
            return None

    def read(self) -> tuple[list[list[float]], list[list[float]]]:
        """Each worker's batch finish times and CPU times so far.

        Returns:
            ``(finish_times_s, cpu_times_s)`` (the same object while no worker recorded a
            batch): one list per worker id (empty for ids from ``MAX_WORKERS`` on), in
            recording order, of
            ``time.monotonic()`` and of the worker's ``time.process_time()`` at each batch's
            finish, seconds (increasing within an iterator; a non-persistent loader's workers
            start again at each epoch under the same ids, their CPU times from 0).
        """
        counts = self._counts[:]
        if counts == self._reading_counts:
            return self._reading
        finish: list[list[float]] = []
        cpu: list[list[float]] = []
        for worker in range(self.workers):
            n = min(max(counts[worker], 0), SLOTS_PER_WORKER)
            base = worker * SLOTS_PER_WORKER
            finish.append(list(self._times[base : base + n]))
            cpu.append(list(self._cpu_times[base : base + n]))
        unrecorded = self.num_workers - self.workers  # they count, at the others' pace
        self._reading = (
            finish + [[] for _ in range(unrecorded)],
            cpu + [[] for _ in range(unrecorded)],
        )
        self._reading_counts = counts
        return self._reading

    def first_batch_wait_s(self, now_s: float, hook_created_s: float) -> float | None:
        """The first epoch's start-up as the training loop waited for it, seconds: from the
        first worker's start (``process_start_s``) to ``now_s`` (the first training forward),
        read at the first training step.

        Where the first batch was ready before the hook existed, something held it before
        training began (a framework's prefetch, the user looking at one batch): only its
        making counts, up to the first batch's finish. Where a worker did not record its start
        (``TimedCollate`` without starts), the start is taken from its CPU time: a lower bound
        on the wait.

        Args:
            now_s: ``time.monotonic()`` now (the first training forward).
            hook_created_s: when the hook was created, on the same clock.

        Returns:
            The wait (>= 0); None before any worker recorded a batch.
        """
        finish, cpu = self.read()
        firsts = []
        for worker, (f, c) in enumerate(zip(finish, cpu, strict=False)):
            if f and c:
                recorded = self._process_starts[worker] if worker < self.workers else 0.0
                start = recorded if 0.0 < recorded <= f[0] else f[0] - c[0]
                firsts.append((start, f[0]))
        if not firsts:
            return None
        start = min(s for s, _ in firsts)
        ready = min(f for _, f in firsts)
        end = now_s if ready >= hook_created_s else ready
        return max(0.0, end - start)

    def detach(self) -> None:
        """Give the loader (and copies of it ``attach`` saw) its own ``collate_fn`` back
        (iterators started since keep timing until their slots are full). Idempotent; never
        raises."""
        for loader in self._loaders:
            try:
                if loader.collate_fn is self._wrapper:
                    loader.collate_fn = self._original
            except Exception as exc:
                logger.debug("DataLoader collate_fn not restored: %r", exc)


def _iterated_loader(loader: Any) -> Any:
    """The loader whose iterator really runs: ``loader``, or the ``base_dataloader`` it wraps
    (Accelerate's adapters iterate that one and only forward attribute reads to it)."""
    for _ in range(4):
        base = getattr(loader, "__dict__", {}).get("base_dataloader")
        if base is None or base is loader:
            return loader
        loader = base
    return loader
