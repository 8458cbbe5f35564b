"""Trace discovery: the trace files named by paths (files or folders), and loading them.

One place decides what counts as a trace file: an ets-hook ``.ets`` file (``trace.io``) or an ETS
paper-artifact CSV (``trace.importers``), found recursively under folders in sorted order, the
artifact's ``MANIFEST.csv`` left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from .events import Trace
from .importers import read_ets_csv
from .io import load_trace

#: File suffixes (lower case) that hold traces.
TRACE_SUFFIXES = (".ets", ".csv")
_NOT_TRACES = {"MANIFEST.csv"}


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """The trace files the given paths name, in order.

    Folders expand to the ``.ets`` / ``.csv`` files under them (recursively, sorted, any
    ``MANIFEST.csv`` left out).

    Args:
        paths: files (taken as they are, whatever their suffix) and folders.

    Returns:
        The files, in the order of ``paths``.

    Raises:
        FileNotFoundError: a path does not exist, or a folder holds no trace file. (Anything
            else that exists -- a FIFO, a device -- is returned for the loader to refuse.)
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                q
                for q in path.rglob("*")
                if q.is_file() and q.suffix.lower() in TRACE_SUFFIXES and q.name not in _NOT_TRACES
            )
            if not found:
                raise FileNotFoundError(f"{path}: a folder without .csv or .ets trace files")
            files.extend(found)
        elif path.is_file() or path.exists():  # a FIFO or a device: the loader refuses it
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: No such file or directory")
    return files


def load_traces(
    paths: Iterable[str | Path],
    *,
    device_name: str | None = None,
    op_codes: Mapping[int, str] | None = None,
) -> list[Trace]:
    """Load every trace file the paths name (``trace_files``), in order.

    Args:
        paths: ``.ets`` files, ETS CSV files, or folders of them.
        device_name: overrides the GPU name of CSV traces (default: the CSV's folder name).
        op_codes: the artifact's op-code table for CSV traces (default: an ``opCodes.dict``
            found near each file).

    Returns:
        One ``Trace`` per file; each carries ``metadata["file"]`` (its file name) unless the
        file set one.

    Raises:
        FileNotFoundError: as ``trace_files``.
        TraceFileError: a file not ending in ``.csv`` (read as ``.ets``) cannot be read.
        ETSCSVError: a CSV file, or the ``opCodes.dict`` found for it, is malformed.
        OSError: a file cannot be opened.
    """
    traces: list[Trace] = []
    for path in trace_files(paths):
        if path.suffix.lower() == ".csv":
            trace = read_ets_csv(path, op_codes=op_codes, device_name=device_name)
        else:
            trace = load_trace(path)
        trace.metadata.setdefault("file", path.name)
        traces.append(trace)
    return traces
