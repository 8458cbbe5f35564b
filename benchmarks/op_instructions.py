"""Instructions per op that each op-capture mode adds, counted by valgrind's callgrind.

Wall time on a shared machine moves by more than the cost of observing one op; instruction
counts do not. This script re-runs itself under ``valgrind --tool=callgrind
--instr-atstart=no`` (the interpreter start-up and ``import torch`` run uninstrumented) and, in
that child, runs a tiny op-bound loop in each mode:

- ``none``:             nothing observes the ops;
- ``native``,           ets-hook's native RecordFunction observer (``NativeOpCapture``), without
  ``native+shapes``:    / with input shapes;
- ``profiler``,         ets-hook's profiler path (``ProfilerOpCapture``: Kineto CPU profiler,
  ``profiler+shapes``:  the same observer a bare ``torch.profiler.profile`` installs);
- ``none`` again last (``none(repeat)``): the counts' own noise floor.

Each mode's capture is started, then warmed up, then the loop runs between callgrind client
requests (``CALLGRIND_ZERO_STATS`` / ``CALLGRIND_DUMP_STATS_AT``, through a ten-line C helper
compiled against ``valgrind/callgrind.h`` at run time), so only the loop's instructions are
counted; the capture's ``stop`` and ``read`` (the profiler's disable materialises every event on
the training thread; ``read`` turns the records into ``RawOp`` rows, off the training thread in
the hook) are counted as separate segments. Reported per mode: instructions per op added in the
loop over ``none`` (all threads), and ``stop`` / ``read`` instructions per recorded event.

Loops (``--loops``): ``add``, ``--iters`` calls of ``torch.add`` on two 4-element tensors (one
op each); ``mlp``, ``--iters / 10`` training steps of a 16-16-1 MLP with SGD (forward, backward,
optimizer step: ~110 ops each, autograd nodes included). Ops per iteration are counted with the
native observer beforehand (and checked against the profiler's event count).

Needs valgrind (``valgrind --version``), ``valgrind/callgrind.h`` and a C compiler. The default
run (both loops, 2000 iterations) takes about a minute. Usage::

    python benchmarks/op_instructions.py [--iters 2000] [--loops add,mlp] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("none", "native", "native+shapes", "profiler", "profiler+shapes", "none(repeat)")
LOOPS = ("add", "mlp")
MLP_DIVISOR = 10  # mlp runs iters / 10 steps (each step is ~110 ops)
WARMUP = 50
TRIGGER = "desc: Trigger: Client Request: "
HELPER_SOURCE = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int cg_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
"""


# ---------------------------------------------------------------------------------------------
# Parent: build what the child needs, run it under callgrind, read the dumps


def build_helper(folder: Path) -> Path:
    """Compile the callgrind client-request helper into ``folder`` (cached by source hash)."""
    header = Path("/usr/include/valgrind/callgrind.h")
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler (set CC or install gcc)")
    key = hashlib.sha256(HELPER_SOURCE.encode()).hexdigest()[:12]
    output = folder / f"cg_helper-{key}.so"
    if output.is_file():
        return output
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"cg_helper-{key}.c"
    source.write_text(HELPER_SOURCE)
    tmp = output.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(tmp)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        hint = "" if header.is_file() else f" ({header} is missing: install valgrind's headers)"
        raise SystemExit(f"cannot compile the callgrind helper{hint}:\n{result.stderr[-2000:]}")
    os.replace(tmp, output)
    return output


def read_dumps(folder: Path) -> dict[str, int]:
    """``label -> instructions`` of every client-request dump callgrind wrote into ``folder``."""
    counts: dict[str, int] = {}
    for path in glob.glob(str(folder / "cg.out.*")):
        label, total = None, None
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(TRIGGER):
                    label = line[len(TRIGGER) :].strip()
                elif line.startswith("summary:"):
                    total = int(line.split()[1])
                    break
        if label is not None and total is not None:
            counts[label] = total
    return counts


def run_parent(args: argparse.Namespace) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found")
    version = subprocess.run(
        [valgrind, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    from ets_hook.capture import native_ops

    module = native_ops.load(build_if_missing=True)  # never compile under valgrind
    if module is None:
        print(f"WARNING: no native observer: {native_ops.unavailable_reason()}", file=sys.stderr)
    helper = build_helper(native_ops.cache_dir() / "bench")
    with tempfile.TemporaryDirectory(prefix="op-instructions-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in glob.glob(str(folder / "cg.out*")):
            os.unlink(stale)
        command = [
            valgrind,
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={folder / 'cg.out'}",
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            "--helper",
            str(helper),
            "--iters",
            str(args.iters),
            "--loops",
            args.loops,
        ]
        print(f"{version}; running: {' '.join(command[:4])} python {Path(__file__).name} ...")
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
        if result.returncode != 0 or not lines:
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-5000:])
            raise SystemExit(f"the callgrind child failed (exit {result.returncode})")
        child = json.loads(lines[-1][len("RESULT ") :])
        counts = read_dumps(folder)
    report = summarize(child, counts)
    report.update({"valgrind": version, "elapsed_s": elapsed, "iters": args.iters})
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0


def summarize(child: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    """Instructions per op added per mode and loop, from the child's facts and the dumps."""
    out: dict[str, Any] = {"torch": child["torch"], "loops": {}}
    for loop, facts in child["loops"].items():
        ops = facts["iters"] * facts["ops_per_iter"]
        base = counts.get(f"{loop}/none/loop")
        modes: dict[str, Any] = {}
        for mode in MODES:
            loop_count = counts.get(f"{loop}/{mode}/loop")
            if loop_count is None:
                continue
            rows = facts["rows"].get(mode, 0)
            entry: dict[str, Any] = {
                "loop_instructions": loop_count,
                "per_op": loop_count / ops,
                "added_per_op": (loop_count - base) / ops if base is not None else None,
                "events_recorded": rows,
            }
            for segment in ("start", "stop", "read"):
                value = counts.get(f"{loop}/{mode}/{segment}")
                if value is not None:
                    entry[f"{segment}_instructions"] = value
                    entry[f"{segment}_per_event"] = value / rows if rows else None
            modes[mode] = entry
        ratios = {}
        for label, num, den in (
            ("native/profiler", "native", "profiler"),
            ("native+shapes/profiler+shapes", "native+shapes", "profiler+shapes"),
        ):
            a = modes.get(num, {}).get("added_per_op")
            b = modes.get(den, {}).get("added_per_op")
            ratios[label] = a / b if a is not None and b else None
        out["loops"][loop] = {
            "iters": facts["iters"],
            "ops_per_iter": facts["ops_per_iter"],
            "ops_per_iter_profiler": facts["ops_per_iter_profiler"],
            "modes": modes,
            "ratios": ratios,
        }
    return out


def print_report(report: dict[str, Any]) -> None:
    print(f"torch {report['torch']}; child ran {report['elapsed_s']:.0f} s under callgrind")
    for loop, r in report["loops"].items():
        print(
            f"\n{loop}: {r['iters']} iterations x {r['ops_per_iter']:g} ops (native count; "
            f"profiler {r['ops_per_iter_profiler']:g})"
        )
        print(
            f"  {'mode':16} {'instr/op':>9} {'added/op':>9} {'events':>7} "
            f"{'stop/event':>10} {'read/event':>10} {'start':>10}"
        )
        for mode, e in r["modes"].items():
            added = e["added_per_op"]
            print(
                f"  {mode:16} {e['per_op']:9.0f} "
                f"{'' if added is None else f'{added:+9.0f}':>9} {e['events_recorded']:7d} "
                f"{_opt(e.get('stop_per_event')):>10} {_opt(e.get('read_per_event')):>10} "
                f"{_opt(e.get('start_instructions')):>10}"
            )
        ratios = "  ".join(
            f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in r["ratios"].items()
        )
        print(f"  added-per-op ratios: {ratios}")


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


# ---------------------------------------------------------------------------------------------
# Child: runs under callgrind


def run_child(args: argparse.Namespace) -> int:
    import torch

    from ets_hook.capture import native_ops
    from ets_hook.capture.ops import NativeOpCapture, ProfilerOpCapture

    torch.set_num_threads(1)
    cg = ctypes.CDLL(args.helper)
    cg.cg_dump.argtypes = [ctypes.c_char_p]
    module = native_ops.load()

    def capture_for(mode: str) -> tuple[Any, bool]:
        shapes = mode.endswith("+shapes")
        if mode.startswith("native"):
            if module is None:
                return None, shapes
            return NativeOpCapture(module), shapes
        if mode.startswith("profiler"):
            return ProfilerOpCapture(), shapes
        return None, shapes

    def make_loop(name: str) -> tuple[Any, int]:
        if name == "add":
            a, b = torch.ones(4), torch.ones(4)

            def add(count: int) -> None:
                for _ in range(count):
                    torch.add(a, b)

            return add, args.iters
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(4, 16)

        def mlp(count: int) -> None:
            for _ in range(count):
                opt.zero_grad(set_to_none=True)
                model(x).sum().backward()
                opt.step()

        return mlp, max(1, args.iters // MLP_DIVISOR)

    def ops_per_iter(fn: Any, capture: Any) -> float:
        fn(3)
        capture.start(True)
        fn(10)
        capture.stop()
        return len(capture.read()) / 10

    facts: dict[str, Any] = {"torch": torch.__version__, "loops": {}}
    loops = {}
    for name in (n.strip() for n in args.loops.split(",") if n.strip()):
        fn, iters = make_loop(name)
        fn(WARMUP)
        native_count = ops_per_iter(fn, NativeOpCapture(module)) if module else None
        profiler_count = ops_per_iter(fn, ProfilerOpCapture())
        loops[name] = fn, iters
        facts["loops"][name] = {
            "iters": iters,
            "ops_per_iter": native_count if native_count is not None else profiler_count,
            "ops_per_iter_profiler": profiler_count,
            "rows": {},
        }
    cg.cg_start()  # instrumentation on from here (start-up and imports ran uninstrumented)
    for name, (fn, iters) in loops.items():
        rows = facts["loops"][name]["rows"]
        for mode in MODES:
            label = f"{name}/{mode}"
            capture, shapes = capture_for(mode)
            if mode.startswith("native") and capture is None:
                continue
            if capture is not None:
                cg.cg_zero()
                capture.start(shapes)
                cg.cg_dump(f"{label}/start".encode())
            fn(WARMUP)  # first-touch of the capture's buffers, caches of this mode
            cg.cg_zero()
            fn(iters)
            cg.cg_dump(f"{label}/loop".encode())
            if capture is not None:
                cg.cg_zero()
                capture.stop()
                cg.cg_dump(f"{label}/stop".encode())
                cg.cg_zero()
                rows[mode] = len(capture.read())
                cg.cg_dump(f"{label}/read".encode())
    cg.cg_stop()
    print("RESULT " + json.dumps(facts), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Modes: " + ", ".join(MODES) + ". See the module docstring for details.",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=2000,
        help="torch.add calls in the add loop; the mlp loop runs iters/10 steps (default 2000)",
    )
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help=f"comma-separated loops to run, of {', '.join(LOOPS)} (default: both)",
    )
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep callgrind's dumps in DIR (one per segment, labelled LOOP/MODE/SEGMENT in "
        "their 'desc: Trigger' line) for callgrind_annotate; default: a temporary folder",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--helper", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iters < MLP_DIVISOR:
        parser.error(f"--iters must be >= {MLP_DIVISOR}, got {args.iters}")
    unknown = [n for n in args.loops.split(",") if n.strip() and n.strip() not in LOOPS]
    if unknown:
        parser.error(f"unknown loops {unknown}; choose from {list(LOOPS)}")
    if args.child:
        return run_child(args)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
