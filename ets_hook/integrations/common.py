"""What the framework integrations share: which ``ETSHook`` options a callback accepts, how
their values are checked when the callback is created, the metrics they log, and reading counts
from a framework's (loosely typed) state."""

from __future__ import annotations

import inspect
import math
import time
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..capture.steps import optimizer_list
from ..capture.sysinfo import checked_trace_path, distributed_rank
from ..capture.window import DEFAULT_SKIP_STEPS, MAX_ADAPTIVE_CAPTURE_STEPS, check_window_settings
from ..distributed.coordinator import check_exchange_timeout
from ..forecast.early_stop import EarlyStoppingRule
from ..forecast.forecaster import check_time_limit_s
from ..forecast.job import JobModel, eval_prior_from_loaders
from ..forecast.trace_estimators import check_trace_estimator
from ..hook import ETSHook
from ..hook_arguments import (
    check_checkpoint_options,
    check_switches,
    checked_device,
    checked_grad_scaler,
    plain_number,
)
from ..reporters.builder import build_reporters, check_log_every

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

_HOOK_PARAMETERS = inspect.signature(ETSHook.__init__).parameters

#: Every keyword argument of ``ETSHook`` (``model`` included: a callback may exclude it).
HOOK_ARGUMENTS = frozenset(_HOOK_PARAMETERS) - {"self"}

#: ``ETSHook``'s default of each argument that has one.
HOOK_DEFAULTS: dict[str, Any] = {
    name: p.default for name, p in _HOOK_PARAMETERS.items() if p.default is not p.empty
}

#: The ``ETSHook`` argument a callback's signature leaves out: the model is the framework's.
_NOT_IN_CALLBACK_SIGNATURE = frozenset({"self", "model"})

#: ``ETSHook`` options a framework callback reads from the framework (the Trainer's optimizer,
#: length, accumulation, evaluation and checkpoint schedules, ...) unless they are given.
FRAMEWORK_OPTIONS = frozenset(
    {
        "optimizer",
        "grad_scaler",
        "total_steps",
        "initial_step",
        "grad_accum_steps",
        "steps_per_epoch",
        "dataloader",
        "eval_every",
        "checkpoint_every",
        "checkpoint_files",
        "checkpoint_in_memory",
        "final_phases",
        "early_stopping",
        "time_limit_s",
    }
)

#: A callback's default of each option: ``ETSHook``'s, but None ("read from the framework")
#: for ``FRAMEWORK_OPTIONS``.
CALLBACK_DEFAULTS: dict[str, Any] = {
    name: None if name in FRAMEWORK_OPTIONS else default for name, default in HOOK_DEFAULTS.items()
}


def given_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a callback was given, less those at the callback's default
    (``CALLBACK_DEFAULTS``).

    Configuration tools (LightningCLI's ``init_args``, jsonargparse) pass every parameter of
    the callback's signature (``callback_signature``), given or not. A framework's option left
    at None is read from the framework (``grad_accum_steps=None``: the Trainer's accumulation;
    ``grad_accum_steps=1`` is given, and wins over the Trainer's with one log line); any other
    option at ``ETSHook``'s own default is what ``ETSHook`` would use anyway. Only plain values
    compare equal (``None``, ``str``, numbers, ``bool``, tuples of them, or a list where the
    default is a tuple).

    Args:
        options: ``ETSHook`` keyword arguments.

    Returns:
        A new dict of those that differ from the callback's defaults.
    """
    return {name: value for name, value in options.items() if not _is_default(name, value)}


def _is_default(name: str, value: Any) -> bool:
    if name not in CALLBACK_DEFAULTS:
        return False
    default = CALLBACK_DEFAULTS[name]
    if value is default:
        return True
    if isinstance(default, tuple) and isinstance(value, list):
        value = tuple(value)  # a config file's list for a tuple default
    plain = (str, int, float, bool, tuple)
    return type(value) is type(default) and isinstance(default, plain) and value == default


def callback_signature(init: Any) -> inspect.Signature:
    """The signature a callback's ``__init__(self, ..., **hook_options)`` shows: its own named
    parameters, then every ``ETSHook`` argument but ``model`` as keyword-only, with
    ``ETSHook``'s annotations (resolved where they can be) and the callback's defaults
    (``CALLBACK_DEFAULTS``: None, "read from the framework", for ``FRAMEWORK_OPTIONS``).

    What ``inspect.signature``, ``help()`` and configuration tools read (LightningCLI builds a
    callback's options from it; ``**hook_options`` alone would make every option unknown to it).
    The ``__init__`` still takes only these (another name is a ``TypeError``).

    Args:
        init: the callback's ``__init__``.

    Returns:
        The signature, to be set as ``init.__signature__``.
    """
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    try:
        hints = typing.get_type_hints(ETSHook.__init__)
    except Exception:  # a name only a type checker sees: keep the text
        hints = {}
    taken = {p.name for p in own}
    options = []
    for name, parameter in _HOOK_PARAMETERS.items():
        if name in _NOT_IN_CALLBACK_SIGNATURE or name in taken:
            continue
        annotation = hints.get(name, parameter.annotation)
        default = CALLBACK_DEFAULTS.get(name, parameter.default)
        if default is None and parameter.default is not None and name in hints:
            annotation = typing.Optional[annotation]  # noqa: UP045 - a runtime object
        options.append(
            parameter.replace(kind=parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        )
    return inspect.Signature(own + options, return_annotation=None)


#: ``ETSHook``'s options that go to ``reporters.builder.build_reporters`` (as hook.py passes
#: them), and the two named differently there.
_REPORTER_OPTIONS = (
    "log_every",
    "verbose",
    "progress",
    "status_path",
    "on_prediction",
    "deadline",
    "on_deadline",
    "deadline_policy",
    "tensorboard_dir",
    "prometheus_port",
    "prometheus_textfile",
    "dashboard_ranks",
    "log_ranks",
)
_REPORTER_ARGUMENTS = {"log_every": "log_every_n_steps"}

# Counts of the job, each checked on its own as ETSHook checks it (JobModel.from_args): with
# the framework's values added later, only a combination can still fail at training start.
_JOB_COUNTS = (
    "total_steps",
    "steps_per_epoch",
    "grad_accum_steps",
    "eval_every",
    "checkpoint_every",
    "initial_step",
)


def check_hook_options(options: Mapping[str, Any]) -> None:
    """Check the values of ``ETSHook`` options given to a framework callback, when the callback
    is created: what ``ETSHook`` would reject, found before any model, Trainer or hook exists.

    Each option is checked by the code ``ETSHook`` checks it with (the same messages): the
    counts one by one (``JobModel.from_args``), the capture window, the optimizer, paths
    (``trace_path``, ``status_path``, dashboards: their folder must exist), the deadline, the
    early-stopping rule, the time limit, the reporters' options (their constructors, which
    open nothing). Combinations with what the framework supplies (``initial_step`` past the
    Trainer's total, ...) are still checked by ``ETSHook`` when training starts. Nothing is
    written, opened or registered anywhere.

    Args:
        options: ``ETSHook`` keyword arguments (names already known to be ``ETSHook``'s).

    Raises:
        ValueError: an option's value ``ETSHook`` rejects, naming the option and the value.
        ImportError: ``progress=True`` without tqdm; a dashboard option without its package.
    """
    given = {name: plain_number(value) for name, value in options.items()}

    def value(name: str) -> Any:
        return given.get(name, HOOK_DEFAULTS.get(name))

    check_switches(value("capture_kernels"), value("decode_in_background"))
    if "model" in given and not isinstance(given["model"], torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(given['model']).__name__}")
    for name in _JOB_COUNTS:
        if name in given:
            JobModel.from_args(**{name: given[name]})
    if "total_steps" in given and "initial_step" in given:
        JobModel.from_args(total_steps=given["total_steps"], initial_step=given["initial_step"])
    if given.get("epochs") is not None:
        JobModel.from_args(epochs=given["epochs"], steps_per_epoch=1)
    if given.get("dataloader") is not None:
        JobModel.from_args(dataloader=given["dataloader"])
    phase_every = given.get("phase_every")
    if isinstance(phase_every, Mapping):
        phase_every = {name: plain_number(every) for name, every in phase_every.items()}
    JobModel.from_args(phase_every=phase_every, final_phases=given.get("final_phases", ()))
    if given.get("eval_dataloader") is not None:
        eval_prior_from_loaders(given["eval_dataloader"], given.get("dataloader"))
    capture_steps, skip_steps = value("capture_steps"), value("skip_steps")
    check_window_settings(
        MAX_ADAPTIVE_CAPTURE_STEPS if capture_steps is None else capture_steps,
        DEFAULT_SKIP_STEPS if skip_steps is None else skip_steps,
        value("op_capture"),
        value("record_shapes"),
    )
    optimizer_list(given.get("optimizer"))
    rank, world_size = distributed_rank()
    checked_trace_path(given.get("trace_path"), rank, world_size)
    EarlyStoppingRule.coerce(given.get("early_stopping"))
    check_checkpoint_options(value("checkpoint_files"), value("checkpoint_in_memory"))
    check_time_limit_s(given.get("time_limit_s"))
    check_exchange_timeout(value("rank_exchange_timeout_s"))
    check_log_every(value("log_every"), "log_every")
    checked_grad_scaler(given.get("grad_scaler"))
    checked_device(given.get("device"))
    check_trace_estimator(value("trace_estimator"))
    build_reporters(  # as ETSHook builds them (hook.py), dropped: none opens anything
        **{_REPORTER_ARGUMENTS.get(name, name): value(name) for name in _REPORTER_OPTIONS},
        rank=rank,
        world_size=world_size,
        configure_logging=False,
    )


def whole_number(value: Any, minimum: int | None = None) -> int | None:
    """``value`` as an int when it is a finite whole number (an int, or a float such as 12.0),
    at least ``minimum`` when given; else None (bools, strings, NaN, infinity included).

    Args:
        value: what the framework reports (``trainer.max_steps``, ``state.global_step``, ...).
        minimum: the smallest value accepted; None: any.

    Returns:
        The int, or None.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value != int(value):
        return None
    number = int(value)
    return number if minimum is None or number >= minimum else None


#: A framework's progress bar gets our text at every one of the job's first
#: ``BAR_EAGER_STEPS`` steps (where the prediction moves most), then at most every
#: ``BAR_REFRESH_S``: reading a prediction costs ~0.1-0.2 ms, a tenth of a fast job's step,
#: and a bar redraws a few times a second at most.
BAR_EAGER_STEPS = 16
BAR_REFRESH_S = 0.5


class BarRefresh:
    """When a progress bar's ETA text is due again (``BAR_EAGER_STEPS``, ``BAR_REFRESH_S``)."""

    def __init__(self) -> None:
        self._at_s = -math.inf

    def due(self, steps_completed: int) -> bool:
        """Whether to make the text again now (and, if so, note the time).

        Args:
            steps_completed: the hook's steps so far.

        Returns:
            True within the first ``BAR_EAGER_STEPS`` steps or ``BAR_REFRESH_S`` after the
            last time it said True.
        """
        now_s = time.monotonic()
        if steps_completed > BAR_EAGER_STEPS and now_s - self._at_s < BAR_REFRESH_S:
            return False
        self._at_s = now_s
        return True


#: The metrics both integrations log, named after the ``Prediction`` fields they hold.
LOG_KEYS = ("ets/iteration_s", "ets/eta_s", "ets/total_s")


def prediction_metrics(prediction: Prediction | None) -> dict[str, float]:
    """The logged values of a prediction.

    Args:
        prediction: the hook's prediction, or None.

    Returns:
        ``{"ets/iteration_s": ..., "ets/eta_s": ..., "ets/total_s": ...}`` as floats; a key is
        left out while its value is unknown (no job length: no ETA, no total) or not finite
        (empty for None).
    """
    if prediction is None:
        return {}
    out: dict[str, float] = {}
    for key in LOG_KEYS:
        value = getattr(prediction, key.removeprefix("ets/"))
        if value is not None and math.isfinite(value):
            out[key] = float(value)
    return out
