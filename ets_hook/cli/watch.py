"""``ets-hook watch STATUS.json``: render a job's status file live in a terminal.

The status file is what ``ETSHook(status_path=...)`` writes (``reporters.status_file``; JSON
Schema ``ets_hook/data/status.schema.json``). On a terminal the view is redrawn in place every
``--interval`` seconds until the job's state leaves ``running`` (the final state is drawn, then
the command exits 0) or Ctrl-C (130); when stdout is not a terminal, or with ``--once``, one
snapshot is printed. A missing file is waited for (it may not be written yet; ``--once``: exit
2); a file that is not a regular file, not JSON, or not a status file of a known version is one
line naming the file and the problem (``cli.common.InputError``, exit 2). Nothing here imports
torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

from ..forecast.text import (
    format_duration,
    format_relative,
    format_step_time,
    format_straggler_host,
)
from ..reporters.status_file import STATUS_FORMAT, STATUS_SCOPES, STATUS_STATES, STATUS_VERSION
from ..trace.untrusted import read_regular_file
from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    HelpFormatter,
    InputError,
    describe,
    exit_codes_epilog,
    float_in,
    require_file,
)

#: How often ``StatusFileReporter`` rewrites the file while running (its default ``interval_s``).
WRITE_INTERVAL_S = 5.0
#: A running job's file older than this (and than three step times) is reported stale.
STALE_AFTER_S = 3 * WRITE_INTERVAL_S
#: A status file is a few KiB; anything larger is refused unread.
MAX_STATUS_BYTES = 4 << 20
#: Pause before the one retry of a failed read.
RETRY_PAUSE_S = 0.1
#: Width of the progress bar, in characters.
BAR_WIDTH = 30

#: What the end states mean, for the note under the figures.
_ENDINGS = {
    "closed": "job ended: closed (the hook was closed or the script ended)",
    "interrupted": "job ended: interrupted (Ctrl-C or SIGTERM)",
    "failed": "job FAILED",
}
#: ANSI: clear the screen; cursor home; clear to the end of the line; clear below the cursor.
_CLEAR, _HOME, _CLEAR_LINE, _CLEAR_BELOW = "\x1b[2J", "\x1b[H", "\x1b[K", "\x1b[J"
_NUMBER = (int, float)


# ---------------------------------------------------------------------------------------------
# Reading and checking the document


def parse_status(data: bytes, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and check a status document, as far as ``watch`` uses it.

    Args:
        data: the file's bytes.
        path: the file, for messages.

    Returns:
        The document, with ``prediction`` a dict or None.

    Raises:
        InputError: not UTF-8 JSON, not an object, not an ``ets-hook-status`` document, a
            version this ets-hook does not know, or a field of the wrong type or value.
    """
    name = os.fspath(path)
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{name}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != STATUS_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"{name}: not an ets-hook status file (format {found!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InputError(f"{name}: invalid status file version {version!r}")
    if version > STATUS_VERSION:
        raise InputError(
            f"{name}: status file version {version} is newer than this ets-hook reads "
            f"(1-{STATUS_VERSION}): upgrade ets-hook"
        )
    if doc.get("state") not in STATUS_STATES:
        state = doc.get("state")
        raise InputError(f"{name}: field 'state': {state!r} is not one of {STATUS_STATES}")
    _check(doc, name, "", {"pid": (int,), "host": (str,), "updated_at": (str,)}, required=True)
    _check(
        doc,
        name,
        "",
        {"error": (str, type(None)), "scope": (str,), "rank": (int,), "world_size": (int,)},
        required=False,
    )
    if "scope" in doc and doc["scope"] not in STATUS_SCOPES:
        raise InputError(f"{name}: field 'scope': {doc['scope']!r} is not one of {STATUS_SCOPES}")
    _timestamp(doc["updated_at"], name, "updated_at")
    prediction = doc.get("prediction")
    if prediction is not None:
        if not isinstance(prediction, dict):
            raise InputError(f"{name}: field 'prediction': not an object or null")
        _check(prediction, name, "prediction.", {"step": (int,)}, required=True)
        optional = (*_NUMBER, type(None))
        fields = {
            "total_steps": (int, type(None)),
            "iteration_s": optional,
            "iteration_ci_s": optional,
            "eta_s": optional,
            "total_s": optional,
            "total_ci_s": optional,
            "level": optional,
            "elapsed_s": optional,
            "time_limit_s": optional,
            "stopped_by_time_limit": (bool,),
            "finish_time": (str, type(None)),
            "start_time": (str, type(None)),
            "converged": (bool,),
            "source": (str,),
            "slowest_rank": (int, type(None)),
            "straggler_rank": (int, type(None)),
            "straggler_host_foreign_cpu": optional,
        }
        _check(prediction, name, "prediction.", fields, required=False)
        for key in ("finish_time", "start_time"):
            if isinstance(prediction.get(key), str):
                _timestamp(prediction[key], name, f"prediction.{key}")
    return doc


def _check(
    obj: dict[str, Any],
    name: str,
    prefix: str,
    types: dict[str, tuple[type, ...]],
    *,
    required: bool,
) -> None:
    for key, allowed in types.items():
        if key not in obj:
            if required:
                raise InputError(f"{name}: missing field '{prefix}{key}'")
            continue
        value = obj[key]
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if wrong_bool or not isinstance(value, allowed):
            raise InputError(f"{name}: field '{prefix}{key}': unexpected value {value!r}")


def _timestamp(text: str, name: str, field: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InputError(f"{name}: field '{field}': not an ISO 8601 time: {text!r}") from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def read_status(path: Path) -> dict[str, Any] | None:
    """Read the status file once, retrying a failed read or parse once.

    Args:
        path: the status file.

    Returns:
        The checked document (``parse_status``); None when the file does not exist (yet).

    Raises:
        InputError: it is not a regular file (refused unread), or it cannot be read or is
            invalid twice in a row.
    """
    for attempt in range(2):
        try:
            os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(describe(exc, path)) from exc
        require_file(path)  # a directory, FIFO or device: refused before opening it
        try:
            data = read_regular_file(
                path,
                MAX_STATUS_BYTES,
                not_regular=lambda kind: InputError(
                    f"{path}: {kind}, not a regular file: refused without reading it"
                ),
                too_large=lambda size: InputError(
                    f"{path}: {size} bytes, too large for a status file"
                ),
            )
            return parse_status(data, path)
        except FileNotFoundError:
            return None  # removed between the stat and the open
        except InputError:
            if attempt:
                raise
        except OSError as exc:
            if attempt:
                raise InputError(describe(exc, path)) from exc
        time.sleep(RETRY_PAUSE_S)
    raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Rendering


def render_status(
    doc: dict[str, Any],
    path: str | os.PathLike[str],
    now: datetime,
    *,
    stale_after_s: float = STALE_AFTER_S,
) -> list[str]:
    """Render a checked status document as lines of text.

    Args:
        doc: the document, as ``parse_status`` returns it.
        path: the status file, for the title.
        now: the current time (aware).
        stale_after_s: a running job's file older than this and than three step times is
            reported stale.

    Returns:
        The lines: title, job, in a multi-process job which file this is (``scope``: ``job of
        2 ranks · waits for rank 1`` for the job's file, ``rank 1 of 2 · this rank ends last``
        for a rank's, ``_scope_text``), progress, step time, ETA, finish, total, age, then
        notes (stale, process gone, job ended). Where the job's length is unknown, ETA,
        finish and total say so, with the time limit's bound when the job has one
        (``time_limit_s``); a total cut to the time limit says ``capped by the time limit``.
    """
    state = doc["state"]
    job = f"{doc['host']}  pid {doc['pid']}  {state}"
    if state == "failed":
        job += f" ({doc.get('error') or 'unknown error'})"
    lines = [f"ets-hook watch  {os.fspath(path)}", f"job       {job}"]
    p = doc.get("prediction")
    scope = _scope_text(doc, p, running=state == "running")
    if scope is not None:
        lines.append(f"scope     {scope}")
    if p is None:
        lines.append("progress  no prediction yet")
        step_s = None
    else:
        step_s = _finite(p.get("iteration_s"))
        lines.extend(_prediction_lines(p, step_s, running=state == "running"))
    updated = _timestamp(doc["updated_at"], os.fspath(path), "updated_at")
    age = (now - updated).total_seconds()
    lines.append(f"updated   {_age(age)} ({_local(updated)})")
    if state == "running":
        threshold = max(stale_after_s, 3 * step_s) if step_s is not None else stale_after_s
        if age > threshold:
            lines.append(
                f"! STALE: not updated for {format_duration(age)} (written every "
                f"~{format_duration(WRITE_INTERVAL_S)} at step ends while running): the job "
                "may be hung, in a long evaluation or checkpoint, or killed"
            )
        if _process_gone(doc["host"], doc["pid"]):
            lines.append(
                f"! process {doc['pid']} is not running on this host: the job ended without "
                "updating the file (killed?)"
            )
    else:
        ending = _ENDINGS[state]
        if state == "failed":
            ending += f": {doc.get('error') or 'unknown error'}"
        lines.append(f"{ending}; the figures above are its last prediction")
    return lines


def _scope_text(doc: dict[str, Any], p: dict[str, Any] | None, *, running: bool) -> str | None:
    """Which file of a multi-process job this is, and whom the job's end waits for.

    Args:
        doc: the checked document (``scope``, ``rank``, ``world_size``: version 4 on).
        p: its prediction, or None.
        running: the job is still running (else the end is told in the past).

    Returns:
        ``job of 2 ranks`` (the job's file, ``scope`` job) or ``rank 1 of 2`` (a rank's own),
        then `` · waits for rank 1`` (``slowest_rank``; `` · this rank ends last`` in that
        rank's own file), `` (a straggler)`` where that rank is ``straggler_rank`` (else
        `` · straggler: rank 0``), with ``format_straggler_host``'s short note where its host
        was busy during its capture; None for a single process or a file without these
        fields.
    """
    world = doc.get("world_size")
    if not isinstance(world, int) or world < 2:
        return None
    rank = doc.get("rank")
    own = doc.get("scope") == "rank" and isinstance(rank, int)
    text = f"rank {rank} of {world}" if own else f"job of {world} ranks"
    if p is None:
        return text
    slowest, straggler = p.get("slowest_rank"), p.get("straggler_rank")
    busy = _finite(p.get("straggler_host_foreign_cpu"))
    note = f"; {format_straggler_host(busy, short=True)}" if busy is not None else ""
    if slowest is not None:
        if own and slowest == rank:
            text += " · this rank ends last" if running else " · this rank ended last"
        else:
            text += f" · {'waits' if running else 'waited'} for rank {slowest}"
        if straggler == slowest:
            text += f" (a straggler{note})"
    if straggler is not None and straggler != slowest:
        text += f" · straggler: rank {straggler}{f' ({note[2:]})' if note else ''}"
    return text


def _prediction_lines(p: dict[str, Any], step_s: float | None, *, running: bool) -> list[str]:
    step, total = p["step"], p.get("total_steps")
    if total:
        fraction = min(1.0, max(0.0, step / total))
        filled = round(BAR_WIDTH * fraction)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        progress = f"[{bar}] {step}/{total} {100 * fraction:.1f}%"
    else:
        progress = f"step {step} (total steps unknown)"
    level = _finite(p.get("level"))
    level_text = f" ({100 * level:g}%)" if level is not None else ""
    if step_s is None:
        step_text = "? s/step"
    else:
        ci = _finite(p.get("iteration_ci_s"))
        rel = ci / step_s if ci is not None and step_s > 0 else math.inf
        step_text = f"{format_step_time(step_s)} {format_relative(rel)}{level_text}"
    source = p.get("source") or "?"
    if running:
        step_text += f"  {source}, {'converged' if p.get('converged') else 'not converged yet'}"
    else:  # the job is over: its step time was measured, converged or not
        step_text += f"  {source}, final"
    eta = _finite(p.get("eta_s"))
    finish = p.get("finish_time")
    total_s = _finite(p.get("total_s"))
    unknown = "?" if total else "? (total steps unknown)"
    eta_text = format_duration(eta) if eta is not None else unknown
    finish_text = _local(_timestamp(finish, "", "")) if finish else unknown
    total_text = format_duration(total_s) if total_s is not None else unknown
    total_ci = _finite(p.get("total_ci_s"))
    stopped = p.get("stopped_by_time_limit") is True and total_s is not None
    if total_ci is not None and total_s is not None and not (stopped and total_ci == 0):
        total_text += f" ± {format_duration(total_ci)}{level_text}"
    limit_s = _finite(p.get("time_limit_s"))
    if stopped:
        eta_text += " (capped by the time limit)"
        total_text += " (capped by the time limit)"
    elif total_s is None and not total and limit_s is not None:
        eta_text, finish_text, total_text = _time_limit_bounds(p, limit_s)
    return [
        f"progress  {progress}",
        f"step      {step_text}",
        f"ETA       {eta_text}",
        f"finish    {finish_text}",
        f"total     {total_text}",
    ]


def _time_limit_bounds(p: dict[str, Any], limit_s: float) -> tuple[str, str, str]:
    """ETA, finish and total of a job of unknown length with a time limit: at most the limit."""
    elapsed_s = _finite(p.get("elapsed_s"))
    if elapsed_s is not None and elapsed_s >= limit_s:
        reached = f"? (total steps unknown; time limit {format_duration(limit_s)} reached)"
        return reached, reached, reached
    eta_text = "? (total steps unknown)"
    if elapsed_s is not None:
        left = format_duration(limit_s - elapsed_s)
        eta_text = f"? (total steps unknown; at most {left}: time limit)"
    finish_text = "? (total steps unknown)"
    start = p.get("start_time")
    if isinstance(start, str):
        latest = _timestamp(start, "", "") + timedelta(seconds=limit_s)
        finish_text = f"? (total steps unknown; {_local(latest)} at the latest: time limit)"
    total_text = f"? (total steps unknown; at most {format_duration(limit_s)}: time limit)"
    return eta_text, finish_text, total_text


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        return None
    return float(value) if math.isfinite(value) else None


def _local(moment: datetime) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").rstrip()


def _age(seconds: float) -> str:
    if seconds < 0:
        return f"{format_duration(-seconds)} in the future (clocks differ?)"
    return f"{format_duration(seconds)} ago"


def _process_gone(host: str, pid: int) -> bool:
    """Whether ``pid`` is certainly not running, when the file was written on this host."""
    if host != socket.gethostname() or pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists, owned by someone else
        return False
    return False


class _Screen:
    """Redraws a block of lines in place: cursor home, each line, clear the rest."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.first = True

    def draw(self, lines: list[str]) -> None:
        prefix = (_CLEAR if self.first else "") + _HOME
        self.first = False
        body = "".join(f"{line}{_CLEAR_LINE}\n" for line in lines)
        self.stream.write(prefix + body + _CLEAR_BELOW)
        self.stream.flush()


# ---------------------------------------------------------------------------------------------
# The subcommand


def run_watch(args: argparse.Namespace) -> int:
    """Watch (or print once) the status file ``args.status``.

    Args:
        args: the parsed ``watch`` arguments: ``status``, ``interval``, ``once``, ``timeout``,
            ``stale_after``.

    Returns:
        0: a snapshot was printed (not a terminal, or ``--once``), or the job's state left
        ``running`` and the final state was drawn; 1 (live view): the file says ``running``
        but its process is gone (on this host): the job ended without closing its hook.

    Raises:
        InputError: the file is missing with ``--once`` or still missing after ``--timeout``,
            is not a regular file, cannot be read, or is not a valid status file.
        KeyboardInterrupt: Ctrl-C (``cli.main`` exits 130).
    """
    path = Path(args.status)
    live = not args.once and sys.stdout.isatty()
    screen = _Screen(sys.stdout) if live else None
    footer = f"refreshing every {format_duration(args.interval)} · Ctrl-C to quit"
    missing_since: float | None = None
    while True:
        doc = read_status(path)
        if doc is None:
            if args.once:
                raise InputError(f"{path}: No such file or directory (not written yet?)")
            now = time.monotonic()
            if missing_since is None:
                missing_since = now
                if screen is None:
                    print(f"waiting for {path} ...", file=sys.stderr, flush=True)
            waited = now - missing_since
            if args.timeout is not None and waited >= args.timeout:
                raise InputError(
                    f"{path}: No such file or directory after waiting "
                    f"{format_duration(args.timeout)}"
                )
            if screen is not None:
                screen.draw([f"waiting for {path} ... {format_duration(waited)}", footer])
            pause = args.interval
            if args.timeout is not None:
                pause = min(pause, max(0.0, args.timeout - waited))
            time.sleep(pause)
            continue
        missing_since = None
        lines = render_status(doc, path, datetime.now(timezone.utc), stale_after_s=args.stale_after)
        if screen is None:
            print("\n".join(lines), flush=True)
            return EXIT_OK
        running = doc["state"] == "running"
        # A job whose process is gone (seen on this host) never writes the file again: the
        # last state drawn, then exit 1, so that a script waiting on the watch ends too.
        gone = running and _process_gone(doc["host"], doc["pid"])
        screen.draw([*lines, footer] if running and not gone else lines)
        if not running:
            return EXIT_OK
        if gone:
            return EXIT_FAILURE
        time.sleep(args.interval)


def add_watch_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``watch``: render a status file (``ETSHook(status_path=...)``) live.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.

    Returns:
        The ``watch`` subparser (its ``handler`` is ``run_watch``).
    """
    p = subparsers.add_parser(
        "watch",
        help="show a job's status file live: progress, step time, ETA, finish time",
        description="Render a status file written by ETSHook(status_path=...): the job (in a "
        "multi-process job, whether the file is the job's or one rank's, and the rank its end "
        "waits for), a progress bar, the step time and its interval, the ETA, the predicted "
        "finish (local time), the total and its interval, and how old the file is. On a "
        "terminal it is redrawn every --interval seconds until the job's state leaves "
        "running; otherwise, or with --once, one snapshot is printed. A missing file is "
        "waited for.",
        epilog=exit_codes_epilog(
            "the snapshot was printed, or the job ended (closed, interrupted, failed) and its "
            "final state was drawn",
            "usage error, or STATUS is not a regular file (a directory, FIFO, device), "
            "unreadable, not valid JSON, not an ets-hook status file or of a newer version; "
            "or it is missing with --once, or still missing after --timeout",
            "live view: the file says running but the job's process, on this host, is gone "
            "(killed: the hook never closed), after drawing its last state; or an unexpected "
            "failure while running (Python's traceback)",
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("status", metavar="STATUS", help="the status file (JSON)")
    p.add_argument(
        "--interval",
        metavar="SECONDS",
        type=float_in(0, low_open=True),
        default=2.0,
        help="seconds between refreshes (2)",
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float_in(0),
        default=None,
        help="seconds to wait for a missing file before giving up (default: forever)",
    )
    p.add_argument(
        "--stale-after",
        metavar="SECONDS",
        type=float_in(0, low_open=True),
        default=STALE_AFTER_S,
        help="a running job's file older than this many seconds (and than three step times) "
        f"is reported stale ({STALE_AFTER_S:g}: three times the hook's {WRITE_INTERVAL_S:g} s "
        "interval)",
    )
    p.set_defaults(handler=run_watch)
    return p
