"""Visible by default: ets-hook's log lines on stderr when the application configured no logging.

Well-kept ML libraries (transformers, Lightning) show their progress without asking the user to
configure ``logging`` first. ``ETSHook(verbose=True)`` (the default) does the same: if neither
the root logger nor the ``ets_hook`` logger has a handler, it attaches ``ConsoleHandler`` to the
``ets_hook`` logger (INFO and above, ``ets-hook: <message>``). The handler steps aside by itself
as soon as the application configures logging (a root handler appears), so lines never come out
twice; ``verbose=False`` never attaches it. Lines are written through ``tqdm.write`` when tqdm
is loaded, so they never break a progress bar (the bar is cleared, the line written, the bar
redrawn).

In a multi-process job, the ranks that write no log lines (``ETSHook(log_ranks=...)``, rank 0
by default) keep ets-hook's notes below WARNING to themselves too (``quiet_below_warning``):
with ``logging.basicConfig(level=logging.INFO)`` on every rank, as torchrun scripts often
have, a note such as "capture dropped" would otherwise come once per rank. Warnings still come
from every rank (they may be that rank's own).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import TextIO

from .ascii_text import for_stream

LOGGER_NAME = "ets_hook"
_lock = threading.Lock()


class ConsoleHandler(logging.Handler):
    """Writes ``ets-hook: <message>`` lines to stderr, tqdm-aware; silent once the
    application has configured logging (the root logger has a handler). ASCII substitutes
    where the stream's encoding lacks a character; never raises (a closed stream drops the
    line)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        """Create the handler (level INFO).

        Args:
            stream: where to write; None: ``sys.stderr`` as it is at each write.
        """
        super().__init__(logging.INFO)
        self._stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's line, unless the application now handles logging itself.

        Characters the stream's encoding lacks (an ASCII stderr: ``LC_ALL=C``,
        ``PYTHONIOENCODING=ascii``) are written as ASCII substitutes (``ascii_text``): ``±``
        as ``+/-``, ``·`` as ``|``. A stream that cannot be written (closed, a broken pipe,
        none at all) drops the line: logging never fails the training job.
        """
        if logging.getLogger().handlers:
            return  # configured since we attached: the application's handlers show it
        try:
            line = record.getMessage()
        except Exception:
            self.handleError(record)  # a bad message or arguments: Python's report of it
            return
        if not line.startswith("ets-hook: "):
            line = "ets-hook: " + line
        stream = self._stream or sys.stderr
        if stream is None:
            return  # no stderr at all (pythonw)
        try:
            line = for_stream(line, stream)
            tqdm = sys.modules.get("tqdm")
            if tqdm is not None and hasattr(tqdm, "tqdm"):
                tqdm.tqdm.write(line, file=stream)
            else:
                stream.write(line + "\n")
                stream.flush()
        except (OSError, ValueError):
            return  # closed or broken: the line is dropped (its report would go there too)
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        """Python's report of a record that could not be written (on ``sys.stderr``, where
        ``logging.raiseExceptions``), but never an exception: with ``sys.stderr`` closed the
        report itself would raise, out of the training step that logged."""
        with contextlib.suppress(Exception):
            super().handleError(record)


#: A ``ConsoleHandler`` level above every record's: attached by a ``verbose=False`` hook, it
#: writes nothing and keeps Python's last-resort handler from printing ets-hook's warnings.
SILENT = logging.CRITICAL + 1


def logging_configured() -> bool:
    """Whether the application set up logging: a handler on the root logger or on ours
    (other than our own ``ConsoleHandler``)."""
    ours = logging.getLogger(LOGGER_NAME)
    return bool(logging.getLogger().handlers) or any(
        not isinstance(h, ConsoleHandler) for h in ours.handlers
    )


def ensure_console_handler(
    stream: TextIO | None = None, level: int = logging.INFO
) -> ConsoleHandler | None:
    """Attach one ``ConsoleHandler`` to the ``ets_hook`` logger unless logging is configured.

    Sets the logger's level to INFO when it has none (so INFO lines pass the default WARNING).
    Idempotent: a second call returns the handler already attached, its level lowered to
    ``level`` where that is lower (a hook with log lines after one with warnings only).

    Args:
        stream: passed to a new handler; None: stderr.
        level: the lowest level it writes: INFO (log lines and notes), WARNING (a hook
            without log lines: its warnings still come out as ets-hook's, not bare through
            Python's last-resort handler), or ``SILENT`` (``verbose=False``: nothing).

    Returns:
        The handler in place, or None when the application configured logging.
    """
    logger = logging.getLogger(LOGGER_NAME)
    with _lock:
        existing = next((h for h in logger.handlers if isinstance(h, ConsoleHandler)), None)
        if existing is not None:
            if level < existing.level:
                existing.setLevel(level)
            return existing
        if logging_configured():
            return None
        handler = ConsoleHandler(stream)
        handler.setLevel(level)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        return handler


class _BelowWarningFilter(logging.Filter):
    """Drops ``ets_hook`` records below WARNING while ``quiet`` is set."""

    quiet = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.quiet or record.levelno >= logging.WARNING


_replica_filter = _BelowWarningFilter()


def quiet_below_warning(quiet: bool) -> None:
    """Whether this process keeps ets-hook's records below WARNING to itself: True on a rank
    that writes no log lines. Process-wide (a process is one rank); the latest hook created
    decides. Idempotent.

    Args:
        quiet: True: drop INFO and DEBUG records of the ``ets_hook`` logger; False: pass them.
    """
    logger = logging.getLogger(LOGGER_NAME)
    with _lock:
        _replica_filter.quiet = quiet
        if quiet and _replica_filter not in logger.filters:
            logger.addFilter(_replica_filter)
