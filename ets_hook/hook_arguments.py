"""Checks and coercions of ``ETSHook``'s constructor arguments, shared with the framework
callbacks (``integrations``), which check what they pass on before a hook exists.

Every check raises ``ValueError`` naming the argument and its value; nothing here has side
effects beyond one warning (``warn_if_deadline_past``).
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from datetime import datetime
from typing import Any

import torch

from .forecast.text import format_duration

logger = logging.getLogger("ets_hook")


#: Device types ``device=`` may name: the CPU, CUDA (steps timed on the device too), and the
#: accelerators whose steps the hook times on the host, as for a model found there.
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def _device_available(device: torch.device) -> bool:
    """Whether this process can use ``device`` (its type available, its index in range)."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return count > 0 and (device.index is None or device.index < count)
    if device.type == "mps":
        return torch.backends.mps.is_available()
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and bool(xpu.is_available())


def checked_device(device: Any) -> torch.device | None:
    """``ETSHook``'s ``device=`` as a ``torch.device``, checked.

    Args:
        device: None, a device string or ``torch.device`` of a type in ``DEVICE_TYPES``, or an
            int ``N`` (as in torch: ``cuda:N``).

    Returns:
        The device; None for None.

    Raises:
        ValueError: naming ``device`` and its value: not a device torch accepts, of a type
            not in ``DEVICE_TYPES``, or one this process cannot use (no CUDA, an index past
            the devices there are, ...).
    """
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise ValueError(
            f"device must be a device string (e.g. 'cpu', 'cuda:0'), a torch.device, an int "
            f"(a CUDA device index) or None, got {device!r}"
        )
    try:
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"device must be a device of type {'/'.join(DEVICE_TYPES)} (e.g. 'cpu', 'cuda:0'), "
            f"got {device!r}: not a device torch knows"
        ) from None
    if resolved.type not in DEVICE_TYPES:
        raise ValueError(
            f"device must be of type {'/'.join(DEVICE_TYPES)}, got {device!r} (type "
            f"{resolved.type!r}: ets-hook does not time steps there)"
        )
    if not _device_available(resolved):
        what = f"an int names a CUDA device ({resolved})" if isinstance(device, int) else ""
        if resolved.type == "cuda" and torch.cuda.is_available():
            reason = f"this process sees {torch.cuda.device_count()} CUDA device(s)"
        else:
            reason = f"{resolved.type} is not available in this process"
        raise ValueError(
            f"device={device!r}: {what + '; ' if what else ''}{reason}; pass a device this "
            "process has (e.g. 'cpu'), or None for the model's own"
        )
    return resolved


#: Attributes in which a loss-scaler wrapper holds its ``GradScaler`` (timm's ``NativeScaler``:
#: ``_scaler``; Accelerate's ``Accelerator`` and Lightning's precision plugins: ``scaler``).
WRAPPED_SCALER_ATTRIBUTES = ("_scaler", "scaler")


def unwrap_grad_scaler(grad_scaler: Any) -> Any:
    """The ``GradScaler`` a loss-scaler wrapper holds, or ``grad_scaler`` itself.

    An object without a callable ``update`` that holds one with it in one of
    ``WRAPPED_SCALER_ATTRIBUTES`` (timm's ``NativeScaler``, whose ``__call__`` runs backward and
    the optimizer step through its ``_scaler``) stands for that scaler; anything else is
    returned as given (``checked_grad_scaler`` judges it).

    Args:
        grad_scaler: the ``grad_scaler`` argument.

    Returns:
        The scaler the hook watches.
    """
    if grad_scaler is None or callable(getattr(grad_scaler, "update", None)):
        return grad_scaler
    for name in WRAPPED_SCALER_ATTRIBUTES:
        inner = getattr(grad_scaler, name, None)
        if inner is not None and callable(getattr(inner, "update", None)):
            return inner
    return grad_scaler


def checked_grad_scaler(grad_scaler: Any) -> Any:
    """``grad_scaler`` must be None or a ``GradScaler``-like object: a callable ``update``
    that the hook can wrap (an instance attribute is set on it until ``close``), or a wrapper
    holding one (``unwrap_grad_scaler``).

    Returns:
        The scaler the hook watches: ``grad_scaler``, the one its wrapper holds, or None.

    Raises:
        ValueError: naming ``grad_scaler`` and its value (e.g. an optimizer passed instead).
    """
    grad_scaler = unwrap_grad_scaler(grad_scaler)
    if grad_scaler is None:
        return None
    if not callable(getattr(grad_scaler, "update", None)):
        text = repr(grad_scaler)
        shown = text if len(text) <= 80 and "\n" not in text else f"a {type(grad_scaler).__name__}"
        hint = (
            " (an optimizer: pass it as optimizer=)"
            if isinstance(grad_scaler, torch.optim.Optimizer)
            else ""
        )
        raise ValueError(
            "grad_scaler must be a torch.amp.GradScaler (anything with a callable update(), "
            f"or a wrapper holding one in {' or '.join(WRAPPED_SCALER_ATTRIBUTES)}) or None, "
            f"got {shown}{hint}"
        )
    if not hasattr(grad_scaler, "__dict__"):
        raise ValueError(
            f"grad_scaler must accept attributes (its update() is wrapped until close()), got "
            f"{type(grad_scaler).__name__} without __dict__"
        )
    return grad_scaler


def check_checkpoint_options(checkpoint_files: Any, checkpoint_in_memory: Any) -> None:
    """``checkpoint_files``: an int >= 1; ``checkpoint_in_memory``: a bool.

    Raises:
        ValueError: naming the argument and its value.
    """
    if (
        isinstance(checkpoint_files, bool)
        or not isinstance(checkpoint_files, int)
        or (checkpoint_files < 1)
    ):
        raise ValueError(f"checkpoint_files must be an int >= 1, got {checkpoint_files!r}")
    if not isinstance(checkpoint_in_memory, bool):
        raise ValueError(f"checkpoint_in_memory must be a bool, got {checkpoint_in_memory!r}")


def check_switches(capture_kernels: Any, decode_in_background: Any) -> None:
    """``capture_kernels``: a bool or None (on CUDA); ``decode_in_background``: a bool.

    Raises:
        ValueError: either is not, naming it and its value.
    """
    if capture_kernels is not None and not isinstance(capture_kernels, bool):
        raise ValueError(
            f"capture_kernels must be True, False or None (on CUDA), got {capture_kernels!r}"
        )
    if not isinstance(decode_in_background, bool):
        raise ValueError(
            f"decode_in_background must be True or False, got {decode_in_background!r}"
        )


def check_epochs_length(epochs: Any, steps_per_epoch: Any, dataloader: Any) -> None:
    """``epochs`` (a valid number of them) needs steps per epoch from ``steps_per_epoch`` or
    ``dataloader``: the message names the hook's own arguments (``JobModel.from_args`` also
    knows ``batches_per_epoch``, which the hook does not take). Also used by the framework
    callbacks, which read no epoch length once ``epochs`` is given.

    Args:
        epochs: the ``epochs`` argument (numpy numbers too).
        steps_per_epoch: the ``steps_per_epoch`` argument, or None.
        dataloader: the ``dataloader`` argument, or None.

    Raises:
        ValueError: ``epochs`` given without either, naming ``epochs`` and its value.
    """
    epochs = plain_number(epochs)
    valid = (
        isinstance(epochs, (int, float))
        and not isinstance(epochs, bool)
        and math.isfinite(epochs)
        and epochs > 0
    )
    if valid and steps_per_epoch is None and dataloader is None:
        raise ValueError(
            f"epochs={epochs!r} needs the length of an epoch: pass steps_per_epoch= (optimizer "
            "steps per epoch) or dataloader= (a loader with len()), or total_steps= instead"
        )


def warn_if_deadline_past(deadline: Any) -> None:
    """A ``datetime`` deadline already past at creation: one warning, not an error. A job
    restarted after its deadline (a requeue, an elastic restart) must still start; the guard
    then reports the miss at the first step (``on_deadline``), as for any predicted miss."""
    if not isinstance(deadline, datetime):
        return
    ago_s = time.time() - deadline.timestamp()
    if ago_s >= 0:
        logger.warning(
            "deadline=%r has already passed (%s ago%s): every prediction will miss it",
            deadline,
            format_duration(ago_s),
            ", naive = local time" if deadline.tzinfo is None else "",
        )


def checked_timeout_s(value: Any, name: str = "timeout_s") -> float | None:
    """A wait's limit in seconds: a real number >= 0 (numpy scalars included), or None.

    Args:
        value: the argument.
        name: its name, for the message.

    Returns:
        ``value`` as a float, or None.

    Raises:
        ValueError: ``value`` is a bool, not a real number, NaN or negative.
    """
    if value is None:
        return None
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0 or None, got {value!r}")
    return float(value)


def plain_number(value: Any) -> Any:
    """``value`` as a Python ``int`` / ``float`` when it is another integral / real number type
    (numpy's ``int64``, ``float32``, ...); anything else (bools included) unchanged."""
    if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)
