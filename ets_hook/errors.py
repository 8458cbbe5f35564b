"""Every public exception of ets-hook, in one place that imports nothing from the package.

Each stage raises its errors from here without climbing the pipeline: the trace file format
(``TraceFileError`` and its subclasses), the paper-CSV importer (``ETSCSVError``, also a
``TraceFileError``), the model files (``ModelFileError``, ``SchemaVersionError``) and the deadline
guard (``DeadlineExceededError``). All but the last two are ``ValueError`` subclasses: they
describe bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .reporters.deadline import DeadlineMiss


class TraceFileError(ValueError):
    """A trace file cannot be read. Subclasses say why; the message names the file."""


class NotATraceFileError(TraceFileError):
    """The file does not start with the ets-hook trace magic."""


class TruncatedTraceError(TraceFileError):
    """The file ends before the header or the payload it announces."""


class CorruptTraceError(TraceFileError):
    """Checksum mismatch, undecodable payload, or a payload that breaks the format's invariants."""


class TraceFieldError(CorruptTraceError):
    """One field of the payload is malformed: a wrong type, a value out of range, or an encoding
    that breaks the loader's bounds (nesting too deep, a container longer than the bytes left).

    Attributes:
        source: the file (or ``"<bytes>"``) the payload came from.
        field: where the field is, e.g. ``"meta.device.name"`` or ``"iterations[0].ops.parent"``;
            ``"payload"`` for the payload as a whole.
        problem: what is wrong with it.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        """Build the error; its message is ``"<source>: <field>: <problem>"``.

        Args:
            source: the file the payload came from.
            field: the field's location in the payload.
            problem: what is wrong with it.
        """
        self.source = source
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by the constructor's arguments (``args`` holds only the joined message)."""
        return (type(self), (self.source, self.field, self.problem))


class UnsupportedTraceVersionError(TraceFileError):
    """The file was written in a format version this ets-hook cannot read."""


class TraceTooLargeError(TraceFileError):
    """The file is larger than the ``max_bytes`` the caller allows."""


class NotARegularFileError(TraceFileError):
    """The path names a directory, FIFO, socket or device: refused before anything is read."""


class ETSCSVError(TraceFileError):
    """A malformed ETS CSV file; ``path`` and ``line`` (1-based, 0 = whole file) locate it.

    A ``TraceFileError`` (so a ``ValueError``) like the ``.ets`` loader's errors.
    """

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        """Build the error; its message is ``"<path>:<line>: <message>"`` (no ``:<line>`` if 0).

        Args:
            path: the CSV file (kept as ``self.path``, a ``Path``).
            line: 1-based line of the problem; 0 when it concerns the whole file.
            message: what is wrong (kept as ``self.reason``).
        """
        self.path = Path(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line > 0 else str(self.path)
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by the constructor's arguments (``args`` holds only the joined message)."""
        return (type(self), (self.path, self.line, self.reason))


class ETSCSVTooLargeError(ETSCSVError, TraceTooLargeError):
    """An ETS CSV or ``opCodes.dict`` file larger than the ``max_bytes`` the caller allows."""


class ETSCSVNotARegularFileError(ETSCSVError, NotARegularFileError):
    """An ETS CSV or ``opCodes.dict`` path that names a directory, FIFO, socket or device."""


class SchemaVersionError(ValueError):
    """A weights file or schema of another feature-schema version than this code's."""

    def __init__(self, found: Any, expected: int, source: str = "") -> None:
        """Build the error; the message names both versions and says to retrain.

        Args:
            found: the version the file or schema declares (any value, as read).
            expected: the version this code reads (``ets.features.FEATURE_SCHEMA_VERSION``).
            source: where the version was read (a path), for the message; "" when unknown.
        """
        self.found = found
        self.expected = expected
        where = f"{source}: " if source else ""
        super().__init__(
            f"{where}feature schema version {found} is not supported: this ets_hook reads "
            f"version {expected}; retrain the model with this version (ets-hook train)"
        )


class ModelFileError(ValueError):
    """A weights file that is not an ets-hook model or is missing parts."""


class DeadlineExceededError(RuntimeError):
    """The job is predicted to miss its deadline (``on_deadline="raise"``).

    Raised into the training loop on purpose, once; ``miss`` holds the details.
    """

    def __init__(self, miss: DeadlineMiss) -> None:
        """Build the error from the guard's finding.

        Args:
            miss: the ``reporters.deadline.DeadlineMiss``; its ``message`` is the error's message.
        """
        super().__init__(miss.message)
        self.miss = miss


class NativeOpsBuildError(RuntimeError):
    """The native operator observer (``ets_hook._ops``) cannot be built for the running torch.

    The message says why (no compiler, no sources, the compiler's error). The hook never raises
    it: op capture then uses the torch profiler, and ``capture_status`` says so.
    """
