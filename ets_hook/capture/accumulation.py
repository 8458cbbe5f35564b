"""Gradient accumulation the hook was not told of, when it matters: a job length from the loader.

``ETSHook(dataloader=loader, epochs=3)`` reads ``len(loader)`` as the batches of an epoch and,
with ``grad_accum_steps=1`` (the default), as its optimizer steps too. A loop that accumulates
gradients over k micro-batches (k training forwards, one ``optimizer.step()``) without saying
so then runs k times fewer steps than the hook expects: every ETA is k times too long until the
job ends. ``UndeclaredAccumulation`` counts the training forwards of a few early steps (the
step detector reports them while its module hook is installed, the capture window) and, when
each of them took the same k >= 2, says once what to pass. It never changes the job's length
itself: a model run twice on each batch (two views of it, a discriminator on real and fake
samples) looks the same.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("ets_hook")

#: Steps counted (after the first, whose opening forward is not reported as one).
STEPS_COUNTED = 3


class UndeclaredAccumulation:
    """Counts training forwards per optimizer step over ``STEPS_COUNTED`` steps; warns once
    when each took the same k >= 2 forwards. Training thread only."""

    def __init__(self, batches_per_epoch: int) -> None:
        """Start counting.

        Args:
            batches_per_epoch: ``len(dataloader)``, which the job's length was read from.
        """
        self._batches_per_epoch = batches_per_epoch
        self._forwards = 0
        self._counts: list[int] = []
        self._partial = False  # the current step began at a forward-marked boundary
        self.done = False

    def on_forward(self) -> None:
        """A training forward (not the first of the job) started."""
        self._forwards += 1

    def on_step(self, step_index: int, forward_marked: bool = False) -> int | None:
        """A step ended.

        Args:
            step_index: the step's local index (0: the first, not counted).
            forward_marked: a training forward ended it (no optimizer given and none seen
                stepping yet: ``capture.steps``): one forward by construction, not counted;
                nor is the step after it, which began in the middle of an iteration.

        Returns:
            The forwards per step k when this step decided that accumulation went undeclared
            (the warning is logged then), else None. ``done`` is set once decided either way.
        """
        forwards, self._forwards = self._forwards, 0
        partial, self._partial = self._partial, forward_marked
        if self.done or step_index == 0 or forward_marked or partial:
            return None
        if forwards == 0:  # the module hook is gone (window over): nothing more to count
            self.done = True
            return None
        self._counts.append(forwards)
        if len(self._counts) < STEPS_COUNTED:
            return None
        self.done = True
        k = self._counts[0]
        if k < 2 or any(count != k for count in self._counts):
            return None
        logger.warning(
            "each optimizer step took %d training forwards, but the job's length was "
            "read from len(dataloader)=%d as one batch a step: if they are micro-batches of "
            "gradient accumulation, pass grad_accum_steps=%d (until then every ETA is %dx too "
            "long); if each batch takes %d forwards, pass steps_per_epoch=%d to say so",
            k,
            self._batches_per_epoch,
            k,
            k,
            k,
            self._batches_per_epoch,
        )
        return k
