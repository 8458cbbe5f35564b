"""The thin Python face of the native extension ``ets_hook._C``.

What lives here: the record dtype (generated from the C++ field table, never written by hand), the
CUPTI availability status, the ``KernelCollector`` lifecycle wrapper, external-correlation push/pop,
clock alignment and bulk name resolution. Interpreting records (kernels, launches, steps) is
``ets_hook.capture.gpu_records``'s job.

Clocks: every CUPTI record carries CUPTI timestamps. On Linux CUPTI uses ``CLOCK_REALTIME`` (the
``time.time_ns()`` clock) unless a tool registered its own timestamp source, so the offset to the
trace clock is measured, not assumed: ``measure_clock_offset_ns()`` brackets a CUPTI timestamp read
between two ``time.time_ns()`` calls and keeps the tightest of a few samples. Add the offset to a
record's ``start_ns``/``end_ns`` to put it on the ``time.time_ns()`` clock.

Finding libcupti: see ``csrc/cupti_api.h`` for the search order (a libcupti already loaded in the
process first); ``ETS_HOOK_CUPTI_LIBRARY=/path/to/libcupti.so`` overrides it.

Failure policy: nothing here raises into the training loop for CUPTI trouble; every
CUPTI problem becomes a ``CuptiStatus`` with a machine code and a human reason. Bad arguments are
programming errors and raise ``ValueError``.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import glob
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _C

if TYPE_CHECKING:
    pass


def record_dtype_from_fields(fields: Iterable[tuple[str, str, int]], itemsize: int) -> np.dtype:
    """A numpy structured dtype from a ``(name, format, offset)`` table and the record size.

    Args:
        fields: ``(name, numpy format string, byte offset)`` per field, e.g.
            ``_C.record_fields()``; must be non-empty.
        itemsize: size of one record in bytes (padding included).

    Returns:
        The structured dtype; fields may overlap (the record is a tagged union).

    Raises:
        ValueError: ``fields`` is empty, or the fields do not fit in ``itemsize``.
        TypeError: a format string numpy does not understand.
    """
    names, formats, offsets = zip(*fields)
    return np.dtype(
        {
            "names": list(names),
            "formats": list(formats),
            "offsets": list(offsets),
            "itemsize": itemsize,
        }
    )


#: Layout of one ring record; generated from the C++ field table (``csrc/record.h``).
RECORD_DTYPE: np.dtype = record_dtype_from_fields(_C.record_fields(), _C.RECORD_ITEMSIZE)

#: The ring buffer and string table classes of the extension.
RingBuffer = _C.RingBuffer
StringTable = _C.StringTable


class RecordKind(enum.IntEnum):
    """``kind`` of a ring record (mirrors ``ets::RecordKind``; a test checks they agree)."""

    KERNEL = 1
    MEMCPY = 2
    MEMSET = 3
    RUNTIME = 4
    DRIVER = 5
    EXTERNAL_CORRELATION = 6


#: Every ``CuptiStatus.code``.
STATUS_CODES: tuple[str, ...] = (
    "ok",
    "no_headers",
    "no_driver",
    "no_libcupti",
    "version_mismatch",
    "multiple_subscribers",
    "insufficient_privileges",
    "other_client",
    "cupti_error",
    "already_active",
)

#: Activity kinds enabled by default. "driver" is on because kernels launched through the driver
#: API (Triton, cuBLASLt's cuLaunchKernelEx) have no runtime record to tie them to their op.
DEFAULT_ACTIVITIES: tuple[str, ...] = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "driver",
    "external_correlation",
)


@dataclass(frozen=True, slots=True)
class CuptiStatus:
    """Whether CUPTI kernel capture is (or was) possible, and why not when it is not.

    Attributes:
        available: True exactly when ``code == "ok"``.
        code: one of ``STATUS_CODES``.
        reason: a human-readable explanation (also when ok: e.g. the library path).
    """

    available: bool
    code: str
    reason: str

    @classmethod
    def from_native(cls, pair: tuple[str, str]) -> CuptiStatus:
        """The status from a native ``(code, reason)`` pair; available when code is "ok"."""
        code, reason = pair
        return cls(available=code == "ok", code=code, reason=reason)

    @classmethod
    def error(cls, code: str, reason: str) -> CuptiStatus:
        """An unavailable status with this ``code`` (one of ``STATUS_CODES``) and ``reason``."""
        return cls(available=False, code=code, reason=reason)


# ------------------------------------------------------------------------------------------------
# Other CUPTI clients

_ENV_CLIENTS = (
    ("NSYS_PROFILING_SESSION_ID", "Nsight Systems is profiling this process"),
    ("NV_NSIGHT_INJECTION_TRANSPORT_TYPE", "Nsight Compute is profiling this process"),
    ("NVPROF_ID", "nvprof is profiling this process"),
    (
        "CUDA_INJECTION64_PATH",
        "a CUDA injection library (Nsight, DCGM, Kineto daemon) is configured",
    ),
    ("KINETO_USE_DAEMON", "Kineto on-demand tracing (dynolog) may start GPU tracing at any time"),
)


def other_cupti_client() -> str | None:
    """Why another CUPTI client probably owns the activity callbacks, or None.

    CUPTI has one set of activity-buffer callbacks per process; registering ours would silently
    steal them from Nsight Systems/Compute, nvprof or an active torch.profiler (Kineto). Checked:
    their environment variables, an injection library loaded in the process, and an active torch
    profiler session (only when torch is already imported; this never imports torch).

    Returns:
        A human-readable reason naming the evidence (the environment variable and its value, the
        library path or the profiler kind), or None when nothing points to another client
        (also when torch's private profiler query fails).
    """
    for var, what in _ENV_CLIENTS:
        value = os.environ.get(var, "").strip()
        if value and value != "0":
            return f"{what} ({var}={value})"
    for path in _C.loaded_libraries("ToolsInjection"):
        return f"an Nsight injection library is loaded ({path})"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch._C._autograd._profiler_enabled():
                kind = torch._C._autograd._profiler_type()
                return (
                    f"a torch profiler session is active ({kind}); with CUDA activities its "
                    "Kineto backend owns CUPTI's activity buffers"
                )
        except Exception:  # private API moved: no evidence either way
            return None
    return None


def cupti_library_dirs() -> list[str]:
    """Library folders of pip-installed NVIDIA wheels (``nvidia/*/lib``) on ``sys.path``.

    Passed to the native loader as the last place to look for libcupti.

    Returns:
        Folders holding a ``libcupti.so*``, in ``sys.path`` order, without duplicates.
    """
    dirs: list[str] = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            found = glob.glob(str(base / "*" / "lib" / "libcupti.so*"))
            dirs.extend(sorted(os.path.dirname(p) for p in found))
    return list(dict.fromkeys(dirs))


def cupti_status(*, allow_other_client: bool = False) -> CuptiStatus:
    """Could a ``KernelCollector`` start now? Never raises.

    The native probe checks, in order: CUPTI headers compiled in, the NVIDIA driver (libcuda,
    ``cuInit``, a visible GPU), libcupti, its version, and whether another CUPTI subscriber exists.
    Then the Python-side evidence of another client (``other_cupti_client``) unless allowed.

    Args:
        allow_other_client: skip the Python-side check for another CUPTI client.

    Returns:
        The status; ``code`` is "cupti_error" when the native probe itself raised.
    """
    try:
        status = CuptiStatus.from_native(_C.cupti_probe(cupti_library_dirs()))
    except Exception as exc:
        return CuptiStatus.error("cupti_error", f"CUPTI probe failed: {exc!r}")
    if status.available and not allow_other_client:
        other = other_cupti_client()
        if other is not None:
            return CuptiStatus.error("other_client", other)
    return status


# ------------------------------------------------------------------------------------------------
# Names, external correlation, clocks


def name_table() -> StringTable:
    """The process-wide string table the collector interns kernel names into."""
    return _C.names()


def resolve_names(
    name_ids: Sequence[int] | np.ndarray, *, table: StringTable | None = None
) -> list[str]:
    """Names for many ids at once (each distinct id is resolved once).

    Args:
        name_ids: string-table ids (any shape; flattened), e.g. a record array's ``name_id``.
        table: the table to resolve in; None (or an empty table, which is falsy) means the
            process-wide ``name_table()``.

    Returns:
        One name per id, in input order (UTF-8 decoded with replacement).

    Raises:
        ValueError: an id is negative or not in the table.
    """
    ids = np.asarray(name_ids, dtype=np.int64).ravel()
    if ids.size == 0:
        return []
    unique, inverse = np.unique(ids, return_inverse=True)
    resolved = (table or name_table()).resolve_many(unique)
    return [resolved[i] for i in inverse.tolist()]


def push_external_id(external_id: int) -> bool:
    """Tag CUDA API calls made next on this thread with ``external_id`` (until popped).

    False when CUPTI is not loaded (nothing to tag). Records of kind EXTERNAL_CORRELATION map the
    CUPTI correlation ids of those calls to ``external_id`` (external kind CUSTOM2).

    Args:
        external_id: the id to push, in ``[0, 2**64)``.

    Returns:
        True when CUPTI accepted the push; False when libcupti is not loaded or CUPTI refused.

    Raises:
        ValueError: ``external_id`` is outside ``[0, 2**64)``.
    """
    if not 0 <= external_id < 2**64:
        raise ValueError(f"external_id must be in [0, 2**64), got {external_id}")
    return bool(_C.push_external_id(external_id))


def pop_external_id() -> int | None:
    """Pop this thread's innermost external id.

    Returns:
        The popped id; None when none is pushed, libcupti is not loaded or CUPTI reports an error.
    """
    value = _C.pop_external_id()
    return None if value is None else int(value)


def correlation_api() -> Any:
    """The external-correlation push/pop as a capsule of C function pointers.

    The native operator observer (``capture.ops.NativeOpCapture``) calls them on every op start
    and end, without Python, so each kernel links to the op that launched it.

    Returns:
        An opaque capsule (``"ets_hook._C.correlation_api"``).
    """
    return _C.correlation_api()


def cupti_timestamp_ns() -> int | None:
    """CUPTI's clock now in ns (``cuptiGetTimestamp``).

    Returns:
        The timestamp; None when libcupti is not loaded or the call fails.
    """
    value = int(_C.cupti_timestamp_ns())
    return None if value < 0 else value


def _clock_samples(samples: int) -> list[tuple[int, int]]:
    """``(bracket width, offset)`` pairs; empty when libcupti is not loaded."""
    out = []
    for _ in range(samples):
        before = time.time_ns()
        cupti = _C.cupti_timestamp_ns()
        after = time.time_ns()
        if cupti < 0:
            return []
        out.append((after - before, (before + after) // 2 - cupti))
    return out


def measure_clock_offset_ns(samples: int = 9) -> int | None:
    """``time.time_ns() - CUPTI clock``, from the tightest of ``samples`` bracketed reads.

    Args:
        samples: number of bracketed reads, >= 1.

    Returns:
        The offset in ns (add it to a CUPTI timestamp to get ``time.time_ns()`` time); None when
        libcupti is not loaded.

    Raises:
        ValueError: ``samples`` < 1.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    measured = _clock_samples(samples)
    return min(measured)[1] if measured else None


#: The external-correlation kind ets-hook pushes its op ids under (``push_external_id``).
EXTERNAL_CORRELATION_KIND: int = int(_C.EXTERNAL_CORRELATION_KIND)


def demangle_names(names: Sequence[str]) -> list[str]:
    """C++ kernel names demangled (``_Z...`` -> ``void foo<float>(...)``); others unchanged.

    Args:
        names: kernel names as CUPTI reports them.

    Returns:
        One display name per input name, in order.
    """
    return list(_C.demangle(list(names)))


#: CUPTI memcpy kind -> direction ("HtoD", ...), for display names of memcpy records.
MEMCPY_KIND_NAMES: dict[int, str] = dict(_C.memcpy_kind_names())


# ------------------------------------------------------------------------------------------------
# Collector


@dataclass(frozen=True, slots=True)
class CollectorStats:
    """Counters of one collection session (see ``csrc/activity_collector.h``).

    Attributes:
        buffers_requested: activity buffers CUPTI asked for.
        buffers_completed: buffers CUPTI handed back.
        buffers_starved: requests refused because every pool buffer was outstanding.
        foreign_buffers: completed buffers this collector did not hand out (left alone).
        records_decoded: records written to the ring.
        records_skipped: records of activity kinds that are not decoded.
        buffers_discarded: buffers completed while no ring was attached.
        ring_dropped: records lost because the ring was full.
        cupti_dropped: records CUPTI had no buffer space for.
        decode_errors: buffers where reading the next record failed midway.
        buffers_outstanding: buffers handed to CUPTI and not yet returned.
    """

    buffers_requested: int = 0
    buffers_completed: int = 0
    buffers_starved: int = 0
    foreign_buffers: int = 0
    records_decoded: int = 0
    records_skipped: int = 0
    buffers_discarded: int = 0
    ring_dropped: int = 0
    cupti_dropped: int = 0
    decode_errors: int = 0
    buffers_outstanding: int = 0

    @property
    def dropped(self) -> int:
        """Records lost: ring full plus records CUPTI could not buffer."""
        return self.ring_dropped + self.cupti_dropped


_active_lock = threading.RLock()  # re-entrant: close() may run in a SIGTERM handler
_active: KernelCollector | None = None  # guarded by _active_lock
_last_started: KernelCollector | None = None  # whose session the native counters describe


class KernelCollector:
    """One CUPTI activity collection session (kernels, memcpy/memset, runtime launches).

    CUPTI allows one collection per process: a second ``start()`` while another collector runs
    returns the status ``already_active``. ``start``/``flush``/``stop`` never raise for CUPTI
    trouble; they return a ``CuptiStatus``. Call ``torch.cuda.synchronize()`` before the final
    ``flush()``/``stop()`` so every kernel record is complete (incomplete ones carry 0 timestamps
    and are skipped by ``capture.gpu_records``).
    """

    def __init__(
        self,
        *,
        ring_capacity: int = 1 << 20,
        buffer_size_bytes: int = 4 << 20,
        buffer_count: int = 8,
        activities: Iterable[str] = DEFAULT_ACTIVITIES,
        allow_other_client: bool = False,
    ) -> None:
        """Configure a collector; nothing is allocated or started until ``start()``.

        Args:
            ring_capacity: records the ring holds before it drops, in ``[1, 2**28]``.
            buffer_size_bytes: size of each CUPTI activity buffer, in ``[4096, 2**30]``.
            buffer_count: activity buffers in the pool, in ``[2, 1024]``.
            activities: activity kinds to enable, a non-empty subset of
                ``_C.activity_names()`` (default ``DEFAULT_ACTIVITIES``).
            allow_other_client: start even when another CUPTI client seems present (skips
                ``other_cupti_client`` and the native subscriber probe).

        Raises:
            ValueError: a size or count is out of range, or ``activities`` is empty or names an
                unknown kind.
        """
        if not 1 <= ring_capacity <= 1 << 28:
            raise ValueError(f"ring_capacity must be in [1, 2**28], got {ring_capacity}")
        if not 4096 <= buffer_size_bytes <= 1 << 30:
            raise ValueError(f"buffer_size_bytes must be in [4096, 2**30], got {buffer_size_bytes}")
        if not 2 <= buffer_count <= 1024:
            raise ValueError(f"buffer_count must be in [2, 1024], got {buffer_count}")
        self._activities = tuple(activities)
        known = set(_C.activity_names())
        unknown = [a for a in self._activities if a not in known]
        if unknown or not self._activities:
            raise ValueError(
                f"activities must be a non-empty subset of {sorted(known)}, got {self._activities}"
            )
        self._ring_capacity = ring_capacity
        self._buffer_size_bytes = buffer_size_bytes
        self._buffer_count = buffer_count
        self._allow_other_client = allow_other_client
        self._ring: RingBuffer | None = None
        self._status = CuptiStatus.error("cupti_error", "not started")
        self._active = False
        self._stats = CollectorStats()
        self._offsets: list[tuple[int, int]] = []  # (bracket width, offset) samples

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> CuptiStatus:
        """Enable collection; a no-op returning the current status when already active.

        Never raises: a failure (another collector active, another CUPTI client, CUPTI errors,
        no memory for the ring) is returned as the status.

        Returns:
            The status; ``available`` is True when collection started.
        """
        global _active, _last_started
        if self._active:
            return self._status
        with _active_lock:
            if _active is not None:
                self._status = CuptiStatus.error(
                    "already_active", "another KernelCollector is collecting in this process"
                )
                return self._status
            if not self._allow_other_client:
                other = other_cupti_client()
                if other is not None:
                    self._status = CuptiStatus.error("other_client", other)
                    return self._status
            try:
                if self._ring is None:
                    self._ring = RingBuffer(self._ring_capacity)
                status = CuptiStatus.from_native(
                    _C.cupti_start(
                        self._ring,
                        self._buffer_size_bytes,
                        self._buffer_count,
                        list(self._activities),
                        probe_subscriber=not self._allow_other_client,
                        extra_dirs=cupti_library_dirs(),
                    )
                )
            except Exception as exc:  # MemoryError for the ring, or an unexpected native error
                status = CuptiStatus.error(
                    "cupti_error", f"could not start CUPTI collection: {exc!r}"
                )
            self._status = status
            if status.available:
                self._active = True
                _active = _last_started = self
                self._sample_clock()
            return status

    def flush(self, forced: bool = True) -> CuptiStatus:
        """Deliver buffered activity records into the ring (``cuptiActivityFlushAll``).

        Runs CUPTI's callbacks on this thread; call it off the training thread where possible.
        Never raises.

        Args:
            forced: also deliver buffers holding incomplete records.

        Returns:
            The flush status; before ``start()`` (no ring) or after ``close()``, the last status.
        """
        if self._ring is None:
            return self._status
        try:
            status = CuptiStatus.from_native(_C.cupti_flush(forced))
        except Exception as exc:
            status = CuptiStatus.error("cupti_error", f"flush failed: {exc!r}")
        self._sample_clock()
        return status

    def stop(self, *, flush: bool = True) -> CuptiStatus:
        """Disable the activity kinds and flush every buffer back. Idempotent.

        ``flush=False`` skips the (blocking) final flush so the training thread returns at once;
        ``collect()``/``flush()`` must then run before another CUPTI client starts. Never raises.

        Args:
            flush: flush every buffer into the ring before returning.

        Returns:
            The stop status; when not active, the last status.
        """
        global _active
        if not self._active:
            return self._status
        try:
            status = CuptiStatus.from_native(_C.cupti_stop(flush))
        except Exception as exc:
            status = CuptiStatus.error("cupti_error", f"stop failed: {exc!r}")
        self._sample_clock()
        self.stats()
        with _active_lock:
            self._active = False
            if _active is self:
                _active = None
        return status

    def close(self) -> None:
        """Stop (with the blocking flush) if needed and release the ring.

        Records not drained are lost. Never raises; ``start()`` may be called again afterwards.
        """
        self.stop()
        if self._ring is not None:
            with contextlib.suppress(Exception):
                _C.cupti_detach(self._ring)
            self._ring = None

    def __enter__(self) -> KernelCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ----------------------------------------------------------------------------

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Remove and return the records in the ring, oldest first.

        Args:
            max_records: at most this many (>= 0); None for all.

        Returns:
            A 1-D ``RECORD_DTYPE`` array; empty before ``start()`` and after ``close()``.

        Raises:
            ValueError: ``max_records`` < 0.
        """
        if max_records is not None and max_records < 0:
            raise ValueError(f"max_records must be >= 0, got {max_records}")
        if self._ring is None:
            return np.empty(0, dtype=RECORD_DTYPE)
        return self._ring.drain(-1 if max_records is None else max_records)

    def collect(self) -> tuple[np.ndarray, int, int]:
        """Flush (forced) and drain everything collected. Never raises.

        Returns:
            ``(records, clock_offset_ns, dropped)``: the ``RECORD_DTYPE`` records, oldest first
            (``capture.gpu_records.decode_activity`` interprets them); the offset
            ``time.time_ns() - CUPTI clock`` this collector measured (0 when it measured none);
            the records lost so far.
        """
        self.flush()
        records = self.drain()
        return records, self.clock_offset_ns or 0, self.dropped

    @property
    def status(self) -> CuptiStatus:
        """Status of the last start/flush/stop."""
        return self._status

    @property
    def active(self) -> bool:
        """Whether this collector is collecting (between a successful start and stop)."""
        return self._active

    @property
    def ring(self) -> RingBuffer | None:
        """The ring records land in; None before the first ``start()`` and after ``close()``."""
        return self._ring

    @property
    def clock_offset_ns(self) -> int | None:
        """``time.time_ns() - CUPTI clock`` in ns from samples taken at start/flush/stop
        (tightest sample); None when none could be taken."""
        if not self._offsets:
            return None
        return min(self._offsets)[1]

    @property
    def dropped(self) -> int:
        """Records lost so far (ring full + CUPTI out of buffer space)."""
        return self.stats().dropped

    def stats(self) -> CollectorStats:
        """Counters of this collector's session (frozen once another collector starts).

        Never raises: when the native read fails, the last counters read are returned.
        """
        if _last_started is self:
            with contextlib.suppress(Exception):
                raw: dict[str, Any] = _C.cupti_stats()
                self._stats = CollectorStats(**{k: int(v) for k, v in raw.items()})
        return self._stats

    # -- internals --------------------------------------------------------------------------

    def _sample_clock(self) -> None:
        with contextlib.suppress(Exception):
            self._offsets.extend(_clock_samples(5))


def _stop_active_at_exit() -> None:
    collector = _active
    if collector is not None:
        collector.stop()


atexit.register(_stop_active_at_exit)
