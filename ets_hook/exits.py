"""Every way a training script ends closes its live hooks first, before torch is torn down.

A hook left capturing at interpreter exit leaves the torch profiler (or an op callback) active
while torch's own ``atexit`` handlers and module teardown run: on the profiler path that ended
in a segmentation fault (exit 139) after the user's traceback. And a status file left at
``"running"`` tells a scheduler nothing. This module keeps a registry of live hooks and closes
them on every exit path, recording how the job ended:

- normal end of the main module, ``sys.exit`` (any code): ``"closed"``;
- an uncaught exception: ``"failed"`` (with the exception's type name), seen through a
  ``sys.excepthook`` wrapper that then calls the previous hook (the traceback prints as usual);
- an uncaught exception that ends a thread (``threading.excepthook``, wrapped alike): the hooks
  whose steps that thread drove close as ``"failed"`` then; the others go on;
- ``KeyboardInterrupt`` (Ctrl-C): ``"interrupted"``;
- ``SIGTERM`` (schedulers, ``torchrun`` stopping workers): ``"interrupted"``, then the process
  dies of the signal as it would have (default handler). A handler the application installed
  before the hook runs first: if it returns (a graceful stop: set a flag, save, exit later),
  the job and its hooks go on, and they close as the job ends -- as ``"interrupted"`` unless
  they reached their last step (``sigterm_received``); if it raises (``sys.exit``),
  ``"interrupted"``. Python lets only the main thread set a signal handler: a hook created on
  another thread leaves SIGTERM alone, and the next hook registered on the main thread installs
  the handler.

In IPython / Jupyter an exception ends a cell, not the process: after a cell that raised, each
live hook whose capture window is still open abandons that window (``IPython``'s
``post_run_cell`` event) and goes on timing steps; otherwise its op observer would go on
recording every op of the kernel's later cells.

A process forked from the job (``os.fork``, ``multiprocessing``'s ``fork`` workers, a
``DataLoader``'s workers) starts with an empty registry: its exit, or a SIGTERM that ends it
(``Process.terminate``), closes none of the parent's hooks and writes none of their files.

The ``atexit`` handler is registered when the first hook registers, i.e. after ``import torch``:
``atexit`` runs handlers last-registered first, so ours runs before torch's. Nothing here
imports torch or the rest of the package.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Protocol

logger = logging.getLogger("ets_hook")

#: The ways a job can end, as the status file's ``state`` records them.
CLOSED, INTERRUPTED, FAILED = "closed", "interrupted", "failed"


class ExitListener(Protocol):
    """What the registry calls at exit (``ETSHook`` implements it)."""

    def close_at_exit(self, outcome: str, error: str | None) -> None:
        """Close for good; never raises. ``outcome``: one of ``CLOSED``/``INTERRUPTED``/
        ``FAILED``; ``error``: the exception's type name for ``FAILED``, else None."""

    def after_thread_failed(self, thread_ident: int, error: str) -> None:
        """The thread ``thread_ident`` ended with an uncaught ``error`` (the exception's type
        name): close as ``FAILED`` if that thread drove this hook's steps; never raises."""

    def after_failed_cell(self, error: str) -> None:
        """A notebook cell raised ``error`` (the exception's type name): stop an open capture
        window; never raises."""

    def after_fork_in_child(self) -> None:
        """This process is a fork of the one the hook belongs to: do nothing from now on
        (count no step, close nothing, write no file); never raises."""


_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run inside register()
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False
_sigterm_installed = False
_outcome: tuple[str, str | None] | None = None
_sigterm_received = False
_previous_excepthook: Callable[..., Any] | None = None
_previous_thread_excepthook: Callable[..., Any] | None = None
_previous_sigterm: Any = None


def _forget_hooks_in_child() -> None:
    """After ``fork``, in the child: the hooks are the parent's (see the module docstring): each
    goes inert, and none is closed here. A fresh lock too: another thread of the parent may have
    held the old one at the fork (the child has one thread: the registry is read without it)."""
    global _lock, _live
    listeners, _live = list(_live), weakref.WeakSet()
    _lock = threading.RLock()
    for listener in listeners:
        with contextlib.suppress(Exception):
            listener.after_fork_in_child()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_hooks_in_child)


def register(listener: ExitListener) -> None:
    """Close ``listener`` at exit unless it is unregistered first. Installs the handlers once.

    Args:
        listener: a live hook (held weakly: a hook that is garbage-collected drops out).
    """
    global _installed
    with _lock:
        _live.add(listener)
        first = not _installed
        _installed = True
    if first:
        atexit.register(_at_exit)
        _install_excepthook()
        _install_cell_hook()
    if not _sigterm_installed:  # a hook first registered off the main thread left it unset
        _install_sigterm_handler()


def unregister(listener: ExitListener) -> None:
    """Forget ``listener`` (it closed itself). Never raises."""
    with _lock:
        _live.discard(listener)


def outcome() -> tuple[str, str | None]:
    """How the process is ending as seen so far: ``(state, error type name or None)``."""
    return _outcome or (CLOSED, None)


def sigterm_received() -> bool:
    """Whether this process got a SIGTERM while a hook was alive (through the handler
    installed here), whatever the application's own handler then did: a job that stops after
    it (a graceful stop) was stopped, not finished."""
    return _sigterm_received


def close_all(state: str, error: str | None = None) -> None:
    """Close every live hook with ``state``; never raises (used at exit and on SIGTERM)."""
    with _lock:
        listeners = list(_live)
        _live.clear()
    for listener in listeners:
        try:
            listener.close_at_exit(state, error)
        except Exception:  # a hook's close must not stop the others, nor the exit
            logger.debug("closing a hook at exit failed", exc_info=True)


def _at_exit() -> None:
    state, error = outcome()
    close_all(state, error)


def ending_of(exc_type: type[BaseException] | None) -> tuple[str, str | None]:
    """How a job that an exception of ``exc_type`` ended (None: none) ended.

    Returns:
        ``(INTERRUPTED, None)`` for ``KeyboardInterrupt``; ``(CLOSED, None)`` for None,
        ``SystemExit`` and ``GeneratorExit`` (a normal end); else ``(FAILED, its type name)``.
    """
    if exc_type is None or issubclass(exc_type, (SystemExit, GeneratorExit)):
        return CLOSED, None
    if issubclass(exc_type, KeyboardInterrupt):
        return INTERRUPTED, None
    return FAILED, exc_type.__name__


def _record(exc_type: type[BaseException] | None) -> None:
    global _outcome
    ending = ending_of(exc_type)
    if _outcome is None and ending[0] != CLOSED:
        _outcome = ending


def _excepthook(
    exc_type: type[BaseException],
    exc: BaseException,
    traceback: TracebackType | None,
) -> None:
    with contextlib.suppress(Exception):
        _record(exc_type)
    previous = _previous_excepthook or sys.__excepthook__
    previous(exc_type, exc, traceback)


def _thread_excepthook(args: Any) -> None:
    with contextlib.suppress(Exception):
        thread = args.thread
        if thread is not None and thread.ident is not None and args.exc_type is not None:
            with _lock:
                listeners = list(_live)
            for listener in listeners:
                try:
                    listener.after_thread_failed(thread.ident, args.exc_type.__name__)
                except Exception:
                    logger.debug("a hook failed after a thread failed", exc_info=True)
    previous = _previous_thread_excepthook or threading.__excepthook__
    previous(args)


def _install_excepthook() -> None:
    global _previous_excepthook, _previous_thread_excepthook
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    _previous_thread_excepthook = threading.excepthook
    threading.excepthook = _thread_excepthook


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _outcome, _sigterm_received
    _sigterm_received = True
    previous = _previous_sigterm
    if callable(previous):
        # The application's own handler first: a graceful stop (set a flag, save, exit later)
        # keeps the job running, and its hooks with it; they close when it ends.
        try:
            previous(signum, frame)
        except BaseException:  # it ends the job from the handler (sys.exit, an exception)
            if _outcome is None:
                _outcome = (INTERRUPTED, None)
            close_all(INTERRUPTED)
            raise
        return
    if _outcome is None:
        _outcome = (INTERRUPTED, None)
    close_all(INTERRUPTED)
    # The default action: die of the signal, as the process would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_handler() -> None:
    """Wrap SIGTERM's handler (main thread only: Python allows no other; elsewhere, skipped
    until a hook registers on the main thread). Once only."""
    global _previous_sigterm, _sigterm_installed
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if _sigterm_installed:
            return
        _sigterm_installed = True
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None or previous == signal.SIG_IGN:  # set from C, or ignored: leave it
            return
        _previous_sigterm = previous
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no signals here (embedded interpreter)
        _previous_sigterm = None


def after_failed_cell(error: str) -> None:
    """Tell every live hook that a notebook cell raised ``error`` (the exception's type name);
    never raises."""
    with _lock:
        listeners = list(_live)
    for listener in listeners:
        try:
            listener.after_failed_cell(error)
        except Exception:
            logger.debug("a hook failed after a failed cell", exc_info=True)


#: ``time.perf_counter_ns()`` when the notebook cell running now started (IPython's
#: ``pre_run_cell``); 0 outside IPython.
_cell_started_ns = 0


def cell_started_ns() -> int:
    """When the notebook cell running now started (``time.perf_counter_ns``), or 0 outside an
    IPython kernel or shell: what was done before it was done by an earlier cell."""
    return _cell_started_ns


def _pre_run_cell(info: Any = None) -> None:
    global _cell_started_ns
    _cell_started_ns = time.perf_counter_ns()


def _post_run_cell(result: Any) -> None:
    error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
    if error is not None:
        after_failed_cell(type(error).__name__)


def _install_cell_hook() -> None:
    """Listen to IPython's ``pre_run_cell`` and ``post_run_cell`` when this process is an IPython
    kernel or shell (IPython already imported and running; never imported here)."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is not None:
            shell.events.register("pre_run_cell", _pre_run_cell)
            shell.events.register("post_run_cell", _post_run_cell)
            _pre_run_cell()  # the cell that made the first hook: running now
    except Exception:  # an IPython without events, or a stub: notebooks just go unwatched
        logger.debug("IPython's post_run_cell not watched", exc_info=True)
