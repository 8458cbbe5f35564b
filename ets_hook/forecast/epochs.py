"""Epoch boundaries of the input pipeline as a phase, not step time.

A ``DataLoader`` with ``num_workers > 0`` and ``persistent_workers=False`` (PyTorch's default)
starts its worker processes again at every epoch: the first batch of each epoch waits for them
to start and fill their prefetch queues. That wait lands in the epoch's first training step and
recurs once per epoch, so it is neither the steady step time (left in, one slow step in every
``steps_per_epoch`` would be read as noise or a burst and dropped, or would raise the step time
of every step) nor a one-off: it is a phase with the epoch's period.

``EpochStarts`` takes it out of the step: at the first step of every epoch after the first (the
job's step counts are global: ``initial_step`` counts the steps done before this process), the
step's time above the median of the steps just before it is the epoch-start phase
(``EPOCH_START``; ``JobModel.from_args`` hints its period, the steps per epoch). The job's very
first step also starts the workers, but it carries the job's own warm-up too; when the loader is
known to restart its workers (``restarts``), its excess over the first steady steps seeds the
phase's cost until a later epoch starts (``PhaseTracker`` then uses the later occurrences only);
where the workers' clocks measured the loop's wait for them instead, that wait is a lower bound
on a later start (``SEED_TO_LATER_START``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: The phase an epoch's start-up (worker start, first batch) is recorded as.
EPOCH_START = "epoch start"
#: Steps before an epoch's first step whose median is the reference for its excess.
REFERENCE_STEPS = 8
#: The job's first step is compared with this many steps after it (for the seed).
SEED_STEPS = 3
#: A later epoch's start-up over the first epoch's as the workers' clocks measure it (from the
#: first worker's start to the first training forward, ``BatchClock.first_batch_wait_s``):
#: that seed is a lower bound. A later start also waits for the previous epoch's workers to
#: finish the batches in flight and exit (13-35 ms for two workers, 3.8k-sample epochs of a
#: 256-feature MLP), for the forks before the first worker runs, and runs its first step
#: beside the new workers' prefetching. Measured on CPU with two workers: 1.2-1.7x the seed
#: in a plain loop (median 1.6, ``benchmarks/epoch_starts.py``), 1.0-1.7x under the Hugging
#: Face Trainer (median 1.4, its ``--loop transformers``), 1.25-3.0x under Lightning
#: (median 2.0, fourteen runs; ``benchmarks/RESULTS.md``, *The epoch start-up's seed*). Until
#: a later epoch has started, one is priced at the middle of this range of the seed, the range
#: its interval.
SEED_TO_LATER_START = (1.0, 2.2)


def loader_restarts_workers(dataloader: Any) -> bool:
    """Whether ``dataloader`` starts worker processes again at each epoch.

    Args:
        dataloader: a ``torch.utils.data.DataLoader`` or anything else (None included).

    Returns:
        True for ``num_workers > 0`` without ``persistent_workers``; False otherwise (and for
        objects without those attributes).
    """
    workers = getattr(dataloader, "num_workers", 0)
    return (
        isinstance(workers, int)
        and workers > 0
        and not getattr(dataloader, "persistent_workers", False)
    )


class EpochStarts:
    """Decides, step by step, how much of a step is the epoch's start-up (module docs).

    Attributes:
        steps_per_epoch: optimizer steps per epoch, >= 1.
        initial_step: global steps done before this process, >= 0.
        restarts: the loader restarts its workers each epoch (seed from the first step).
    """

    def __init__(self, steps_per_epoch: int, initial_step: int = 0, restarts: bool = False) -> None:
        """Track epoch starts.

        Args:
            steps_per_epoch: optimizer steps per epoch, >= 1.
            initial_step: global steps done before this process, >= 0.
            restarts: the loader restarts its workers at each epoch
                (``loader_restarts_workers``).

        Raises:
            ValueError: ``steps_per_epoch`` < 1 or ``initial_step`` < 0.
        """
        if steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        if initial_step < 0:
            raise ValueError(f"initial_step must be >= 0, got {initial_step}")
        self.steps_per_epoch = steps_per_epoch
        self.initial_step = initial_step
        self.restarts = restarts

    def starts_epoch(self, step_index: int) -> bool:
        """Whether local step ``step_index`` (0-based) is the first step of an epoch."""
        return (self.initial_step + step_index) % self.steps_per_epoch == 0

    def excess_s(self, step_index: int, duration_s: float, earlier_s: Sequence[float]) -> float:
        """The epoch start-up in local step ``step_index``, seconds (0 for other steps).

        Args:
            step_index: the step's 0-based local index.
            duration_s: its time, seconds.
            earlier_s: the step times before it, latest last.

        Returns:
            ``duration_s`` above the median of the ``REFERENCE_STEPS`` steps before it, at
            least 0; 0 for a step that starts no epoch, the job's first step (warm-up, see
            ``seed_s``), and while fewer than two earlier steps exist.
        """
        if step_index == 0 or not self.starts_epoch(step_index):
            return 0.0
        reference = list(earlier_s[-REFERENCE_STEPS:])
        if len(reference) < 2:
            return 0.0
        return max(0.0, duration_s - statistics.median(reference))

    def seed_s(self, step_times_s: Sequence[float]) -> float | None:
        """The first epoch's start-up, from the job's first step, once ``SEED_STEPS`` more exist.

        Args:
            step_times_s: the local step times so far.

        Returns:
            The first step's excess over the median of the ``SEED_STEPS`` after it (>= 0), when
            the loader restarts its workers, the first local step starts an epoch and exactly
            ``1 + SEED_STEPS`` steps exist (it is taken once); else None.
        """
        if not self.restarts or not self.starts_epoch(0) or len(step_times_s) != 1 + SEED_STEPS:
            return None
        return max(0.0, step_times_s[0] - statistics.median(step_times_s[1:]))
