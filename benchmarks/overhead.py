"""Cost of ets-hook's op capture (native observer and profiler paths) beside bare torch.profiler.

For each workload the same training loop runs in rounds; every round runs one block of each
variant, in an order rotated from round to round (so drift and noise from the machine hit every
variant alike, and no variant always follows the same one). Round 0 is a warm-up and is dropped
(``--warmup-rounds``). Variants:

- ``none``, ``none_aa``:   no hook at all (``--after-steps`` steps). ``none`` is the baseline of
                           its round; ``none_aa`` is the same thing measured again elsewhere in
                           the round (an A/A control: how far apart two identical blocks land,
                           i.e. the noise floor of every "added" number below);
- ``native_shapes``,       a fresh ``ETSHook(op_capture="native")`` with ``record_shapes="all"``
  ``native``:              / ``"none"`` through its default window (skip 1 step, capture 5);
- ``profiler_shapes``,     the same with ``op_capture="profiler"`` (Kineto CPU profiler);
  ``profiler``:
- ``torch_profiler_shapes``, a bare ``torch.profiler.profile(activities=[CPU],
  ``torch_profiler``:      record_shapes=True / False)`` block around 5 steps;
- ``observer_shapes``,     the native observer alone, no hook (``NativeOpCapture`` started
  ``observer``:            before and stopped after 5 steps; its ``read`` is timed apart): the
                           observer's own cost, apples to apples with the bare torch.profiler
                           block; the hook variants add the hook's per-step Python work.

Measured per variant:

1. In-window cost per step: the steady window steps (the 2nd-4th of the window / of the
   profiler block: none contains the enable or the disable). Reported as median step time and
   as cost *added* over ``none`` of the same round, per step and per op (µs/op = added step
   time / ops per step; ops per step are counted by a native capture of a few steps of the
   timed region, cross-checked against the profiler's count and the hook's decoded trace).
   Ratios native / torch.profiler (and native / ets-hook's profiler path) of the added cost,
   with and without shapes. Target: native ≤ 0.6 × torch.profiler, with and without shapes.
2. Whole-capture cost: the extra wall time of a fresh hook's steps 0-5 (step 0's boundary
   starts capture, window step 4's stops it and hands the ops to the decode thread) plus the
   steps that run while the window is decoded and its trace estimate made (until
   ``capture_status`` leaves ``decoding``); "to trace": only the steps up to the one during
   which ``hook.trace`` was set (the trace model's estimate runs after it). Compared with the
   extra time of a bare 5-step torch.profiler block (enter + 5 steps + exit; torch parses its
   events lazily, so that is enable, 5 observed steps and Kineto's disable). Target: whole
   native capture until ``hook.trace`` is ready ≤ 1× the bare
   ``torch.profiler(record_shapes=True)`` block (stretch 0.5×).
3. ``after``: steps after the ``native_shapes`` window once its trace is ready; plus
   ``hook_cost_per_step_us``, the hook's own cost per step after the window, isolated from any
   model (A/B blocks of a one-parameter step).

Every "added" number is a per-round paired difference (variant minus that round's ``none``);
results are medians over rounds with the interquartile range (IQR) and min/max across rounds.
The machine facts, the load (``uptime``) at the start and the end of every workload, and the
noise floor (spread of ``none`` across rounds, and the ``none_aa - none`` A/A difference) are
printed with the results.

Usage::

    python benchmarks/overhead.py [--workloads a,b] [--repeats 12] [--threads 1]
        [--json out.json] [--markdown out.md] [--device cpu]

Kineto prints two ``USDT:`` lines per profiler session on stderr; they are filtered out (other
stderr output is replayed after each workload).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ets_hook import ETSHook
from ets_hook.capture import native_ops
from ets_hook.capture.ops import NativeOpCapture, ProfilerOpCapture
from ets_hook.cli.zoo import workloads
from ets_hook.ets import flops

DEFAULT_WORKLOADS = (
    "mlp-w128-d2-b32",
    "gpt-d64-l2-b8-t64",
    "resnet-w8-x1-b16-s32",
    "transformer-d128-l4-b16-t64",
)
WINDOW = 5
STEADY = slice(1, 4)  # window / profiler-block steps with neither the enable nor the disable

#: variant -> (kind, op_capture, record shapes)
VARIANTS: dict[str, tuple[str, str | None, bool]] = {
    "none": ("none", None, False),
    "none_aa": ("none", None, False),
    "native_shapes": ("hook", "native", True),
    "native": ("hook", "native", False),
    "profiler_shapes": ("hook", "profiler", True),
    "profiler": ("hook", "profiler", False),
    "torch_profiler_shapes": ("bare", None, True),
    "torch_profiler": ("bare", None, False),
    "observer_shapes": ("observer", "native", True),
    "observer": ("observer", "native", False),
}
HOOK_VARIANTS = tuple(name for name, spec in VARIANTS.items() if spec[0] == "hook")
BARE_VARIANTS = tuple(name for name, spec in VARIANTS.items() if spec[0] == "bare")
OBSERVER_VARIANTS = tuple(name for name, spec in VARIANTS.items() if spec[0] == "observer")
#: (label, numerator, denominator) of the added-cost ratios reported
RATIOS = (
    ("native/torch.prof shapes", "native_shapes", "torch_profiler_shapes"),
    ("native/torch.prof", "native", "torch_profiler"),
    ("native/ets-prof shapes", "native_shapes", "profiler_shapes"),
    ("native/ets-prof", "native", "profiler"),
    ("observer/torch.prof shapes", "observer_shapes", "torch_profiler_shapes"),
    ("observer/torch.prof", "observer", "torch_profiler"),
)
#: the ratios of the markdown table
MD_RATIOS = (
    "native/torch.prof shapes",
    "native/torch.prof",
    "observer/torch.prof shapes",
    "observer/torch.prof",
)
PER_STEP_TARGET = 0.6
CAPTURE_TARGET, CAPTURE_STRETCH = 1.0, 0.5


# ---------------------------------------------------------------------------------------------
# Statistics


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of ``values`` (all equal to the value when only one)."""
    values = sorted(values)
    if not values:
        return {"n": 0}
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {
        "n": len(values),
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": values[0],
        "max": values[-1],
    }


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _fmt(value: float | None, spec: str = "6.2f") -> str:
    if value is None:
        return "n/a".rjust(len(format(0.0, spec)))
    return format(value, spec)


# ---------------------------------------------------------------------------------------------
# Timed blocks


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed_steps(job: Any, batches: Any, count: int, hook: ETSHook | None) -> list[float]:
    times = []
    for _ in range(count):
        batch = next(batches)
        _sync(job.device)
        start = time.perf_counter_ns()
        job.train_step(batch)
        if hook is not None:
            hook.step()
        _sync(job.device)
        times.append((time.perf_counter_ns() - start) / 1e9)
    return times


def _steps_while_decoding(
    job: Any, batches: Any, hook: ETSHook, limit: int = 100_000
) -> tuple[list[float], int]:
    """Timed steps from the window's end until the decode thread has finished, and how many
    of them ended before ``hook.trace`` was set (the trace is ready before its estimate)."""
    times: list[float] = []
    to_trace = None
    while hook.capture_status.startswith("decoding") and len(times) < limit:
        if to_trace is None and hook.trace is not None:
            to_trace = len(times)
        times += _timed_steps(job, batches, 1, hook)
    return times, len(times) if to_trace is None else to_trace


def _none_block(job: Any, batches: Any, steps: int) -> dict[str, Any]:
    return {"steady": _timed_steps(job, batches, steps, None)}


def _hook_block(
    job: Any, batches: Any, op_capture: str, shapes: bool, after_steps: int
) -> dict[str, Any]:
    # Each capture measured as a job's first: the trace model's per-op cost cache starts cold
    # (within one trace it still reuses repeated ops, as in a real job).
    flops._cached_op_cost.cache_clear()
    hook = ETSHook(
        job.model,
        optimizer=job.optimizer,
        capture_steps=WINDOW,
        skip_steps=1,
        log_every=None,
        op_capture=op_capture,
        record_shapes="all" if shapes else "none",
    )
    step0 = _timed_steps(job, batches, 1, hook)  # capture starts at its boundary
    window = _timed_steps(job, batches, WINDOW, hook)  # ... and stops at the last one's
    decode, decode_to_trace = _steps_while_decoding(job, batches, hook)
    trace = hook.wait_for_trace(300)
    after = _timed_steps(job, batches, after_steps, hook) if after_steps else []
    status = hook.capture_status
    hook.close()
    ops = [len(it.ops) for it in trace.iterations] if trace is not None else []
    return {
        "steady": window[STEADY],
        "window_s": sum(step0) + sum(window),
        "decode": decode,
        "decode_to_trace": decode_to_trace,
        "after": after,
        "trace_ops_per_step": statistics.median(ops) if ops else 0,
        "trace_steps": len(ops),
        "op_capture": trace.capture.op_capture if trace is not None else f"no trace: {status}",
        "status": status,
    }


def _bare_block(job: Any, batches: Any, shapes: bool) -> dict[str, Any]:
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes
    )
    _sync(job.device)
    started = time.perf_counter_ns()
    with profiler:
        steps = _timed_steps(job, batches, WINDOW, None)
    _sync(job.device)
    total = (time.perf_counter_ns() - started) / 1e9
    results = getattr(profiler.profiler, "kineto_results", None)
    events = len(results.events()) if results is not None else 0  # outside the timing
    return {"steady": steps[STEADY], "block_s": total, "events_per_step": events / WINDOW}


def _observer_block(job: Any, batches: Any, shapes: bool) -> dict[str, Any]:
    capture = NativeOpCapture(native_ops.load())
    _sync(job.device)
    started = time.perf_counter_ns()
    capture.start(shapes)
    steps = _timed_steps(job, batches, WINDOW, None)
    capture.stop()
    _sync(job.device)
    stopped = time.perf_counter_ns()
    rows = len(capture.read())
    read_s = (time.perf_counter_ns() - stopped) / 1e9
    return {
        "steady": steps[STEADY],
        "block_s": (stopped - started) / 1e9,
        "read_s": read_s,
        "events_per_step": rows / WINDOW,
    }


def count_ops(job: Any, batches: Any, steps: int = 3) -> dict[str, float]:
    """Ops per timed step (``train_step`` only), seen by the native observer and the profiler."""
    out: dict[str, float] = {}
    module = native_ops.load(build_if_missing=True)
    captures: list[tuple[str, Any]] = [("profiler", ProfilerOpCapture())]
    if module is not None:
        captures.insert(0, ("native", NativeOpCapture(module)))
    for name, capture in captures:
        rows = 0
        for _ in range(steps):
            batch = next(batches)
            capture.start(True)
            job.train_step(batch)
            capture.stop()
            rows += len(capture.read())
        out[name] = rows / steps
    return out


@contextlib.contextmanager
def filtered_stderr(drop_prefix: str = "USDT:") -> Iterator[None]:
    """Send fd 2 to a file for the block, then replay its lines not starting with the prefix."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(drop_prefix):
                    sys.stderr.write(line)
            sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# One workload


def measure(
    name: str,
    repeats: int,
    device: str,
    after_steps: int,
    variants: Sequence[str],
    warmup_rounds: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``warmup_rounds + repeats`` rounds of every variant on one workload."""
    job = workloads()[name].build(device)
    batches = job.batches()
    _timed_steps(job, batches, 10, None)  # warm-up: allocator, lazy init, first-step effects
    ops = count_ops(job, batches)
    ops_per_step = ops.get("native") or ops["profiler"]
    load_start = os.getloadavg()
    blocks: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    started = time.perf_counter()
    for round_index in range(warmup_rounds + repeats):
        shift = round_index % len(variants)
        order = list(variants[shift:]) + list(variants[:shift])
        for variant in order:
            kind, op_capture, shapes = VARIANTS[variant]
            gc.collect()
            if kind == "none":
                result = _none_block(job, batches, after_steps)
            elif kind == "hook":
                assert op_capture is not None
                extra = after_steps if variant == "native_shapes" else 0
                result = _hook_block(job, batches, op_capture, shapes, extra)
            elif kind == "observer":
                result = _observer_block(job, batches, shapes)
            else:
                result = _bare_block(job, batches, shapes)
            if round_index >= warmup_rounds:
                blocks[variant].append(result)
        if progress is not None:
            progress(f"  {name}: round {round_index + 1}/{warmup_rounds + repeats}")
    elapsed = time.perf_counter() - started
    return summarize(name, blocks, ops, ops_per_step, load_start, elapsed)


def summarize(
    name: str,
    blocks: dict[str, list[dict[str, Any]]],
    ops: dict[str, float],
    ops_per_step: float,
    load_start: tuple[float, float, float],
    elapsed_s: float,
) -> dict[str, Any]:
    """Turn the blocks of every round into medians, spreads, added costs and ratios."""
    rounds = len(blocks["none"])
    # Per-round medians of the steady steps, then paired differences against none.
    round_median = {
        v: [statistics.median(b["steady"]) for b in bs] for v, bs in blocks.items() if bs
    }
    base = round_median["none"]
    step_ms = {
        v: {k: 1e3 * x if k != "n" else x for k, x in spread(meds).items()}
        for v, meds in round_median.items()
    }
    added_us: dict[str, dict[str, float]] = {}
    added_per_op: dict[str, dict[str, float]] = {}
    overhead: dict[str, float] = {}
    for v, meds in round_median.items():
        if v == "none":
            continue
        diffs = [1e6 * (m - b) for m, b in zip(meds, base, strict=True)]
        added_us[v] = spread(diffs)
        added_per_op[v] = spread([d / ops_per_step for d in diffs])
        overhead[v] = statistics.median(m / b - 1.0 for m, b in zip(meds, base, strict=True))
    ratios = {
        label: _ratio(
            added_per_op.get(num, {}).get("median"), added_per_op.get(den, {}).get("median")
        )
        for label, num, den in RATIOS
    }

    # After the window (native_shapes blocks only).
    after: dict[str, Any] = {}
    if blocks.get("native_shapes") and blocks["native_shapes"][0]["after"]:
        meds = [statistics.median(b["after"]) for b in blocks["native_shapes"]]
        after = {
            "step_ms": 1e3 * statistics.median(meds),
            "overhead": statistics.median(m / b - 1.0 for m, b in zip(meds, base, strict=True)),
        }

    # Whole capture: window (steps 0-5) + decode steps, over as many steps of that round's none.
    capture: dict[str, Any] = {}
    for v in HOOK_VARIANTS:
        if not blocks.get(v):
            continue
        window_ms, decode_ms, total_ms, to_trace_ms, steps = [], [], [], [], []
        for b, nb in zip(blocks[v], base, strict=True):
            window_ms.append(1e3 * (b["window_s"] - (WINDOW + 1) * nb))
            decode_ms.append(1e3 * (sum(b["decode"]) - len(b["decode"]) * nb))
            total_ms.append(window_ms[-1] + decode_ms[-1])
            # Until hook.trace is set (the issue's "until hook.trace is ready"): the steps up
            # to and including the one during which the trace was set; the trace model's
            # estimate runs after that.
            k = min(b["decode_to_trace"] + 1, len(b["decode"]))
            to_trace_ms.append(window_ms[-1] + 1e3 * (sum(b["decode"][:k]) - k * nb))
            steps.append(len(b["decode"]))
        capture[v] = {
            "window_ms": spread(window_ms),
            "decode_ms": spread(decode_ms),
            "decode_steps": spread(steps),
            "total_ms": spread(total_ms),
            "to_trace_ms": spread(to_trace_ms),
            "trace_ops_per_step": statistics.median(b["trace_ops_per_step"] for b in blocks[v]),
            "trace_steps": min(b["trace_steps"] for b in blocks[v]),
            "op_capture": sorted({b["op_capture"] for b in blocks[v]}),
        }
    for v in BARE_VARIANTS + OBSERVER_VARIANTS:
        if not blocks.get(v):
            continue
        block_ms = [
            1e3 * (b["block_s"] - WINDOW * nb) for b, nb in zip(blocks[v], base, strict=True)
        ]
        capture[v] = {
            "block_ms": spread(block_ms),
            "none_steps_ms": 1e3 * WINDOW * statistics.median(base),
            "read_ms": (
                spread([1e3 * b["read_s"] for b in blocks[v]]) if "read_s" in blocks[v][0] else None
            ),
            "events_per_step": statistics.median(b["events_per_step"] for b in blocks[v]),
        }

    def cost(v: str) -> float | None:
        c = capture.get(v)
        if c is None:
            return None
        return (c.get("total_ms") or c["block_ms"])["median"]

    capture_ratios = {
        f"{v}/torch_profiler_shapes": _ratio(cost(v), cost("torch_profiler_shapes"))
        for v in HOOK_VARIANTS
        if v in capture
    }
    capture_ratios["native/torch_profiler"] = _ratio(cost("native"), cost("torch_profiler"))
    for v, den in (("native_shapes", "torch_profiler_shapes"), ("native", "torch_profiler")):
        if v in capture and den in capture:
            capture_ratios[f"{v} to trace/{den}"] = _ratio(
                capture[v]["to_trace_ms"]["median"], cost(den)
            )
    for v, den in (("observer_shapes", "torch_profiler_shapes"), ("observer", "torch_profiler")):
        if v in capture:
            capture_ratios[f"{v}/{den}"] = _ratio(cost(v), cost(den))

    # Noise floor: none across rounds, and the A/A difference none_aa - none.
    n = step_ms["none"]
    noise: dict[str, Any] = {
        "none_spread_pct": {
            "iqr": 100 * (n["q3"] - n["q1"]) / n["median"],
            "range": 100 * (n["max"] - n["min"]) / n["median"],
        }
    }
    if "none_aa" in added_us:
        noise["aa_us"] = added_us["none_aa"]
        noise["aa_us_per_op"] = added_per_op["none_aa"]
    return {
        "workload": name,
        "rounds": rounds,
        "elapsed_s": elapsed_s,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "ops_per_step": ops_per_step,
        "ops_per_step_by_capture": ops,
        "steady_steps_per_block": {v: len(bs[0]["steady"]) for v, bs in blocks.items() if bs},
        "median_step_ms": {v: s["median"] for v, s in step_ms.items()},
        "step_ms": step_ms,
        "overhead": overhead,
        "added_us_per_step": added_us,
        "added_us_per_op": added_per_op,
        "added_ratio": ratios,
        "after": after,
        "capture": capture,
        "capture_ratio": capture_ratios,
        "noise": noise,
    }


# ---------------------------------------------------------------------------------------------
# After the window, isolated


def hook_cost_per_step_us(blocks: int = 20, steps: int = 2000) -> dict[str, float]:
    """What the hook adds to one training step after its window, isolated from the model.

    A one-element parameter and SGD make ``forward + backward + optimizer.step()`` a few
    microseconds; blocks of steps without and with a hook (window already over) alternate, and
    the difference of the medians of per-block means is the hook's own cost per step: its
    root-module pre-forward call, optimizer post-hook and O(1) step bookkeeping.
    """
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.ones(1, 1)

    def block() -> float:
        start = time.perf_counter_ns()
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
        return (time.perf_counter_ns() - start) / steps / 1e3

    for _ in range(3):
        block()  # warm-up
    without, with_hook = [], []
    for _ in range(blocks):
        without.append(block())
        hook = ETSHook(model, optimizer=opt, capture_steps=1, skip_steps=0, log_every=None)
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
        hook.wait_for_trace(60)
        with_hook.append(block())
        hook.close()
    base, hooked = statistics.median(without), statistics.median(with_hook)
    return {"step_us_without": base, "step_us_with": hooked, "hook_us": hooked - base}


# ---------------------------------------------------------------------------------------------
# Machine facts and output


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def uptime() -> str:
    """``uptime``'s line (load averages), or ``os.getloadavg()`` when it cannot run."""
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict[str, Any]:
    module = native_ops.load()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "native_observer": (
            getattr(module, "__file__", "loaded")
            if module is not None
            else f"unavailable: {native_ops.unavailable_reason()}"
        ),
    }


def _pm(s: dict[str, float], spec: str = ".2f") -> str:
    """``median [q1, q3]``."""
    return f"{format(s['median'], spec)} [{format(s['q1'], spec)}, {format(s['q3'], spec)}]"


def print_workload(r: dict[str, Any]) -> None:
    ms = r["step_ms"]
    none = ms["none"]
    noise = r["noise"]
    print(
        f"\n== {r['workload']}: {r['rounds']} rounds in {r['elapsed_s']:.0f} s; ops/step "
        f"{r['ops_per_step']:.0f} (native {r['ops_per_step_by_capture'].get('native', 0):.0f}, "
        f"profiler {r['ops_per_step_by_capture']['profiler']:.0f}); load "
        f"{r['load_start'][0]:.2f} -> {r['load_end'][0]:.2f}"
    )
    aa = noise.get("aa_us_per_op")
    print(
        f"   none {none['median']:.3f} ms/step (IQR {noise['none_spread_pct']['iqr']:.1f}%, "
        f"min-max {noise['none_spread_pct']['range']:.1f}% across rounds)"
        + (
            f"; A/A none_aa-none: {_pm(aa, '+.3f')} us/op ({_pm(noise['aa_us'], '+.0f')} us/step)"
            if aa
            else ""
        )
    )
    print(
        f"   {'in window, per step':24} {'ms/step':>9} {'added %':>8} "
        f"{'added us/op [IQR]':>26} {'min..max us/op':>17}"
    )
    for v, s in ms.items():
        if v in ("none", "none_aa"):
            continue
        a = r["added_us_per_op"][v]
        print(
            f"   {v:24} {s['median']:9.3f} {100 * r['overhead'][v]:+7.1f}% "
            f"{_pm(a, '+.3f'):>26} {a['min']:+7.3f}..{a['max']:+7.3f}"
        )
    if r["after"]:
        print(
            f"   {'after (native_shapes)':24} {r['after']['step_ms']:9.3f} "
            f"{100 * r['after']['overhead']:+7.1f}%"
        )
    ratios = "  ".join(f"{label} {_fmt(value, '.2f')}" for label, value in r["added_ratio"].items())
    print(f"   added-cost ratios (target native/torch.prof <= {PER_STEP_TARGET}): {ratios}")
    print(
        f"   {'whole capture':24} {'window ms':>18} {'decode ms':>18} {'steps':>5} "
        f"{'total ms [IQR]':>24} {'to trace ms [IQR]':>24} {'trace ops/step':>14}"
    )
    for v, c in r["capture"].items():
        if "total_ms" in c:
            print(
                f"   {v:24} {_pm(c['window_ms'], '.1f'):>18} {_pm(c['decode_ms'], '.1f'):>18} "
                f"{c['decode_steps']['median']:5.0f} {_pm(c['total_ms'], '.1f'):>24} "
                f"{_pm(c['to_trace_ms'], '.1f'):>24} {c['trace_ops_per_step']:14.0f}"
            )
        else:
            print(
                f"   {v + ' (block)':24} {'':>18} {'':>18} {'':>5} "
                f"{_pm(c['block_ms'], '.1f'):>24} {c['events_per_step']:14.0f}"
                + (
                    f"  (+ read {_pm(c['read_ms'], '.1f')} ms)"
                    if c.get("read_ms")
                    else f"  (5 steps without hook: {c['none_steps_ms']:.1f} ms)"
                )
            )
    ratios = "  ".join(f"{k} {_fmt(v, '.2f')}" for k, v in r["capture_ratio"].items())
    print(
        f"   whole-capture ratios (target native_shapes/torch_profiler_shapes <= "
        f"{CAPTURE_TARGET}, stretch {CAPTURE_STRETCH}): {ratios}"
    )
    paths = {v: c["op_capture"] for v, c in r["capture"].items() if "op_capture" in c}
    for v, names in paths.items():
        expect = "native" if v.startswith("native") else "profiler"
        if not all(expect in n for n in names):
            print(f"   WARNING: {v} ran on {names}")


def markdown(report: dict[str, Any]) -> str:
    """The results as markdown tables (per step; whole capture)."""
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
        f"({m['torch_threads']} threads), Python {m['python']}. "
        f"Load: {report['uptime_start']} / {report['uptime_end']}.",
        "",
        "In-window cost per step, added over no hook (median over rounds [IQR]):",
        "",
        "| workload | ops/step | step (no hook) | noise (none IQR) | A/A µs/op "
        + "".join(f"| {v} µs/op " for v in VARIANTS if v not in ("none", "none_aa"))
        + "".join(f"| {label} " for label in MD_RATIOS)
        + "|",
        "|---|---:|---:|---:|---:"
        + "".join("|---:" for v in VARIANTS if v not in ("none", "none_aa"))
        + "|---:" * len(MD_RATIOS)
        + "|",
    ]
    for r in report["results"]:
        aa = r["noise"].get("aa_us_per_op")
        row = (
            f"| {r['workload']} | {r['ops_per_step']:.0f} | {r['step_ms']['none']['median']:.2f} ms"
            f" | {r['noise']['none_spread_pct']['iqr']:.1f}% | "
            + (f"{aa['median']:+.3f}" if aa else "")
        )
        for v in VARIANTS:
            if v in ("none", "none_aa"):
                continue
            a = r["added_us_per_op"].get(v)
            row += f" | {_pm(a, '.2f')}" if a else " | "
        for label in MD_RATIOS:
            row += f" | {_fmt(r['added_ratio'].get(label), '.2f')}"
        lines.append(row + " |")
    lines += [
        "",
        "Whole capture, extra wall time over no hook (ms; steps 0-5 + decoding until the trace "
        "is ready) vs a bare 5-step torch.profiler block (enter + 5 steps + exit) and the bare "
        "observer (start + 5 steps + stop; its read not included). Ratios: whole capture / "
        "torch.profiler(shapes) block; native / torch.profiler block:",
        "",
        "| workload | "
        + " | ".join(HOOK_VARIANTS)
        + " | torch.profiler(shapes) block | torch.profiler block | observer(shapes) block"
        + " | observer block | native_shapes ratio | native ratio"
        + " | native_shapes to trace | native_shapes to trace ratio |",
        "|---|" + "---:|" * (len(HOOK_VARIANTS) + 8),
    ]
    for r in report["results"]:
        c = r["capture"]
        cells = [
            f"{c[v]['total_ms']['median']:.1f} ({c[v]['decode_steps']['median']:.0f})"
            if v in c
            else ""
            for v in HOOK_VARIANTS
        ]
        cells += [
            f"{c[v]['block_ms']['median']:.1f}" if v in c else ""
            for v in BARE_VARIANTS + OBSERVER_VARIANTS
        ]
        cells += [
            _fmt(r["capture_ratio"].get("native_shapes/torch_profiler_shapes"), ".2f"),
            _fmt(r["capture_ratio"].get("native/torch_profiler"), ".2f"),
            f"{c['native_shapes']['to_trace_ms']['median']:.1f}" if "native_shapes" in c else "",
            _fmt(r["capture_ratio"].get("native_shapes to trace/torch_profiler_shapes"), ".2f"),
        ]
        lines.append(f"| {r['workload']} | " + " | ".join(cells) + " |")
    cost = report.get("hook_cost_per_step")
    if cost:
        lines += [
            "",
            f"Hook cost per step after the window (isolated): {cost['hook_us']:.1f} µs.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Variants: " + ", ".join(VARIANTS) + ". See the module docstring for details.",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help="comma-separated zoo workloads (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=12, help="measured rounds per workload (default 12)"
    )
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="rounds run first and dropped (lazy init of hooks, Kineto, ...; default 1)",
    )
    parser.add_argument("--device", default="cpu", help="training device (default cpu)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: torch's own choice). On a shared or loaded "
        "machine 1 avoids OpenMP threads spinning against other processes",
    )
    parser.add_argument(
        "--after-steps",
        type=int,
        default=20,
        help="steps per none / none_aa block, and after the native_shapes window (default 20)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated subset of the variants (none is always run; default: all)",
    )
    parser.add_argument(
        "--no-hook-cost", action="store_true", help="skip the isolated after-window hook cost"
    )
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write results as markdown tables")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.warmup_rounds < 0:
        parser.error(f"--warmup-rounds must be >= 0, got {args.warmup_rounds}")
    if args.after_steps < 1:
        parser.error(f"--after-steps must be >= 1, got {args.after_steps}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if "none" not in variants:
        variants.insert(0, "none")
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    zoo = workloads()
    missing = [n for n in names if n not in zoo]
    if missing:
        parser.error(f"unknown workloads {missing}; choose from {sorted(zoo)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if native_ops.load(build_if_missing=True) is None:
        print(
            f"WARNING: native observer unavailable ({native_ops.unavailable_reason()}); "
            "the native variants will run on the profiler",
            file=sys.stderr,
        )

    facts = machine()
    uptime_start = uptime()
    print(f"machine: {facts}")
    print(f"uptime: {uptime_start}")
    results = []
    for name in names:
        with filtered_stderr():
            r = measure(
                name,
                args.repeats,
                args.device,
                args.after_steps,
                variants,
                args.warmup_rounds,
                progress=lambda line: print(line, file=sys.__stdout__, flush=True),
            )
        results.append(r)
        print_workload(r)
        sys.stdout.flush()
    cost = None
    if not args.no_hook_cost:
        cost = hook_cost_per_step_us()
        print(
            f"\nhook cost per step after the window (isolated): {cost['hook_us']:.1f} us "
            f"(tiny step {cost['step_us_without']:.1f} us -> {cost['step_us_with']:.1f} us)"
        )
        for r in results:
            r["hook_cost_fraction"] = cost["hook_us"] / (1e3 * r["median_step_ms"]["none"])
            print(f"  = {100 * r['hook_cost_fraction']:.3f}% of a {r['workload']} step")
    uptime_end = uptime()
    print(f"uptime: {uptime_end}")
    report = {
        "machine": facts,
        "uptime_start": uptime_start,
        "uptime_end": uptime_end,
        "args": vars(args),
        "results": results,
        "hook_cost_per_step": cost,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
