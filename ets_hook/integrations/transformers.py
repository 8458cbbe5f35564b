"""Hugging Face ``transformers.Trainer`` integration: ``ETSTrainerCallback``.

``Trainer(..., callbacks=[ETSTrainerCallback()])`` is all a user writes. At train begin the
callback creates an ``ETSHook`` on the Trainer's model and optimizer with what the Trainer knows:

- ``total_steps`` from ``state.max_steps``, ``initial_step`` from ``state.global_step`` (resumed
  runs), ``grad_accum_steps`` from the arguments (the hook counts optimizer steps, as the Trainer's
  ``global_step`` does: Accelerate's ``AcceleratedOptimizer`` only steps the real optimizer on the
  last micro-batch of an accumulation, and its ``GradScaler``, under fp16, marks the steps whose
  optimizer step it skipped);
- ``eval_every`` / ``checkpoint_every`` from ``eval_strategy`` / ``save_strategy`` (``steps``: the
  Trainer's ``eval_steps`` / ``save_steps``; ``epoch``: optimizer steps per epoch from the train
  dataloader and the accumulation; ``best``: saves can only follow evaluations; ``no``: none);
  ``final_phases``: the Trainer's runs after the last step (an evaluation under ``epoch``, and
  under ``steps`` where the installed ``DefaultFlowCallback`` evaluates at a last step off its
  period, as 5.x does; a save under ``steps`` or ``epoch``, on their periods or not), part of
  the job's time;
- ``dataloader`` (the train dataloader): epoch start-up as a phase (a sized one) and, with
  ``dataloader_num_workers > 0``, the workers' batch pace as a floor under the step time (an
  ``IterableDataset``'s loader too; the Trainer starts iterating after ``on_train_begin``, so
  their first batches are timed).
  With a period and a sized ``eval_dataset``, evaluations are priced before the first is
  measured: its batches at ``eval_batch_size`` x a forward of a training micro-batch, plus
  the tokens each batch generates when the evaluation generates (``predict_with_generate``)
  (``forecast.job.eval_cost_prior``; ``ETSHook.expect_phase_cost``); with ``checkpoint_every``
  the hook prices each save from the model's and optimizer's state until the first is measured.

Early stopping: when the Trainer's callbacks include a ``transformers.EarlyStoppingCallback``,
the hook follows its rule (``early_stopping=EarlyStoppingRule.from_hf(early_stopping_patience,
early_stopping_threshold, greater_is_better)``) and each ``on_evaluate`` reports the monitored
metric (``metric_for_best_model``, prefixed with ``eval_`` as the Trainer does) to
``hook.report_metric``: predictions then carry ``expected_stop_step`` and ``total_range_s``. An
``early_stopping=`` option given explicitly wins over the callback's rule (the metric is still
reported when ``metric_for_best_model`` is set).

Anything passed to ``ETSTrainerCallback(**hook_options)`` goes to ``ETSHook`` and wins over what
the Trainer says (one log line when the two disagree).

Evaluation, prediction and checkpoint saving are phases, out of the step rate. Transformers has
no "evaluate begin" event: ``DefaultFlowCallback`` sets ``control.should_evaluate`` /
``should_save`` in ``on_step_end`` / ``on_epoch_end`` (it runs before user callbacks), so those
events begin the phase, and ``on_evaluate`` / ``on_save`` / ``on_predict`` end it (evaluation
comes before saving). An evaluation loop started any other way (``eval_on_start``, a
``trainer.evaluate()`` or ``trainer.predict()`` from a callback) begins its phase at its first
``on_prediction_step``. ``on_step_begin`` and ``on_train_end`` end any phase left open.

The latest prediction goes into the Trainer's logs at its logging steps (``LOG_KEYS``:
``ets/iteration_s``, ``ets/eta_s``, ``ets/total_s``): into ``state.log_history`` and into the
``logs`` dict the ``on_log`` callbacks receive. The Trainer puts the ``report_to`` integrations
before user callbacks, so a second, tiny callback (``ETSLogInjector``) is put first in the
Trainer's callback list and adds the values before any integration sees them. The ETA also goes
into the postfix of the Trainer's tqdm bar (``ProgressCallback``).

Importing this module needs transformers (``pip install 'ets-hook[transformers]'``);
``import ets_hook`` never imports it.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

try:
    from transformers import EarlyStoppingCallback, TrainerCallback
    from transformers.trainer_callback import (
        CallbackHandler,
        DefaultFlowCallback,
        ProgressCallback,
    )
    from transformers.trainer_callback import TrainerControl as _TrainerControl
except ImportError as exc:
    raise ImportError(
        "ets_hook.integrations.transformers needs Hugging Face transformers: "
        "pip install 'ets-hook[transformers]'"
    ) from exc

from ..capture.steps import optimizer_list
from ..forecast.early_stop import EarlyStoppingRule
from ..forecast.job import eval_cost_prior
from ..hook import ETSHook
from ..reporters.tqdm import TqdmReporter
from .common import (
    HOOK_ARGUMENTS,
    BarRefresh,
    callback_signature,
    check_hook_options,
    given_options,
    prediction_metrics,
    whole_number,
)
from .common import LOG_KEYS as LOG_KEYS  # re-exported: what the callback adds to the logs

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from ..forecast.prediction import Prediction

logger = logging.getLogger("ets_hook")

#: The keys our prediction adds to the Trainer's logs (``Prediction`` fields of the same name).
EVAL_PHASE = "eval"
PREDICT_PHASE = "predict"
CHECKPOINT_PHASE = "checkpoint"

# ETSHook's keyword arguments (the model is always the Trainer's).
_HOOK_OPTIONS = HOOK_ARGUMENTS - {"model"}

# How far up the stack the Trainer's CallbackHandler.call_event is looked for.
_HANDLER_FRAMES = 6


def log_values(prediction: Prediction | None) -> dict[str, float]:
    """The values ``ETSTrainerCallback`` adds to a Trainer log (``common.prediction_metrics``)."""
    return prediction_metrics(prediction)


class ETSLogInjector(TrainerCallback):
    """Adds ``ETSTrainerCallback``'s values to each training log before any other callback's
    ``on_log`` runs: ``ETSTrainerCallback`` puts it first in the Trainer's callback list. Not
    meant to be created by users."""

    def __init__(self, owner: ETSTrainerCallback) -> None:
        """Serve ``owner`` (held weakly).

        Args:
            owner: the callback whose hook's prediction is logged.
        """
        self._owner = weakref.ref(owner)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add the values to ``logs`` and to its ``state.log_history`` entry.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            logs: the log being dispatched (mutated).
            **kwargs: the Trainer's other event arguments.
        """
        owner = self._owner()
        if owner is not None:
            owner._inject(state, logs)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a weak reference is not): the owner is pickled with it."""
        return {"owner": self._owner()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild the weak reference to the owner."""
        owner = state["owner"]
        self._owner = weakref.ref(owner) if owner is not None else lambda: None


class ETSTrainerCallback(TrainerCallback):
    """An ``ETSHook`` for a ``transformers.Trainer``: ``callbacks=[ETSTrainerCallback()]``.

    Creates the hook at each ``on_train_begin`` (see the module docstring for what is read from
    the Trainer) and closes it at ``on_train_end``. Option values are checked when the callback is
    created. Nothing here raises into training, except ``ETSHook``'s own validation at train
    begin of the options together with the Trainer's values (a ``ValueError`` naming the
    argument) and ``on_deadline="raise"``.

    Attributes:
        hook: the ``ETSHook`` of the latest ``train()`` call (closed after it), or None before.
    """

    def __init__(self, **hook_options: Any) -> None:
        """Keep ``ETSHook`` options for the hook created at train begin.

        Args:
            **hook_options: keyword arguments of ``ETSHook`` (all but ``model``, which is the
                Trainer's). ``optimizer``, ``total_steps``, ``initial_step``,
                ``grad_accum_steps``, ``eval_every``, ``checkpoint_every`` and ``grad_scaler``
                are read from the Trainer unless given here; a value given here wins (one log
                line at train begin when it disagrees with the Trainer's); None for one of them
                means "not given" (``common.given_options``).

        Raises:
            TypeError: an option that is not an ``ETSHook`` keyword argument (``model``
                included).
            ValueError: an option's value ``ETSHook`` rejects, naming the option and the
                value: checked now, as ``ETSHook`` checks them (``common.check_hook_options``);
                ``ETSHook`` checks them again, with the Trainer's, at train begin.
            ImportError: ``progress=True`` without tqdm; a dashboard option without its
                package.
        """
        unknown = sorted(set(hook_options) - _HOOK_OPTIONS)
        if unknown:
            raise TypeError(
                f"ETSTrainerCallback got unexpected ETSHook option(s) {', '.join(unknown)}"
                + (" (the model is the Trainer's)" if "model" in unknown else "")
            )
        hook_options = given_options(hook_options)
        check_hook_options(hook_options)
        self._start(hook_options)

    def _start(self, hook_options: dict[str, Any]) -> None:
        """Set the callback up with checked options and no hook yet."""
        self._options = dict(hook_options)
        self.hook: ETSHook | None = None
        self._training = False
        self._phase: str | None = None
        self._in_loop = False  # an evaluation/prediction loop is running (its logs get nothing)
        self._flagged_eval = False  # the evaluation running was asked for by control flags
        self._save_best = False
        self._handler: weakref.ref[CallbackHandler] | None = None
        self._injector = ETSLogInjector(self)
        self._progress: ProgressCallback | None = None
        self._notebook: Any = None  # the Trainer's NotebookProgressCallback, in a notebook
        self._notebook_text = ""  # our text for its bar's comment
        self._shown: Prediction | None = None
        self._bar_refresh = BarRefresh()
        self._monitor: str | None = None  # the metric reported to the hook at on_evaluate

    @property
    def prediction(self) -> Prediction | None:
        """The hook's latest prediction (the final one after training); None before any."""
        return self.hook.prediction if self.hook is not None else None

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (hyperparameter search backends pickle the Trainer): the options and the
        log injector; not the hook, which lives in the process that trains."""
        return {"options": self._options, "injector": self._injector}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A callback with the pickled options (checked when first created) and no hook yet."""
        self._start(state["options"])
        self._injector = state["injector"]
        self._injector._owner = weakref.ref(self)

    # ------------------------------------------------------------------------------------------
    # Trainer events

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Put ``ETSLogInjector`` first in the Trainer's callback list.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            **kwargs: the Trainer's other event arguments.
        """
        self._adopt_handler()

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        optimizer: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        """Create the hook (closing the previous run's if still open).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (``max_steps``, ``global_step``, ``eval_steps``, ...).
            control: the Trainer's control flags.
            model: the Trainer's model (the hook's root module).
            optimizer: the Trainer's optimizer (an ``AcceleratedOptimizer``: the optimizer it
                holds is watched, and its ``GradScaler``, if any, marks the steps).
            train_dataloader: the Trainer's train dataloader (steps per epoch).
            **kwargs: the Trainer's other event arguments.

        Raises:
            ValueError: from ``ETSHook``: the options and the Trainer's values together are
                invalid (each option alone was checked when the callback was created).
        """
        self._adopt_handler()
        self._close_hook(finished=False, retry=bool(getattr(args, "auto_find_batch_size", False)))
        options, disagree = self._hook_options(args, state, optimizer, train_dataloader)
        self._save_best = _strategy(args, "save_strategy") == "best"
        self._phase, self._in_loop, self._flagged_eval, self._shown = None, False, False, None
        self._bar_refresh = BarRefresh()
        self._monitor = _monitored_metric(args) if "early_stopping" in options else None
        self.hook = ETSHook(model, **options)
        self.hook.expect_explicit_close()  # open past train(): it raised (on_train_end: closed)
        self._training = True
        if "eval_dataloader" not in options and options.get("eval_every"):
            self._price_evaluation(args, options.get("grad_accum_steps", 1))
        if disagree:  # after the hook: its console handler shows the line
            logger.info(
                "ETSTrainerCallback uses the values given explicitly: %s",
                "; ".join(disagree),
            )

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """End a phase left open (a ``save_strategy="best"`` evaluation that saved nothing).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            **kwargs: the Trainer's other event arguments.
        """
        self._end_phase()
        self._flagged_eval = False

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Show the ETA on the Trainer's bar; begin the evaluation or checkpoint phase the
        control flags announce.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags (set by ``DefaultFlowCallback``).
            **kwargs: the Trainer's other event arguments.
        """
        if not self._training:
            return
        self._show_progress()
        self._phase_from_flags(control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Begin the evaluation or checkpoint phase of an epoch strategy.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags (set by ``DefaultFlowCallback``).
            **kwargs: the Trainer's other event arguments.
        """
        if self._training:
            self._phase_from_flags(control)

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """An evaluation or prediction loop runs: its phase begins here unless the control
        flags began it already.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            **kwargs: the Trainer's other event arguments.
        """
        if not self._training or self._in_loop:
            return
        self._in_loop = True
        if self._phase not in (EVAL_PHASE, PREDICT_PHASE):
            self._begin_phase(_loop_phase())

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """End the evaluation phase (reporting the early-stopping metric to the hook); begin the
        checkpoint phase when a save follows.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            metrics: the evaluation's metrics (the monitored one goes to ``report_metric``).
            **kwargs: the Trainer's other event arguments.
        """
        if not self._training:
            return
        self._in_loop = False
        self._end_phase()
        self._report_metric(metrics)
        # save_strategy="best": whether it saves is decided after this event; a phase that
        # saved nothing ends at the next step's begin (same step: one occurrence, its cost the
        # expected save cost per evaluation).
        if control.should_save or (self._save_best and self._flagged_eval):
            self._begin_phase(CHECKPOINT_PHASE)

    def on_predict(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """End the prediction phase.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            **kwargs: the Trainer's other event arguments (``metrics``).
        """
        if self._training:
            self._in_loop = False
            self._end_phase()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """End the checkpoint phase (the checkpoint is written when this event comes).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            **kwargs: the Trainer's other event arguments.
        """
        if self._training:
            self._end_phase()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add the values here when ``ETSLogInjector`` could not be put first (then only the
        callbacks after this one and ``state.log_history`` get them).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            logs: the log being dispatched (mutated).
            **kwargs: the Trainer's other event arguments.
        """
        if not self._injector_first():
            self._inject(state, logs)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """End any open phase, show the final prediction on the bar, close the hook.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control flags.
            **kwargs: the Trainer's other event arguments.
        """
        self._close_hook()

    # ------------------------------------------------------------------------------------------
    # Internals

    def _hook_options(
        self, args: TrainingArguments, state: TrainerState, optimizer: Any, dataloader: Any
    ) -> tuple[dict[str, Any], list[str]]:
        """``ETSHook`` keyword arguments (the Trainer's values, then the explicit ones) and a
        description of each explicit value that disagrees with the Trainer's."""
        found = _trainer_options(args, state, optimizer, dataloader)
        rule = self._early_stopping_rule(args)
        if rule is not None:
            found["early_stopping"] = rule
        explicit = self._options
        if "optimizer" in explicit or "grad_scaler" in explicit:
            found.pop("grad_scaler", None)  # the Trainer's scaler goes with its optimizer only
        disagree = [
            f"{name}={_describe(explicit[name])} (the Trainer's: {_describe(found[name])})"
            for name in found
            if name in explicit and not _same(name, explicit[name], found[name])
        ]
        options = {**found, **explicit}
        if "optimizer" in explicit:
            given = explicit["optimizer"]
            options["optimizer"] = (
                [_held_optimizer(o) for o in given]
                if isinstance(given, (list, tuple))
                else _held_optimizer(given)
            )
        return options, disagree

    def _price_evaluation(self, args: TrainingArguments, grad_accum_steps: int) -> None:
        """Price the evaluations before the first is measured (``ETSHook.expect_phase_cost``):
        the Trainer's evaluation batches (``eval_dataset`` at ``args.eval_batch_size``), each a
        forward of a training micro-batch scaled by the batch sizes, and the tokens each batch
        generates when the evaluation generates (``_generation``). Never raises: without a
        sized evaluation set, evaluations count as 0 until the first is measured."""
        trainer = _running_trainer(self._handler() if self._handler is not None else None)
        batches = _eval_batches(trainer, args) if trainer is not None else None
        if not batches or self.hook is None:
            return
        try:
            ratio = float(args.eval_batch_size) / float(args.train_batch_size)
            tokens, beams = _generation(trainer, args)
            prior = eval_cost_prior(
                batches, ratio, grad_accum_steps, generated_tokens=tokens, num_beams=beams
            )
        except (AttributeError, TypeError, ValueError, ZeroDivisionError):
            return
        self.hook.expect_phase_cost(EVAL_PHASE, train_steps=prior.train_steps, rel_ci=prior.rel_ci)

    def _early_stopping_rule(self, args: TrainingArguments) -> EarlyStoppingRule | None:
        """The rule of the Trainer's ``EarlyStoppingCallback``, if it has one (and
        ``metric_for_best_model``, without which that callback does nothing). Never raises."""
        handler = self._handler() if self._handler is not None else None
        if handler is None or _monitored_metric(args) is None:
            return None
        early = next(
            (cb for cb in handler.callbacks if isinstance(cb, EarlyStoppingCallback)), None
        )
        if early is None:
            return None
        try:
            return EarlyStoppingRule.from_hf(
                early.early_stopping_patience,
                early.early_stopping_threshold or 0.0,
                bool(getattr(args, "greater_is_better", False)),
            )
        except (ValueError, TypeError) as exc:
            logger.info("EarlyStoppingCallback not followed: %r", exc)
            return None

    def _report_metric(self, metrics: dict[str, Any] | None) -> None:
        """Give the monitored metric of an evaluation to the hook (never raises)."""
        if self.hook is None or self._monitor is None or not isinstance(metrics, dict):
            return
        value = metrics.get(self._monitor)
        if isinstance(value, (int, float, torch.Tensor)) and not isinstance(value, bool):
            self.hook.report_metric(self._monitor, float(value))

    def _phase_from_flags(self, control: TrainerControl) -> None:
        if control.should_evaluate:
            self._flagged_eval = True
            self._begin_phase(EVAL_PHASE)
        elif control.should_save:
            self._begin_phase(CHECKPOINT_PHASE)

    def _begin_phase(self, name: str) -> None:
        if self._phase == name or self.hook is None:
            return
        self._end_phase()
        self.hook.begin_phase(name)
        self._phase = name

    def _end_phase(self) -> None:
        if self._phase is not None and self.hook is not None:
            self._phase = None
            self.hook.end_phase()

    def _close_hook(self, *, finished: bool = True, retry: bool = False) -> None:
        """Close the hook: the run ``finished`` (``on_train_end``), or it is the previous
        ``train()``'s, still open because that call raised (closed as interrupted; ``retry``:
        the Trainer may have started its loop again itself, ``auto_find_batch_size``)."""
        if self.hook is None:
            return
        self._end_phase()
        self._training = False
        self._in_loop = False
        if finished:
            self.hook.close()
        elif not self.hook.closed:
            logger.warning(
                "the previous training loop stopped at step %d without ending (%s): closed as "
                "interrupted; this loop gets a new hook",
                self.hook.steps_completed,
                "an exception, or auto_find_batch_size retrying at a smaller batch size"
                if retry
                else "an exception",
            )
            self.hook.close_at_exit("interrupted", None)
        self._show_progress(final=True)

    def _inject(self, state: TrainerState, logs: dict[str, Any] | None) -> None:
        """Add ``log_values`` to a training log and to its ``state.log_history`` entry (the
        Trainer appends a copy of ``logs`` plus ``step`` there before calling ``on_log``).
        Evaluation and prediction logs get nothing; the closing summary (``train_runtime``)
        closes the hook first and gets the job as it ran. Never raises."""
        if not self._training or self._in_loop or not isinstance(logs, dict):
            return
        try:
            if _closing_summary(logs) and self.hook is not None:
                # The Trainer's closing summary: training is over (an early stop ends it
                # before max_steps), so it gets the final values, not an ETA.
                self.hook.close()
            values = log_values(self.prediction)
            if not values:
                return
            history = getattr(state, "log_history", None)
            entry = history[-1] if history else None
            if isinstance(entry, dict) and all(entry.get(k) is v for k, v in logs.items()):
                entry.update(values)
            logs.update(values)
        except Exception as exc:  # a log without our values, never a failed training
            logger.debug("could not add the prediction to the Trainer's log: %r", exc)

    def _show_progress(self, *, final: bool = False) -> None:
        """Our ETA on the Trainer's progress bar: the postfix of its tqdm bar (redrawn by its
        next update), or in a notebook the comment of its HTML bar (``_annotate_notebook``):
        when ``BarRefresh`` says it is due, and the ``final`` one at close."""
        bar = getattr(self._progress, "training_bar", None)
        tracker = getattr(self._notebook, "training_tracker", None)
        if (bar is None and tracker is None) or self.hook is None:
            return
        if not (final or self._bar_refresh.due(self.hook.steps_completed)):
            return
        prediction = self.prediction
        if prediction is None or prediction is self._shown:
            return
        self._shown = prediction
        try:
            text = TqdmReporter.postfix(prediction)
            if bar is not None:
                bar.set_postfix_str(text, refresh=False)
            if tracker is not None:
                self._notebook_text = text
                _annotate_notebook(tracker, weakref.ref(self))
        except Exception as exc:
            logger.debug("could not annotate the Trainer's progress bar: %r", exc)

    def _adopt_handler(self) -> None:
        """Find the Trainer's ``CallbackHandler`` (the caller of this event), put
        ``ETSLogInjector`` first in its list and remember its ``ProgressCallback``."""
        try:
            self._adopt(self._handler() if self._handler is not None else None)
        except Exception as exc:  # the values then reach fewer places; training goes on
            logger.debug("could not arrange the Trainer's callbacks: %r", exc)

    def _adopt(self, handler: CallbackHandler | None) -> None:
        if handler is None or not any(cb is self for cb in handler.callbacks):
            handler = _calling_handler(self)
        if handler is None:
            logger.debug(
                "the Trainer's callback list was not found; the ets/ values reach "
                "state.log_history and the callbacks after ETSTrainerCallback only"
            )
            return
        self._handler = weakref.ref(handler)
        if not self._injector_first():
            others = [cb for cb in handler.callbacks if cb is not self._injector]
            # A new list: an event being dispatched goes on over the old one.
            handler.callbacks = [self._injector, *others]
        self._progress = next(
            (cb for cb in handler.callbacks if isinstance(cb, ProgressCallback)), None
        )
        # In a notebook the Trainer shows an HTML bar instead (transformers.utils.notebook:
        # matched by name, so that its IPython import is never ours).
        self._notebook = next(
            (
                cb
                for cb in handler.callbacks
                if any(c.__name__ == NOTEBOOK_PROGRESS for c in type(cb).__mro__)
            ),
            None,
        )

    def _injector_first(self) -> bool:
        handler = self._handler() if self._handler is not None else None
        return (
            handler is not None
            and bool(handler.callbacks)
            and handler.callbacks[0] is self._injector
        )


#: The class name of the Trainer's progress callback in notebooks (an HTML bar, not tqdm).
NOTEBOOK_PROGRESS = "NotebookProgressCallback"


def _annotate_notebook(tracker: Any, owner: weakref.ref[ETSTrainerCallback]) -> None:
    """Have the notebook bar's comment (``Epoch 1/3``, which the Trainer sets at each of its
    updates) end with ``owner``'s text: its ``update`` is wrapped once, on the instance, for
    as long as the bar lives (the Trainer drops it at train end). Never raises."""
    if getattr(tracker, "_ets_annotated", False):
        return
    original = tracker.update

    def update(value: int, force_update: bool = False, comment: str | None = None) -> Any:
        callback = owner()
        text = callback._notebook_text if callback is not None else ""
        if text and comment is not None:
            comment = f"{comment} · {text}"
        return original(value, force_update=force_update, comment=comment)

    try:
        tracker.update = update
        tracker._ets_annotated = True
    except Exception as exc:  # a bar that takes no attributes: the log lines still say it
        logger.debug("could not annotate the notebook progress bar: %r", exc)


# --------------------------------------------------------------------------------------------
# Reading the Trainer


# What inspect.signature and help() show: every ETSHook option, not only **hook_options.
ETSTrainerCallback.__init__.__signature__ = callback_signature(  # type: ignore[attr-defined]
    ETSTrainerCallback.__init__
)


def _trainer_options(
    args: TrainingArguments, state: TrainerState, optimizer: Any, dataloader: Any
) -> dict[str, Any]:
    """What the Trainer says about the job, as ``ETSHook`` keyword arguments."""
    accum = whole_number(getattr(args, "gradient_accumulation_steps", 1), 1) or 1
    done = whole_number(getattr(state, "global_step", 0), 0) or 0
    total = whole_number(getattr(state, "max_steps", None), 1)
    found: dict[str, Any] = {
        # A resumed run whose checkpoint is past max_steps ends at once; keep the hook valid.
        "total_steps": max(total, done) if total is not None else None,
        "initial_step": done,
        "grad_accum_steps": accum,
    }
    try:
        per_epoch: int | None = max(math.ceil(len(dataloader) / accum), 1)
    except TypeError:  # an iterable dataset (or no dataloader): no epoch length
        per_epoch = None
        if dataloader is not None:  # its workers are still timed, from the same point on
            found["dataloader"] = dataloader
    else:
        # Its epochs (start-up at each) and, with worker processes, their pace: the Trainer
        # starts iterating it after on_train_begin, so the hook can time its workers.
        found["dataloader"] = dataloader
    eval_every = _period(
        _strategy(args, "eval_strategy", "evaluation_strategy"),
        _first_count(getattr(state, "eval_steps", None), getattr(args, "eval_steps", None)),
        per_epoch,
    )
    save_strategy = _strategy(args, "save_strategy")
    checkpoint_every = (
        eval_every
        if save_strategy == "best"
        else _period(
            save_strategy,
            _first_count(getattr(state, "save_steps", None), getattr(args, "save_steps", None)),
            per_epoch,
        )
    )
    found["eval_every"] = eval_every
    found["checkpoint_every"] = checkpoint_every
    # After its last step the Trainer evaluates once more under the "epoch" strategy (its epoch
    # ends there) and, in the transformers versions that do it, under "steps" off its period;
    # it saves once more under "steps" or "epoch", on their periods or not.
    eval_strategy = _strategy(args, "eval_strategy", "evaluation_strategy")
    final = (
        [EVAL_PHASE]
        if eval_strategy == "epoch" or (eval_strategy == "steps" and _evaluates_at_the_end())
        else []
    )
    if save_strategy in ("steps", "epoch"):
        final.append(CHECKPOINT_PHASE)
    if final:
        found["final_phases"] = tuple(final)
    if optimizer is not None:
        try:
            optimizer_list(_held_optimizer(optimizer))
        except ValueError:
            logger.info(
                "the Trainer's optimizer (%s) holds no torch optimizer; steps are "
                "marked by any optimizer's step or the model's forwards",
                type(optimizer).__name__,
            )
        else:
            found["optimizer"] = _held_optimizer(optimizer)
            scaler = getattr(optimizer, "scaler", None)  # AcceleratedOptimizer under fp16
            if scaler is not None and callable(getattr(scaler, "update", None)):
                found["grad_scaler"] = scaler
    return found


def _caller_self(matches: Callable[[Any], bool], frames: int) -> Any:
    """The first ``self`` that ``matches`` among the ``frames`` callers of this function's
    caller (innermost first); None if none does."""
    frame = sys._getframe(2)
    for _ in range(frames):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and matches(owner):
            return owner
        frame = frame.f_back
    return None


def _running_trainer(handler: Any) -> Any:
    """The ``Trainer`` whose callback handler is ``handler``, found among the few callers of
    the event being dispatched (callbacks are not given the Trainer); None if not found."""
    if handler is None:
        return None
    return _caller_self(
        lambda owner: getattr(owner, "callback_handler", None) is handler, 2 * _HANDLER_FRAMES
    )


def _eval_batches(trainer: Any, args: Any) -> int | None:
    """Batches in one of the Trainer's evaluations (every ``eval_dataset`` if it holds
    several), at ``args.eval_batch_size``; None when a set has no length."""
    datasets = getattr(trainer, "eval_dataset", None)
    if datasets is None:
        return None
    sets = list(datasets.values()) if isinstance(datasets, dict) else [datasets]
    try:
        size = int(args.eval_batch_size)
        drop_last = bool(getattr(args, "dataloader_drop_last", False))
        counts = [len(d) // size if drop_last else math.ceil(len(d) / size) for d in sets]
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None
    return sum(counts)


@functools.cache
def _evaluates_at_the_end() -> bool:
    """Whether this transformers' ``DefaultFlowCallback`` evaluates at the last step when it is
    off the ``eval_steps`` period (5.x does, 4.x did not): asked of the callback itself, on a
    3-step job evaluating every 2 steps. Never raises (False when the probe fails)."""
    try:
        args = SimpleNamespace(
            logging_first_step=False,
            logging_strategy="no",
            eval_strategy="steps",
            evaluation_strategy="steps",
            eval_delay=0,
            save_strategy="no",
        )
        state = SimpleNamespace(
            global_step=3, max_steps=3, eval_steps=2, save_steps=0, logging_steps=1, epoch=1.0
        )
        control = _TrainerControl()
        DefaultFlowCallback().on_step_end(args, state, control)
        return bool(control.should_evaluate)
    except Exception as exc:  # an unknown flow: the 4.x rule
        logger.debug("could not ask DefaultFlowCallback about its last evaluation: %r", exc)
        return False


def _closing_summary(logs: dict[str, Any]) -> bool:
    """Whether ``logs`` is the Trainer's closing summary (``train_runtime`` with
    ``train_loss`` and ``total_flos``): with ``include_num_input_tokens_seen`` every training
    log carries ``train_runtime`` too."""
    return "train_runtime" in logs and "train_loss" in logs and "total_flos" in logs


def _generation(trainer: Any, args: Any) -> tuple[int, int]:
    """``(tokens generated per sequence, beams)`` of each evaluation batch: ``(0, 1)`` unless
    the evaluation generates, as a ``Seq2SeqTrainer``'s does with ``predict_with_generate``
    when it has ``compute_metrics`` (without, the Trainer evaluates the loss only) and
    ``prediction_loss_only`` is off. The length is ``generation_max_length``, else the model's
    ``generation_config`` (``max_new_tokens``, else ``max_length``); the beams
    ``generation_num_beams``, else the config's ``num_beams``. Never raises."""
    if not getattr(args, "predict_with_generate", False) or getattr(
        args, "prediction_loss_only", False
    ):
        return 0, 1
    if getattr(trainer, "compute_metrics", None) is None:
        return 0, 1
    config = getattr(getattr(trainer, "model", None), "generation_config", None)
    length = _count(getattr(args, "generation_max_length", None))
    if length is None:
        length = _count(getattr(config, "max_new_tokens", None))
    if length is None:
        length = _count(getattr(config, "max_length", None)) or 20  # transformers' default
    beams = _count(getattr(args, "generation_num_beams", None))
    if beams is None:
        beams = _count(getattr(config, "num_beams", None)) or 1
    return length, beams


def _count(value: Any) -> int | None:
    """``value`` when it is an int >= 1 (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _monitored_metric(args: Any) -> str | None:
    """The metric key ``EarlyStoppingCallback`` reads: ``metric_for_best_model`` prefixed with
    ``eval_`` unless it starts with it; None when it is not set."""
    name = getattr(args, "metric_for_best_model", None)
    if not isinstance(name, str) or not name:
        return None
    return name if name.startswith("eval_") else f"eval_{name}"


def _held_optimizer(optimizer: Any) -> Any:
    """The torch optimizer an Accelerate ``AcceleratedOptimizer`` holds, else ``optimizer``.

    ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer`` without running its
    ``__init__``: step hooks cannot be registered on it, only on the optimizer it holds (whose
    ``step`` it calls on the last micro-batch of each accumulation).
    """
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and not hasattr(
        optimizer, "_optimizer_step_pre_hooks"
    ):
        return inner
    return optimizer


def _strategy(args: Any, *names: str) -> str:
    """An ``IntervalStrategy``/``SaveStrategy`` argument as its string value (``"no"`` if
    absent)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            return str(getattr(value, "value", value))
    return "no"


def _period(strategy: str, steps: int | None, per_epoch: int | None) -> int | None:
    if strategy == "steps":
        return steps
    if strategy == "epoch":
        return per_epoch
    return None


def _first_count(*values: Any) -> int | None:
    return next((c for c in (whole_number(v, 1) for v in values) if c is not None), None)


def _same(name: str, explicit: Any, found: Any) -> bool:
    if found is None:
        return True  # the Trainer says nothing: no disagreement
    if name == "optimizer":
        try:
            return [id(o) for o in optimizer_list(_held_optimizer(explicit))] == [
                id(o) for o in optimizer_list(found)
            ]
        except ValueError:
            return False
    if name == "grad_scaler":
        return explicit is found
    if name == "early_stopping":
        try:
            return EarlyStoppingRule.coerce(explicit) == found
        except ValueError:
            return False
    return explicit == found


def _describe(value: Any) -> str:
    simple = (int, float, str, type(None))
    if isinstance(value, (*simple, EarlyStoppingRule)):
        return repr(value)
    if isinstance(value, tuple) and all(isinstance(v, simple) for v in value):
        return repr(value)
    return type(value).__name__


def _calling_handler(callback: ETSTrainerCallback) -> CallbackHandler | None:
    """The ``CallbackHandler`` dispatching the current event to ``callback``, from the stack."""
    return _caller_self(
        lambda owner: (
            isinstance(owner, CallbackHandler) and any(cb is callback for cb in owner.callbacks)
        ),
        _HANDLER_FRAMES,
    )


def _loop_phase() -> str:
    """``"predict"`` when the running evaluation loop is ``Trainer.predict``'s, else ``"eval"``."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        if frame.f_globals.get("__name__", "").startswith("transformers."):
            if frame.f_code.co_name == "predict":
                return PREDICT_PHASE
            if frame.f_code.co_name == "evaluate":
                return EVAL_PHASE
        frame = frame.f_back
    return EVAL_PHASE
