"""Why the first bf16-autocast steps on CPU are slower, and what ets-hook predicts from them.

Each run is a fresh Python process (oneDNN's primitive cache, its JIT-generated kernels and the
allocator's pools are per process, so a warm-up is only seen once per process) that trains one
small zoo job for ``--steps`` steps in fp32 or under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` and records every step's wall time. Workloads: ``cnn``
(resnet-w8-x1-b16-s32), ``mlp`` (mlp-w512-d3-b64), ``transformer`` (transformer-d64-l2-b16-t32),
the ``ets-hook demo`` models, or any zoo workload by name. Modes (``--modes``):

- ``none``:  no hook at all: the job's own warm-up (oneDNN primitive creation and JIT, weight
             reorders, optimizer state, allocator growth);
- ``timer``: ``ETSHook(capture_steps=0)``: the hook as a pure step timer (its prediction has no
             capture cost to model and no trace estimate);
- ``hook``:  ``ETSHook`` with its defaults but the window (native op observer; window = steps
             2-6, 1-based, where the default was when these runs were first measured);
- ``profiler``: the same with ``op_capture="profiler"`` (the torch profiler path: a few us per
             op, so the ops autocast adds cost far more there).

``timer``/``hook``/``profiler`` runs read ``hook.prediction`` after steps 1, 2, 3, 5, 10 and 20
(as the console reporter does early on); the read's cost lands in the next step.

Settings (``--settings``; mode ``none`` unless said, each also for the fp32 twin where it means
anything):

- ``no_mkldnn``:  ``torch.backends.mkldnn.enabled = False`` before the model is built;
- ``prim_cache0``: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` (every op creates its primitive anew);
- ``no_cast_cache``: ``torch.autocast(..., cache_enabled=False)`` (bf16 only; autocast's
             weight-cast cache lives for one autocast region, i.e. one forward, either way);
- ``second_job``: the same job is first run for ``--first-job-steps`` steps in the same process
             with another model instance (same shapes), then timed: what is left of the warm-up
             once the process-level caches are warm;
- ``numpy_ma`` (modes ``timer`` and ``hook``): ``numpy.ma`` imported before the hook is created,
             as an ``import numpy.ma`` in ``ets_hook.forecast.stats`` would: ``np.median``
             imports it lazily on its first call, inside the first prediction read with two
             steps, and that cost lands in the training step after it (ets-hook now imports it
             itself, so on a current checkout this equals the default: an A/B for older ones).

Every round runs every variant once, in an order rotated from round to round, so drift and the
load of other work on the machine hit every variant alike. Per run, the machine's CPU time not
spent by the run's own process over the run's wall time is recorded (``foreign`` load, in cores,
from ``/proc/stat``; counted in 10 ms ticks, so it is +-0.1 core on a sub-second run), next to
``os.getloadavg()``; a run above ``--max-foreign`` is run again (up to ``--retries`` times).

Outputs (medians over rounds with [min, max]):

1. Step-time phases: the steady step (median of the second half, ms) and, as ratios to it, step 1,
   step 2, steps 3-6 (the hook's window is steps 2-6), 7-10, 11-20, 21-50; the excess time of
   steps 1-50 over the steady state in steady steps; MSER-1's cut on the first 50 steps.
   Step 1 of ``timer``/``hook`` starts at hook creation, so it includes the hook's own set-up.
2. Ops per step (native observer, fp32 vs bf16) and the cast ops autocast adds
   (``aten::to``/``_to_copy``/``copy_``/``empty_strided``); the hook's realised window cost
   (window steps 3-6 of ``hook`` minus those of ``timer`` of the same round, per op) against
   the observer's per-op cost range, the capture ratio the hook used, and the step by which the
   window's trace was decoded.
3. Prediction error of the total (wall time from hook creation to the last step's end) at steps
   1, 2, 3, 5, 10, 20, for ``timer``, ``hook`` and ``profiler``, split into a *rate* part
   (remaining steps x (predicted step time + loop overhead - true steady step)) and a *one-off*
   part (predicted remaining capture cost - the true time still to come beyond remaining x
   steady); plus the prediction's fields (``iteration_s``, ``measured_iteration_s`` and
   ``trace_iteration_s`` over the true steady step, warm-up steps, source).
4. The cost of each ``hook.prediction`` read.
5. Replay (``--no-replay`` skips it): every recorded ``timer``/``hook`` run fed again through
   ets-hook's ``Forecaster`` (steps 1, 2, 3, 5: before any trace estimate) with the plain CPU
   prior, with the prior the hook picks (``StepTimePrior.for_low_precision`` for bf16), and
   with that prior's early-step part for the fp32 twin too: is the early warm-up bf16's own?

Usage::

    python benchmarks/bf16_warmup.py [--steps 150] [--rounds 3] [--workloads cnn,mlp,transformer]
        [--modes none,timer,hook,profiler] [--threads 0]
        [--settings no_mkldnn,prim_cache0,no_cast_cache,second_job,numpy_ma] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ets_hook.cli.zoo import workloads

WORKLOADS = {
    "cnn": "resnet-w8-x1-b16-s32",
    "mlp": "mlp-w512-d3-b64",
    "transformer": "transformer-d64-l2-b16-t32",
}
PRECISIONS = ("fp32", "bf16")
MODES = ("none", "timer", "hook", "profiler")
SETTINGS = ("no_mkldnn", "prim_cache0", "no_cast_cache", "second_job", "numpy_ma")
# Settings of the predicting modes (timer, hook); the others apply to mode "none".
PREDICTION_SETTINGS = ("numpy_ma",)
REPORT_STEPS = (1, 2, 3, 5, 10, 20)
PHASES = (("1", 0, 1), ("2", 1, 2), ("3-6", 2, 6), ("7-10", 6, 10), ("11-20", 10, 20))
PHASES += (("21-50", 20, 50),)
CAST_OPS = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::empty_strided")
RESULT_MARK = "BF16_WARMUP_RESULT "
REPLAY_STEPS = (1, 2, 3, 5)
# How the replay sets the forecaster's prior up (see _replay).
REPLAY_PRIORS = ("before", "as is")
BATCHES = 8
#: The capture window of the "hook" and "profiler" runs starts after this many steps (0-based
#: start): the default of ETSHook when these runs were first measured, kept so they compare.
WINDOW_START = 1


# ---------------------------------------------------------------------------------------------
# Child process: one run


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ets_hook import ETSHook

    setting = spec["setting"]
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    if setting == "no_mkldnn":
        torch.backends.mkldnn.enabled = False
    bf16 = spec["precision"] == "bf16"
    cache_enabled = setting != "no_cast_cache"
    workload = workloads()[WORKLOADS.get(spec["workload"], spec["workload"])]

    def make(seed: int) -> tuple[Any, list[Any], Callable[[Any], None]]:
        job = workload.build("cpu", seed=seed)
        stream = job.batches()
        batches = [next(stream) for _ in range(BATCHES)]

        def step(batch: Any) -> None:
            job.optimizer.zero_grad(set_to_none=True)
            if bf16:
                with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
                    loss = job.loss(batch)
            else:
                loss = job.loss(batch)
            loss.backward()
            job.optimizer.step()

        return job, batches, step

    if setting == "second_job":
        _, batches, step = make(spec["seed"] + 1000)
        for i in range(spec["first_job_steps"]):
            step(batches[i % BATCHES])
    if spec["mode"] == "opcount":
        return _count_ops(make(spec["seed"]), spec["steps"])
    job, batches, step = make(spec["seed"])
    if setting == "numpy_ma":
        # What importing numpy.ma with ets_hook.forecast.stats would do: np.median's first call
        # imports it lazily (several ms), inside the first prediction read in the training loop.
        import numpy.ma  # noqa: F401
    gc.collect()
    steps = spec["steps"]
    hook = None
    if spec["mode"] != "none":
        hook = ETSHook(
            job.model,
            optimizer=job.optimizer,
            total_steps=steps,
            capture_steps=0 if spec["mode"] == "timer" else 5,
            skip_steps=WINDOW_START,  # the window the replay below assumes
            op_capture="profiler" if spec["mode"] == "profiler" else "auto",
            log_every=None,
            verbose=False,
            deadline=False,
        )
    jiffies0, own0, load0 = _cpu_jiffies(), _own_cpu_s(), os.getloadavg()[0]
    t0_ns = hook.created_ns if hook is not None else time.perf_counter_ns()
    ends_s: list[float] = []
    predictions: dict[int, Any] = {}
    prediction_ms: dict[int, float] = {}
    # The hook's first step after its trace is decoded (None: no capture, or not by the end).
    decode_done_step = None
    decoding = True if spec["mode"] in ("hook", "profiler") else None
    for i in range(steps):
        step(batches[i % BATCHES])
        ends_s.append((time.perf_counter_ns() - t0_ns) / 1e9)
        if decoding is not None and hook.capture_status.startswith(("done", "off")):
            decode_done_step, decoding = i + 1, None
        if hook is not None and i + 1 in REPORT_STEPS:
            asked_ns = time.perf_counter_ns()
            p = hook.prediction
            prediction_ms[i + 1] = (time.perf_counter_ns() - asked_ns) / 1e6
            predictions[i + 1] = p.to_dict() if p is not None else None
    wall_s = ends_s[-1]
    jiffies1, own1 = _cpu_jiffies(), _own_cpu_s()
    out: dict[str, Any] = {"ends_s": ends_s, "predictions": predictions}
    out["prediction_ms"] = prediction_ms
    out["decode_done_step"] = decode_done_step
    if hook is not None:
        forecaster = getattr(hook, "_forecaster", None)
        prior = getattr(forecaster, "prior", None)
        out["capture_ratio"] = list(getattr(prior, "capture_ratio", ()) or ())
        out["window_ops"] = list(getattr(hook, "_window_ops", []) or [])
        out["hook_step_s"] = hook.step_times_s
        hook.close()
    ncpu = os.cpu_count() or 1
    foreign = math.nan
    if jiffies0 is not None and jiffies1 is not None:
        total = jiffies1[1] - jiffies0[1]
        busy_s = (jiffies1[0] - jiffies0[0]) / max(total, 1) * ncpu * wall_s
        foreign = max(0.0, busy_s - (own1 - own0)) / wall_s
    out["foreign_cores"] = foreign
    out["loadavg"] = [load0, os.getloadavg()[0]]
    out["threads"] = torch.get_num_threads()
    return out


def _count_ops(made: tuple[Any, list[Any], Callable[[Any], None]], steps: int) -> dict[str, Any]:
    from ets_hook.capture import native_ops
    from ets_hook.capture.ops import NativeOpCapture

    _, batches, step = made
    for i in range(3):
        step(batches[i % BATCHES])
    module = native_ops.load(build_if_missing=True)
    if module is None:
        return {"error": f"native observer unavailable: {native_ops.unavailable_reason()}"}
    capture = NativeOpCapture(module)
    capture.start(record_shapes=False)
    for i in range(steps):
        step(batches[i % BATCHES])
    capture.stop()
    names = collections.Counter(op.name for op in capture.read())
    return {
        "ops_per_step": sum(names.values()) / steps,
        "cast_ops_per_step": {name: names[name] / steps for name in CAST_OPS},
    }


# ---------------------------------------------------------------------------------------------
# Parent: rounds of fresh processes


def _run_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    if spec["setting"] == "prim_cache0":
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "0"
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def _variants(
    workloads: Sequence[str], modes: Sequence[str], settings: Sequence[str]
) -> list[tuple[str, ...]]:
    out = []
    for workload in workloads:
        for precision in PRECISIONS:
            for mode in modes:
                out.append((workload, precision, mode, "default"))
            for setting in settings:
                if setting in PREDICTION_SETTINGS:
                    out += [
                        (workload, precision, m, setting) for m in ("timer", "hook") if m in modes
                    ]
                elif "none" in modes and (setting != "no_cast_cache" or precision == "bf16"):
                    out.append((workload, precision, "none", setting))
    return out


def _step_times(ends_s: Sequence[float]) -> list[float]:
    return [ends_s[0]] + [b - a for a, b in itertools.pairwise(ends_s)]


def _analyse(run: dict[str, Any]) -> dict[str, Any]:
    """Phases, excess and prediction errors of one run."""
    import numpy as np

    from ets_hook.forecast.stats import truncation_point

    ends = run["ends_s"]
    steps = _step_times(ends)
    n = len(steps)
    steady = statistics.median(steps[n // 2 :])
    out: dict[str, Any] = {"steady_ms": steady * 1e3, "foreign": run["foreign_cores"]}
    for label, lo, hi in PHASES:
        if hi <= n:
            out[f"r{label}"] = statistics.median(steps[lo:hi]) / steady
    head = steps[: min(50, n)]
    out["excess_steps"] = sum(t - steady for t in head) / steady
    out["mser_cut"] = truncation_point(np.asarray(head))[0]
    truth = ends[-1]
    errors: dict[int, dict[str, float]] = {}
    for k_text, p in run.get("predictions", {}).items():
        k = int(k_text)
        if p is None or p.get("total_s") is None:
            continue
        remaining = n - k
        actual_remaining = truth - ends[k - 1]
        extra = actual_remaining - remaining * steady
        rate = remaining * (p["iteration_s"] + p["overhead_per_step_s"] - steady)
        one_off = p["remaining_capture_s"] - extra
        measured = p.get("measured_iteration_s")
        trace = p.get("trace_iteration_s")
        errors[k] = {
            "total": 100 * (p["total_s"] - truth) / truth,
            "rate": 100 * rate / truth,
            "one_off": 100 * one_off / truth,
            "iter_ratio": p["iteration_s"] / steady,
            "measured_ratio": measured / steady if measured else math.nan,
            "trace_ratio": trace / steady if trace else math.nan,
            "warmup_steps": p["warmup_steps"],
            "capture_steps_pred": p["remaining_capture_s"] / steady,
            "extra_steps_true": extra / steady,
            "source": p["source"],
        }
    out["errors"] = errors
    out["step_s"] = steps
    out["capture_ratio"] = run.get("capture_ratio")
    out["prediction_ms"] = run.get("prediction_ms", {})
    out["decode_done_step"] = run.get("decode_done_step")
    if n > 2:
        out["r3"] = steps[2] / steady
    return out


def _replay(run: dict[str, Any], k: int, prior: str) -> float:
    """Total error (%) of what ets-hook's forecaster predicts after step ``k`` from the run's
    recorded hook step times (no trace estimate: steps <= 6 have none yet).

    ``prior``: ``"as is"``: what the hook does (for a bf16 job the low-precision first-step
    range: ``Forecaster.set_low_precision``); ``"before"``: the same with the early-step part
    of the CPU prior as it was before 2026-12-02 (steps 2-5 at 0.82-1.09x, the window's
    measured slowdown not widened by it).
    """
    from ets_hook.capture.ops import NativeOpCapture, ProfilerOpCapture
    from ets_hook.capture.window import measured_capture_ratio
    from ets_hook.forecast.forecaster import Forecaster
    from ets_hook.forecast.job import JobModel

    steps, ends = run["hook_step_s"], run["ends_s"]
    _, precision, mode, _ = run["variant"]
    forecaster = Forecaster(JobModel(total_steps=len(ends)), start_s=0.0, wall_start_s=0.0)
    if precision == "bf16":
        forecaster.set_low_precision()
    if prior == "before":
        forecaster.prior = dataclasses.replace(
            forecaster.prior, early_ratio=(0.82, 1.09), early_steps=5, early_in_window=False
        )
    start, end = WINDOW_START, WINDOW_START + 5  # the runs' window (capture_steps=5)
    if mode in ("hook", "profiler"):
        costs = (NativeOpCapture if mode == "hook" else ProfilerOpCapture).cpu_costs
        forecaster.set_capture_window(start, end, **costs)
        forecaster.set_perturbed_steps(end + 1)
    ops = run.get("window_ops") or []
    for i in range(k):
        forecaster.on_step_end(i, steps[i], ends[i])
        if mode == "hook" and ops and start <= i < end:
            done = steps[start : i + 1]
            ratio = measured_capture_ratio(done, ops[: len(done)], NativeOpCapture.us_per_op[True])
            if ratio is not None:
                forecaster.set_capture_window(start, end, capture_ratio=ratio, measured=True)
    prediction = forecaster.prediction
    return 100 * (prediction.total_s - ends[-1]) / ends[-1]


def _ok(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if "step_s" in r]


def _stat(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _report(
    results: dict[tuple[str, ...], list[dict[str, Any]]],
    opcounts: dict[tuple[str, str], dict[str, Any]],
) -> str:
    parts = []
    # 1. phases
    header = ["workload", "prec", "mode", "setting", "steady ms"]
    header += [f"{label}/steady" for label, _, _ in PHASES]
    header += ["excess (steps)", "MSER cut", "foreign load"]
    rows = []
    for (workload, precision, mode, setting), runs in results.items():
        runs = [r for r in runs if "error" not in r]
        if not runs:
            continue
        row = [workload, precision, mode, setting, _stat([r["steady_ms"] for r in runs])]
        row += [_stat([r.get(f"r{label}", math.nan) for r in runs]) for label, _, _ in PHASES]
        row += [_stat([r["excess_steps"] for r in runs], "{:.1f}")]
        row += [_stat([r["mser_cut"] for r in runs], "{:.0f}")]
        row += [_stat([r["foreign"] for r in runs])]
        rows.append(row)
    parts.append("## Step-time phases (ratio to steady; median [min, max] over rounds)\n")
    parts.append(_table(header, rows))
    # 2. capture cost
    rows = []
    for (workload, precision), counts in opcounts.items():
        if "error" in counts:
            rows.append([workload, precision, "-", counts["error"]] + ["-"] * 6)
            continue
        ops = counts["ops_per_step"]
        casts = sum(counts["cast_ops_per_step"].values())
        timer = _ok(results.get((workload, precision, "timer", "default"), []))
        for mode in ("hook", "profiler"):
            captured = _ok(results.get((workload, precision, mode, "default"), []))
            if not captured:
                continue
            pairs = list(zip(captured, timer))
            window = [
                (statistics.median(c["step_s"][2:6]), statistics.median(t["step_s"][2:6]))
                for c, t in pairs
            ]
            used = [
                statistics.fmean(c["capture_ratio"]) for c in captured if c.get("capture_ratio")
            ]
            rows.append(
                [
                    workload,
                    precision,
                    mode,
                    f"{ops:.0f}",
                    f"{casts:.0f}",
                    _stat([(c - t) * 1e3 for c, t in window]),
                    _stat([(c - t) * 1e6 / ops for c, t in window]),
                    _stat([c / t for c, t in window]),
                    _stat(used),
                    _stat([c["decode_done_step"] or math.nan for c in captured], "{:.0f}"),
                ]
            )
    parts.append(
        "\n## Capture window cost: window steps 3-6 with capture minus the timer's steps 3-6, "
        "paired by round (the native observer's per-op cost range is 0.4-0.9 us with shapes, "
        "0.3-0.7 without; shapes are recorded in the window's first step only)\n"
    )
    parts.append(
        _table(
            [
                "workload",
                "prec",
                "capture",
                "ops/step",
                "to/_to_copy/copy_/empty_strided per step",
                "added ms/step",
                "added us/op",
                "window/timer",
                "capture ratio the hook used",
                "trace decoded by step",
            ],
            rows,
        )
    )
    # 3. prediction errors
    rows, cost_rows = [], []
    for (workload, precision, mode, setting), runs in results.items():
        if mode == "none" or setting not in ("default", *PREDICTION_SETTINGS):
            continue
        runs = [r for r in runs if "errors" in r]
        cost_rows.append(
            [workload, precision, mode, setting]
            + [
                _stat([r["prediction_ms"].get(str(k), math.nan) for r in runs])
                for k in REPORT_STEPS
            ]
            + [_stat([r.get("r3", math.nan) for r in runs])]
        )
        for k in REPORT_STEPS:
            cells = [r["errors"].get(k) for r in runs]
            cells = [c for c in cells if c is not None]
            if not cells:
                continue
            rows.append(
                [
                    workload,
                    precision,
                    mode,
                    setting,
                    str(k),
                    _stat([c["total"] for c in cells], "{:+.1f}"),
                    _stat([c["rate"] for c in cells], "{:+.1f}"),
                    _stat([c["one_off"] for c in cells], "{:+.1f}"),
                    _stat([c["iter_ratio"] for c in cells]),
                    _stat([c["measured_ratio"] for c in cells]),
                    _stat([c["trace_ratio"] for c in cells]),
                    _stat([c["warmup_steps"] for c in cells], "{:.0f}"),
                    _stat([c["capture_steps_pred"] for c in cells], "{:.1f}"),
                    _stat([c["extra_steps_true"] for c in cells], "{:.1f}"),
                    "/".join(sorted({c["source"] for c in cells})),
                ]
            )
    parts.append(
        "\n## Total-time prediction error, % of the true total (median [min, max] over rounds)"
        "\nrate = remaining x (iteration_s + overhead - steady); one-off = remaining_capture_s - "
        "true time to come beyond remaining x steady; ratios are to the true steady step.\n"
    )
    parts.append(
        _table(
            [
                "workload",
                "prec",
                "mode",
                "setting",
                "step",
                "total err %",
                "rate %",
                "one-off %",
                "iteration/steady",
                "measured/steady",
                "trace/steady",
                "warm-up cut",
                "capture left (steps)",
                "true extra left (steps)",
                "source",
            ],
            rows,
        )
    )
    parts.append(
        "\n## Cost of reading hook.prediction after step k, ms (it lands in step k + 1: the "
        "hook's step clock restarted at the boundary); step 3 / steady\n"
    )
    parts.append(
        _table(
            ["workload", "prec", "mode", "setting"]
            + [f"after {k}" for k in REPORT_STEPS]
            + ["step 3 / steady"],
            cost_rows,
        )
    )
    return "\n".join(parts)


def _replay_report(raw: Sequence[dict[str, Any]]) -> str:
    """|total error| at steps 1, 2, 3, 5 of the recorded timer/hook runs replayed through the
    forecaster with each of ``REPLAY_PRIORS``, per precision and setting."""
    from ets_hook.forecast.forecaster import Forecaster

    if not hasattr(Forecaster, "set_low_precision"):
        return "\n## Replay: skipped (this ets-hook has no Forecaster.set_low_precision)"
    errors: dict[tuple[str, ...], list[float]] = collections.defaultdict(list)
    for run in raw:
        _, precision, mode, setting = run["variant"]
        if mode not in ("timer", "hook") or not run.get("hook_step_s"):
            continue
        for prior in REPLAY_PRIORS:
            for k in REPLAY_STEPS:
                errors[(precision, setting, prior, str(k))].append(_replay(run, k, prior))
    rows = []
    for precision in PRECISIONS:
        for setting in ("default", *PREDICTION_SETTINGS):
            for prior in REPLAY_PRIORS:
                cells = [errors.get((precision, setting, prior, str(k)), []) for k in REPLAY_STEPS]
                if not any(cells):
                    continue
                rows.append(
                    [precision, setting, prior, str(len(cells[0]))] + [_abs_stat(c) for c in cells]
                )
    return (
        "\n## Replay: the recorded timer and hook runs through ets-hook's forecaster (no trace "
        "estimate) as the hook sets it up (as is) and with the early-step prior of before "
        "2026-12-02 (before); |total error| % median / P90 (signed median)\n\n"
        + _table(["prec", "setting", "prior", "runs"] + [f"step {k}" for k in REPLAY_STEPS], rows)
    )


def _abs_stat(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(abs(v) for v in values)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return f"{statistics.median(ordered):.1f} / {p90:.1f} ({statistics.median(values):+.1f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated: {', '.join(WORKLOADS)} or any zoo workload name "
        "(ets_hook.cli.zoo, e.g. gpt-d64-l2-b8-t64)",
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}"
    )
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help=f"comma-separated, from {', '.join(SETTINGS)} ('' for none)",
    )
    parser.add_argument("--first-job-steps", type=int, default=30, help="for second_job")
    parser.add_argument("--opcount-steps", type=int, default=3, help="steps the op count spans")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per run (0: torch's default, one per core); 1 leaves a core to other "
        "work on a shared machine, so a busy neighbour no longer stalls the OpenMP team",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=None,
        help="a run during which other processes used more CPU cores than this on average is "
        "run again (default: the cores torch leaves free, less 0.15, at least 0.15: torch's "
        "OpenMP team stalls when one of its cores is taken)",
    )
    parser.add_argument("--retries", type=int, default=3, help="reruns of a disturbed run")
    parser.add_argument("--retry-pause", type=float, default=5.0, help="seconds before a rerun")
    parser.add_argument(
        "--no-replay",
        dest="replay",
        action="store_false",
        help="skip the replay of the timer/hook runs with other warm-up priors",
    )
    parser.add_argument("--json", help="write every run's data here (after every round)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(RESULT_MARK + json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    if args.steps < 60:
        parser.error("--steps must be >= 60 (phases up to step 50, steady from the second half)")
    cores = os.cpu_count() or 1
    if args.max_foreign is None:
        args.max_foreign = max(0.15, cores - (args.threads or cores) - 0.15)
    chosen = [w for w in args.workloads.split(",") if w]
    settings = [s for s in args.settings.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    zoo = workloads()
    for name in chosen:
        if WORKLOADS.get(name, name) not in zoo:
            parser.error(f"unknown workload {name!r}")
    for name in modes:
        if name not in MODES:
            parser.error(f"unknown mode {name!r}")
    for name in settings:
        if name not in SETTINGS:
            parser.error(f"unknown setting {name!r}")
    variants = _variants(chosen, modes, settings)
    print(
        f"# bf16 warm-up: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}; {len(variants)} variants x {args.rounds} rounds, "
        f"{args.steps} steps, torch threads {args.threads or 'default'}, reruns above "
        f"{args.max_foreign:.2f} foreign cores; load at start {os.getloadavg()}",
        flush=True,
    )
    base = {"steps": args.steps, "seed": args.seed, "first_job_steps": args.first_job_steps}
    base["threads"] = args.threads
    opcounts: dict[tuple[str, str], dict[str, Any]] = {}
    for workload in chosen:
        for precision in PRECISIONS:
            spec = dict(base, workload=workload, precision=precision, setting="default")
            spec.update(mode="opcount", steps=args.opcount_steps)
            opcounts[(workload, precision)] = _run_child(spec, args.timeout)
    results: dict[tuple[str, ...], list[dict[str, Any]]] = {v: [] for v in variants}
    raw: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        shift = (round_index * 5) % len(variants)  # 5: coprime with the 2x3 block of a workload
        order = variants[shift:] + variants[:shift]
        if round_index % 2:
            order.reverse()
        for variant in order:
            workload, precision, mode, setting = variant
            spec = dict(base, workload=workload, precision=precision, mode=mode, setting=setting)
            for attempt in range(args.retries + 1):
                run = _run_child(spec, args.timeout)
                if not run.get("foreign_cores", 0.0) > args.max_foreign:
                    break
                print(
                    f"  {'/'.join(variant)}: other work used {run['foreign_cores']:.2f} cores "
                    f"during the run (attempt {attempt + 1}); "
                    + ("kept" if attempt == args.retries else "running it again"),
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(args.retry_pause)
            if "error" in run:
                print(f"  {variant}: {run['error']}", file=sys.stderr)
                results[variant].append(run)
                continue
            analysed = _analyse(run)
            results[variant].append(analysed)
            raw.append({"variant": variant, "round": round_index, **run})
        print(f"# round {round_index + 1}/{args.rounds} done; load {os.getloadavg()}", flush=True)
        if args.json:  # after every round: a killed run keeps what it measured
            with open(args.json, "w") as f:
                document = {"opcounts": {"/".join(k): v for k, v in opcounts.items()}, "runs": raw}
                json.dump(document, f)
    print(_report(results, opcounts))
    if args.replay:
        print(_replay_report(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
