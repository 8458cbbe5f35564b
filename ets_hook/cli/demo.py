"""``ets-hook demo``: a real training run with the hook, printing predicted vs actual.

Trains one of the built-in zoo models on synthetic data (CPU by default, CUDA when asked or
available with ``--device auto``), prints the capture summary once the trace is decoded, the
prediction at a few early steps, and at the end the error of each early prediction against what
actually happened: total wall time from hook creation to the last step's end, and the steady-state
step time (median of the second half of the steps).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass

from ..capture.sysinfo import DISABLE_ENV, hooks_disabled
from .common import InputError, exit_codes_epilog, int_at_least, parse_seed, require_output

REPORT_STEPS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
MIN_STEPS = 10
#: ``--model`` choice -> the ``cli.zoo`` workload the demo trains (names only: building the
#: parser must not import torch).
DEMO_MODELS = {
    "mlp": "mlp-w512-d3-b64",
    "cnn": "resnet-w8-x1-b16-s32",
    "lstm": "lstm-h64-l1-b32-t32",
    "transformer": "transformer-d64-l2-b16-t32",
    "gpt": "gpt-d64-l2-b8-t64",
}
#: The ``exit codes`` section of ``ets-hook demo --help``.
DEMO_EXIT_CODES = exit_codes_epilog(
    "the run finished (and --trace, when given, was written)",
    f"usage error or invalid value: --steps below {MIN_STEPS}, an unknown --model, a --device "
    "other than cpu, cuda, cuda:N or auto, --device cuda without a CUDA device, a --seed "
    "outside [0, 2**63 - 1], a --trace path that is a directory or in a missing or read-only "
    f"directory, or {DISABLE_ENV}=1 in the environment (it turns off the hook the demo shows)",
    "a failure while training (Python's traceback), or the trace asked for was not written",
)


@dataclass(frozen=True)
class EarlyPrediction:
    """The prediction after one early step, kept to compare with what actually happened.

    Attributes:
        step: the step count after which it was read.
        iteration_s: predicted steady-state step time, s.
        iteration_ci_s: half-width of its 95% interval, s.
        total_s: predicted total wall time from hook creation to the last step's end, s.
        source: the prediction's ``source``.
    """

    step: int
    iteration_s: float
    iteration_ci_s: float
    total_s: float
    source: str


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``demo``'s options (``--model``, ``--steps``, ``--device``, ``--trace``, ``--seed``).

    Args:
        parser: the ``demo`` subparser.
    """
    parser.add_argument(
        "--model", choices=sorted(DEMO_MODELS), default="transformer", help="built-in model"
    )
    parser.add_argument(
        "--steps",
        type=int_at_least(MIN_STEPS),
        default=300,
        help=f"training steps, >= {MIN_STEPS} (default 300)",
    )
    parser.add_argument(
        "--device",
        type=_device,
        default="cpu",
        help="cpu (default), cuda, cuda:N, or auto (cuda when available)",
    )
    parser.add_argument(
        "--trace",
        metavar="PATH",
        help="also write the captured trace here (its directory must exist)",
    )
    parser.add_argument(
        "--seed", type=parse_seed, default=0, help="random seed, 0 to 2**63 - 1 (0)"
    )


def _device(text: str) -> str:
    """``--device``: cpu, cuda, cuda:N or auto (else an argparse usage error, exit 2).

    Args:
        text: the option's value.

    Returns:
        The value, lower-cased.

    Raises:
        argparse.ArgumentTypeError: any other value.
    """
    device = text.strip().lower()
    if device not in ("cpu", "auto") and not re.fullmatch(r"cuda(:\d+)?", device):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or auto, got {text!r}")
    return device


def _pct(predicted: float, actual: float) -> str:
    return f"{100.0 * (predicted - actual) / actual:+.1f}%"


def run_demo(args: argparse.Namespace) -> int:
    """Run ``ets-hook demo``: train, print early predictions, then their errors; prints to stdout.

    Args:
        args: the parsed namespace (``model``, ``steps``, ``device``, ``trace``, ``seed``).

    Returns:
        0; 1 (with a line on stderr) when ``--trace`` was asked for but not written.

    Raises:
        InputError: ``ETS_HOOK_DISABLE`` turns hooks off (the demo shows the hook, so it does
            nothing: no build, no files); ``--trace`` is empty, a directory, or in a folder that
            is missing, not a directory or where no file can be created (read-only, ``/proc``),
            or ``--device cuda`` is asked for without a CUDA device (checked before training).
    """
    if hooks_disabled():
        raise InputError(
            f"{DISABLE_ENV}={os.environ[DISABLE_ENV].strip()} turns ets-hook off and the demo "
            f"shows ets-hook, so there is nothing to show: unset {DISABLE_ENV} to run the demo"
        )
    if args.trace is not None:
        require_output(args.trace, option="--trace")
    import torch

    from ..capture import native_ops
    from ..forecast.text import format_duration
    from ..hook import ETSHook
    from .zoo import workloads

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: no CUDA device is available")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise InputError(
                f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    workload = workloads()[DEMO_MODELS[args.model]]
    job = workload.build(device, seed=args.seed)
    batches = job.batches()
    print(
        f"ets-hook demo: {workload.name} ({workload.family}) on {device}, {args.steps} steps, "
        f"batch {workload.batch_size}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )

    started = time.perf_counter()
    observer = native_ops.load(build_if_missing=True)  # one-off compile, a few seconds
    if observer is None:
        print(f"op capture: torch profiler (native observer: {native_ops.unavailable_reason()})")
    elif time.perf_counter() - started > 0.5:
        print(f"op capture: built the native observer in {time.perf_counter() - started:.1f} s")
    hook = ETSHook(
        job.model, optimizer=job.optimizer, total_steps=args.steps, trace_path=args.trace
    )
    early: list[EarlyPrediction] = []
    summary_printed = False
    for step in range(1, args.steps + 1):
        job.train_step(next(batches))
        if step in REPORT_STEPS:
            prediction = hook.prediction
            if prediction is not None:
                early.append(
                    EarlyPrediction(
                        step,
                        prediction.iteration_s,
                        prediction.iteration_ci_s,
                        prediction.total_s,
                        prediction.source,
                    )
                )
                print(
                    f"  after step {step:>4}: {prediction.iteration_s * 1e3:8.2f} ms/step "
                    f"±{100 * prediction.iteration_ci_s / prediction.iteration_s:4.1f}%   "
                    f"total {format_duration(prediction.total_s):>8}   [{prediction.source}]"
                )
        if not summary_printed and hook.trace is not None:
            summary_printed = True
            _print_capture_summary(hook)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    actual_total_s = (time.perf_counter_ns() - hook.created_ns) / 1e9
    hook.close()
    if not summary_printed:
        _print_capture_summary(hook)

    times = hook.step_times_s
    steady_s = statistics.median(times[len(times) // 2 :])
    print(
        f"\nactual: total {format_duration(actual_total_s)} ({actual_total_s:.2f} s), "
        f"steady state {steady_s * 1e3:.2f} ms/step (median of the second half), "
        f"first step {times[0] * 1e3:.1f} ms"
    )
    print(f"\n{'after step':>10} {'ms/step':>9} {'error':>8} {'total s':>9} {'error':>8}  source")
    for item in early:
        print(
            f"{item.step:>10} {item.iteration_s * 1e3:>9.2f} {_pct(item.iteration_s, steady_s):>8}"
            f" {item.total_s:>9.2f} {_pct(item.total_s, actual_total_s):>8}  {item.source}"
        )
    if args.trace is not None and hook.trace_path is not None and not hook.trace_path.is_file():
        print(
            f"ets-hook demo: error: {args.trace}: the trace was not written "
            f"(capture: {hook.capture_status})",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_capture_summary(hook: object) -> None:
    from ..trace.summary import summarize_iteration

    trace = getattr(hook, "trace", None)
    print(f"\ncapture: {hook.capture_status}; kernels: {hook.kernel_capture_status}")  # type: ignore[attr-defined]
    if trace is None:
        return
    for iteration in trace.iterations:
        s = summarize_iteration(iteration)
        print(
            f"  step {s.step + 1}: {s.duration_ms:8.2f} ms, {s.ops} ops"
            f" ({s.top_level_ops} top-level), {s.kernels} kernels, host gaps {s.gaps_ms:.2f} ms"
        )
    print()
