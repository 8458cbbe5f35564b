"""Collect our own ETS dataset on this machine: early traces with steady-state targets.

Every zoo workload (ten-plus architecture families, several sizes) runs at several batch sizes
through ``ETSHook`` exactly as a user's job would: the hook captures steps [1, 6) (the early
window the predictor sees at run time; the window is set explicitly, not the hook's adaptive
default). Later in the same job, once warm-up is long over, a second hook captures steps
[S, S + 5): the steady-state window whose per-op times are the targets. Each job is saved as one
``.ets`` file holding both windows:

- ``trace.iterations``: early steps first, then the steady steps;
- ``trace.metadata``: ``early_steps``, ``steady_steps``, ``steady_step_s`` (the steady step
  time of the steps after warm-up, outside both windows: their median, or their mean where
  steps vary by design, ``steady_statistic_of``), ``step_times_s`` (every step), workload
  facts (family, batch size, parameters, the training loop's variant), and the machine.

Besides the zoo's plain loop (synthetic batches, one batch a step), ``VARIANTS`` run zoo models
in loops unlike it (issue 16), each with its own ``family`` so that leave-one-family-out holds it
out whole; their loops are ``benchmarks/accuracy.py``'s (``JobSpec``, ``LoaderSpec``):

- ``+loader-w0`` / ``+loader-w2`` (family ``mlp-loader``): the MLPs fed by a ``DataLoader`` over
  a finite dataset with per-sample CPU work (``accuracy._AugmentedVectors``), loaded in the
  training process or by 2 non-persistent workers, ``LOADER_EPOCH_STEPS`` steps an epoch; the
  hook is given ``dataloader=``. The step time includes the wait for data: the loader's own ops
  (``Phase.INPUT``) are no model rows, they fall in the step's lead-in. Epoch-start steps are
  left out of the steady step time, which is the mean with workers (``steady_statistic_of``);
- ``+varlen`` (family ``transformer-varlen``): the transformer encoders on token batches whose
  sequence length is drawn per batch from 16..128 (seeded per job); the steady step time is the
  mean (the rate the job's total runs at), over a longer job (``Variant.steps``);
- ``+accum2`` (family ``gpt-accum2``): the GPT decoders with two micro-batches per optimizer step.

Usage::

    python benchmarks/collect.py --out results/dataset [--steps 60] [--batch-scales 0.5,1,2]
        [--workloads mlp-w128-d2-b32,mlp-w128-d2-b32+loader-w2]
    ets-hook train results/dataset/*.ets -o model.npz      # then train on it
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ets_hook import ETSHook
from ets_hook.cli.zoo import Job, Workload, workloads
from ets_hook.trace.events import Trace
from ets_hook.trace.io import save_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import EpochBatches, JobSpec, LoaderSpec, job_batches, steady_statistic

EARLY_SKIP, WINDOW = 1, 5
LOADER_EPOCH_STEPS = 30  # a loader job's epoch: non-persistent workers restart every 30 steps


@dataclass(frozen=True)
class Variant:
    """Zoo workloads in a training loop unlike the zoo's plain one, as their own family.

    A variant job is named ``<zoo workload>+<suffix>`` (``with_batch_size`` keeps the suffix).

    Attributes:
        suffix: the job name's suffix.
        family: the family label (distinct from every zoo family: held out whole).
        bases: the zoo workloads it runs.
        grad_accum: micro-batches per optimizer step.
        num_workers: a DataLoader with per-sample work (``accuracy.LoaderSpec``) and this many
            workers feeds the model (None: the workload's synthetic batches).
        seq_lengths: (lo, hi): each batch's sequence length, uniform, seeded per job.
        steps: the job's own length (wins over ``--steps``).
    """

    suffix: str
    family: str
    bases: tuple[str, ...]
    grad_accum: int = 1
    num_workers: int | None = None
    seq_lengths: tuple[int, int] | None = None
    steps: int | None = None

    def spec(self, workload: Workload) -> JobSpec:
        """The loop of ``workload`` (at its batch size) as an ``accuracy.JobSpec``."""
        loader = None
        if self.num_workers is not None:
            samples = LOADER_EPOCH_STEPS * self.grad_accum * workload.batch_size
            loader = LoaderSpec(samples, num_workers=self.num_workers)
        return JobSpec(
            workload.name,
            workload.name,
            grad_accum=self.grad_accum,
            loader=loader,
            seq_lengths=self.seq_lengths,
            steps=self.steps,
        )


_MLPS = ("mlp-w128-d2-b32", "mlp-w512-d3-b64", "mlp-w1024-d4-b128")
VARIANTS = (
    Variant("loader-w0", "mlp-loader", _MLPS, num_workers=0),
    Variant("loader-w2", "mlp-loader", _MLPS, num_workers=2),
    # Variable lengths: 200 steps, so that the mean over the settled steps (~120 of them, each
    # length's cost drawn from a ~45%-CV spread) is within a few % of the lengths' expectation.
    Variant(
        "varlen",
        "transformer-varlen",
        ("transformer-d64-l2-b16-t32", "transformer-d128-l4-b16-t64"),
        seq_lengths=(16, 128),
        steps=200,
    ),
    Variant("accum2", "gpt-accum2", ("gpt-d64-l2-b8-t64", "gpt-d128-l3-b8-t128"), grad_accum=2),
)


def collect_jobs() -> dict[str, tuple[Workload, Variant | None]]:
    """Every collectable job by name: the zoo's workloads, then the variants' jobs."""
    zoo = workloads()
    jobs: dict[str, tuple[Workload, Variant | None]] = {n: (w, None) for n, w in zoo.items()}
    for variant in VARIANTS:
        for base in variant.bases:
            name = f"{base}+{variant.suffix}"
            jobs[name] = (dataclasses.replace(zoo[base], name=name, family=variant.family), variant)
    return jobs


def _step_function(job: Job, spec: JobSpec | None, seed: int) -> tuple[Callable[[], Any], Any]:
    """One training step of ``job`` and its batch stream: the zoo's plain step, or the variant's
    (``spec.grad_accum`` micro-batches, then the optimizer step, as ``accuracy.py`` runs them)."""
    if spec is None:
        plain = job.batches()
        return lambda: job.train_step(next(plain)), plain
    # A seed per job: variable-length jobs each draw their own lengths.
    batches: Iterator[Any] = job_batches(job, spec, seed + zlib.crc32(spec.name.encode()))

    def step() -> None:
        for _ in range(spec.grad_accum):
            loss = job.loss(next(batches))
            (loss / spec.grad_accum).backward()
        job.optimizer.step()
        job.optimizer.zero_grad(set_to_none=True)

    return step, batches


def steady_statistic_of(spec: JobSpec | None) -> Callable[[list[float]], float]:
    """How a job's settled step times are summed up into its steady step time: the median
    (robust to the odd slow step: GC, a page fault), or the mean where steps vary by design
    (variable lengths: ``accuracy.steady_statistic``) or with an input pipeline running beside
    them (DataLoader workers: steps alternate between waiting for a batch and finding one ready,
    and the median of that mix jumps between its modes; the job's total runs at the mean)."""
    if spec is None:
        return statistics.median
    if spec.loader is not None and spec.loader.num_workers > 0:
        return statistics.fmean
    return steady_statistic(spec)


def collect_one(
    workload: Workload,
    steps: int,
    device: str,
    seed: int,
    op_capture: str = "auto",
    variant: Variant | None = None,
) -> Trace:
    """Run one job; return its early + steady trace with targets in the metadata."""
    steady_start = max(EARLY_SKIP + WINDOW + 10, steps - WINDOW - 5)
    job = workload.build(device, seed=seed)
    spec = variant.spec(workload) if variant is not None else None
    train_step, batches = _step_function(job, spec, seed)
    early_hook = ETSHook(
        job.model,
        optimizer=job.optimizer,
        total_steps=steps,
        skip_steps=EARLY_SKIP,
        capture_steps=WINDOW,
        log_every=None,
        deadline=False,
        op_capture=op_capture,
        # As a user of a DataLoader would (epochs, worker restarts); micro-batches per step.
        dataloader=batches.loader if isinstance(batches, EpochBatches) else None,
        grad_accum_steps=spec.grad_accum if spec is not None else 1,
    )
    steady_hook: ETSHook | None = None
    for step in range(steps):
        if step == steady_start:
            steady_hook = ETSHook(
                job.model,
                optimizer=job.optimizer,
                skip_steps=0,
                capture_steps=WINDOW,
                log_every=None,
                deadline=False,
                trace_estimator=None,
                op_capture=op_capture,
            )
        train_step()
    early_hook.close()
    assert steady_hook is not None
    steady_hook.close()
    if isinstance(batches, EpochBatches):
        batches.close()  # the workers, if any, shut down
    early, steady_trace = early_hook.wait_for_trace(120), steady_hook.wait_for_trace(120)
    if early is None or steady_trace is None:
        raise RuntimeError(
            f"{workload.name}: capture failed ({early_hook.capture_status}; "
            f"{steady_hook.capture_status})"
        )
    times = early_hook.step_times_s
    windows = set(range(EARLY_SKIP, EARLY_SKIP + WINDOW)) | set(
        range(steady_start, steady_start + WINDOW)
    )
    if spec is not None and spec.loader is not None:
        # The rate within an epoch: epoch starts (worker restarts) are the hook's to project.
        windows |= set(range(0, len(times), LOADER_EPOCH_STEPS))
    settled = [t for i, t in enumerate(times) if i >= steps // 3 and i not in windows]
    steady = steady_statistic_of(spec)
    # The steady hook counts its own steps from 0: shift them to the job's step numbers.
    for iteration in steady_trace.iterations:
        iteration.step += steady_start
    model = job.model
    early.iterations += steady_trace.iterations
    early.metadata.update(
        {
            "source": "benchmarks/collect.py",
            "workload": workload.name,
            "family": workload.family,
            "batch_size": workload.batch_size,
            "workload_params": dict(workload.params),
            "parameters": sum(p.numel() for p in model.parameters()),
            "optimizer": workload.optimizer,
            "seed": seed,
            "early_steps": [it.step for it in early.iterations if it.step < steady_start],
            "steady_steps": [it.step for it in steady_trace.iterations],
            "steady_step_s": steady(settled),
            "steady_statistic": steady.__name__,
            "steps": steps,
            "variant": variant.suffix if variant is not None else None,
            "grad_accum": spec.grad_accum if spec is not None else 1,
            "loader": dataclasses.asdict(spec.loader) if spec and spec.loader else None,
            "seq_lengths": list(spec.seq_lengths) if spec and spec.seq_lengths else None,
            "step_times_s": list(times),
            "machine": platform.node(),
            "op_capture": early.capture.op_capture,
        }
    )
    return early


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/dataset", help="output directory")
    parser.add_argument("--steps", type=int, default=60, help="steps per job (default 60)")
    parser.add_argument("--batch-scales", default="0.5,1,2", help="batch-size multipliers")
    parser.add_argument(
        "--workloads",
        default="",
        help="comma-separated subset of the zoo's workloads and the variants' jobs "
        "(<zoo workload>+<suffix>; default: all)",
    )
    parser.add_argument("--seeds", type=int, default=1, help="runs per configuration")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--op-capture", default="native", choices=("native", "profiler"), help="hook setting"
    )
    args = parser.parse_args(argv)
    if args.steps < 2 * (EARLY_SKIP + WINDOW) + 15:
        parser.error(f"--steps must be >= {2 * (EARLY_SKIP + WINDOW) + 15}, got {args.steps}")
    zoo = collect_jobs()
    names = [n for n in args.workloads.split(",") if n] or list(zoo)
    unknown = [n for n in names if n not in zoo]
    if unknown:
        parser.error(f"unknown workloads {unknown}")
    scales = [float(s) for s in args.batch_scales.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Jobs already listed in an existing index stay listed unless collected again.
    index_path = out / "index.json"
    index: list[dict[str, Any]] = []
    if index_path.is_file():
        index = json.loads(index_path.read_text()).get("jobs", [])
    started = time.perf_counter()
    for name in names:
        base, variant = zoo[name]
        steps = variant.steps if variant is not None and variant.steps else args.steps
        for scale in scales:
            workload = base.with_batch_size(max(1, round(base.batch_size * scale)))
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                trace = collect_one(
                    workload, steps, args.device, seed, args.op_capture, variant=variant
                )
                path = out / f"{workload.name}.s{seed}.ets"
                save_trace(trace, path)
                meta = trace.metadata
                index = [job for job in index if job["file"] != path.name]
                index.append(
                    {
                        "file": path.name,
                        "workload": workload.name,
                        "family": workload.family,
                        "batch_size": workload.batch_size,
                        "steady_step_s": meta["steady_step_s"],
                        "ops_per_step": len(trace.iterations[0].ops),
                    }
                )
                print(
                    f"{path.name:56} {1e3 * meta['steady_step_s']:9.2f} ms/step  "
                    f"{len(trace.iterations[0].ops):6} ops  ({time.perf_counter() - t0:.0f}s)"
                )
                sys.stdout.flush()
    index_path.write_text(
        json.dumps(
            {
                "machine": {
                    "host": platform.node(),
                    "cores": os.cpu_count(),
                    "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(),
                },
                "steps": args.steps,
                "jobs": index,
            },
            indent=1,
        )
    )
    print(f"{len(index)} traces in {out} ({time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
