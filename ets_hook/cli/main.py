"""The ``ets-hook`` command line: info, export, demo, build-ops, train, evaluate, watch.

Subcommands import what they need lazily, so ``ets-hook info`` on a trace does not import torch.
Exit codes (``cli.common``): 0 success; 2 a usage error, an invalid option value, or an
unreadable or invalid input (one line naming the file and the problem); 1 a failure while
running; 130 interrupted; 141 stdout's reader went away early (``| head``), quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from .. import __version__
from ..errors import ETSCSVError, ModelFileError, NativeOpsBuildError, TraceFileError
from ..trace.breakdown import find_straggler, format_rank_table, rank_breakdown
from ..trace.events import Trace
from ..trace.summary import format_info, info_document, printable
from .common import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES_HELP,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
    InputError,
    ascii_substitutes,
    describe,
    exit_codes_epilog,
    reading,
    require_output,
)
from .demo import DEMO_EXIT_CODES, add_demo_arguments
from .train import add_evaluate_parser, add_train_parser
from .watch import add_watch_parser

_TRACE_INPUT = (
    "usage error, or TRACE is missing, not a regular file (a directory, FIFO, device), not "
    "readable, or not a valid .ets trace (or ETS paper CSV)"
)
_UNEXPECTED = "an unexpected failure while running (Python's traceback)"


def _load(path: str) -> Trace:
    """An ``.ets`` trace, or one ETS paper artifact CSV file (``trace.importers``)."""
    with reading(path):
        if path.lower().endswith(".csv"):
            from ..trace.importers import read_ets_csv

            return read_ets_csv(path)
        from ..trace.io import load_trace

        return load_trace(path)


def not_ranks_of_one_job(traces: Sequence[Trace], paths: Sequence[str]) -> str | None:
    """Why traces given together do not look like the ranks of one job, if they do not.

    Ranks of one job each say a different rank, below the same world size, and trace the same
    model (where the traces name it).

    Args:
        traces: the loaded traces.
        paths: their files, in the same order (named in the reasons).

    Returns:
        The reasons, joined by ``"; "``; None when the traces look like ranks of one job.
    """
    reasons = []
    first_of_rank: dict[int, str] = {}
    for trace, path in zip(traces, paths):
        if trace.rank in first_of_rank:
            reasons.append(f"{first_of_rank[trace.rank]} and {path} both say rank {trace.rank}")
        else:
            first_of_rank[trace.rank] = path
    if len({trace.world_size for trace in traces}) > 1:
        sizes = ", ".join(f"{path}: {trace.world_size}" for trace, path in zip(traces, paths))
        reasons.append(f"their world sizes differ ({sizes})")
    reasons += [
        f"{path} says rank {trace.rank} of a world size of {trace.world_size}"
        for trace, path in zip(traces, paths)
        if trace.rank >= trace.world_size
    ]
    models = [trace.metadata.get("model") or "" for trace in traces]
    if len(set(map(printable, models)) - {""}) > 1:
        named = ", ".join(
            f"{path}: {printable(model)}" for path, model in zip(paths, models) if model
        )
        reasons.append(f"they trace different models ({named})")
    return "; ".join(reasons) or None


def _cmd_info(args: argparse.Namespace) -> int:
    paths: list[str] = args.trace
    traces = [_load(path) for path in paths]
    if len(traces) == 1:
        if args.json:
            print(json.dumps(info_document(traces[0], paths[0]), indent=2, allow_nan=False))
        else:
            print(format_info(traces[0], paths[0]))
        return EXIT_OK
    not_one_job = not_ranks_of_one_job(traces, paths)
    # Compared as ranks, traces of different jobs would give numbers that mean nothing.
    breakdowns = [rank_breakdown(trace) for trace in traces] if not_one_job is None else []
    ranked = [(b, t.host.hostname) for b, t in zip(breakdowns, traces) if b is not None]
    if args.json:
        found = find_straggler(
            {b.rank: b.busy_s for b, _ in ranked},
            busy_se_s_by_rank={b.rank: b.busy_se_s for b, _ in ranked},
        )
        document = {
            "traces": [info_document(t, p) for t, p in zip(traces, paths)],
            "ranks": [asdict(b) for b, _ in ranked],
            "straggler_rank": found[0] if found else None,
            "straggler_ratio": found[1] if found else None,
            "not_one_job": not_one_job,
        }
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        for index, (trace, path) in enumerate(zip(traces, paths)):
            last = index == len(traces) - 1 and not_one_job is not None
            print(format_info(trace, path), end="\n" if last else "\n\n")
        if not_one_job is None:
            print("per rank (medians over the captured steps):")
            print(format_rank_table([b for b, _ in ranked], [h for _, h in ranked]))
    if not_one_job is not None:
        sys.stdout.flush()  # the warning after the traces it is about
        print(
            f"ets-hook info: warning: these traces are not the ranks of one job ({not_one_job}): "
            "no per-rank comparison",
            file=sys.stderr,
        )
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from ..trace.chrome import chrome_document, write_chrome

    require_output(args.chrome, option="--chrome")
    trace = _load(args.trace)
    document = chrome_document(trace)
    with reading(args.chrome, errors=(OSError,)):
        target = write_chrome(document, args.chrome)
    # The events the file holds; beyond ops and kernels: steps, launch arrows and track names.
    events = len(document["traceEvents"])
    ops = sum(len(it.ops) for it in trace.iterations)
    kernels = sum(len(it.kernels) for it in trace.iterations)
    print(
        f"wrote {target} ({events} trace events: {ops} ops, {kernels} kernels); "
        "open it in https://ui.perfetto.dev"
    )
    return EXIT_OK


def _cmd_build_ops(args: argparse.Namespace) -> int:
    from ..capture import native_ops

    started = time.perf_counter()
    try:
        path = native_ops.build(force=args.force)
    except (NativeOpsBuildError, OSError) as exc:
        print(f"ets-hook build-ops: error: {describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    module = native_ops.load()
    if module is None:
        print(
            f"ets-hook build-ops: error: built {path} but cannot load it: "
            f"{native_ops.unavailable_reason()}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    print(
        f"native op observer for torch {module.TORCH_VERSION}: {path} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``ets-hook`` parser with every subcommand.

    Returns:
        The parser; each subcommand sets ``handler`` (namespace -> exit code) and ``subparser``
        (its own parser) on its result.
    """
    parser = argparse.ArgumentParser(
        prog="ets-hook",
        description="Early, honest training-time prediction for PyTorch (ETS).",
        epilog=EXIT_CODES_HELP,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ets-hook {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser(
        "info",
        help="per-step table of a trace file",
        description="Print a per-step table of an .ets trace (or an ETS paper artifact CSV "
        "file): ops, kernels, CPU/GPU time, gaps.",
        epilog=exit_codes_epilog("the table (or JSON) was printed", _TRACE_INPUT, _UNEXPECTED),
        formatter_class=HelpFormatter,
    )
    info.add_argument(
        "trace",
        nargs="+",
        help="an .ets trace file or an ETS paper CSV file; several (one per rank): also a "
        "per-rank table of compute, data wait and the rest per step, naming a straggler "
        "(traces that are not the ranks of one job, with a rank twice, different world sizes "
        "or models: a warning instead)",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(handler=_cmd_info)

    export = commands.add_parser(
        "export",
        help="convert a trace to Chrome/Perfetto JSON",
        description="Write an .ets trace as Chrome/Perfetto JSON: ops on threads, kernels on "
        "streams, flow arrows from launches to kernels.",
        epilog=exit_codes_epilog(
            "OUT.json was written",
            f"{_TRACE_INPUT}; or OUT.json cannot be written (a directory, or in a missing "
            "directory)",
            _UNEXPECTED,
        ),
        formatter_class=HelpFormatter,
    )
    export.add_argument("trace", help="an .ets trace file or an ETS paper CSV file")
    export.add_argument("--chrome", required=True, metavar="OUT.json", help="output path")
    export.set_defaults(handler=_cmd_export)

    demo = commands.add_parser(
        "demo",
        help="train a small model with the hook: predicted vs actual",
        description="Train a built-in model on synthetic data with the hook; print the capture "
        "summary, the early predictions and, at the end, their errors against what happened.",
        epilog=DEMO_EXIT_CODES,
        formatter_class=HelpFormatter,
    )
    add_demo_arguments(demo)
    demo.set_defaults(handler=_cmd_demo)

    build_ops = commands.add_parser(
        "build-ops",
        help="compile the native op observer for the installed torch (cached; else on first use)",
        description="Compile the native op observer (ets_hook._ops) for the installed torch "
        "into the cache ($ETS_HOOK_CACHE_DIR, else ~/.cache/ets-hook), unless it is there.",
        epilog=exit_codes_epilog(
            "built, or already in the cache",
            "usage error",
            "it cannot be built (no C++ compiler, no torch headers, a compile error, a cache "
            "folder that cannot be written) or loaded: one line on stderr says why",
        ),
        formatter_class=HelpFormatter,
    )
    build_ops.add_argument("--force", action="store_true", help="rebuild even when cached")
    build_ops.set_defaults(handler=_cmd_build_ops)

    add_train_parser(commands)
    add_evaluate_parser(commands)
    add_watch_parser(commands)
    for subparser in commands.choices.values():
        subparser.set_defaults(subparser=subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ets-hook`` command line.

    Args:
        argv: the arguments after the program name; None: ``sys.argv[1:]``.

    Returns:
        The exit code: the handler's (None counts as 0); 2 after printing one line to stderr,
        ``ets-hook CMD: error: FILE: PROBLEM``, for an unreadable or invalid input (an
        ``InputError``, or a trace, CSV or model file error that escaped one); 130 on
        ``KeyboardInterrupt``; 141, with nothing on stderr, when stdout's reader went away
        (``ets-hook info T.ets | head -1``), as a Unix tool that SIGPIPE stops.

    Raises:
        SystemExit: from argparse on bad usage or an invalid option value (code 2), ``--help``
            or ``--version`` (code 0). Any other exception from a handler propagates: Python
            prints its traceback and exits 1.
    """
    try:
        with ascii_substitutes():  # an ASCII stdout gets "+/-" for "±", never an encoding error
            try:
                code = _run(argv)
            except SystemExit:
                sys.stdout.flush()  # what argparse printed (--help), while a closed pipe is caught
                raise
            sys.stdout.flush()  # here, not at the interpreter's exit, where it cannot be caught
            return code
    except BrokenPipeError:
        return _reader_gone()


def _run(argv: Sequence[str] | None) -> int:
    """``main`` without the closed-pipe handling: parse ``argv``, run the handler."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, whose usage line is the relevant one
        args.subparser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.handler(args) or EXIT_OK)
    except (InputError, TraceFileError, ETSCSVError, ModelFileError) as exc:
        print(f"ets-hook {args.command}: error: {describe(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _reader_gone() -> int:
    """Exit quietly after a ``BrokenPipeError``: the reader of stdout (or stderr) went away.

    Python's recipe (the ``signal`` module's note on SIGPIPE): point the closed stream at
    ``os.devnull``, so that the interpreter's final flush of what is still buffered does not
    raise again ("Exception ignored ... BrokenPipeError", exit 120).

    Returns:
        141 (128 + SIGPIPE), what a shell reports for a tool that SIGPIPE stopped.
    """
    _to_devnull(sys.stdout)
    try:
        sys.stderr.flush()  # the same pipe (2>&1 | head) may hold the rest of a line
    except (AttributeError, OSError, ValueError):
        _to_devnull(sys.stderr)
    return EXIT_BROKEN_PIPE


def _to_devnull(stream: object) -> None:
    """Point ``stream``'s file descriptor at ``os.devnull`` (not a real file: left alone)."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (AttributeError, OSError, ValueError):
        return  # None, or captured in a test, or closed: nothing for the final flush to fail
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
