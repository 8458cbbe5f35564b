"""Early-prediction accuracy of ets-hook against ETA-bar baselines, on real training jobs.

Each job of the zoo (different families and sizes; some with an evaluation phase every M steps
and checkpoint saves, one with gradient accumulation, one whose data loading is a real share of
the step) runs to completion with an ``ETSHook`` (default settings), and ``hook.prediction`` is
read after the steps it is scored at (1, 2, 3, 5, 10, 20, 50, and the last). After the zoo's 14
jobs and its compiled / bf16 / DDP twins come jobs unlike the zoo (issue 16):

- ``mlp-loader-w0-epochs``, ``mlp-loader-w2-epochs``, ``mlp-loader-w2-persistent``: a finite
  dataset with per-sample CPU work in ``__getitem__`` behind a ``DataLoader`` (60 steps an
  epoch, 5 epochs), loaded in the training process (``num_workers=0``) or by 2 workers that
  restart at every epoch boundary (non-persistent) or once (persistent, the control);
- short jobs with their own length (``JobSpec.steps``, which wins over ``--steps``): 60 steps,
  100 steps with an evaluation phase, 120 steps with gradient accumulation and checkpoints;
- ``transformer-small-varlen``: steps of varying length, a token batch whose sequence length is
  drawn per batch from a fixed-seed uniform 16..128;
- ``mlp-loader-w2-balanced``: 2 restarting workers with a tenth of the per-sample work, at
  about the training loop's own pace.

Run only when named in ``--jobs`` (``OPT_IN_JOBS``): ``mlp-medium+unmarked-eval``, a loop that
evaluates every 10 steps without ``hook.phase`` (what the later predictions make of recurring
work nobody told the hook about; no early estimate can know of it).

Ground truth, per job:

- total: wall time from hook creation to the end of the loop: its last training step and the
  phases due after it (an evaluation or checkpoint on its period at the last step; phases,
  epoch boundaries and DataLoader time are real time in the step loop);
- steady-state step time: median training-step time over the second half of the steps (the
  mean for jobs whose steps vary in length by design, whose total sums the mean, not the
  median: see ``steady_statistic``).

At steps 1, 2, 3, 5, 10, 20, 50 we report the absolute percentage error of the predicted total
and of the predicted step time, median and P90 over the jobs, for ets-hook and for what an ETA
bar would have said at that point (elapsed + rate x remaining steps, rate from):

- ``first_step``:  the first iteration's wall time;
- ``mean_k``:      the mean wall time of the iterations so far;
- ``tqdm_ema``:    tqdm's exponential moving average of iteration time (smoothing 0.3);
- ``composer``:    mean training time per step skipping the first step, with evaluation /
                   checkpoint time taken out of the rate and mean phase cost x remaining phases
                   added back (Composer's RuntimeEstimator; it knows the eval interval).
- ``last_step``:   the last iteration's wall time (the plainest ETA: "last step x remaining").

ets-hook's 95% interval of the total is scored too: in how many jobs it covers the real total,
and its median half-width, at each report step. The machine's own noise floor is reported with
them: how far the median step time of steps
20..N/2 (long past warm-up, no prediction involved) lies from the second-half median (means for
variable-length jobs). No early predictor can be expected to beat it by much. Per job, at steps
3, 5 and 10, every method's error sits beside the job's own noise floor, and per report step the
worst job is named (the largest ets-hook error, and the furthest above its own floor).

Outputs JSON, a markdown table and a PNG plot (error vs step, one line per method)::

    python benchmarks/accuracy.py [--jobs a,b] [--steps 300] [--max-steps N] [--device cpu]
        [--out results/accuracy]

``--steps`` is the length of jobs without their own; ``--max-steps`` caps every job, their own
lengths too (smoke runs only: a capped short job is not the job its spec describes).

With ``--rounds N`` every job runs N times, each run a fresh Python process as a user's job is
(process-level warm-up — oneDNN primitives, allocator pools, inductor's cache — is then seen
every time), the jobs' order rotated from round to round so that drift in the machine's load
hits every job alike; a per-job table gives the ets-hook error at steps 3, 5 and 10, every
baseline's and the best baseline's at step 5 and the job's noise floor (median [min-max] over
the rounds), and in how many runs ets-hook was below every baseline at step 5 and met the
target "error <= 5%, or within 2 points of the job's noise floor where that is higher, and below
every baseline". With three runs or more the table also gives each job's run-to-run floor at
steps 3, 5 and 10 (``run_to_run_floor_pct``): how far a run's early steps stand from its
steady state unlike the job's other runs — the miss of an estimate that had learnt the job's
own warm-up from its other runs (a reference level, not a strict bound). ``--rounds-from
RUN_JSON...`` runs nothing and writes that table for runs already made (the per-run JSON files
of several invocations, e.g. the runs of one code in an A/B that alternated it with another).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ets_hook import ETSHook
from ets_hook.cli.zoo import Job, workloads
from ets_hook.ets.regressors import Predictor
from ets_hook.forecast.trace_estimators import LearnedTraceEstimator

REPORT_STEPS = (1, 2, 3, 5, 10, 20, 50)
PER_JOB_STEPS = (3, 5, 10)  # the per-job tables' report steps
METHODS = ("ets-hook", "first_step", "mean_k", "tqdm_ema", "composer", "last_step")
BASELINES = tuple(m for m in METHODS if m != "ets-hook")
TQDM_SMOOTHING = 0.3

Batch = tuple[torch.Tensor, torch.Tensor]


LOADER_FEATURES = 256  # a loader job's sample size (the zoo's MLPs take 256 features)


@dataclass(frozen=True)
class LoaderSpec:
    """A finite dataset with per-sample CPU work (``_AugmentedVectors``) behind a DataLoader.

    The job iterates it epoch after epoch (``shuffle=True``, ``drop_last=True``): an epoch is
    ``samples // batch_size`` steps, and every epoch is a fresh ``iter(loader)``, so
    non-persistent workers start again at each epoch boundary, inside the step loop.

    Attributes:
        samples: dataset size (>= the workload's batch size).
        num_workers: DataLoader worker processes (0: loading in the training process).
        persistent_workers: keep the workers across epochs (needs ``num_workers`` > 0).
        pin_memory: the DataLoader's ``pin_memory`` (a no-op without an accelerator).
        work: per-sample "decode" size (``_AugmentedVectors.work``): the loading cost's knob
            (>= ``LOADER_FEATURES``, the features a sample keeps).
    """

    samples: int
    num_workers: int = 0
    persistent_workers: bool = False
    pin_memory: bool = False
    work: int = 10_000

    def __post_init__(self) -> None:
        if self.samples < 1 or self.num_workers < 0 or self.work < LOADER_FEATURES:
            raise ValueError(f"bad loader spec {self}")
        if self.persistent_workers and not self.num_workers:
            raise ValueError("persistent_workers needs num_workers > 0")


@dataclass(frozen=True)
class JobSpec:
    """A zoo workload plus how the training loop around it behaves.

    ``steps`` (the job's own length) wins over ``--steps``; ``loader`` and ``heavy_data`` are
    two input pipelines (an endless dataset for the zoo's ``mlp-dataloading``, a finite one
    iterated in epochs) and exclusive; ``seq_lengths`` needs a token workload (batches of
    shape (batch, time)) whose model takes any length up to the upper bound.
    """

    name: str
    workload: str
    eval_every: int | None = None
    eval_batches: int = 10
    checkpoint_every: int | None = None
    grad_accum: int = 1
    heavy_data: bool = False
    compiled: bool = False  # torch.compile(model) (inductor), the hook on the compiled module
    autocast: str | None = None  # "bf16": the forward under torch.autocast(bfloat16)
    ranks: int = 1  # > 1: DDP over gloo with that many processes (torch.multiprocessing)
    slow_rank_delay: float = 0.0  # the last rank sleeps this share of a step before each step
    steps: int | None = None  # this job's own length (wins over --steps)
    loader: LoaderSpec | None = None  # a finite dataset iterated in epochs by a DataLoader
    seq_lengths: tuple[int, int] | None = None  # (lo, hi): each batch's length, uniform, seeded
    # False: the loop evaluates without hook.phase and tells the hook nothing about it (a
    # hand-written loop whose author did not mark it): the evaluations are in the step times.
    mark_phases: bool = True

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"{self.name}: steps must be >= 1, got {self.steps}")
        if self.loader is not None and self.heavy_data:
            raise ValueError(f"{self.name}: loader and heavy_data are exclusive")
        if self.seq_lengths is not None:
            lo, hi = self.seq_lengths
            if not 1 <= lo <= hi:
                raise ValueError(f"{self.name}: seq_lengths must be 1 <= lo <= hi, got {lo, hi}")

    @property
    def varies_by_design(self) -> bool:
        """Steps of different lengths by design (a per-batch sequence length, or unmarked
        evaluations inside some steps)."""
        return self.seq_lengths is not None or (
            self.eval_every is not None and not self.mark_phases
        )


JOBS = (
    JobSpec("mlp-small", "mlp-w128-d2-b32"),
    JobSpec("mlp-large+eval", "mlp-w1024-d4-b128", eval_every=50, eval_batches=20),
    JobSpec("resnet-small", "resnet-w8-x1-b16-s32"),
    JobSpec("resnet-medium+ckpt", "resnet-w16-x2-b32-s32", checkpoint_every=60),
    JobSpec("vgg-small+eval", "vgg-w8-b16", eval_every=40),
    JobSpec("mobilenet-small", "mobilenet-w8-b16-s32"),
    JobSpec("lstm-small+accum4", "lstm-h64-l1-b32-t32", grad_accum=4),
    JobSpec("gru-medium", "gru-h128-l2-b32-t64"),
    JobSpec(
        "transformer-small+eval+ckpt",
        "transformer-d64-l2-b16-t32",
        eval_every=50,
        checkpoint_every=100,
    ),
    JobSpec("transformer-medium", "transformer-d128-l4-b16-t64"),
    JobSpec("gpt-small", "gpt-d64-l2-b8-t64"),
    JobSpec("gpt-medium+eval", "gpt-d128-l3-b8-t128", eval_every=60),
    JobSpec("recsys-small", "recsys-t4-r10000-b256"),
    JobSpec("mlp-dataloading", "mlp-w512-d3-b64", heavy_data=True),
    # Compiled, mixed-precision and distributed jobs, with their fp32 / eager / one-process
    # twins (resnet-small above, mlp-medium).
    JobSpec("resnet-small+compile", "resnet-w8-x1-b16-s32", compiled=True),
    JobSpec("resnet-small+bf16", "resnet-w8-x1-b16-s32", autocast="bf16"),
    JobSpec("mlp-medium", "mlp-w512-d3-b64"),
    JobSpec("mlp-medium+ddp2-uneven", "mlp-w512-d3-b64", ranks=2, slow_rank_delay=0.3),
    # Jobs unlike the zoo (issue 16). Input-bound steps over several epochs: per-sample work
    # of about as much as the model's step, 60 steps an epoch (3,840 samples at batch 64).
    JobSpec("mlp-loader-w0-epochs", "mlp-w512-d3-b64", loader=LoaderSpec(60 * 64)),
    JobSpec("mlp-loader-w2-epochs", "mlp-w512-d3-b64", loader=LoaderSpec(60 * 64, num_workers=2)),
    JobSpec(
        "mlp-loader-w2-persistent",
        "mlp-w512-d3-b64",
        loader=LoaderSpec(60 * 64, num_workers=2, persistent_workers=True),
    ),
    # Short jobs: the capture's own cost is a real share of the total.
    JobSpec("resnet-small-60steps", "resnet-w8-x1-b16-s32", steps=60),
    JobSpec(
        "mobilenet-small-100steps+eval",
        "mobilenet-w8-b16-s32",
        steps=100,
        eval_every=30,
        eval_batches=5,
    ),
    JobSpec(
        "gpt-small-120steps+accum2+ckpt",
        "gpt-d64-l2-b8-t64",
        steps=120,
        grad_accum=2,
        checkpoint_every=40,
    ),
    # Steps of varying length: each batch's sequence length drawn from 16..128.
    JobSpec("transformer-small-varlen", "transformer-d64-l2-b16-t32", seq_lengths=(16, 128)),
    # Workers at about the loop's pace (a tenth of the per-sample work): where the workers'
    # early pace, measured while everything competes for the cores, can overstate.
    JobSpec(
        "mlp-loader-w2-balanced",
        "mlp-w512-d3-b64",
        loader=LoaderSpec(60 * 64, num_workers=2, work=1_000),
    ),
)
ZOO_JOBS = 14  # JOBS[:14] is "the zoo" of earlier runs: names and order kept
#: Jobs run only when named in ``--jobs``: scenarios no early estimate can know of before they
#: happen, measured for what the later predictions do with them.
OPT_IN_JOBS = (
    # A hand-written loop evaluating every 10 steps without hook.phase: the evaluations are
    # bursts in the step times, at a steady beat.
    JobSpec(
        "mlp-medium+unmarked-eval",
        "mlp-w512-d3-b64",
        eval_every=10,
        eval_batches=10,
        mark_phases=False,
    ),
)


class _AugmentedVectors(torch.utils.data.Dataset):
    """Per-sample CPU work in __getitem__ (a decode + augment stand-in): loading is real time."""

    def __init__(self, size: int, features: int, work: int = 40_000) -> None:
        self.size, self.features, self.work = size, features, work

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng(index)
        raw = rng.standard_normal(self.work).astype(np.float32)
        raw = np.sort(raw)  # the "decode": O(n log n) per sample
        x = torch.from_numpy(raw[: self.features].copy())
        return (x - x.mean()) / (x.std() + 1e-6), torch.tensor(index % 10)


class EpochBatches:
    """Endless batches from a DataLoader, epoch after epoch, on ``device``.

    Every epoch is a fresh ``iter(loader)`` (non-persistent workers start again there), begun
    by the ``next`` that needs it, so its start-up is part of the step that asks.

    Attributes:
        epochs: epochs begun so far.
        batches: batches handed out so far.
    """

    def __init__(self, loader: torch.utils.data.DataLoader, device: torch.device) -> None:
        if len(loader) < 1:
            raise ValueError("the loader has no batch: an epoch would never end")
        self.loader, self.device = loader, device
        self.epochs = 0
        self.batches = 0
        self._iterator: Iterator[Batch] | None = None

    def __iter__(self) -> EpochBatches:
        return self

    def __next__(self) -> Batch:
        while True:
            if self._iterator is None:
                self._iterator = iter(self.loader)
                self.epochs += 1
            try:
                x, y = next(self._iterator)
            except StopIteration:
                self._iterator = None
                continue
            self.batches += 1
            return x.to(self.device), y.to(self.device)

    def close(self) -> None:
        """Drop the current epoch's iterator (its workers, if any, shut down)."""
        self._iterator = None


def at_length(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """A (batch, time) tensor cut or tiled along time to ``length`` (the batch's own tokens,
    repeated: the step's cost depends on the shape, not on the token values)."""
    if tokens.dim() != 2:
        raise ValueError(f"expected (batch, time) tokens, got shape {tuple(tokens.shape)}")
    repeats = -(-length // tokens.shape[1])
    return tokens.repeat(1, repeats)[:, :length]


def varied_lengths(
    batches: Iterator[Batch], lengths: tuple[int, int], seed: int = 0
) -> Iterator[Batch]:
    """``batches`` with each batch's sequence length drawn uniformly from ``lengths`` (both
    ends included) by a generator seeded with ``seed``: the same lengths on every run.

    Inputs are (batch, time) tokens; a (batch, time) target (next-token) gets the same length,
    a (batch,) target is kept.
    """
    lo, hi = lengths
    rng = np.random.default_rng([seed, lo, hi])
    for x, y in batches:
        length = int(rng.integers(lo, hi + 1))
        yield at_length(x, length), at_length(y, length) if y.dim() == 2 else y


def job_batches(job: Job, spec: JobSpec, seed: int = 0) -> Iterator[Batch]:
    """The job's batch stream: the workload's synthetic batches, or a DataLoader's."""
    if spec.loader is not None:
        loader_spec = spec.loader
        if loader_spec.samples < job.workload.batch_size:
            raise ValueError(f"{spec.name}: {loader_spec.samples} samples < one batch")
        loader = torch.utils.data.DataLoader(
            _AugmentedVectors(loader_spec.samples, LOADER_FEATURES, loader_spec.work),
            batch_size=job.workload.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=loader_spec.num_workers,
            persistent_workers=loader_spec.persistent_workers,
            pin_memory=loader_spec.pin_memory,
            generator=torch.Generator().manual_seed(seed),
        )
        return EpochBatches(loader, job.device)
    if spec.seq_lengths is not None:
        return varied_lengths(job.batches(), spec.seq_lengths, seed)
    if spec.heavy_data:
        return _endless_heavy_batches(job)
    return job.batches()


def _endless_heavy_batches(job: Job) -> Iterator[Batch]:
    dataset = _AugmentedVectors(10**6, 256)
    loader = torch.utils.data.DataLoader(dataset, batch_size=job.workload.batch_size, shuffle=True)
    while True:
        for x, y in loader:
            yield x.to(job.device), y.to(job.device)


@dataclass
class Run:
    spec: JobSpec
    steps: int
    step_ends_s: list[float] = field(default_factory=list)  # from hook creation
    train_step_s: list[float] = field(default_factory=list)  # hook's per-step times
    phase_s_before_step: list[float] = field(default_factory=list)  # phase time in iteration k
    predictions: list[dict[str, Any] | None] = field(default_factory=list)
    start_wall_s: float = 0.0  # time.time() at hook creation
    epoch_start_steps: list[int] = field(default_factory=list)  # loader jobs: step of each epoch
    job_end_s: float | None = None  # from hook creation to the loop's end (final phases in)
    capture_status: str = ""  # hook.capture_status at close (rank 0's for DDP jobs)
    capture_cost_s: float | None = None  # hook.capture_cost_s at close

    @property
    def true_total_s(self) -> float:
        """The job's real total: until its loop ended, the phases after its last step (an
        evaluation or a checkpoint due there) included."""
        return self.job_end_s if self.job_end_s is not None else self.step_ends_s[-1]


def held_out_estimator(models_dir: Path | None, family: str) -> Any:
    """The trace estimator for a job of ``family``: ``"auto"`` (the shipped model, which was
    trained on every zoo family) or, with ``models_dir``, the fold model that never saw it."""
    if models_dir is None:
        return "auto"
    path = models_dir / f"{family}.npz"
    if not path.is_file():
        raise SystemExit(f"no held-out model {path} (train_early_model.py --fold-dir)")
    return LearnedTraceEstimator(Predictor.load(path))


def run_job(
    spec: JobSpec,
    steps: int,
    device: str,
    seed: int = 0,
    models_dir: Path | None = None,
    record_shapes: str = "first",
    op_capture: str = "auto",
) -> Run:
    """Train ``spec`` for ``steps`` steps under an ``ETSHook``; the run's timings and the
    hook's predictions at the report steps (and the last), times from hook creation."""
    if spec.ranks > 1:
        return run_ddp_job(spec, steps, device, seed, models_dir, record_shapes, op_capture)
    return _run_rank(spec, steps, device, seed, models_dir, record_shapes, op_capture)


def _run_rank(spec: JobSpec, steps: int, *args: Any, **kwargs: Any) -> Run:
    """``_run_rank_in`` with a checkpoint folder of its own, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="ets-accuracy-") as checkpoint_dir:
        return _run_rank_in(checkpoint_dir, spec, steps, *args, **kwargs)


def _run_rank_in(
    checkpoint_dir: str,
    spec: JobSpec,
    steps: int,
    device: str,
    seed: int = 0,
    models_dir: Path | None = None,
    record_shapes: str = "first",
    op_capture: str = "auto",
    rank: int = 0,
) -> Run:
    workload = workloads()[spec.workload]
    job = workload.build(device, seed=seed)
    if spec.ranks > 1:
        from torch.nn.parallel import DistributedDataParallel

        job = dataclasses.replace(job, model=DistributedDataParallel(job.model))
    if spec.compiled:
        job = dataclasses.replace(job, model=torch.compile(job.model))
    batches = job_batches(job, spec, seed)
    run = Run(spec, steps)
    autocast = (
        torch.autocast(job.device.type, dtype=torch.bfloat16)
        if spec.autocast == "bf16"
        else contextlib.nullcontext()
    )
    slow = spec.slow_rank_delay if spec.ranks > 1 and rank == spec.ranks - 1 else 0.0
    told_eval = spec.eval_every if spec.mark_phases else None
    hook = ETSHook(
        job.model,
        optimizer=job.optimizer,
        total_steps=steps,
        eval_every=told_eval,
        checkpoint_every=spec.checkpoint_every,
        # As a user with a validation loader would: one evaluation's batches (training-sized).
        eval_dataloader=range(spec.eval_batches) if told_eval else None,
        log_every=None,
        deadline=False,
        trace_estimator=held_out_estimator(models_dir, workload.family),
        record_shapes=record_shapes,
        op_capture=op_capture,
        # As a user of a DataLoader would: its epochs (and whether it restarts its workers).
        dataloader=batches.loader if isinstance(batches, EpochBatches) else None,
    )
    t0_ns = hook.created_ns
    run.start_wall_s = time.time() - (time.perf_counter_ns() - t0_ns) / 1e9
    pending_phase_s = 0.0
    last_step_s = 0.0
    epochs_seen = 0
    for step in range(1, steps + 1):
        started_s = time.perf_counter()
        if slow:  # an uneven rank: a slower input pipeline, a share of its own step time
            time.sleep(slow * last_step_s)
        for _ in range(spec.grad_accum):
            with autocast:
                loss = job.loss(next(batches))
            (loss / spec.grad_accum).backward()
        job.optimizer.step()
        job.optimizer.zero_grad(set_to_none=True)
        if job.device.type == "cuda" and step == steps:
            # Like an ETA bar, the loop never syncs; the job ends when the device is done.
            torch.cuda.synchronize()
        run.step_ends_s.append((time.perf_counter_ns() - t0_ns) / 1e9)
        last_step_s = time.perf_counter() - started_s
        epochs = getattr(batches, "epochs", 0)  # one begun in a phase: at the step after it
        run.epoch_start_steps += [step] * (epochs - epochs_seen)
        epochs_seen = epochs
        run.phase_s_before_step.append(pending_phase_s)
        # Read where it is scored (as the console reporter reads at steps 1, 3, 5, ...): a
        # read that rebuilds the prediction costs ~0.1-0.5 ms early on, which a loop reading
        # every step would add to its own early steps, and so to the baselines' rates.
        prediction = hook.prediction if step in REPORT_STEPS or step == steps else None
        run.predictions.append(prediction.to_dict() if prediction is not None else None)
        pending_phase_s = 0.0
        if spec.eval_every and step % spec.eval_every == 0:
            started = time.perf_counter()
            marked = hook.phase("eval") if spec.mark_phases else contextlib.nullcontext()
            with marked, torch.no_grad():
                job.model.eval()
                for _ in range(spec.eval_batches):
                    job.loss(next(batches))
                job.model.train()
            if spec.mark_phases:  # unmarked, it is step time for every method alike
                pending_phase_s += time.perf_counter() - started
        if spec.checkpoint_every and step % spec.checkpoint_every == 0:
            started = time.perf_counter()
            with hook.phase("checkpoint"):
                torch.save(
                    {"model": job.model.state_dict(), "optimizer": job.optimizer.state_dict()},
                    os.path.join(checkpoint_dir, "ckpt.pt"),
                )
            pending_phase_s += time.perf_counter() - started
        if step == steps:  # after the phases due at the last step, as a loop runs them
            break
    run.job_end_s = (time.perf_counter_ns() - t0_ns) / 1e9
    hook.close()
    run.capture_status, run.capture_cost_s = hook.capture_status, hook.capture_cost_s
    if isinstance(batches, EpochBatches):
        batches.close()  # after the last step: the workers' shutdown is not part of the job
    run.train_step_s = hook.step_times_s
    return run


def _ddp_worker(rank: int, spec: JobSpec, steps: int, port: int, args: tuple, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=spec.ranks)
    try:
        run = _run_rank(spec, steps, *args, rank=rank)
    finally:
        torch.distributed.destroy_process_group()
    document = dataclasses.asdict(run)
    document["spec"] = None
    Path(out, f"rank{rank}.json").write_text(json.dumps(document))


def run_ddp_job(
    spec: JobSpec,
    steps: int,
    device: str,
    seed: int = 0,
    models_dir: Path | None = None,
    record_shapes: str = "first",
    op_capture: str = "auto",
) -> Run:
    """A DDP job over gloo, one process per rank; rank 0's run, scored against the job's end.

    The job ends when its last rank ends: the last step end of rank 0's run is replaced by the
    latest rank's end (on rank 0's clock, through the wall clock), so ``errors_for`` scores
    rank 0's predictions (the job-level ones, after an exchange) against the job's real end;
    the baselines are what rank 0's own ETA bar would say.
    """
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tempfile.mkdtemp(prefix="ets-accuracy-ddp-")
    args = (device, seed, models_dir, record_shapes, op_capture)
    try:
        mp.spawn(_ddp_worker, args=(spec, steps, port, args, out), nprocs=spec.ranks)
        runs = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(spec.ranks)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    first = runs[0]
    job_end_wall_s = max(r["start_wall_s"] + r["step_ends_s"][-1] for r in runs)
    run = Run(spec, steps)
    run.step_ends_s = [*first["step_ends_s"][:-1], job_end_wall_s - first["start_wall_s"]]
    run.train_step_s = first["train_step_s"]
    run.phase_s_before_step = first["phase_s_before_step"]
    run.predictions = first["predictions"]
    run.start_wall_s = first["start_wall_s"]
    run.epoch_start_steps = first["epoch_start_steps"]
    run.capture_status, run.capture_cost_s = first["capture_status"], first["capture_cost_s"]
    return run


# ---------------------------------------------------------------------------------------------
# Baselines: what an ETA bar would have predicted after k steps


def baseline_rates(run: Run, k: int, remaining_phases_s: float) -> dict[str, tuple[float, float]]:
    """(step-time, total) per baseline after k completed steps (k >= 1).

    Every baseline's total is elapsed + its rate x the remaining steps (``composer`` adds its
    remaining phases); ``last_step``'s rate is the k-th iteration's wall time (step end k-1 to
    step end k, a phase run in between included, as an ETA bar sees it)."""
    ends = run.step_ends_s
    iteration_s = [ends[0]] + [b - a for a, b in itertools.pairwise(ends)]
    seen = iteration_s[:k]
    elapsed = ends[k - 1]
    remaining = run.steps - k
    ema = seen[0]
    for value in seen[1:]:
        ema = TQDM_SMOOTHING * value + (1 - TQDM_SMOOTHING) * ema
    train_only = [t - p for t, p in zip(seen, run.phase_s_before_step[:k])]
    composer_rate = statistics.fmean(train_only[1:]) if k > 1 else train_only[0]
    rates = {
        "first_step": seen[0],
        "mean_k": statistics.fmean(seen),
        "tqdm_ema": ema,
        "last_step": seen[-1],
    }
    out = {name: (rate, elapsed + rate * remaining) for name, rate in rates.items()}
    out["composer"] = (composer_rate, elapsed + composer_rate * remaining + remaining_phases_s)
    return out


def _composer_remaining_phases(run: Run, k: int) -> float:
    """Mean observed cost of each phase kind x its remaining occurrences (0 before the first)."""
    spec, total = run.spec, 0.0
    per_kind = (("eval", spec.eval_every), ("checkpoint", spec.checkpoint_every))
    observed = run.phase_s_before_step[:k]
    if not any(observed):
        return 0.0
    # Phase time is attributed to the iteration after the phase; split by kind using periods.
    for _kind, every in per_kind:
        if not every:
            continue
        done = [observed[i] for i in range(1, k) if i % every == 0]
        if not done:
            continue
        remaining = sum(1 for s in range(k, run.steps + 1) if s % every == 0)
        total += statistics.fmean(done) * remaining
    return total


def steady_statistic(spec: JobSpec) -> Callable[[list[float]], float]:
    """How a run of step times is summed up into one steady step time: the median (robust to
    the odd slow step: a GC pause, an epoch boundary, a burst of load), or the mean for jobs
    whose steps vary by design, where the total is the sum of the steps and the median of a
    skewed per-step cost is not the rate that sum runs at."""
    return statistics.fmean if spec.varies_by_design else statistics.median


def true_step_s(run: Run) -> float:
    """The run's steady step time: ``steady_statistic`` over the second half of its steps."""
    return steady_statistic(run.spec)(run.train_step_s[len(run.train_step_s) // 2 :])


def errors_for(run: Run) -> dict[str, dict[int, tuple[float, float]]]:
    """method -> step -> (abs % error of total, abs % error of step time)."""
    true_total = run.true_total_s
    true_step = true_step_s(run)
    out: dict[str, dict[int, tuple[float, float]]] = {m: {} for m in METHODS}
    for k in REPORT_STEPS:
        if k >= run.steps:
            continue
        prediction = run.predictions[k - 1]
        if prediction is not None and prediction.get("total_s") is not None:
            out["ets-hook"][k] = (
                100 * abs(prediction["total_s"] - true_total) / true_total,
                100 * abs(prediction["iteration_s"] - true_step) / true_step,
            )
        phases = _composer_remaining_phases(run, k)
        for name, (rate, total) in baseline_rates(run, k, phases).items():
            out[name][k] = (
                100 * abs(total - true_total) / true_total,
                100 * abs(rate - true_step) / true_step,
            )
    return out


def summarize(per_job: list[dict[str, dict[int, tuple[float, float]]]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for method in METHODS:
        table[method] = {}
        for k in REPORT_STEPS:
            values = [job[method][k] for job in per_job if k in job[method]]
            if not values:
                continue
            totals = np.array([v[0] for v in values])
            steps = np.array([v[1] for v in values])
            table[method][k] = {
                "total_median": float(np.median(totals)),
                "total_p90": float(np.percentile(totals, 90)),
                "step_median": float(np.median(steps)),
                "step_p90": float(np.percentile(steps, 90)),
                "jobs": len(values),
            }
    return table


def interval_calibration(runs: list[Run]) -> dict[int, dict[str, float]]:
    """At each report step: the share of jobs whose real total lies inside ets-hook's 95%
    interval of the total (``total_s +- total_ci_s``), and the median relative half-width of
    that interval (``total_ci_s / true total``).

    The interval is closed: a real total exactly on its edge counts as covered. A job is left
    out of a step at or past its last step, and where it made no prediction at that step or
    its prediction carries no interval.

    Args:
        runs: the jobs' runs (``run.predictions[k - 1]`` is the prediction at step ``k``; the
            real total is ``run.true_total_s``).

    Returns:
        Per report step with at least one job scored: ``coverage_pct`` (% of those jobs
        covered), ``half_width_median_pct`` (median half-width, % of the real total) and
        ``jobs`` (how many were scored). Steps with no job scored are absent.
    """
    out: dict[int, dict[str, float]] = {}
    for k in REPORT_STEPS:
        hits, widths = [], []
        for run in runs:
            if k >= run.steps:
                continue
            prediction = run.predictions[k - 1]
            if not prediction or prediction.get("total_ci_s") is None:
                continue
            true_total = run.true_total_s
            hits.append(abs(prediction["total_s"] - true_total) <= prediction["total_ci_s"])
            widths.append(100.0 * prediction["total_ci_s"] / true_total)
        if hits:
            out[k] = {
                "coverage_pct": 100.0 * sum(hits) / len(hits),
                "half_width_median_pct": float(np.median(widths)),
                "jobs": len(hits),
            }
    return out


def calibration_markdown(calibration: dict[int, dict[str, float]]) -> str:
    head = "| ets-hook's 95% interval of the total | " + " | ".join(
        f"step {k}" for k in calibration
    )
    rule = "|---|" + "---|" * len(calibration)
    cover = "| covers the real total (% of jobs) | " + " | ".join(
        f"{c['coverage_pct']:.0f}" for c in calibration.values()
    )
    width = "| median half-width (% of the total) | " + " | ".join(
        f"{c['half_width_median_pct']:.1f}" for c in calibration.values()
    )
    return "\n".join([head + " |", rule, cover + " |", width + " |"])


def per_job_markdown(runs: list[Run], per_job: list[dict[str, dict[int, tuple[float, float]]]],
                     k: int) -> str:  # fmt: skip
    """Markdown: per job, every method's absolute % error of the total at step ``k`` beside the
    job's own noise floor ("-" where the job is too short for either)."""
    head = "| job | steps | noise floor | " + " | ".join(METHODS) + " |"
    rows = [f"**Per job, step {k}**: absolute % error of the total", "", head,
            "|---|---|---|" + "---|" * len(METHODS)]  # fmt: skip
    for run, errors in zip(runs, per_job):
        floor = job_noise_floor(run)
        cells = [f"{errors[m][k][0]:.1f}" if k in errors[m] else "-" for m in METHODS]
        rows.append(
            f"| {run.spec.name} | {run.steps} | {'-' if floor is None else f'{floor:.1f}'} | "
            + " | ".join(cells) + " |"
        )  # fmt: skip
    return "\n".join(rows)


def worst_jobs(
    runs: list[Run], per_job: list[dict[str, dict[int, tuple[float, float]]]]
) -> dict[int, dict[str, Any]]:
    """Per report step: ets-hook's median total error over the jobs, its worst job (name, error,
    that job's noise floor or None), and the job furthest above its own floor (a floor of 0
    where the job is too short to have one) with that excess in points."""
    out: dict[int, dict[str, Any]] = {}
    for k in REPORT_STEPS:
        scored = [(run, errors["ets-hook"][k][0]) for run, errors in zip(runs, per_job)
                  if k in errors["ets-hook"]]  # fmt: skip
        if not scored:
            continue
        worst_run, worst_error = max(scored, key=lambda item: item[1])
        floors = {id(run): job_noise_floor(run) for run, _ in scored}
        above_run, above_error = max(scored, key=lambda it: it[1] - (floors[id(it[0])] or 0.0))
        out[k] = {
            "median_pct": float(np.median([error for _, error in scored])),
            "jobs": len(scored),
            "worst_job": worst_run.spec.name,
            "worst_pct": worst_error,
            "worst_noise_floor_pct": floors[id(worst_run)],
            "furthest_above_floor_job": above_run.spec.name,
            "furthest_above_floor_points": above_error - (floors[id(above_run)] or 0.0),
        }
    return out


def worst_markdown(worst: dict[int, dict[str, Any]]) -> str:
    """Markdown: one line per report step naming ets-hook's worst job (see ``worst_jobs``)."""
    rows = [
        "**Worst job**: ets-hook's total-time error",
        "",
        "| step | median | worst job | its error | its noise floor | furthest above its floor |",
        "|---|---|---|---|---|---|",
    ]
    for k, w in worst.items():
        floor = w["worst_noise_floor_pct"]
        rows.append(
            f"| {k} | {w['median_pct']:.1f} | {w['worst_job']} | {w['worst_pct']:.1f} "
            f"| {'-' if floor is None else f'{floor:.1f}'} "
            f"| {w['furthest_above_floor_job']} ({w['furthest_above_floor_points']:+.1f}) |"
        )
    return "\n".join(rows)


NOISE_FLOOR_FROM_STEP = 20


def job_noise_floor(run: Run) -> float | None:
    """This job's own noise floor, %: the steady step time of steps 20..N/2 against the second
    half's (``steady_statistic``: medians; means for variable-length jobs, whose floor is then
    also how far two samples of the lengths' mean differ); None for jobs of 41 steps or fewer.

    Epoch jobs keep medians: an epoch boundary's start-up is structure the predictor is to
    project (issue 16), not noise, and every half of their runs holds about as many."""
    times = run.train_step_s
    half = len(times) // 2
    if half <= NOISE_FLOOR_FROM_STEP:
        return None
    steady = steady_statistic(run.spec)
    first = steady(times[NOISE_FLOOR_FROM_STEP:half])
    return 100.0 * abs(first / steady(times[half:]) - 1.0)


def noise_floor(runs: list[Run]) -> dict[str, float]:
    """|median step time of steps 20..N/2 / second-half median - 1| in %, median and P90."""
    errors = [floor for floor in map(job_noise_floor, runs) if floor is not None]
    if not errors:
        return {}
    return {
        "median": float(np.median(errors)),
        "p90": float(np.percentile(errors, 90)),
        "jobs": len(errors),
    }


def markdown(table: dict[str, Any], key: str, title: str) -> str:
    head = "| method | " + " | ".join(f"step {k}" for k in REPORT_STEPS) + " |"
    rule = "|---|" + "---|" * len(REPORT_STEPS)
    rows = [f"**{title}**: absolute % error, median / P90 over jobs", "", head, rule]
    for method in METHODS:
        cells = []
        for k in REPORT_STEPS:
            cell = table[method].get(k)
            cells.append(f"{cell[f'{key}_median']:.1f} / {cell[f'{key}_p90']:.1f}" if cell else "-")
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, key, title in ((axes[0], "total", "total job time"), (axes[1], "step", "step time")):
        for method in METHODS:
            steps = [k for k in REPORT_STEPS if k in table[method]]
            axis.plot(
                steps,
                [table[method][k][f"{key}_median"] for k in steps],
                marker="o",
                label=method,
                linewidth=2.5 if method == "ets-hook" else 1.2,
            )
        axis.set_xscale("log")
        axis.set_yscale("symlog", linthresh=1)
        axis.set_xticks(list(REPORT_STEPS), [str(k) for k in REPORT_STEPS])
        axis.set_xlabel("prediction made after step")
        axis.set_ylabel("median absolute error (%)")
        axis.set_title(f"Predicted {title}")
        axis.grid(True, alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def job_steps(spec: JobSpec, default: int, cap: int | None = None) -> int:
    """A job's length: its own (``spec.steps``) or ``default``, at most ``cap``."""
    steps = spec.steps if spec.steps is not None else default
    return steps if cap is None else min(steps, cap)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default=",".join(j.name for j in JOBS))
    parser.add_argument(
        "--steps", type=int, default=300, help="length of the jobs without their own length"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="cap every job at N steps, their own lengths too (smoke runs)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/accuracy", help="output path prefix")
    parser.add_argument(
        "--record-shapes",
        default="first",
        choices=("first", "all", "none"),
        help="hook setting (default: the hook's own)",
    )
    parser.add_argument(
        "--op-capture", default="native", choices=("native", "profiler"), help="hook setting"
    )
    parser.add_argument(
        "--held-out-models",
        type=Path,
        default=None,
        metavar="DIR",
        help="per-family trace models from train_early_model.py --fold-dir: each job is "
        "predicted by a model that never saw its family (default: the shipped model)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="run every job this many times, each in a fresh process, and report per job "
        "(0: every job once in this process)",
    )
    parser.add_argument(
        "--rounds-from",
        nargs="+",
        metavar="RUN_JSON",
        default=None,
        help="run nothing: the per-job table of runs already made (their per-run JSON files, "
        "e.g. PREFIX_r*_*.json of several --rounds invocations), written to --out",
    )
    args = parser.parse_args(argv)
    if args.rounds_from:
        return report_rounds(args.rounds_from, Path(args.out))
    if args.rounds < 0:
        parser.error(f"--rounds must be >= 0, got {args.rounds}")
    if args.steps <= max(REPORT_STEPS):
        parser.error(f"--steps must be > {max(REPORT_STEPS)}, got {args.steps}")
    if args.max_steps is not None and args.max_steps < 2:
        parser.error(f"--max-steps must be >= 2, got {args.max_steps}")
    specs = {j.name: j for j in (*JOBS, *OPT_IN_JOBS)}
    unknown = [n for n in args.jobs.split(",") if n not in specs]
    if unknown:
        parser.error(f"unknown jobs {unknown}; known: {sorted(specs)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.rounds:
        return run_rounds(args, argv or sys.argv[1:], out)
    print(f"machine: {machine()}")
    runs, per_job = [], []
    for name in args.jobs.split(","):
        started = time.perf_counter()
        run = run_job(
            specs[name],
            job_steps(specs[name], args.steps, args.max_steps),
            args.device,
            args.seed,
            args.held_out_models,
            args.record_shapes,
            args.op_capture,
        )
        errors = errors_for(run)
        runs.append(run)
        per_job.append(errors)
        k3 = errors["ets-hook"].get(3, (math.nan, math.nan))
        k5 = {m: errors[m].get(5, (math.nan, math.nan))[0] for m in METHODS}
        best_baseline = min(BASELINES, key=lambda m: k5[m])
        floor_pct = job_noise_floor(run)
        took_s = time.perf_counter() - started
        print(
            f"{name:30} total {run.true_total_s:7.2f}s  steady "
            f"{1e3 * true_step_s(run):8.2f} ms/step  "
            f"ets-hook@3: total {k3[0]:5.1f}% step {k3[1]:5.1f}%  "
            f"@5: total {k5['ets-hook']:5.1f}% (best baseline {best_baseline} "
            f"{k5[best_baseline]:.1f}%, noise floor "
            f"{floor_pct if floor_pct is not None else math.nan:.1f}%)  ({took_s:.0f}s)"
        )
        sys.stdout.flush()
    table = summarize(per_job)
    floor = noise_floor(runs)
    calibration = interval_calibration(runs)
    worst = worst_jobs(runs, per_job)
    report = "\n\n".join(
        [
            markdown(table, "total", "Predicted total job time"),
            markdown(table, "step", "Predicted steady-state step time"),
            worst_markdown(worst),
            *(per_job_markdown(runs, per_job, k) for k in PER_JOB_STEPS),
            calibration_markdown(calibration),
            (
                f"Noise floor: the median step time of steps {NOISE_FLOOR_FROM_STEP}..N/2 (the "
                f"mean for variable-length jobs) misses the second half's by "
                f"{floor['median']:.1f}% (median) / "
                f"{floor['p90']:.1f}% (P90) over the jobs."
                if floor
                else ""
            ),
        ]
    )
    print("\n" + report)
    document = {
        "machine": machine(),
        "steps": args.steps,
        "max_steps": args.max_steps,
        "device": args.device,
        "trace_models": str(args.held_out_models) if args.held_out_models else "shipped",
        "summary": table,
        "noise_floor": floor,
        "interval_calibration": calibration,
        "worst_job": worst,
        "jobs": [
            {
                "name": run.spec.name,
                "workload": run.spec.workload,
                "steps": run.steps,
                "epoch_start_steps": run.epoch_start_steps,
                "true_total_s": run.true_total_s,
                "noise_floor_pct": job_noise_floor(run),
                "steady_statistic": steady_statistic(run.spec).__name__,
                "true_step_s": true_step_s(run),
                "errors": {m: {str(k): v for k, v in e.items()} for m, e in errors.items()},
                "step_ends_s": run.step_ends_s,
                "train_step_s": run.train_step_s,
                "capture_status": run.capture_status,
                "capture_cost_s": run.capture_cost_s,
                "predictions": [
                    None
                    if p is None
                    else {
                        key: p[key]
                        for key in (
                            "step",
                            "iteration_s",
                            "iteration_ci_s",
                            "total_ci_s",
                            "total_s",
                            "source",
                            "converged",
                            "measured_iteration_s",
                            "measured_ci_s",
                            "trace_iteration_s",
                            "trace_ci_s",
                        )
                    }
                    for p in run.predictions
                ],
            }
            for run, errors in zip(runs, per_job)
        ],
    }
    out.with_suffix(".json").write_text(json.dumps(document, indent=1))
    out.with_suffix(".md").write_text(report + "\n")
    try:
        plot(table, out.with_suffix(".png"))
        print(f"\nwrote {out.with_suffix('.json')}, .md, .png")
    except ImportError:  # the plot needs the [bench] extra (matplotlib)
        print(f"\nwrote {out.with_suffix('.json')}, .md (no .png: pip install 'ets-hook[bench]')")
    return 0


TARGET_PCT = 5.0  # total-time error at step 5 (issue 15), or the noise floor + 2 points


def _strip_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the given options and their values (``--x v`` and ``--x=v``)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in names:
            skip = True
            continue
        if item.split("=", 1)[0] in names:
            continue
        out.append(item)
    return out


def run_rounds(args: argparse.Namespace, argv: list[str], out: Path) -> int:
    """Every job ``args.rounds`` times, each run a fresh process; the per-job report."""
    names = args.jobs.split(",")
    passthrough = _strip_options(list(argv), ("--jobs", "--out", "--rounds"))
    print(f"machine: {machine()}; load {os.getloadavg()}")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run_out = out.parent / f"{out.name}_r{round_index + 1}_{name}"  # no dot: a suffix
            command = [sys.executable, __file__, "--jobs", name, "--out", str(run_out)]
            done = subprocess.run(command + passthrough, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"round {round_index + 1} {name}: failed\n{done.stderr[-2000:]}")
                continue
            job = json.loads(run_out.with_suffix(".json").read_text())["jobs"][0]
            results[name].append(job)
            print(f"round {round_index + 1}: " + done.stdout.splitlines()[1].strip())
            sys.stdout.flush()
        print(f"# round {round_index + 1}/{args.rounds} done; load {os.getloadavg()}")
    write_rounds(results, out)
    return 0


def write_rounds(results: dict[str, list[dict[str, Any]]], out: Path) -> None:
    """Print the per-job table (``rounds_table``) and write it and the runs: ``OUT.rounds.md``,
    ``OUT.rounds.json``."""
    table = rounds_table(results)
    print("\n" + table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".rounds.md").write_text(table + "\n")
    out.with_suffix(".rounds.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out.with_suffix('.rounds.md')}, {out.with_suffix('.rounds.json')}")


RUN_TO_RUN_MIN_RUNS = 3  # runs of a job needed for its run-to-run floor


def run_to_run_floor_pct(jobs: list[dict[str, Any]], k: int) -> float | None:
    """How far a job's early steps stand from the steady state differently from run to run, %:
    a reference floor for an estimate read from those steps at step ``k`` (not a strict bound:
    an estimate may weigh the steps otherwise).

    Per run, ``x = median(steps 2..k) / that run's steady step time`` (step 1 is left out, as
    the predictions leave it out once a second step exists; the median, as an estimate would
    leave a one-off slow step out); each run's ``x`` is compared with
    the median ``x`` of the job's *other* runs — what an estimator would know that had learnt
    this job's own warm-up from them — and the floor is the median ``|x / that - 1|``. It is
    the step rate's error, which the total's is about equal to while most steps are ahead.

    Args:
        jobs: the job's runs (``run_rounds``' per-job list: ``train_step_s``, ``true_step_s``).
        k: the report step.

    Returns:
        The floor in %, or None for ``k < 2`` or with fewer than ``RUN_TO_RUN_MIN_RUNS`` runs of
        at least ``k`` steps.
    """
    if k < 2:
        return None
    ratios = [
        statistics.median(job["train_step_s"][1:k]) / job["true_step_s"]
        for job in jobs
        if len(job.get("train_step_s") or ()) >= k and (job.get("true_step_s") or 0.0) > 0.0
    ]
    if len(ratios) < RUN_TO_RUN_MIN_RUNS:
        return None
    misses = [
        abs(x / statistics.median(ratios[:i] + ratios[i + 1 :]) - 1.0) for i, x in enumerate(ratios)
    ]
    return 100.0 * statistics.median(misses)


def report_rounds(paths: list[str], out: Path) -> int:
    """The per-job table (``rounds_table``) of runs already made, e.g. the runs of several
    ``--rounds`` invocations of one code (an A/B alternates them with another code's).

    Args:
        paths: per-run JSON files (``run_rounds``' ``PREFIX_rN_JOB.json``; every job in them).
        out: output prefix: ``OUT.rounds.md`` and ``OUT.rounds.json`` are written.

    Returns:
        0, or 2 when no path holds a run.
    """
    results: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for job in json.loads(Path(path).read_text()).get("jobs", []):
            results.setdefault(job["name"], []).append(job)
    if not results:
        print(f"no runs in {paths}", file=sys.stderr)
        return 2
    write_rounds(results, out)
    return 0


def rounds_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: per job, median [min-max] over its runs (see ``run_rounds``), and its
    run-to-run floor at steps 3, 5 and 10 (``run_to_run_floor_pct``; "-" with fewer than
    three runs)."""

    def stat(values: list[float]) -> str:
        values = [v for v in values if v is not None and math.isfinite(v)]
        if not values:
            return "-"
        return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

    rows = [
        "| job | runs | step 3 | step 5 | step 10 | "
        + " | ".join(f"{m} at step 5" for m in BASELINES)
        + " | best baseline at step 5 | job's noise floor | run-to-run floor at steps 3 / 5 / 10 "
        "| below every baseline at step 5 | target met at step 5 |",
        "|---|---|---|---|---|" + "---|" * len(BASELINES) + "---|---|---|---|---|",
    ]
    floors = {name: [run_to_run_floor_pct(jobs, k) for k in PER_JOB_STEPS]
              for name, jobs in results.items()}  # fmt: skip
    for name, jobs in results.items():
        if not jobs:
            continue
        ours = {
            k: [j["errors"]["ets-hook"].get(str(k), [math.nan])[0] for j in jobs]
            for k in (3, 5, 10)
        }
        at5 = {m: [j["errors"].get(m, {}).get("5", [math.nan])[0] for j in jobs] for m in BASELINES}
        best, below, met = [], 0, 0
        for i, err5 in enumerate(ours[5]):
            baselines = [at5[m][i] for m in BASELINES if math.isfinite(at5[m][i])]
            if not baselines or not math.isfinite(err5):
                continue
            best.append(min(baselines))
            floor = jobs[i]["noise_floor_pct"] or 0.0
            beats = err5 < min(baselines)
            below += beats
            met += beats and err5 <= max(TARGET_PCT, floor + 2.0)
        rows.append(
            f"| {name} | {len(jobs)} | {stat(ours[3])} | {stat(ours[5])} | {stat(ours[10])} | "
            + " | ".join(stat(at5[m]) for m in BASELINES)
            + f" | {stat(best)} | {stat([j['noise_floor_pct'] for j in jobs])} | "
            + " / ".join("-" if f is None else f"{f:.1f}" for f in floors[name])
            + f" | {below}/{len(jobs)} | {met}/{len(jobs)} |"
        )
    summary = []
    for i, k in enumerate(PER_JOB_STEPS):
        at_k = [f[i] for f in floors.values() if f[i] is not None]
        errors = [j["errors"]["ets-hook"].get(str(k), [math.nan])[0]
                  for jobs in results.values() for j in jobs]  # fmt: skip
        errors = [e for e in errors if math.isfinite(e)]
        if at_k and errors:
            summary.append(f"step {k}: {statistics.median(at_k):.1f}% "
                           f"(ets-hook {statistics.median(errors):.1f}%)")  # fmt: skip
    if summary:
        rows += ["", "Run-to-run floor, median over jobs (ets-hook's median total error over "
                 "every run): " + "; ".join(summary)]  # fmt: skip
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
