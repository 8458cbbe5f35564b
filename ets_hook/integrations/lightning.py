"""PyTorch Lightning integration: ``ETSCallback``.

``Trainer(..., callbacks=[ETSCallback()])`` is all a user writes. When training starts
(``on_train_start``) the callback creates an ``ETSHook`` on the ``LightningModule`` and the
Trainer's optimizers with what the Trainer knows:

- ``total_steps``: ``trainer.max_steps`` when > 0, and ``trainer.estimated_stepping_batches``
  (``max_epochs`` x optimizer steps per epoch; with a ``GradientAccumulationScheduler``, each
  epoch's steps at its scheduled accumulation), the smaller of the two; unknown (no ETA, step
  time only, no made-up total) for an ``IterableDataset`` without ``len()`` and
  ``max_steps=-1``, or ``max_epochs=-1``.
- ``time_limit_s``: what ``max_time`` still allows (``trainer_time_limit_s``: its ``Timer``'s
  ``time_remaining()``, a resumed fit's trained time subtracted): the job's only bound while
  its length is unknown, and a predicted total beyond it is cut to it
  (``Prediction.stopped_by_time_limit``); one log line says which.
- ``early_stopping``: with an ``EarlyStopping`` callback (the first of
  ``trainer.early_stopping_callbacks``), its rule (``EarlyStoppingRule.from_lightning(patience,
  abs(min_delta), mode, check_finite)``); its ``monitor`` value in ``trainer.callback_metrics``
  goes to ``hook.report_metric`` wherever that callback checks it (validation end, or train
  epoch end with ``check_on_train_epoch_end``), so predictions carry ``expected_stop_step`` and
  ``total_range_s``; a stop that ``min_epochs`` / ``min_steps`` hold back is predicted at their
  end (``EarlyStoppingRule.min_stop_step``). An ``early_stopping=`` option given explicitly
  wins (the callback's ``monitor`` is still reported).
- ``initial_step``: ``trainer.global_step`` (restored by ``fit(ckpt_path=...)``).
- several optimizers (manual optimization): a hook step ends once each has stepped, while
  ``trainer.global_step`` counts every optimizer's step; ``max_steps``, ``min_steps``, the
  restored step and ``every_n_train_steps`` are converted (``global_steps_per_step``). Under
  manual optimization Lightning's length assumes one optimizer step per batch; after the first
  epoch the callback warns when the optimizers stepped less often.
- ``grad_accum_steps``: ``accumulate_grad_batches``. The hook counts optimizer steps, as
  ``trainer.global_step`` does: Lightning steps the optimizer once per accumulation (and on an
  epoch's last batch); under fp16 mixed precision the precision plugin's ``GradScaler``
  (``grad_scaler``) marks the steps whose optimizer step it skipped, which Lightning counts too.
- ``eval_every``: the validation period in optimizer steps where it is one
  (``check_val_every_n_epoch`` x steps per epoch, or ``val_check_interval`` batches / the
  accumulation when that divides evenly); else the hook learns it from the validations it sees.
  With a period and a finite ``trainer.num_val_batches``, validations are priced before the
  first is measured: their batches x a forward of a training micro-batch
  (``forecast.job.eval_cost_prior``; ``ETSHook.expect_phase_cost``).
- ``steps_per_epoch``: optimizer steps per epoch (``trainer_steps_per_epoch``; not with a
  ``GradientAccumulationScheduler``, nor when ``steps_per_epoch``, ``epochs`` or ``dataloader``
  is given): each epoch's start-up (a fresh iterator; worker processes started again unless
  ``persistent_workers``) is the phase ``"epoch start"``, as in a plain loop.
- the train loader's worker processes (``ETSHook.time_dataloader_workers``; not when the
  options give a ``dataloader``): Lightning builds the loader and starts its first iterator
  (its workers) before ``on_train_start``, so from ``setup`` until training starts the callback
  wraps the fit loop's loader source (``trainer.fit_loop._data_source``: Lightning keeps no
  public handle on it before the loader exists) and attaches a ``BatchClock`` to the loader it
  returns, before the loader's first ``iter()``; the hook then reads that clock. Several train
  loaders (a ``CombinedLoader``, a list or dict of them: a batch from each per step) are each
  timed and the slowest sets the pace (not in ``"sequential"`` mode). A loader Lightning
  re-creates for a distributed sampler keeps the clock (it copies the loader's attributes, or
  replays the attribute writes made while the loader was built: the wrapped ``collate_fn``
  either way), and both are given back at close.
- ``checkpoint_every``: the period of the ``ModelCheckpoint`` saves where it is one
  (``trainer_checkpoint_every``); the hook then prices each save from the model's and
  optimizers' state until the first is measured, once per file the save writes
  (``checkpoint_files``, from ``trainer_checkpoint_files``: ``save_last=True`` writes the
  state twice).

Anything passed to ``ETSCallback(**hook_options)`` goes to ``ETSHook`` and wins over what the
Trainer says (one log line when the two disagree).

Phases, out of the step rate and projected over the rest of the job: validation during
training (``on_validation_start`` .. ``on_validation_end``) as ``"eval"``, and checkpoint
saving as ``"checkpoint"``. Lightning has no "checkpoint written" event (``on_save_checkpoint``
comes before the file is written), so while training runs the callback wraps the Trainer's
``save_checkpoint`` on the instance: every save (``ModelCheckpoint``, which Lightning always
runs after other callbacks' ``on_validation_end``, ``OnExceptionCheckpoint``, a user's
``trainer.save_checkpoint``) is a checkpoint phase, state gathering and writing included.

The hook is created at ``on_train_start``, not earlier: the restored ``global_step`` only exists
after ``on_fit_start``, and reading the job length before the Trainer set up its train data
would make Lightning set it up inside the sanity check's ``isolate_rng`` block, which changes the
random stream of a seeded run. The sanity check therefore runs before the hook exists; the
callback times it (``sanity_check_s``), and ``hook.prediction``'s clock starts at training.

The latest prediction is logged with ``pl_module.log`` from ``on_train_batch_end`` (``LOG_KEYS``:
``ets/iteration_s``, ``ets/eta_s``, ``ets/total_s``, as the Hugging Face integration) at
Lightning's logging steps (``log_every_n_steps``: ``self.log`` costs ~2 ms) and at the job's
last step, so it reaches ``trainer.loggers`` and stays in ``trainer.callback_metrics``. The
values are logged as CPU tensors: reading them never synchronises a GPU. The progress bar
shows the ETA as text, ``ETA: 13m32s`` (``? (0.412 s/step)`` while the job length is
unknown): logged values must be numbers, so while training runs the callback wraps the bar's
``get_metrics`` on the instance (what Lightning's documentation says to override for what a
bar shows) to add it; where the bar cannot be wrapped, the logged ETA (the step time while the
length is unknown, from the first values on) goes into the bar as the number of seconds. The
hook is closed at ``on_train_end`` and by ``on_exception`` (the status file then says
``failed`` or ``interrupted``).

Both import names of Lightning are served by the same code, ``BaseETSCallback``; a Trainer
only takes callbacks subclassing its own package's ``Callback`` (``lightning.pytorch.Callback``
and ``pytorch_lightning.Callback`` are distinct classes), so ``callback_class(package)`` makes
the class for one package. ``ets_hook.integrations.lightning.ETSCallback`` is the class for
``lightning.pytorch`` when ``lightning`` is installed, else for ``pytorch_lightning``;
``ets_hook.integrations.pytorch_lightning.ETSCallback`` is always the ``pytorch_lightning`` one.
The class is made on first use and only its package is imported: importing the other one as
well would reroute Lightning's own log lines (both share ``lightning_utilities``' logging). A
callback from the wrong package gets one warning naming the right import. Importing this module
needs ``lightning`` or ``pytorch_lightning`` installed (else an ImportError naming the extra,
``pip install 'ets-hook[lightning]'``); ``import ets_hook`` never imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import logging
import math
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .lightning_packages import INSTALL_HINT, PACKAGES, installed_packages, is_a, package_of

# Checked before torch and the hook are imported: without Lightning, the error comes at once.
if not installed_packages():
    raise ImportError(
        "ets_hook.integrations.lightning needs PyTorch Lightning (the `lightning` or "
        f"`pytorch_lightning` package): {INSTALL_HINT}"
    )

import torch

from .. import exits
from ..capture.batch_clock import BatchClock
from ..forecast.early_stop import EarlyStoppingRule
from ..forecast.job import CHECKPOINT, EVAL, eval_cost_prior
from ..forecast.text import format_duration, format_step_time
from ..hook import ETSHook
from ..hook_arguments import check_epochs_length
from .common import (
    HOOK_ARGUMENTS,
    LOG_KEYS,
    BarRefresh,
    callback_signature,
    check_hook_options,
    given_options,
    prediction_metrics,
    whole_number,
)
from .lightning_trainer import (
    checks_on_train_epoch_end,
    early_stopping_callback,
    early_stopping_rule,
    global_steps_per_step,
    loaders_batch_size,
    train_loaders,
    trainer_checkpoint_every,
    trainer_checkpoint_files,
    trainer_eval_every,
    trainer_grad_scaler,
    trainer_min_stop_step,
    trainer_optimizers,
    trainer_steps_per_epoch,
    trainer_time_limit_s,
    trainer_total_steps,
    trainer_val_batches,
)

# Options that give the job's length; with either given, the Trainer's total is not used (a
# `dataloader` alone gives the steps per epoch, not the job's length: the Trainer's total stays).
_LENGTH_OPTIONS = ("total_steps", "epochs")
#: Options that set the epoch length themselves: the Trainer's steps per epoch are not derived.
_EPOCH_OPTIONS = ("steps_per_epoch", "epochs", "dataloader")

_MISSING = object()


if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

logger = logging.getLogger("ets_hook")

#: Phase names: validation during training, checkpoint saving (as in ``ETSHook``'s hints
#: ``eval_every`` / ``checkpoint_every`` and the Hugging Face integration).
EVAL_PHASE = EVAL
CHECKPOINT_PHASE = CHECKPOINT

#: The progress bar's entry for the ETA (``BaseETSCallback.bar_items``).
BAR_KEY = "ETA"

#: ``ETSHook``'s arguments an ``ETSCallback`` accepts.
HOOK_OPTIONS = HOOK_ARGUMENTS


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    """``repr(value)`` when it is one short line, else ``<TypeName>`` (a model, an optimizer)."""
    text = repr(value)
    return text if len(text) <= 60 and "\n" not in text else f"<{type(value).__name__}>"


def _check_manual_steps(trainer: Any, pl_module: Any, hook: ETSHook, initial_step: Any) -> None:
    """Under manual optimization Lightning counts one optimizer step per batch
    (``estimated_stepping_batches``); after a first epoch run whole in this process, warn once
    when the steps the hook counted differ (the optimizer stepped every k-th batch). Never
    raises."""
    try:
        if getattr(pl_module, "automatic_optimization", True) is not False:
            return
        if hook.total_steps is None or whole_number(getattr(trainer, "current_epoch", None)):
            return  # no length to correct, or not the fit's first epoch (resumed)
        expected = trainer_steps_per_epoch(trainer)
        done = hook.steps_completed
        if expected is None or done in (0, expected) or initial_step:
            return
        if getattr(trainer, "should_stop", False) is True or done >= hook.total_steps:
            return  # the epoch was cut short: the job ended (max_steps, max_time, a stop)
        logger.warning(
            "manual optimization: the optimizers stepped %d times in the first epoch, where "
            "the job's length assumes one step per batch (%d): the predicted total is off by "
            "about %.2gx; pass ETSCallback(total_steps=...) with the steps of the whole fit "
            "(with several optimizers, rounds in which each has stepped)",
            done,
            expected,
            expected / done,
        )
    except Exception as exc:  # a note less, never a failed fit
        logger.debug("could not check the first epoch's steps: %r", exc)


def _initial(callback: ETSCallback) -> int:
    """The steps done before this fit (resumed), as the callback resolved them."""
    initial = (callback.resolved_options or {}).get("initial_step", 0)
    return initial if isinstance(initial, int) else 0


def _logging_step(trainer: Any) -> bool:
    """Whether Lightning writes to its loggers after this batch (its logger connector's
    ``should_update_logs``, as its own ``LearningRateMonitor`` asks); True where that is
    unreadable (another Lightning version)."""
    should = getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", None)
    return should if isinstance(should, bool) else True


def _note_disagreement(notes: list[str], key: str, given: Any, derived: Any) -> None:
    """Append the log note for an option given against a different value from the Trainer."""
    if derived is not None and not _same(given, derived):
        notes.append(
            f"{key}={_short(given)} given; the Trainer says {_short(derived)} "
            f"(using {_short(given)})"
        )


def _same(given: Any, derived: Any) -> bool:
    if given is derived:
        return True
    if isinstance(derived, EarlyStoppingRule):
        try:
            return EarlyStoppingRule.coerce(given) == derived
        except ValueError:
            return False
    if isinstance(given, (list, tuple)) and isinstance(derived, (list, tuple)):
        return len(given) == len(derived) and all(map(_same, given, derived))
    try:
        return bool(given == derived)
    except Exception:
        return False


# --------------------------------------------------------------------------------------------
# The callback
# --------------------------------------------------------------------------------------------


def _restore_attribute(patch: tuple[Any, Any, Any] | None, name: str) -> None:
    """Undo an instance-attribute wrap ``(owner, wrapper, previous)``: the previous instance
    attribute back, or none (``_MISSING``: the class's again). Left alone when someone else
    wrapped it again since (theirs stays in place); nothing for None."""
    if patch is None:
        return
    owner, wrapper, previous = patch
    if vars(owner).get(name) is not wrapper:
        return
    if previous is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, previous)


class BaseETSCallback:
    """What every ``ETSCallback`` does, whichever Lightning package its ``Callback`` is from.

    ``ETSCallback`` (``callback_class``) subclasses this and the package's ``Callback``: a
    Lightning callback that runs an ``ETSHook`` over ``trainer.fit``. One instance can serve
    several fits: each creates a new hook at its training start (and closes the previous one).
    See the module docstring for what is read from the Trainer.

    Attributes:
        hook_options: the options given, passed to ``ETSHook`` (those at the callback's
            default left out: ``common.given_options``).
        prog_bar: whether the ETA goes into the progress bar.
        resolved_options: the ``ETSHook`` arguments of the latest fit (what the Trainer said,
            overridden by ``hook_options``); None before the first training start.
        sanity_check_s: seconds the latest sanity check took (before the hook exists), or None.
    """

    def __init__(self, *, prog_bar: bool = True, **hook_options: Any) -> None:
        """Store the options; the hook is created when training starts.

        Args:
            prog_bar: show the ETA in Lightning's progress bar, as text (``ETA: 13m32s``;
                ``bar_items``), while training runs.
            **hook_options: any ``ETSHook`` argument (``status_path=``, ``trace_path=``,
                ``deadline=``, ``log_every=``, ...). One the Trainer also supplies (``model``,
                ``optimizer``, ``total_steps``, ``initial_step``, ``grad_accum_steps``,
                ``eval_every``, ``grad_scaler``) wins, with one log line when they differ;
                None for one of those means "not given" (``common.given_options``:
                LightningCLI passes every option).
                Values are checked now, as ``ETSHook`` checks them
                (``common.check_hook_options``); ``ETSHook`` checks them again, with the
                Trainer's, when training starts.

        Raises:
            TypeError: an option is not an ``ETSHook`` argument.
            ValueError: ``prog_bar`` not a bool; an option's value ``ETSHook`` rejects (naming
                the option and the value), or ``epochs`` without ``steps_per_epoch`` or
                ``dataloader`` (given ``epochs``, the callback leaves the epoch length to the
                options).
            ImportError: ``progress=True`` without tqdm; a dashboard option without its
                package.
        """
        if not isinstance(prog_bar, bool):
            raise ValueError(f"prog_bar must be True or False, got {prog_bar!r}")
        unknown = sorted(set(hook_options) - HOOK_OPTIONS)
        if unknown:
            raise TypeError(
                f"ETSCallback got options ETSHook does not take: {', '.join(unknown)} "
                f"(ETSHook takes: {', '.join(sorted(HOOK_OPTIONS))})"
            )
        hook_options = given_options(hook_options)
        check_hook_options(hook_options)
        if "epochs" in hook_options:  # then no steps per epoch are read from the Trainer
            check_epochs_length(
                hook_options["epochs"],
                hook_options.get("steps_per_epoch"),
                hook_options.get("dataloader"),
            )
        super().__init__()
        self.hook_options: dict[str, Any] = dict(hook_options)
        self.prog_bar = prog_bar
        self.resolved_options: dict[str, Any] | None = None
        self.sanity_check_s: float | None = None
        self._hook: ETSHook | None = None
        self._open = False
        self._in_eval = False
        self._logged_steps = -1
        self._bar_key: str | None = None  # the key logged with prog_bar=True in this fit
        self._first_epoch_checked = False
        self._logged_keys: set[str] = set()  # logged once: NaN once they become unknown
        self._bar_refresh = BarRefresh()  # when the bar's ETA text is made again
        self._bar_text: dict[str, str] = {}
        self._logging_failed = False
        self._sanity_started_ns: int | None = None
        self._trainer_patch: tuple[Any, Callable[..., Any], Any] | None = None
        # The progress bar whose get_metrics shows our ETA as text, while training runs.
        self._bar_patch: tuple[Any, Callable[..., Any], Any] | None = None
        self._early_stopping: Any = None  # the EarlyStopping callback whose monitor is reported
        # The fit loop's loader source while it is wrapped (setup .. train start), and the
        # clock attached to the loader it built, until the hook takes it.
        self._source_patch: tuple[Any, Callable[..., Any]] | None = None
        self._early_clocks: list[BatchClock] | None = None  # attached while Lightning builds

    # -- public --------------------------------------------------------------------------------

    @property
    def hook(self) -> ETSHook | None:
        """The ``ETSHook`` of the latest fit (closed once training ended), or None before."""
        return self._hook

    @property
    def prediction(self) -> Prediction | None:
        """The hook's current (after training: final) prediction, or None before the first
        step."""
        return self._hook.prediction if self._hook is not None else None

    # -- Lightning hooks -----------------------------------------------------------------------

    #: The Lightning package of this class's ``Callback`` (set by ``callback_class``).
    lightning_package: str = ""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Warn when the Trainer comes from another Lightning package than this class's
        ``Callback`` (Lightning then only duck-types it; ``Trainer(callbacks=cb)`` without a
        list, for one, would not take it)."""
        trainer_package = package_of(trainer)
        if trainer_package and self.lightning_package and trainer_package != self.lightning_package:
            logger.warning(
                "this ETSCallback is a %s Callback but the Trainer is from %s: use "
                "%s.ETSCallback (or callback_class(%r))",
                self.lightning_package,
                trainer_package,
                PACKAGES[trainer_package],
                trainer_package,
            )
        if stage == "fit" and "dataloader" not in self.hook_options:
            self._watch_train_loader(trainer)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        """Time the sanity check (it runs before the hook exists)."""
        self._sanity_started_ns = time.perf_counter_ns()

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        """Record the sanity check's duration in ``sanity_check_s``."""
        if self._sanity_started_ns is not None:
            self.sanity_check_s = (time.perf_counter_ns() - self._sanity_started_ns) / 1e9
            self._sanity_started_ns = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Create the hook from the Trainer's settings and ``hook_options``.

        Raises:
            ValueError: from ``ETSHook``: the options and the Trainer's values together are
                invalid (each option alone was checked when the callback was created).
        """
        self._close(outcome=None)
        self._early_stopping = early_stopping_callback(trainer)
        options, notes, trainer_total = self._resolve_options(trainer, pl_module)
        self.resolved_options = options
        self._hook = ETSHook(**options)
        self._hook.expect_explicit_close()  # on_train_end / on_exception / teardown close it
        self._time_train_loader(trainer)
        if "eval_dataloader" not in options and options.get("eval_every"):
            self._price_validation(trainer, options.get("grad_accum_steps", 1))
        self._open, self._in_eval, self._logged_steps = True, False, -1
        self._bar_key, self._first_epoch_checked = None, False
        self._logged_keys = set()
        self._bar_refresh, self._bar_text = BarRefresh(), {}
        self._logging_failed = False
        self._patch_save_checkpoint(trainer)
        if self.prog_bar:
            self._patch_progress_bar(trainer)
        notes += self._length_notes(trainer, trainer_total)
        for note in notes:
            logger.info("%s", note)
        if "early_stopping" in self.hook_options and self._early_stopping is None:
            logger.warning(
                "ETSCallback(early_stopping=...) was given, but the Trainer has no "
                "EarlyStopping callback whose monitored metric it could follow: the rule sees "
                "only what you report with ets.hook.report_metric(name, value) (e.g. in "
                "on_validation_epoch_end); add EarlyStopping(monitor=...) to have it followed"
            )

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Begin the validation phase (validation during training only)."""
        if self._open and not self._in_eval and not getattr(trainer, "sanity_checking", False):
            assert self._hook is not None
            self._hook.begin_phase(EVAL_PHASE)
            self._in_eval = True

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """End the validation phase (before ``ModelCheckpoint`` saves: Lightning runs it last);
        report the ``EarlyStopping`` monitor when that callback checks at validation end."""
        self._end_eval()
        if not checks_on_train_epoch_end(self._early_stopping):
            self._report_metric(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Report the ``EarlyStopping`` monitor when that callback checks at train epoch end;
        after a fit's first epoch under manual optimization, say when its optimizer steps
        were not the one per batch the job's length assumed."""
        if checks_on_train_epoch_end(self._early_stopping):
            self._report_metric(trainer)
        if self._hook is not None and self._open and not self._first_epoch_checked:
            self._first_epoch_checked = True
            _check_manual_steps(trainer, pl_module, self._hook, _initial(self))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the prediction at Lightning's logging steps (``log_every_n_steps``, where it
        writes to the loggers: ``pl_module.log`` costs ~2 ms, too much for every step) and at
        the job's last step (its values then stay in ``trainer.callback_metrics``). The
        progress bar shows the ETA as text (``bar_items``) where its ``get_metrics`` could be
        wrapped, else the logged number: the key on the bar is chosen once per fit
        (Lightning refuses a key logged with ``prog_bar`` changed), NaN once unknown."""
        hook = self._hook
        if not self._open or hook is None or self._logging_failed:
            return
        steps = hook.steps_completed
        if steps == self._logged_steps:
            return  # no new step since the last values (gradient accumulation)
        if not (hook.reached_last_step or _logging_step(trainer)):
            return  # between logging steps; the last step's values stay in callback_metrics
        prediction = hook.prediction
        if prediction is None:
            return
        self._logged_steps = steps
        try:
            metrics = prediction_metrics(prediction)
            for key in self._logged_keys - metrics.keys():
                metrics[key] = math.nan  # became unknown: not the last value
            self._logged_keys |= metrics.keys()
            if self._bar_key is None:
                self._bar_key = "ets/eta_s" if "ets/eta_s" in metrics else "ets/iteration_s"
            bar_key = self._bar_key
            on_bar = self.prog_bar and self._bar_patch is None
            # Trainer(logger=False): the values still reach callback_metrics (and the bar),
            # without Lightning's "no logger configured" warning for each key.
            to_loggers = bool(trainer.loggers)
            for key, value in metrics.items():
                pl_module.log(
                    key,
                    torch.tensor(value, dtype=torch.float64),
                    on_step=True,
                    on_epoch=False,
                    prog_bar=on_bar and key == bar_key,
                    logger=to_loggers,
                )
        except Exception as exc:  # never into the training loop: log once, stop logging
            self._logging_failed = True
            logger.warning("logging the prediction to Lightning failed: %r", exc)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the hook (final prediction, every hook removed)."""
        self._close(outcome="closed")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close the hook the way the exception ends the job (``exits.ending_of``): its status
        file records ``interrupted`` (Ctrl-C; a SIGTERM, which Lightning turns into its
        ``SIGTERMException``, a ``SystemExit``) or ``failed`` with the exception's type."""
        outcome, error = exits.ending_of(type(exception))
        if getattr(trainer, "received_sigterm", False) is True:
            outcome, error = exits.INTERRUPTED, None
        self._release_train_loader()
        self._close(outcome=outcome, error=error)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Close a hook still open (a fit that ended without ``on_train_end``); give back a
        train loader timed for a hook that was never created."""
        self._release_train_loader()
        self._close(outcome="closed")

    # -- internals -----------------------------------------------------------------------------

    def _watch_train_loader(self, trainer: Any) -> None:
        """Until training starts, attach a ``BatchClock`` to each train loader the fit loop
        builds, before its first ``iter()`` starts the workers: every one, since a finder
        callback (``LearningRateFinder``, ``BatchSizeFinder``) runs a fit of its own first and
        the real loop then builds its loaders again. Never raises."""
        self._release_train_loader()
        source = getattr(getattr(trainer, "fit_loop", None), "_data_source", None)
        build = getattr(source, "dataloader", None)
        if source is None or not callable(build):
            return
        callback = self

        def dataloader(*args: Any, **kwargs: Any) -> Any:
            loaders = build(*args, **kwargs)
            early = callback._early_clocks = callback._early_clocks or []
            try:
                for loader in train_loaders(loaders):
                    clock = BatchClock.attach(loader)
                    if clock is not None and all(clock is not known for known in early):
                        early.append(clock)
            except Exception as exc:  # a collection whose attributes raise: untimed
                logger.debug("train loaders not timed: %r", exc)
            return loaders

        try:
            source.dataloader = dataloader
        except Exception as exc:  # a frozen or slotted source in another Lightning version
            logger.debug("Lightning's train loader source not wrapped: %r", exc)
            return
        self._source_patch = (source, dataloader)

    def _unwatch_train_loader(self) -> None:
        patch, self._source_patch = self._source_patch, None
        if patch is not None and vars(patch[0]).get("dataloader") is patch[1]:
            del patch[0].dataloader

    def _time_train_loader(self, trainer: Any) -> None:
        """Have the hook time the workers of the Trainer's train loaders (the clocks attached
        while Lightning built them, or ones from each loader's next ``iter()``). Never
        raises."""
        self._unwatch_train_loader()
        early, self._early_clocks = self._early_clocks or [], None
        timed: list[BatchClock | None] = []
        if self._hook is not None and "dataloader" not in self.hook_options:
            try:
                for loader in train_loaders(getattr(trainer, "train_dataloader", None)):
                    if self._hook.time_dataloader_workers(loader):
                        timed.append(BatchClock.attached_to(loader))
            except Exception as exc:  # a collection whose attributes raise: untimed
                logger.debug("train loaders not timed: %r", exc)
        for clock in early:
            if all(clock is not used for used in timed):
                clock.detach()

    def _release_train_loader(self) -> None:
        """Undo ``_watch_train_loader`` where training never started."""
        self._unwatch_train_loader()
        early, self._early_clocks = self._early_clocks or [], None
        for clock in early:
            clock.detach()

    def _price_validation(self, trainer: Any, grad_accum_steps: int) -> None:
        """Price the validations before the first is measured (``ETSHook.expect_phase_cost``):
        the Trainer's validation batches (``trainer.num_val_batches``, its limits applied),
        each a forward of a training micro-batch scaled by the loaders' batch sizes. Never
        raises: without a finite batch count, validations count as 0 until the first is
        measured."""
        batches = trainer_val_batches(trainer)
        if not batches or self._hook is None:
            return
        val_size = loaders_batch_size(getattr(trainer, "val_dataloaders", None))
        train_size = loaders_batch_size(getattr(trainer, "train_dataloader", None))
        ratio = val_size / train_size if val_size and train_size else 1.0
        try:
            prior = eval_cost_prior(batches, ratio, max(1, int(grad_accum_steps)))
        except (TypeError, ValueError):
            return
        self._hook.expect_phase_cost(EVAL_PHASE, train_steps=prior.train_steps, rel_ci=prior.rel_ci)

    def _resolve_options(
        self, trainer: Any, pl_module: Any
    ) -> tuple[dict[str, Any], list[str], int | None]:
        """``ETSHook`` arguments: the Trainer's, overridden by ``hook_options``.

        Returns:
            The arguments, log notes, and the Trainer's total when the options describe the
            job's length themselves (compared with the hook's once it resolved them).
        """
        given = self.hook_options
        derived: dict[str, Any] = {"model": pl_module}
        notes: list[str] = []
        optimizer, note = trainer_optimizers(trainer)
        if note:
            notes.append(note)
        if optimizer is not None:
            derived["optimizer"] = optimizer
            if isinstance(optimizer, list):
                notes.append(
                    f"{len(optimizer)} optimizers: a step ends once each has stepped, while "
                    "trainer.global_step counts every optimizer's steps"
                )
        scaler = trainer_grad_scaler(trainer)
        if scaler is not None:
            derived["grad_scaler"] = scaler
        accumulate = whole_number(getattr(trainer, "accumulate_grad_batches", 1))
        if accumulate is not None and accumulate >= 1:
            derived["grad_accum_steps"] = accumulate
        # Several optimizers (manual optimization): trainer.global_step counts each one's step.
        per_step = global_steps_per_step(optimizer)
        derived["initial_step"] = max(0, whole_number(trainer.global_step) or 0) // per_step
        total = trainer_total_steps(trainer, per_step)
        if total is not None:  # below the restored step: Lightning stops at once
            derived["total_steps"] = max(total, derived["initial_step"])
        time_limit_s = trainer_time_limit_s(trainer)
        if time_limit_s is not None:
            derived["time_limit_s"] = time_limit_s
        callbacks = list(getattr(trainer, "callbacks", None) or [])
        if any(is_a(cb, "GradientAccumulationScheduler") for cb in callbacks):
            eval_every = checkpoint_every = None  # steps per epoch change with the accumulation
            notes.append(
                "GradientAccumulationScheduler: the accumulation changes between epochs; the "
                "job's steps are counted epoch by epoch from its schedule, validations and "
                "checkpoints are priced as they come"
            )
        else:
            eval_every = trainer_eval_every(trainer)
            checkpoint_every = trainer_checkpoint_every(trainer, eval_every, per_step)
            per_epoch = trainer_steps_per_epoch(trainer)
            if per_epoch is not None and not any(k in given for k in _EPOCH_OPTIONS):
                # Each epoch's start-up (a fresh iterator: workers started again when not
                # persistent) becomes the phase "epoch start", as in a plain loop.
                derived["steps_per_epoch"] = per_epoch
        if eval_every is not None:
            derived["eval_every"] = eval_every
        if checkpoint_every is not None:
            derived["checkpoint_every"] = checkpoint_every
            derived["checkpoint_files"] = trainer_checkpoint_files(trainer)
            derived["checkpoint_in_memory"] = True  # _atomic_save: torch.save into a BytesIO
        rule = early_stopping_rule(self._early_stopping)
        if rule is not None:
            # The fit goes on past the rule until min_epochs / min_steps are done.
            min_stop = trainer_min_stop_step(trainer, per_step)
            derived["early_stopping"] = (
                dataclasses.replace(rule, min_stop_step=min_stop) if min_stop else rule
            )

        options = dict(derived)
        trainer_total = None
        if any(key in given for key in _LENGTH_OPTIONS):  # theirs; compared after creation
            trainer_total = options.pop("total_steps", None)
        phase_every = given.get("phase_every") or {}
        if EVAL_PHASE in phase_every and "eval_every" not in given:
            options.pop("eval_every", None)  # ours would override their phase_every entry
            _note_disagreement(
                notes, f"phase_every[{EVAL_PHASE!r}]", phase_every[EVAL_PHASE], eval_every
            )
        for key, value in given.items():
            if key != "total_steps" or trainer_total is None:
                _note_disagreement(notes, key, value, derived.get(key))
            options[key] = value
        return options, notes, trainer_total

    def _length_notes(self, trainer: Any, trainer_total: int | None) -> list[str]:
        """Log notes on the job's length: the given one against the Trainer's, unknown, and
        the bounds of ``max_time`` and early stopping."""
        hook = self._hook
        assert hook is not None
        notes = []
        if trainer_total is not None and hook.total_steps != trainer_total:
            notes.append(
                f"the job length given resolves to {hook.total_steps} steps; the Trainer says "
                f"{trainer_total} (using {hook.total_steps})"
            )
        callbacks = list(getattr(trainer, "callbacks", None) or [])
        remaining = trainer_time_limit_s(trainer)
        if hook.total_steps is None:
            notes.append(
                "the job length in steps is unknown (train data without len() and "
                "max_steps=-1, or max_epochs=-1): step time only, no ETA"
            )
        if remaining is not None:
            bound = f"Trainer(max_time=...) stops training after {format_duration(remaining)}"
            if "time_limit_s" in self.hook_options:
                notes.append(f"{bound} at the latest (time_limit_s given)")
            elif hook.total_steps is None:
                notes.append(
                    f"{bound} at the latest: that is the job's only bound (predictions carry "
                    "it as time_limit_s)"
                )
            else:
                notes.append(
                    f"{bound} at the latest: a predicted total beyond it is cut to it "
                    "(time_limit_s)"
                )
        if self._early_stopping is None and any(is_a(cb, "EarlyStopping") for cb in callbacks):
            notes.append("EarlyStopping may end the job sooner: the total is an upper bound")
        return notes

    def _report_metric(self, trainer: Any) -> None:
        """Give the ``EarlyStopping`` monitor's current value to the hook (training only, never
        in the sanity check). Never raises."""
        early = self._early_stopping
        if not self._open or self._hook is None or early is None:
            return
        if getattr(trainer, "sanity_checking", False):
            return
        monitor = getattr(early, "monitor", None)
        metrics = getattr(trainer, "callback_metrics", None) or {}
        if not isinstance(monitor, str) or monitor not in metrics:
            return
        try:
            value = float(metrics[monitor])
        except (TypeError, ValueError, RuntimeError) as exc:
            logger.debug("%s is not a number: %r", monitor, exc)
            return
        self._hook.report_metric(monitor, value)

    def _end_eval(self) -> None:
        if self._in_eval and self._hook is not None:
            self._in_eval = False
            self._hook.end_phase()

    def _patch_save_checkpoint(self, trainer: Any) -> None:
        """Make every ``trainer.save_checkpoint`` call a checkpoint phase until close."""
        original = trainer.save_checkpoint
        previous = vars(trainer).get("save_checkpoint", _MISSING)
        callback = self

        @functools.wraps(original)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            hook = callback._hook if callback._open else None
            if hook is None:
                return original(*args, **kwargs)
            hook.begin_phase(CHECKPOINT_PHASE)
            try:
                return original(*args, **kwargs)
            finally:
                hook.end_phase()

        trainer.save_checkpoint = save_checkpoint
        self._trainer_patch = (trainer, save_checkpoint, previous)

    def _unpatch_save_checkpoint(self) -> None:
        patch, self._trainer_patch = self._trainer_patch, None
        _restore_attribute(patch, "save_checkpoint")

    def bar_items(self) -> dict[str, str]:
        """What the callback adds to Lightning's progress bar: the ETA as text.

        Returns:
            ``{"ETA": "13m32s"}`` (``format_duration``); while the job length is unknown,
            ``{"ETA": "? (0.412 s/step)"}``; empty before the first prediction, after training,
            or with ``prog_bar=False``.
        """
        hook = self._hook
        if not self.prog_bar or not self._open or hook is None:
            return {}
        if not (hook.reached_last_step or self._bar_refresh.due(hook.steps_completed)):
            return dict(self._bar_text)  # made again when due, and at the job's last step
        prediction = hook.prediction
        if prediction is None:
            return {}
        eta_s = prediction.eta_s
        if eta_s is not None and math.isfinite(eta_s):
            self._bar_text = {BAR_KEY: format_duration(eta_s)}
        else:
            self._bar_text = {BAR_KEY: f"? ({format_step_time(prediction.iteration_s)})"}
        return dict(self._bar_text)

    def _patch_progress_bar(self, trainer: Any) -> None:
        """Until close, have the Trainer's progress bar show ``bar_items`` (Lightning's
        metrics are numbers; the bar's ``get_metrics``, which its documentation says to
        override for what it shows, takes text). Wrapped on the instance; never raises."""
        self._unpatch_progress_bar()
        bar = getattr(trainer, "progress_bar_callback", None)
        original = getattr(bar, "get_metrics", None)
        if bar is None or not callable(original):
            return
        try:
            previous = vars(bar).get("get_metrics", _MISSING)
        except TypeError:  # no __dict__: the number stays in the bar
            return
        callback = self

        @functools.wraps(original)
        def get_metrics(*args: Any, **kwargs: Any) -> Any:
            items = original(*args, **kwargs)
            try:
                ours = callback.bar_items()
                return {**items, **ours} if ours else items
            except Exception as exc:  # never into the loop: the bar as it was
                logger.debug("the ETA not shown in the progress bar: %r", exc)
                return items

        try:
            bar.get_metrics = get_metrics
        except Exception as exc:  # a read-only attribute: the number stays in the bar
            logger.debug("Lightning's progress bar not wrapped: %r", exc)
            return
        self._bar_patch = (bar, get_metrics, previous)

    def _unpatch_progress_bar(self) -> None:
        patch, self._bar_patch = self._bar_patch, None
        _restore_attribute(patch, "get_metrics")

    def _close(self, outcome: str | None, error: str | None = None) -> None:
        """End an open phase, undo the patch, close the hook (``outcome`` None: replaced)."""
        if not self._open:
            return
        self._open = False
        hook = self._hook
        try:
            self._end_eval()
            self._unpatch_save_checkpoint()
            self._unpatch_progress_bar()
        finally:
            if hook is not None:
                if outcome in (None, "closed"):
                    hook.close()
                else:
                    hook.close_at_exit(outcome, error)


# What LightningCLI (jsonargparse), inspect.signature and help() read: every ETSHook option
# by name, so `init_args: {status_path: ...}` in a config is accepted.
BaseETSCallback.__init__.__signature__ = callback_signature(  # type: ignore[attr-defined]
    BaseETSCallback.__init__
)

_CLASSES: dict[str, type[BaseETSCallback]] = {}


def default_package() -> str:
    """The Lightning package ``ETSCallback`` is made for: ``lightning.pytorch`` when the
    ``lightning`` package is installed, else ``pytorch_lightning``."""
    return installed_packages()[0]


def callback_class(package: str | None = None) -> type[BaseETSCallback]:
    """The ``ETSCallback`` class for a Lightning package: ``BaseETSCallback`` + its ``Callback``.

    Made once per package and cached. Only the package asked for is imported (importing the
    other one too would change where Lightning's own log lines go).

    Args:
        package: ``"lightning.pytorch"`` or ``"pytorch_lightning"``; None: ``default_package()``.

    Returns:
        The class (named ``ETSCallback``; its module is the ``PACKAGES`` entry).

    Raises:
        ValueError: ``package`` is not one of those.
        ImportError: that package is not installed (the message names the extra).
    """
    package = default_package() if package is None else package
    if package not in PACKAGES:
        raise ValueError(f"package must be one of {sorted(PACKAGES)}, got {package!r}")
    cls = _CLASSES.get(package)
    if cls is None:
        try:
            module: ModuleType = importlib.import_module(package)
        except ModuleNotFoundError as exc:
            if exc.name not in (package, package.split(".")[0]):
                raise
            raise ImportError(f"{package} is not installed: {INSTALL_HINT}") from exc
        namespace = {
            "__module__": PACKAGES[package],
            "__qualname__": "ETSCallback",
            "__doc__": BaseETSCallback.__doc__,
            "lightning_package": package,
        }
        cls = type("ETSCallback", (BaseETSCallback, module.Callback), namespace)
        _CLASSES[package] = cls
    return cls


if TYPE_CHECKING:  # what a type checker sees: a Lightning Callback (Trainer(callbacks=[...]))
    from lightning.pytorch.callbacks import Callback as _LightningCallback

    class ETSCallback(BaseETSCallback, _LightningCallback):  # type: ignore[misc]
        """``BaseETSCallback`` as a ``lightning.pytorch.callbacks.Callback``."""

else:

    def __getattr__(name: str) -> Any:
        """``ETSCallback``: ``callback_class()``, made at first use (PEP 562)."""
        if name == "ETSCallback":
            return callback_class()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BAR_KEY",
    "CHECKPOINT_PHASE",
    "EVAL_PHASE",
    "HOOK_OPTIONS",
    "INSTALL_HINT",
    "LOG_KEYS",
    "PACKAGES",
    "BaseETSCallback",
    "ETSCallback",
    "callback_class",
    "default_package",
    "installed_packages",
    "prediction_metrics",
    "trainer_checkpoint_every",
    "trainer_checkpoint_files",
    "trainer_eval_every",
    "trainer_steps_per_epoch",
    "trainer_time_limit_s",
    "trainer_total_steps",
    "trainer_val_batches",
]
