"""Compile events: when ``torch.compile`` compiled, and for how long, on ``perf_counter_ns``.

``CompileWatcher`` registers a start and an end callback with dynamo's compile-callback handler
(``torch._dynamo.callback.callback_handler``) and keeps the (start_ns, end_ns) intervals, a
running total and a count, so that the hook can take compile time out of step times (a phase
named "compile"), treat steps that compiled as warm-up and postpone the capture window while
steps still compile.

``torch._dynamo`` takes ~1.4 s to import: this module never imports it (nor torch). It registers
only once ``torch._dynamo`` is in ``sys.modules`` (``torch.compile`` imports it); call
``ensure_registered`` at hook creation, at the first forward and at early step boundaries: it
costs a dict lookup while dynamo is absent and a membership test in a list of a few callbacks
once registered.

What the callbacks bracket (torch 2.13, CPU, default inductor backend; measured on small
MLP/CNN training loops, see ``tests/capture/test_compile_events.py``):

- every frame compile (trigger ``DYNAMO``): dynamo tracing, AOTAutograd, inductor's codegen and
  C++ build of the forward graph, cache hits of the FX/AOTAutograd caches, and the backward
  graph too where it is compiled with the forward (dynamic shapes);
- the backward graph AOTAutograd compiles lazily at the first ``backward()`` (``LAZY_BACKWARD``;
  on a GPU it may run on the autograd engine's thread);
- recompiles: guard failures (a new batch size, ``eval()``/``no_grad``, a graph break's resume
  function) are new ``DYNAMO`` compiles, their compile id's attempt is > 0 (``is_recompile``);
- CUDA graph recording (``CUDAGRAPH_RECORDING``, ``mode="reduce-overhead"``, GPU only).

On a cold cache the first step's DYNAMO + LAZY_BACKWARD intervals covered 99.7% of its time
(MLP: 13.44 s of 13.47 s; the rest is eager work: the first optimizer step, allocations).

Not bracketed: dynamo's own import (~1 s, inside the user's ``torch.compile()`` call), guard
evaluation on every call (microseconds), runtime Triton autotuning (GPU; its trigger is disabled
in torch), and the compile-worker pool that keeps starting in the background after a compile.

The handler runs start callbacks only when no compile is pending and end callbacks when the last
pending one ends, so overlapping compiles (two threads) make one interval and intervals never
overlap. ``torch._dynamo.reset()`` empties the handler's lists: ``ensure_registered`` then
registers again. Compiles that finished before the first registration (dynamo imported after the
watcher was created, e.g. ``torch.compile`` called after ``ETSHook``) are recovered once from
dynamo's ``compilation_time_metrics`` as one ``BACKFILLED`` event ending at the registration.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

logger = logging.getLogger("ets_hook")

#: The module whose presence in ``sys.modules`` means ``torch.compile`` may run.
DYNAMO_MODULE = "torch._dynamo"
_CALLBACK_MODULE = "torch._dynamo.callback"
_UTILS_MODULE = "torch._dynamo.utils"

#: ``torch._dynamo.utils.compilation_time_metrics`` keys (lists of seconds) of the work the
#: callbacks bracket: frame compiles and lazy backward compiles. Read once, for the backfill.
BACKFILL_METRICS = ("_compile.compile_inner", "backward._backward_impl")

#: ``trigger`` of the event that stands for compiles that ran before registration.
BACKFILLED = "BACKFILLED"


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` has been imported (by ``torch.compile`` or anyone); O(1)."""
    return DYNAMO_MODULE in sys.modules


class CompileEvent(NamedTuple):
    """One compile interval on the ``time.perf_counter_ns`` clock.

    Attributes:
        start_ns: when the outermost compile began.
        end_ns: when the last overlapping compile ended.
        trigger: dynamo's ``CallbackTrigger`` name at the start (``"DYNAMO"``,
            ``"LAZY_BACKWARD"``, ``"CUDAGRAPH_RECORDING"``, ...), ``BACKFILLED``, or
            ``"UNKNOWN"``.
        compile_id: dynamo's compile id, ``"<frame>/<attempt>"`` (e.g. ``"0/1"``: the first
            recompile of frame 0; lazy backward compiles carry their forward's id); ``""`` if
            unknown.
    """

    start_ns: int
    end_ns: int
    trigger: str
    compile_id: str

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns

    @property
    def is_recompile(self) -> bool:
        """Whether the compile id names a second or later compile of its frame (a guard
        failure); False when the id cannot be read."""
        attempt = self.compile_id.rsplit("/", 1)[-1].split("_", 1)[0].strip("[]! ")
        return attempt.isdigit() and int(attempt) > 0


class CompileWatcher:
    """Hears dynamo's compile start/end callbacks and answers how much compiling happened when.

    Thread-safe: the callbacks may come from any thread (the autograd engine's on a GPU); queries
    come from the training thread. No method raises: a failure is logged once on
    ``logging.getLogger("ets_hook")`` and the method returns its neutral value.

    Memory is bounded: the newest ``max_events`` intervals are kept (``dropped`` counts older
    ones); ``total_ns`` and ``count`` stay exact.
    """

    def __init__(
        self, max_events: int = 1024, clock: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        """Create a watcher; nothing is registered until ``ensure_registered``.

        Args:
            max_events: intervals kept, >= 1.
            clock: the nanosecond clock of the intervals (must be the clock the step times
                are taken with; tests pass a fake).

        Raises:
            ValueError: ``max_events`` is not an int >= 1.
        """
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be an int >= 1, got {max_events!r}")
        self._clock = clock
        self._lock = threading.Lock()  # guards every field below that callbacks touch
        self._events: deque[CompileEvent] = deque(maxlen=max_events)
        self._open: tuple[int, str, str] | None = None  # (start_ns, trigger, compile_id)
        self._total_ns = 0
        self._count = 0
        self._dropped = 0
        self._last_end_ns: int | None = None
        self._handler: Any = None  # dynamo's CompilationCallbackHandler, once registered
        self._closed = False
        self._failed = False
        # Dynamo absent now: whatever it compiles before we register happens after this point.
        self._backfill_pending = not dynamo_loaded()
        # Bound once: the handler's lists are searched and edited with these very objects.
        self._start_callback = self.on_compile_start
        self._end_callback = self.on_compile_end

    # -- registration ----------------------------------------------------------------------

    def ensure_registered(self) -> bool:
        """Register the callbacks with dynamo if it is loaded and they are not registered.

        Cheap enough for every early step: a dict lookup while dynamo is absent, a membership
        test in the handler's short list once registered. Registers again after
        ``torch._dynamo.reset()`` emptied the handler's lists. The first registration of a
        watcher created before dynamo was loaded adds the ``BACKFILLED`` event.

        Returns:
            Whether the callbacks are registered now (False: dynamo not loaded, closed, or a
            failure, logged once).
        """
        handler = self._handler
        try:
            if handler is not None and self._start_callback in handler.start_callbacks:
                return True
            if self._closed:
                return False
            module = sys.modules.get(_CALLBACK_MODULE)
            handler = getattr(module, "callback_handler", None) if module is not None else None
            if handler is None:  # dynamo absent, or still being imported
                return False
            with self._lock:
                if self._open is not None:  # reset() dropped our end callback mid-compile
                    self._close_interval(self._clock())
            # End first: a compile already running then ends unheard instead of never ending.
            if self._end_callback not in handler.end_callbacks:
                handler.register_end_callback(self._end_callback)
            if self._start_callback not in handler.start_callbacks:
                handler.register_start_callback(self._start_callback)
            self._handler = handler
            if self._backfill_pending:
                self._backfill_pending = False
                self._backfill()
            return True
        except Exception as exc:
            self._fail(exc)
            return False

    @property
    def registered(self) -> bool:
        """Whether the callbacks are in dynamo's handler now."""
        handler = self._handler
        try:
            return handler is not None and self._start_callback in handler.start_callbacks
        except Exception:
            return False

    def close(self) -> None:
        """Unregister the callbacks (safe to call twice; never raises). Intervals recorded so
        far stay readable; nothing is recorded after."""
        self._closed = True
        handler, self._handler = self._handler, None
        if handler is None:
            return
        with contextlib.suppress(Exception):
            while self._start_callback in handler.start_callbacks:
                handler.remove_start_callback(self._start_callback)
        with contextlib.suppress(Exception):
            while self._end_callback in handler.end_callbacks:
                handler.remove_end_callback(self._end_callback)

    # -- dynamo's callbacks (public so tests can drive them without dynamo) -----------------

    def on_compile_start(self, args: Any = None) -> None:
        """Dynamo's start callback: a compile begins (the first of overlapping ones).

        Args:
            args: dynamo's ``CallbackArgs`` (``callback_trigger``, ``compile_id``); None or
                anything else is accepted (older torch passes nothing).
        """
        try:
            now_ns = self._clock()
            if self._closed:
                return
            trigger = getattr(getattr(args, "callback_trigger", None), "name", None)
            compile_id = getattr(args, "compile_id", None)
            with self._lock:
                if self._open is None:
                    self._open = (
                        now_ns,
                        str(trigger) if trigger else "UNKNOWN",
                        str(compile_id) if compile_id is not None else "",
                    )
        except Exception as exc:
            self._fail(exc)

    def on_compile_end(self, args: Any = None) -> None:
        """Dynamo's end callback: the last pending compile ended; records the interval.

        An end without a start (a compile that began before registration) is ignored.

        Args:
            args: dynamo's ``CallbackArgs``, unused.
        """
        try:
            now_ns = self._clock()
            with self._lock:
                if self._closed:
                    self._open = None
                else:
                    self._close_interval(now_ns)
        except Exception as exc:
            self._fail(exc)

    # -- queries -----------------------------------------------------------------------------

    @property
    def total_ns(self) -> int:
        """Compile nanoseconds of all completed intervals (dropped ones included)."""
        return self._total_ns

    @property
    def count(self) -> int:
        """Completed intervals so far (dropped ones included); compare with a saved value to
        learn cheaply whether anything compiled since."""
        return self._count

    @property
    def dropped(self) -> int:
        """Intervals no longer kept because more than ``max_events`` were recorded."""
        return self._dropped

    @property
    def in_progress(self) -> bool:
        """Whether a compile is running now."""
        return self._open is not None

    @property
    def last_end_ns(self) -> int | None:
        """When the latest completed interval ended, or None."""
        return self._last_end_ns

    @property
    def events(self) -> list[CompileEvent]:
        """The kept completed intervals, oldest first (a copy)."""
        with self._lock:
            return list(self._events)

    def compile_ns_in(self, start_ns: int, end_ns: int) -> int:
        """Compile nanoseconds inside ``[start_ns, end_ns)``, a running compile included (up
        to now).

        Args:
            start_ns: window start on the watcher's clock.
            end_ns: window end on the watcher's clock.

        Returns:
            The overlap of the intervals with the window (0 for an empty window, or on a
            failure, logged once). Windows reaching back past dropped intervals miss them.
        """
        try:
            if end_ns <= start_ns:
                return 0
            total = 0
            with self._lock:
                if self._open is not None:
                    total += _overlap(self._open[0], self._clock(), start_ns, end_ns)
                for event in reversed(self._events):  # ordered by end: stop at the window
                    if event.end_ns <= start_ns:
                        break
                    total += _overlap(event.start_ns, event.end_ns, start_ns, end_ns)
            return total
        except Exception as exc:
            self._fail(exc)
            return 0

    def events_in(self, start_ns: int, end_ns: int) -> list[CompileEvent]:
        """The completed intervals that overlap ``[start_ns, end_ns)``, oldest first.

        Args:
            start_ns: window start on the watcher's clock.
            end_ns: window end on the watcher's clock.

        Returns:
            The intervals (whole, not clipped); empty on a failure, logged once.
        """
        try:
            found: list[CompileEvent] = []
            with self._lock:
                for event in reversed(self._events):
                    if event.end_ns <= start_ns:
                        break
                    if event.start_ns < end_ns:
                        found.append(event)
            found.reverse()
            return found
        except Exception as exc:
            self._fail(exc)
            return []

    # -- internals ---------------------------------------------------------------------------

    def _close_interval(self, now_ns: int) -> None:
        """Turn the open interval into an event; the caller holds ``_lock``."""
        if self._open is None:
            return
        start_ns, trigger, compile_id = self._open
        self._open = None
        self._append(CompileEvent(start_ns, max(now_ns, start_ns), trigger, compile_id))

    def _append(self, event: CompileEvent) -> None:
        """Record one completed interval; the caller holds ``_lock``."""
        if len(self._events) == self._events.maxlen:
            self._dropped += 1
        self._events.append(event)
        self._total_ns += event.duration_ns
        self._count += 1
        self._last_end_ns = event.end_ns

    def _backfill(self) -> None:
        """One ``BACKFILLED`` event, ending now, for the compile time dynamo measured before
        we registered (all of it after this watcher's creation: dynamo was absent then)."""
        utils = sys.modules.get(_UTILS_MODULE)
        metrics = getattr(utils, "compilation_time_metrics", None)
        if not isinstance(metrics, dict):
            return
        seconds = sum(sum(metrics.get(key, ())) for key in BACKFILL_METRICS)
        duration_ns = int(seconds * 1e9)
        if duration_ns <= 0:
            return
        now_ns = self._clock()
        with self._lock:
            self._append(CompileEvent(now_ns - duration_ns, now_ns, BACKFILLED, ""))

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            logger.warning(
                "compile watcher failed (%s: %s); compile time may be counted as step time",
                type(exc).__name__,
                exc,
            )


def _overlap(start_ns: int, end_ns: int, window_start_ns: int, window_end_ns: int) -> int:
    return max(0, min(end_ns, window_end_ns) - max(start_ns, window_start_ns))
