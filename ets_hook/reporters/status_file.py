"""``StatusFileReporter``: a JSON status file for schedulers, rewritten atomically, throttled."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..launcher import fill_rank, rank_suffixed
from ..trace.atomic import atomic_write_bytes, check_writable_argument
from .base import EARLY_STEPS, JOB_OUTCOMES, MILESTONE_STEPS, Milestones, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

logger = logging.getLogger("ets_hook")

STATUS_FORMAT = "ets-hook-status"
#: Bumped on every change of the document (``ets_hook/data/status.schema.json``).
STATUS_VERSION = 6
#: Every ``state`` a status file can hold.
STATUS_STATES = ("running", *JOB_OUTCOMES)
#: Keys of the document that ``extra`` may not replace.
RESERVED_KEYS = (
    "format",
    "version",
    "state",
    "error",
    "pid",
    "host",
    "updated_at",
    "prediction",
    "scope",
    "rank",
    "world_size",
)
#: ``scope`` of a status file: the job's (the name the user gave) or one rank's.
STATUS_SCOPES = ("job", "rank")
#: Seconds before retrying after a failed write, doubled per failure up to the maximum.
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 300.0
#: Attempts of the final write at close, and the pause between them.
CLOSE_ATTEMPTS, CLOSE_PAUSE_S = 3, 0.1
#: Seconds between looks at the prediction for a milestone (convergence) between writes.
MILESTONE_CHECK_S = 1.0


def status_paths(
    path: str | os.PathLike[str], rank: int, world_size: int
) -> list[tuple[Path, str]]:
    """The status files one rank writes, each with its ``scope``.

    The name the user gave is the job's file, written by rank 0 (what a scheduler reads); every
    rank of a multi-process job also writes its own, named with its rank: ``{rank}`` filled in
    where the user wrote it (then there is no separate job file), else a ``.rank<N>`` suffix
    (``eta.json`` -> ``eta.rank1.json``).

    Args:
        path: the path the user gave.
        rank: this process's rank (>= 0).
        world_size: processes in the job (>= 1).

    Returns:
        ``[(path, "job")]`` in a single process; with ``{rank}`` in the name,
        ``[(filled path, "rank")]`` (``"job"`` for rank 0 of one process); otherwise rank 0 gets
        ``[(path, "job"), (path.rank0, "rank")]`` and the others ``[(path.rank<N>, "rank")]``.
    """
    text = os.fspath(path)
    if "{rank}" in text:
        return [(Path(fill_rank(text, rank)), "job" if world_size == 1 else "rank")]
    if world_size <= 1:
        return [(Path(text), "job")]
    own = rank_suffixed(text, rank)
    return [(Path(text), "job"), (own, "rank")] if rank == 0 else [(own, "rank")]


def status_schema_path() -> Path:
    """Where the JSON Schema of the status document ships (``ets_hook/data``)."""
    return Path(__file__).resolve().parents[1] / "data" / "status.schema.json"


class StatusFileReporter(Reporter):
    """Rewrites a JSON status file atomically (temp file in the same directory, fsync,
    ``os.replace``; created with the process umask): a reader always sees a complete, valid
    document, even if the process is killed mid-write. Written at each milestone of the
    forecast (``base.Milestones``: the first prediction, those after local steps 1, 3 and 5,
    the first converged one: where the log writes its early lines), else at most every
    ``interval_s``, and when the job ends. Document (JSON Schema:
    ``ets_hook/data/status.schema.json``, ``status_schema_path()``)::

        {"format": "ets-hook-status", "version": 6,
         "state": "running" | "closed" | "interrupted" | "failed",
         "error": exception type name (state "failed") | null,
         "pid": ..., "host": ..., "updated_at": ISO 8601,
         "scope": "job" | "rank", "rank": ..., "world_size": ..., **extra,
         "prediction": Prediction.to_dict() | null}

    A failed write is logged (naming the path) and retried with back-off (1 s, doubling up to
    5 min) at the next due predictions; the final write at close is tried three times. The
    reporter is never disabled by a failed write.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval_s: float | None = 5.0,
        milestone_steps: tuple[int, ...] = MILESTONE_STEPS,
        extra: Mapping[str, Any] | None = None,
        scope: str = "job",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Check the path and the extras; writes nothing yet.

        Args:
            path: the status file; its directory must exist.
            interval_s: seconds of job time (> 0) at least between the periodic rewrites
                while running; None: milestones and close only.
            milestone_steps: local step counts (ints >= 1) whose predictions are always
                written (``base.Milestones``; the log's ``early_lines``).
            extra: JSON-serialisable keys added to every document (not the standard keys).
            scope: ``"job"`` or ``"rank"`` (see ``status_paths``), written as ``scope``.
            rank: the writing process's rank (>= 0), written as ``rank``.
            world_size: processes in the job (> rank), written as ``world_size``.

        Raises:
            ValueError: the directory of ``path`` does not exist or takes no new file (the
                atomic rewrite's temp file is created and removed to check), ``path`` is a
                directory,
                ``interval_s`` is not > 0, a ``milestone_steps`` item is not an int >= 1,
                ``extra`` names a standard key or holds a value JSON cannot carry (NaN,
                infinity, an object ``json.dumps`` cannot serialise).
        """
        if scope not in STATUS_SCOPES:
            raise ValueError(f"scope must be one of {STATUS_SCOPES}, got {scope!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got {rank}, {world_size}")
        self.scope, self.rank, self.world_size = scope, rank, world_size
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ValueError(f"status_path's directory does not exist: {self.path.parent}")
        if self.path.is_dir():
            raise ValueError(f"status_path is a directory: {self.path}")
        check_writable_argument("status_path", self.path)
        if interval_s is not None and (
            isinstance(interval_s, bool)
            or not isinstance(interval_s, (int, float))
            or not interval_s > 0
        ):
            raise ValueError(f"interval_s must be > 0 or None, got {interval_s!r}")
        self.interval_s = interval_s
        self._milestones = Milestones(milestone_steps)
        # Offered the predictions the log is (its early steps and 1 s looks): a milestone such
        # as convergence is written when the log shows it; the periodic writes stay throttled.
        self.schedule = ReportSchedule(
            first_steps=1,
            interval_s=min(interval_s, MILESTONE_CHECK_S) if interval_s else MILESTONE_CHECK_S,
            early_steps=tuple(sorted(set(EARLY_STEPS) | set(milestone_steps))),
        )
        self._last_written_s = -math.inf  # the job time (elapsed_s) of the last running write
        self.extra = dict(extra or {})
        clash = sorted(k for k in self.extra if k in RESERVED_KEYS)
        if clash:
            raise ValueError(f"status file extra may not replace the standard keys {clash}")
        try:
            json.dumps(self.extra, allow_nan=False)  # fail early on extras JSON cannot carry
        except (TypeError, ValueError) as exc:
            raise ValueError(f"status file extra is not JSON-serialisable: {exc}") from exc
        self._host = socket.gethostname()
        self._failures = 0
        self._retry_at = -math.inf

    def document(
        self, state: str, prediction: Prediction | None, error: str | None = None
    ) -> dict[str, Any]:
        """Build the status document.

        Args:
            state: one of ``STATUS_STATES``.
            prediction: the prediction to embed, or None (``"prediction": null``).
            error: the exception's type name (state ``"failed"``), else None.

        Returns:
            The document as a dict (``updated_at``: now, UTC, ISO 8601).

        Raises:
            ValueError: ``state`` is not one of ``STATUS_STATES``.
        """
        if state not in STATUS_STATES:
            raise ValueError(f"state must be one of {STATUS_STATES}, got {state!r}")
        return {
            "format": STATUS_FORMAT,
            "version": STATUS_VERSION,
            "state": state,
            "error": error,
            "pid": os.getpid(),
            "host": self._host,
            "updated_at": datetime.now(timezone.utc).isoformat(),
            "scope": self.scope,
            "rank": self.rank,
            "world_size": self.world_size,
            **self.extra,
            "prediction": prediction.to_dict() if prediction is not None else None,
        }

    def write(self, state: str, prediction: Prediction | None, error: str | None = None) -> None:
        """Write ``document(state, prediction, error)`` as JSON, atomically (replaces the file).

        Raises:
            OSError: the file cannot be written.
            ValueError: ``state`` is unknown.
        """
        data = json.dumps(self.document(state, prediction, error), allow_nan=False, indent=1)
        atomic_write_bytes(self.path, data.encode())

    def on_prediction(self, prediction: Prediction) -> None:
        """Write the document with ``"state": "running"`` at a milestone or once ``interval_s``
        of job time has passed since the last write (skipped while backing off)."""
        milestone = self._milestones.reached(prediction)
        periodic = (
            self.interval_s is not None
            and prediction.elapsed_s - self._last_written_s >= self.interval_s
        )
        if not (milestone or periodic):
            return
        now = time.monotonic()
        if now < self._retry_at:
            return
        if self._attempt("running", prediction, None, now):
            self._last_written_s = prediction.elapsed_s

    def on_close(self, prediction: Prediction | None) -> None:
        """Write the document with ``"state": "closed"``."""
        self.on_end(prediction, "closed", None)

    def on_end(self, prediction: Prediction | None, outcome: str, error: str | None) -> None:
        """Write the final document (``state``: the outcome), trying up to three times."""
        for attempt in range(CLOSE_ATTEMPTS):
            if attempt:
                time.sleep(CLOSE_PAUSE_S)
            final = (attempt + 1, CLOSE_ATTEMPTS)
            if self._attempt(outcome, prediction, error, time.monotonic(), final=final):
                return

    def _attempt(
        self,
        state: str,
        prediction: Prediction | None,
        error: str | None,
        now: float,
        *,
        final: tuple[int, int] | None = None,
    ) -> bool:
        """One write; on failure, a warning and the next retry's time (the final writes at
        close, ``final`` = (attempt, attempts), say which attempt failed: none follows later).
        """
        try:
            self.write(state, prediction, error)
        except OSError as exc:
            self._failures += 1
            delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self._failures - 1))
            self._retry_at = now + delay
            if final is not None:
                logger.warning(
                    "cannot write the final status file %s (%s): attempt %d of %d",
                    self.path,
                    exc,
                    *final,
                )
                return False
            logger.warning(
                "cannot write the status file %s (%s); retrying in %.0f s",
                self.path,
                exc,
                delay,
            )
            return False
        if self._failures:
            logger.info("status file %s written again", self.path)
        self._failures = 0
        self._retry_at = -math.inf
        return True
