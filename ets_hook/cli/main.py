"""The ``ets-hook`` command line: info, export, demo, build-ops, train, evaluate.

Subcommands import what they need lazily, so ``ets-hook info`` on a trace does not import torch.
Exit codes: 0 success, 1 runtime failure, 2 bad usage or unreadable input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .. import __version__
from ..errors import ETSCSVError, ModelFileError, NativeOpsBuildError, TraceFileError
from ..trace.events import Trace
from ..trace.summary import format_info, summarize_iteration
from .demo import add_demo_arguments
from .train import add_evaluate_parser, add_train_parser


def _load(path: str) -> Trace:
    from ..trace.io import load_trace

    return load_trace(path)


def _cmd_info(args: argparse.Namespace) -> int:
    trace = _load(args.trace)
    if args.json:
        payload: dict[str, Any] = {
            "trace": args.trace,
            "device": asdict(trace.device),
            "capture": asdict(trace.capture),
            "torch_version": trace.torch_version,
            "step_times_s": trace.step_times_s,
            "iterations": [asdict(summarize_iteration(it)) for it in trace.iterations],
        }
        print(json.dumps(payload, indent=2))
    else:
        print(format_info(trace, args.trace))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ..trace.chrome import export_chrome

    trace = _load(args.trace)
    target = export_chrome(trace, args.chrome)
    events = sum(len(it.ops) + len(it.kernels) for it in trace.iterations)
    print(f"wrote {target} ({events} events); open it in https://ui.perfetto.dev")
    return 0


def _cmd_build_ops(args: argparse.Namespace) -> int:
    from ..capture import native_ops

    started = time.perf_counter()
    try:
        path = native_ops.build(force=args.force)
    except NativeOpsBuildError as exc:
        print(f"ets-hook: {exc}", file=sys.stderr)
        return 1
    module = native_ops.load()
    if module is None:
        print(
            f"ets-hook: built {path} but cannot load it: {native_ops.unavailable_reason()}",
            file=sys.stderr,
        )
        return 1
    print(
        f"native op observer for torch {module.TORCH_VERSION}: {path} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``ets-hook`` parser with every subcommand.

    Returns:
        The parser; each subcommand sets ``handler`` (namespace -> exit code) on its result.
    """
    parser = argparse.ArgumentParser(
        prog="ets-hook",
        description="Early, honest training-time prediction for PyTorch (ETS).",
    )
    parser.add_argument("--version", action="version", version=f"ets-hook {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="per-step table of a trace file")
    info.add_argument("trace", help="an .ets trace file")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(handler=_cmd_info)

    export = commands.add_parser("export", help="convert a trace to Chrome/Perfetto JSON")
    export.add_argument("trace", help="an .ets trace file")
    export.add_argument("--chrome", required=True, metavar="OUT.json", help="output path")
    export.set_defaults(handler=_cmd_export)

    demo = commands.add_parser(
        "demo", help="train a small model with the hook: predicted vs actual"
    )
    add_demo_arguments(demo)
    demo.set_defaults(handler=_cmd_demo)

    build_ops = commands.add_parser(
        "build-ops",
        help="compile the native op observer for the installed torch (cached; else on first use)",
    )
    build_ops.add_argument("--force", action="store_true", help="rebuild even when cached")
    build_ops.set_defaults(handler=_cmd_build_ops)

    add_train_parser(commands)
    add_evaluate_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ets-hook`` command line.

    Args:
        argv: the arguments after the program name; None: ``sys.argv[1:]``.

    Returns:
        The exit code: the handler's (None counts as 0); 2 after printing one line to stderr
        for an unreadable or invalid input (a trace, CSV or model file that is malformed,
        missing, a folder, or not readable); 130 on ``KeyboardInterrupt``.

    Raises:
        SystemExit: from argparse on bad usage (code 2), ``--help`` or ``--version`` (code 0).
            Other exceptions from a handler propagate (exit code 1).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (TraceFileError, ETSCSVError, ModelFileError, OSError) as exc:
        print(f"ets-hook: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
