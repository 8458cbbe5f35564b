"""The ``ets-hook`` command line: info, export, demo, train, evaluate.

Subcommands import what they need lazily, so ``ets-hook info`` on a trace does not import torch.
Exit codes: 0 success, 1 runtime failure, 2 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from . import __version__
from .trace import IterationTrace, Trace


@dataclass(frozen=True)
class IterationSummary:
    step: int
    duration_ms: float
    ops: int
    top_level_ops: int
    kernels: int
    correlated_kernels: int
    cpu_ms: float  # summed duration of outermost ops
    gpu_ms: float  # summed kernel/memcpy/memset time
    gaps_ms: float  # summed ETS gaps of outermost ops (host or device gaps)


def summarize_iteration(iteration: IterationTrace) -> IterationSummary:
    top = list(iteration.top_level_ops())
    return IterationSummary(
        step=iteration.step,
        duration_ms=iteration.duration_ns / 1e6,
        ops=len(iteration.ops),
        top_level_ops=len(top),
        kernels=len(iteration.kernels),
        correlated_kernels=sum(1 for k in iteration.kernels if k.op_index >= 0),
        cpu_ms=sum(op.duration_ns for op in top) / 1e6,
        gpu_ms=sum(k.duration_ns for k in iteration.kernels) / 1e6,
        gaps_ms=sum(op.gap_ns for op in top if op.gap_ns > 0) / 1e6,
    )


def format_info(trace: Trace, source: str) -> str:
    device = trace.device.name or trace.device.kind
    lines = [
        f"trace    {source}",
        f"device   {device} ({trace.device.kind})   host {trace.host.hostname}"
        f"   torch {trace.torch_version}   ets-hook {trace.ets_hook_version}",
        f"capture  steps [{trace.capture.skip_steps}, "
        f"{trace.capture.skip_steps + trace.capture.capture_steps})"
        f"   ops: {trace.capture.op_capture or '-'}"
        f"   shapes: {trace.capture.shapes_recorded or '-'}",
        f"kernels  {trace.capture.kernel_capture or '-'}"
        f"   dropped records: {trace.capture.dropped_records}",
        f"rank     {trace.rank}/{trace.world_size}",
        "",
        f"{'step':>5} {'time ms':>9} {'ops':>7} {'top':>6} {'kernels':>8} {'linked':>7}"
        f" {'cpu ms':>9} {'gpu ms':>9} {'gaps ms':>9}",
    ]
    for iteration in trace.iterations:
        s = summarize_iteration(iteration)
        lines.append(
            f"{s.step:>5} {s.duration_ms:>9.3f} {s.ops:>7} {s.top_level_ops:>6} {s.kernels:>8}"
            f" {s.correlated_kernels:>7} {s.cpu_ms:>9.3f} {s.gpu_ms:>9.3f} {s.gaps_ms:>9.3f}"
        )
    if trace.step_times_s:
        timed = ", ".join(f"{t * 1e3:.2f}" for t in trace.step_times_s[:12])
        more = " ..." if len(trace.step_times_s) > 12 else ""
        lines += ["", f"step times (ms) from step 0: {timed}{more}"]
    return "\n".join(lines)


def _load(path: str) -> Trace:
    from .trace_io import load_trace

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
    from .chrome import export_chrome

    trace = _load(args.trace)
    target = export_chrome(trace, args.chrome)
    events = sum(len(it.ops) + len(it.kernels) for it in trace.iterations)
    print(f"wrote {target} ({events} events); open it in https://ui.perfetto.dev")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
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
    from .demo import add_demo_arguments

    add_demo_arguments(demo)
    demo.set_defaults(handler=_cmd_demo)

    try:
        from .model_cli import add_evaluate_parser, add_train_parser
    except ImportError:  # pragma: no cover - the model CLI ships with the package
        pass
    else:
        add_train_parser(commands)
        add_evaluate_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .trace_io import TraceFileError

    try:
        return int(args.handler(args) or 0)
    except TraceFileError as exc:
        print(f"ets-hook: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"ets-hook: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
