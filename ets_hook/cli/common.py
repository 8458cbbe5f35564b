"""What every ``ets-hook`` subcommand shares: exit codes, input errors, argument types, help.

A subcommand's handler returns an exit code or raises. ``InputError`` (an unreadable or invalid
input file, an output path that cannot be written, an option value only the run can check) is
printed by ``cli.main`` as one line, ``ets-hook CMD: error: FILE: PROBLEM``, and exits 2, like an
argparse usage error; a reader that closes stdout early (``| head``) ends the command quietly
with 141, as SIGPIPE ends a Unix tool; anything else a handler raises is a failure while running
(exit 1, with Python's traceback). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from ..reporters.ascii_text import ERRORS, needs_substitutes
from ..trace.atomic import check_writable, names_a_directory
from ..trace.untrusted import describe_file_type

#: Exit codes of ``ets-hook``.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: 128 + SIGPIPE, what a shell reports for a tool that SIGPIPE stopped: stdout's reader left.
EXIT_BROKEN_PIPE = 141

#: The largest ``--seed``: every generator a seed goes to (``torch.manual_seed``, a
#: ``torch.Generator``, numpy's ``default_rng``) takes any int in ``[0, 2**63 - 1]``.
MAX_SEED = 2**63 - 1

#: What 141 means, in every ``exit codes`` section.
_BROKEN_PIPE_HELP = "stdout's reader stopped early (| head): output cut short, quietly"

#: The ``exit codes`` section of ``ets-hook --help``.
EXIT_CODES_HELP = f"""exit codes:
  0    success
  1    a failure while running: one line when the cause is known (build-ops: no
       compiler), else Python's traceback (a bug: please report it)
  2    a usage error or an invalid option value (usage and one error line), or an
       unreadable or invalid input file (one line naming the file and the problem,
       no traceback)
  130  interrupted (Ctrl-C)
  141  {_BROKEN_PIPE_HELP}"""


class InputError(Exception):
    """An unreadable or invalid input of a subcommand: ``ets-hook`` prints it and exits 2.

    The message is one line naming the file (when there is one) and the problem.
    """


@contextlib.contextmanager
def ascii_substitutes() -> Iterator[None]:
    """Let ``sys.stdout`` and ``sys.stderr`` write ASCII substitutes (``+/-`` for ``±``, ``|``
    for ``·``: ``reporters.ascii_text``) for the characters their encoding lacks, while the
    block runs.

    Only a stream whose encoding lacks some of them (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``)
    is reconfigured; a UTF-8 one is left alone. Each is given back its own error handler
    after the block.

    Yields:
        Nothing; the block runs inside.
    """
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if stream is None or not needs_substitutes(stream):
            continue
        previous = getattr(stream, "errors", None)
        try:
            stream.reconfigure(errors=ERRORS)  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            continue  # not a TextIOWrapper, or closed: left as it is
        changed.append((stream, previous))
    try:
        yield
    finally:
        for stream, previous in changed:
            with contextlib.suppress(Exception):  # flushes: a closed pipe may fail it
                stream.reconfigure(errors=previous)  # type: ignore[union-attr]


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but paragraphs with indented lines (tables) are kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if "\n " in paragraph:
                paragraphs.append("\n".join(indent + line for line in paragraph.splitlines()))
            else:
                paragraphs.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(paragraphs)


def exit_codes_epilog(ok: str, usage: str, failure: str) -> str:
    """A subcommand's ``exit codes`` section for its ``--help``.

    Args:
        ok: when it exits 0.
        usage: when it exits 2 (beyond argparse's own usage errors).
        failure: when it exits 1.

    Returns:
        The section, as ``HelpFormatter`` keeps it; 130 (interrupted) and 141 (stdout's
        reader gone) end it.
    """
    import textwrap

    rows = []
    for code, text in ((EXIT_OK, ok), (EXIT_FAILURE, failure), (EXIT_USAGE, usage)):
        lines = textwrap.wrap(text, 72, break_on_hyphens=False) or [""]
        rows.append(f"  {code}    {lines[0]}")
        rows.extend(f"       {line}" for line in lines[1:])
    rows.append(f"  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)")
    rows.append(f"  {EXIT_BROKEN_PIPE}  {_BROKEN_PIPE_HELP}")
    return "exit codes:\n" + "\n".join(rows)


def describe(exc: BaseException, path: str | os.PathLike[str] | None = None) -> str:
    """One line saying what went wrong with a file: ``FILE: PROBLEM``.

    Args:
        exc: the error reading or writing the file.
        path: the file, prefixed when the message does not name it already; None: the
            message as it is (loaders name their file).

    Returns:
        The message, on one line.
    """
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{os.fsdecode(exc.filename)}: {exc.strerror}"
    elif isinstance(exc, KeyError):
        text = f"missing entry {exc.args[0]!r}" if exc.args else "missing entry"
    else:
        text = str(exc) or type(exc).__name__
    if path is not None and os.fspath(path) not in text:
        text = f"{os.fspath(path)}: {text}"
    return " ".join(text.split())


@contextlib.contextmanager
def reading(
    path: str | os.PathLike[str] | None = None,
    *,
    errors: tuple[type[BaseException], ...] = (OSError, ValueError),
) -> Iterator[None]:
    """Turn the errors of reading (or writing) a file into one-line ``InputError``s.

    ``ValueError`` covers every typed input error of the package (``TraceFileError``,
    ``ETSCSVError``, ``ModelFileError``, ``SchemaVersionError``).

    Args:
        path: the file, named in the message when the error does not name it; None: several
            files, whose loaders name the one at fault.
        errors: the exception types that mean a bad input here.

    Yields:
        Nothing; the block runs inside.

    Raises:
        InputError: the block raised one of ``errors`` (chained to it).
    """
    try:
        yield
    except InputError:
        raise
    except errors as exc:
        raise InputError(describe(exc, path)) from exc


def require_file(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a regular file, before anything opens it (a FIFO would block).

    Args:
        path: the input file.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        InputError: it does not exist, cannot be inspected, or is a directory, FIFO, device
            or socket.
    """
    target = Path(path)
    try:
        mode = target.stat().st_mode
    except OSError as exc:
        raise InputError(describe(exc, target)) from exc
    if not stat.S_ISREG(mode):
        kind = describe_file_type(mode)
        raise InputError(f"{target}: {kind}, not a regular file: refused without reading it")
    return target


def require_file_name(path: str | os.PathLike[str], *, option: str | None = None) -> Path:
    """Check that an output path names a file, not a directory, before anything is written.

    ``Path`` would read ``""`` as ``.`` and drop a trailing ``/``, and a writer given ``out/``
    or an existing folder would write a file beside it (``out.npz``): each is refused instead.

    Args:
        path: the output path, as given.
        option: the option that gave it (``"-o"``), named when the path is empty.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        InputError: ``path`` is empty, ends with a path separator or in ``.`` or ``..`` (a
            directory's name), is an existing directory, or cannot be examined.
    """
    text = os.fspath(path)
    if not text:
        raise InputError(f"{option + ' ' if option else ''}'': an empty path names no file")
    if names_a_directory(text):
        raise InputError(f"{text}: names a directory, not a file to write")
    target = Path(text)
    try:
        directory = target.is_dir()
    except OSError as exc:
        raise InputError(describe(exc, text)) from exc
    if directory:
        raise InputError(f"{text}: a directory, cannot write it")
    return target


def require_output(
    path: str | os.PathLike[str], *, create_folder: bool = False, option: str | None = None
) -> Path:
    """Check, before the work starts, that an output file can be put at ``path``.

    The folder that will hold the file (with ``create_folder``, the nearest folder on its path
    that exists) must be a directory this process can write: ``os.access`` says so, and a temp
    file like the one ``trace.atomic.atomic_write_bytes`` writes is created there and removed
    at once (``os.access`` says yes to root everywhere, ``/proc`` included).

    Args:
        path: the file to write.
        create_folder: the writer creates missing folders; else the folder must exist.
        option: the option that gave ``path`` (``"--trace"``), named when it is empty.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        InputError: ``path`` does not name a file (``require_file_name``), is a directory or
            another non-file, its directory is missing (and will not be created) or is not a
            directory, no file can be created in it (read-only, no permission, ``/proc``), or
            the path cannot be examined.
    """
    target = require_file_name(path, option=option)
    try:
        if target.exists() and not target.is_file():
            raise InputError(
                f"{target}: {describe_file_type(target.stat().st_mode)}, cannot write it"
            )
        folder = target.parent
        for parent in (folder, *folder.parents):
            if parent.exists():
                if not parent.is_dir():
                    raise InputError(f"{target}: {parent} is not a directory")
                break
            if not create_folder:
                raise InputError(f"{target}: directory {folder} does not exist")
        else:  # only a working directory removed since: "." itself is missing
            raise InputError(f"{target}: directory {folder} does not exist")
    except OSError as exc:
        raise InputError(describe(exc, target)) from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{target}: directory {parent} is not writable")
    try:
        check_writable(parent / target.name)
    except OSError as exc:
        raise InputError(
            f"{target}: cannot create a file in {parent}: {exc.strerror or exc}"
        ) from exc
    return target


def parse_seed(text: str) -> int:
    """An argparse ``type`` for ``--seed``: an int in ``[0, MAX_SEED]``, else a usage error.

    Args:
        text: the option's value.

    Returns:
        The seed.

    Raises:
        argparse.ArgumentTypeError: not an int, or out of range (argparse names ``--seed``;
            the message names the value).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63 - 1], got {value}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int >= ``minimum``, else a usage error (exit 2).

    Args:
        minimum: the smallest value accepted.

    Returns:
        The converter.
    """

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    convert.__name__ = f"int >= {minimum}"
    return convert


def float_in(
    low: float, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type``: a float in ``[low, high)`` (``(low, ...)`` with ``low_open``).

    Args:
        low: the smallest value (excluded when ``low_open``).
        high: the bound the value must stay below; None: no upper bound.
        low_open: exclude ``low`` itself.

    Returns:
        The converter; anything else is a usage error (exit 2).
    """
    interval = f"{'(' if low_open else '['}{low:g}, {'inf' if high is None else f'{high:g}'})"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        inside = (value > low if low_open else value >= low) and (high is None or value < high)
        if not inside:
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value

    convert.__name__ = f"float in {interval}"
    return convert
