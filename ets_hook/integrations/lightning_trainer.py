"""What a Lightning Trainer says about the job, for ``ETSCallback`` (``integrations.lightning``).

Duck-typed readers of a ``lightning.pytorch`` or ``pytorch_lightning`` Trainer and its
callbacks: the job's length, steps per epoch, validation and checkpoint periods, optimizers,
the fp16 ``GradScaler``, the single train loader, and the ``EarlyStopping`` rule. Nothing here
imports Lightning (``lightning_packages.is_a`` imports only the package an object already comes
from).
Each returns None (or a neutral value) where the Trainer does not say.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..capture.steps import optimizer_list
from ..forecast.early_stop import EarlyStoppingRule
from ..forecast.job import loader_batch_size
from .common import whole_number
from .lightning_packages import is_a

logger = logging.getLogger("ets_hook")


def trainer_total_steps(trainer: Any, global_per_step: int = 1) -> int | None:
    """Optimizer steps in the whole fit, as the Trainer bounds it (global, resumed steps included).

    ``trainer.max_steps`` (in ``trainer.global_step`` units: divided by ``global_per_step``,
    rounded up) when > 0, and the steps of the epochs: ``trainer.estimated_stepping_batches``,
    or, with a ``GradientAccumulationScheduler``, its accumulation per epoch over
    ``max_epochs`` epochs (``scheduled_total_steps``); the smaller. None when neither bounds
    it (``max_epochs=-1`` with ``max_steps=-1``, or an iterable dataset without ``len()``).
    ``max_time`` is not a step count (``trainer_time_limit_s`` reads it).

    Args:
        trainer: a Lightning ``Trainer`` whose train data is set up (``on_train_start``).
        global_per_step: ``trainer.global_step`` increments per hook step
            (``global_steps_per_step``).

    Returns:
        The step count (>= 1), or None.
    """
    candidates = []
    max_steps = whole_number(getattr(trainer, "max_steps", None))
    if max_steps is not None and max_steps > 0:
        candidates.append(math.ceil(max_steps / max(global_per_step, 1)))
    scheduler = next(
        (
            cb
            for cb in getattr(trainer, "callbacks", None) or []
            if is_a(cb, "GradientAccumulationScheduler")
        ),
        None,
    )
    if scheduler is not None:
        estimated = scheduled_total_steps(trainer, scheduler)
    else:
        try:
            estimated = whole_number(trainer.estimated_stepping_batches)
        except Exception as exc:  # e.g. accumulation scheduled to vary per epoch
            logger.debug("estimated_stepping_batches unavailable: %r", exc)
            estimated = None
    if estimated is not None and estimated > 0:
        candidates.append(estimated)
    return min(candidates) if candidates else None


def scheduled_total_steps(trainer: Any, scheduler: Any) -> int | None:
    """Optimizer steps of ``max_epochs`` epochs under a ``GradientAccumulationScheduler``: per
    epoch ``ceil(num_training_batches / accumulation)``, the accumulation that epoch's from
    ``scheduler.get_accumulate_grad_batches(epoch)``.

    Args:
        trainer: a Lightning ``Trainer`` whose train data is set up.
        scheduler: its ``GradientAccumulationScheduler``.

    Returns:
        The count (>= 1), or None: no epoch bound (``max_epochs`` -1 or unset), an unknown
        number of batches, or a scheduler that cannot say.
    """
    epochs = whole_number(getattr(trainer, "max_epochs", None))
    batches = whole_number(getattr(trainer, "num_training_batches", None))
    if epochs is None or epochs <= 0 or batches is None or batches <= 0:
        return None
    total = 0
    try:
        for epoch in range(epochs):
            accumulate = whole_number(scheduler.get_accumulate_grad_batches(epoch))
            if accumulate is None or accumulate < 1:
                return None
            total += math.ceil(batches / accumulate)
    except Exception as exc:  # another Lightning version's scheduler
        logger.debug("GradientAccumulationScheduler unreadable: %r", exc)
        return None
    return total


def global_steps_per_step(optimizers: Any) -> int:
    """``trainer.global_step`` increments per hook step: with several optimizers (manual
    optimization) each one's step counts in ``global_step``, and a hook step ends once each
    has stepped; else 1.

    Args:
        optimizers: what the hook watches: one optimizer, a list of them, or None.

    Returns:
        The count (>= 1).
    """
    return len(optimizers) if isinstance(optimizers, list) and optimizers else 1


def trainer_time_limit_s(trainer: Any) -> float | None:
    """Seconds of training the Trainer's time limit still allows: the ``Timer`` callback's
    ``time_remaining()`` (the one ``Trainer(max_time=...)`` adds, its duration parsed from a
    ``timedelta``, a dict or ``"DD:HH:MM:SS"``; a resumed fit's trained time is subtracted).

    Args:
        trainer: a Lightning ``Trainer`` (read at ``on_train_start``).

    Returns:
        The seconds (> 0), or None without a ``Timer``, without a duration, or with none left
        (Lightning then stops at once).
    """
    callbacks = list(getattr(trainer, "callbacks", None) or [])
    timer = next((cb for cb in callbacks if is_a(cb, "Timer")), None)
    if timer is None:
        return None
    try:
        remaining = timer.time_remaining()
    except Exception as exc:  # another Lightning version's Timer
        logger.debug("the Trainer's time limit is unreadable: %r", exc)
        return None
    if isinstance(remaining, bool) or not isinstance(remaining, (int, float)):
        return None
    return float(remaining) if math.isfinite(remaining) and remaining > 0 else None


def trainer_steps_per_epoch(trainer: Any) -> int | None:
    """Optimizer steps per epoch: ``ceil(num_training_batches / accumulate_grad_batches)``
    (Lightning steps on an epoch's last batch even when its accumulation is incomplete).

    Args:
        trainer: a Lightning ``Trainer`` whose train data is set up.

    Returns:
        The count, or None when the number of batches is unknown or zero.
    """
    batches = whole_number(getattr(trainer, "num_training_batches", None))
    accumulate = whole_number(getattr(trainer, "accumulate_grad_batches", 1)) or 1
    if batches is None or batches <= 0:
        return None
    return math.ceil(batches / accumulate)


def trainer_eval_every(trainer: Any) -> int | None:
    """The validation period in optimizer steps, where validation is periodic in steps.

    Computable cases: validation at the end of every ``check_val_every_n_epoch``-th epoch
    (``val_check_interval=1.0``, or an int equal to the epoch's batches): that many epochs of
    steps; ``val_check_interval`` batches within each epoch (``check_val_every_n_epoch=1``) or
    across epochs (``None``), when the accumulation divides it (and the epoch's batches).

    Args:
        trainer: a Lightning ``Trainer`` whose train data is set up.

    Returns:
        The period (>= 1), or None: no validation, time-based ``val_check_interval``, an
        iterable dataset, or a schedule that is not periodic in optimizer steps.
    """
    if not getattr(trainer, "enable_validation", False):
        return None
    if getattr(trainer, "_val_check_time_interval", None) is not None:
        return None  # time-based validation
    steps_per_epoch = trainer_steps_per_epoch(trainer)
    batches = whole_number(getattr(trainer, "num_training_batches", None))
    every = whole_number(getattr(trainer, "val_check_batch", None))
    accumulate = whole_number(getattr(trainer, "accumulate_grad_batches", 1)) or 1
    epochs = getattr(trainer, "check_val_every_n_epoch", 1)
    if steps_per_epoch is None or batches is None or every is None or every <= 0:
        return None
    if epochs is None:  # every `every` batches counted over the whole fit
        divisible = every % accumulate == 0 and batches % accumulate == 0
        return every // accumulate if divisible else None
    epochs = whole_number(epochs)
    if epochs is None or epochs <= 0:
        return None
    if every == batches:
        return epochs * steps_per_epoch
    if epochs == 1 and batches % every == 0 and every % accumulate == 0:
        return every // accumulate
    return None


def trainer_checkpoint_every(
    trainer: Any, eval_every: int | None, global_per_step: int = 1
) -> int | None:
    """The period in optimizer steps of the Trainer's ``ModelCheckpoint`` saves, where it is one.

    Computable cases, per ``ModelCheckpoint``: ``every_n_train_steps`` = n (a period in
    ``trainer.global_step``, which moves by ``global_per_step`` a hook step: a save every
    ``lcm(n, global_per_step) / global_per_step`` steps); ``every_n_epochs`` = n saving after
    validations that end whole epochs (``eval_every`` a multiple k of the steps per epoch:
    every lcm(k, n) epochs), after every validation (n = 1), or at the end of every n-th epoch
    without validation. Several callbacks: the shortest period (their saves are one phase when
    they fall on the same step).

    Args:
        trainer: a Lightning ``Trainer`` whose train data is set up.
        eval_every: the validation period in optimizer steps (``trainer_eval_every``), or None.
        global_per_step: ``trainer.global_step`` increments per hook step
            (``global_steps_per_step``).

    Returns:
        The period (>= 1), or None: no ``ModelCheckpoint``, time-based saving, or a schedule
        not periodic in optimizer steps.
    """
    steps_per_epoch = trainer_steps_per_epoch(trainer)
    validates = bool(getattr(trainer, "enable_validation", False))
    periods = []
    for callback in getattr(trainer, "callbacks", None) or []:
        if not is_a(callback, "ModelCheckpoint"):
            continue
        if getattr(callback, "_train_time_interval", None) is not None:
            return None
        steps = whole_number(getattr(callback, "_every_n_train_steps", 0), 0) or 0
        epochs = whole_number(getattr(callback, "_every_n_epochs", 0), 0) or 0
        if steps > 0:
            k = max(global_per_step, 1)
            periods.append(math.lcm(steps, k) // k)
        elif epochs > 0:
            if validates and eval_every is None:
                return None  # saves follow validations whose period is unknown
            if not validates or eval_every is None:
                period = epochs * steps_per_epoch if steps_per_epoch else None
            elif steps_per_epoch and eval_every % steps_per_epoch == 0:
                period = math.lcm(eval_every // steps_per_epoch, epochs) * steps_per_epoch
            else:
                period = eval_every if epochs == 1 else None
            if period is None:
                return None
            periods.append(period)
    return min(periods) if periods else None


def trainer_checkpoint_files(trainer: Any) -> int:
    """Files one checkpoint save writes in full: per ``ModelCheckpoint``, its own file (unless
    ``save_top_k=0``) and ``last.ckpt`` when ``save_last=True`` (``"link"`` makes a link, not a
    copy); summed over the callbacks, at least 1.

    Args:
        trainer: a Lightning ``Trainer``.

    Returns:
        The file count (>= 1).
    """
    files = 0
    for callback in getattr(trainer, "callbacks", None) or []:
        if not is_a(callback, "ModelCheckpoint"):
            continue
        files += 0 if getattr(callback, "save_top_k", 1) == 0 else 1
        files += 1 if getattr(callback, "save_last", None) is True else 0
    return max(files, 1)


def trainer_val_batches(trainer: Any) -> int | None:
    """Batches in one validation run during training: the sum of ``trainer.num_val_batches``
    (every validation loader, ``limit_val_batches`` applied), or None where it is not known yet
    or not finite (an iterable loader without length).

    Args:
        trainer: a Lightning ``Trainer``.

    Returns:
        The batch count (>= 1), or None.
    """
    counts = getattr(trainer, "num_val_batches", None)
    if not isinstance(counts, (list, tuple)) or not counts:
        return None
    whole = [whole_number(c, 0) for c in counts]
    if any(c is None for c in whole):
        return None
    total = sum(c for c in whole if c is not None)
    return total if total >= 1 else None


def loaders_batch_size(loaders: Any) -> int | None:
    """The ``batch_size`` of a loader, or of the first of a list of loaders; None if unknown."""
    if isinstance(loaders, (list, tuple)):
        loaders = loaders[0] if loaders else None
    return loader_batch_size(loaders)


def trainer_optimizers(trainer: Any) -> tuple[Any, str | None]:
    """The Trainer's optimizers for ``ETSHook(optimizer=...)`` and a note when unusable."""
    optimizers = list(getattr(trainer, "optimizers", None) or [])
    if not optimizers:
        return None, None
    try:
        optimizer_list(optimizers)
    except ValueError as exc:
        return (
            None,
            f"the Trainer's optimizers are not usable ({exc}); any optimizer's step marks steps",
        )
    return (optimizers[0] if len(optimizers) == 1 else optimizers), None


def trainer_grad_scaler(trainer: Any) -> Any:
    """The precision plugin's ``GradScaler`` (fp16 mixed precision), or None."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    return scaler if callable(getattr(scaler, "update", None)) else None


def train_loaders(loaders: Any) -> list[Any]:
    """The ``DataLoader``s in what Lightning calls train dataloaders (a loader, a
    ``CombinedLoader``, or a list, tuple or dict of them, nested), each once, in order; none
    for a ``CombinedLoader`` in ``"sequential"`` mode (its steps draw from one loader at a
    time, not from each) or anything else."""
    found: list[Any] = []

    def visit(item: Any, depth: int) -> None:
        if isinstance(item, torch.utils.data.DataLoader):
            if all(item is not known for known in found):
                found.append(item)
            return
        if depth >= 3:
            return
        flattened = getattr(item, "flattened", None)  # a CombinedLoader
        if isinstance(flattened, list):
            if getattr(item, "_mode", None) != "sequential":
                for inner in flattened:
                    visit(inner, depth + 1)
        elif isinstance(item, dict):
            for inner in item.values():
                visit(inner, depth + 1)
        elif isinstance(item, (list, tuple)):
            for inner in item:
                visit(inner, depth + 1)

    visit(loaders, 0)
    return found


def early_stopping_callback(trainer: Any) -> Any:
    """The Trainer's first ``EarlyStopping`` callback, or None."""
    found = getattr(trainer, "early_stopping_callbacks", None)
    if found is None:
        single = getattr(trainer, "early_stopping_callback", None)
        found = [single] if single is not None else []
    return next(iter(found), None)


def trainer_min_stop_step(trainer: Any, global_per_step: int = 1) -> int:
    """The first step at which the fit may stop early: Lightning goes on past a fired
    ``EarlyStopping`` until ``min_steps`` (in ``trainer.global_step`` units: divided by
    ``global_per_step``, rounded up) and ``min_epochs`` epochs are done.

    Args:
        trainer: a Lightning ``Trainer`` whose train data is set up.
        global_per_step: ``trainer.global_step`` increments per hook step.

    Returns:
        The global step (0: no minimum, or ``min_epochs`` with an unknown or varying number of
        steps per epoch).
    """
    bounds = [0]
    min_steps = whole_number(getattr(trainer, "min_steps", None))
    if min_steps is not None and min_steps > 0:
        bounds.append(math.ceil(min_steps / max(global_per_step, 1)))
    min_epochs = whole_number(getattr(trainer, "min_epochs", None))
    callbacks = getattr(trainer, "callbacks", None) or []
    varying = any(is_a(cb, "GradientAccumulationScheduler") for cb in callbacks)
    per_epoch = None if varying else trainer_steps_per_epoch(trainer)
    if min_epochs is not None and min_epochs > 0 and per_epoch is not None:
        bounds.append(min_epochs * per_epoch)
    return max(bounds)


def early_stopping_rule(callback: Any) -> EarlyStoppingRule | None:
    """The rule of a Lightning ``EarlyStopping`` callback (None for None, or one it cannot be
    made for: logged). Lightning stores ``min_delta`` with its sign flipped in mode "min"."""
    if callback is None:
        return None
    try:
        return EarlyStoppingRule.from_lightning(
            callback.patience,
            abs(float(callback.min_delta)),
            callback.mode,
            bool(getattr(callback, "check_finite", True)),
        )
    except (AttributeError, TypeError, ValueError) as exc:
        logger.info("EarlyStopping not followed: %r", exc)
        return None


def checks_on_train_epoch_end(callback: Any) -> bool:
    """Whether an ``EarlyStopping`` callback checks at train epoch end (resolved in its
    ``setup``) rather than at validation end."""
    return bool(getattr(callback, "_check_on_train_epoch_end", False))
