"""``StatusFileReporter``: a JSON status file for schedulers, rewritten atomically, throttled."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..trace.atomic import atomic_write_bytes
from .base import Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction


STATUS_FORMAT = "ets-hook-status"
STATUS_VERSION = 1


class StatusFileReporter(Reporter):
    """Rewrites a JSON status file atomically (temp file in the same directory, fsync,
    ``os.replace``): a reader always sees a complete, valid document, even if the process is
    killed mid-write. Written for the first prediction, then at most every ``interval_s``, and at
    close (``"state": "closed"``). Document::

        {"format": "ets-hook-status", "version": 1, "state": "running" | "closed",
         "pid": ..., "host": ..., "updated_at": ISO 8601, **extra,
         "prediction": Prediction.to_dict() | null}

    A failed write (``OSError``, or ``ValueError`` for a NaN or infinity in ``extra``) disables
    the reporter through ``ReportDispatcher``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval_s: float = 5.0,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Check the path and the extras; writes nothing yet.

        Args:
            path: the status file; its directory must exist.
            interval_s: seconds (> 0) between rewrites while running; None: first prediction
                and close only.
            extra: JSON-serialisable keys added to every document (they override the standard
                keys of the same name, except ``prediction``).

        Raises:
            ValueError: the directory of ``path`` does not exist, ``path`` is a directory, or
                ``interval_s`` is not > 0.
            TypeError: ``extra`` holds a value ``json.dumps`` cannot serialise.
        """
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ValueError(f"status_path's directory does not exist: {self.path.parent}")
        if self.path.is_dir():
            raise ValueError(f"status_path is a directory: {self.path}")
        self.schedule = ReportSchedule(first_steps=1, interval_s=interval_s)
        self.extra = dict(extra or {})
        json.dumps(self.extra)  # fail early on non-JSON extras
        self._host = socket.gethostname()

    def document(self, state: str, prediction: Prediction | None) -> dict[str, Any]:
        """Build the status document.

        Args:
            state: ``"running"`` or ``"closed"`` (not checked).
            prediction: the prediction to embed, or None (``"prediction": null``).

        Returns:
            The document as a dict (``updated_at``: now, UTC, ISO 8601).
        """
        return {
            "format": STATUS_FORMAT,
            "version": STATUS_VERSION,
            "state": state,
            "pid": os.getpid(),
            "host": self._host,
            "updated_at": datetime.now(timezone.utc).isoformat(),
            **self.extra,
            "prediction": prediction.to_dict() if prediction is not None else None,
        }

    def write(self, state: str, prediction: Prediction | None) -> None:
        """Write ``document(state, prediction)`` as JSON, atomically (replaces the file).

        Raises:
            OSError: the file cannot be written.
            ValueError: the document holds a NaN or infinity (only possible through ``extra``).
        """
        data = json.dumps(self.document(state, prediction), allow_nan=False, indent=1)
        atomic_write_bytes(self.path, data.encode())

    def on_prediction(self, prediction: Prediction) -> None:
        """Write the document with ``"state": "running"``."""
        self.write("running", prediction)

    def on_close(self, prediction: Prediction | None) -> None:
        """Write the document with ``"state": "closed"``."""
        self.write("closed", prediction)
