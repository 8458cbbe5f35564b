"""Whether a job's batches change shape from step to step: steps of different lengths by design.

A loader that pads each batch to its own longest sequence (Hugging Face's dynamic padding,
bucketing, variable image sizes) makes steps whose lengths differ by design, not by noise: their
mean is the steady state, and a step far above the others is not a burst to leave out. The step
detector shows the model's training forward inputs to an ``InputShapeWatch`` for the first steps;
the watch says once whether a tensor's shape changed in any dimension but the first (the batch
dimension, which a last partial batch of an epoch changes without the steps varying), or whether
the first dimensions took three or more sizes (rows that are tokens, nodes or packed sequences:
a mixture-of-experts' routed tokens, a graph batch, a ``PackedSequence``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: Training forwards a watch looks at before it stops (the decision is needed early).
WATCHED_FORWARDS = 64
#: Tensors a signature reads at most (a forward given a list of thousands stays cheap).
MAX_SIGNATURE_TENSORS = 32

#: Different sets of first-dimension sizes among the watched forwards that make the inputs
#: vary (a batch dimension alone takes two: the full batch and an epoch's last partial one).
LEADING_SIZES_THAT_VARY = 3

Signature = tuple[tuple[int, ...], ...]


def input_tensors(args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> list[torch.Tensor]:
    """A forward's tensor inputs: those directly among ``args`` and ``kwargs`` values, and
    those one level down in a mapping, list or tuple argument (a batch dict passed as one
    argument, a ``PackedSequence``); keyword inputs in name order; the first
    ``MAX_SIGNATURE_TENSORS`` found.

    Args:
        args: the forward's positional arguments.
        kwargs: its keyword arguments, or None.

    Returns:
        The tensors, in a deterministic order.
    """
    tensors: list[torch.Tensor] = []

    def add(value: Any, depth: int) -> None:
        if len(tensors) >= MAX_SIGNATURE_TENSORS:
            return
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif depth == 0 and isinstance(value, Mapping):
            for key in sorted(value, key=str):
                add(value[key], 1)
        elif depth == 0 and isinstance(value, (list, tuple)):
            for item in value:
                add(item, 1)

    for value in args:
        add(value, 0)
    if kwargs:
        for key in sorted(kwargs):
            add(kwargs[key], 0)
    return tensors


def input_signature(args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> Signature:
    """The shapes of a forward's tensor inputs (``input_tensors``), without their first (batch)
    dimension; a 0-dimensional tensor counts as ``()``.

    Args:
        args: the forward's positional arguments.
        kwargs: its keyword arguments, or None.

    Returns:
        One tuple of sizes per tensor found, in a deterministic order.
    """
    return _past_first_dimension(input_tensors(args, kwargs))


def _past_first_dimension(tensors: list[torch.Tensor]) -> Signature:
    """Each tensor's shape without its first dimension (``()`` for a 0-dimensional one)."""
    return tuple(tuple(t.shape[1:]) for t in tensors)


class InputShapeWatch:
    """Looks at the first ``WATCHED_FORWARDS`` training forwards' inputs; ``varies`` turns True
    (and stays) once an input's shape beyond the first dimension differs from the first one's,
    or once the first dimensions have taken ``LEADING_SIZES_THAT_VARY`` different sets of
    sizes: inputs whose rows are tokens, nodes or packed sequences (a mixture-of-experts'
    routed tokens, a graph batch, a ``PackedSequence``) change only there, while a batch
    dimension takes at most two sizes (the full batch and an epoch's last partial one).
    Training thread only.

    Attributes:
        varies: the inputs changed shape from forward to forward.
        active: still looking (neither decided nor past ``WATCHED_FORWARDS``).
    """

    def __init__(self, forwards: int = WATCHED_FORWARDS) -> None:
        """Args:
            forwards: training forwards to look at, >= 1.

        Raises:
            ValueError: ``forwards`` is not an int >= 1.
        """
        if isinstance(forwards, bool) or not isinstance(forwards, int) or forwards < 1:
            raise ValueError(f"forwards must be an int >= 1, got {forwards!r}")
        self._left = forwards
        self._first: Signature | None = None
        self._leading: set[tuple[int, ...]] = set()
        self.varies = False
        self.active = True

    def observe(self, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> bool:
        """One training forward's inputs.

        Returns:
            True exactly once: at the forward whose inputs first differ in shape.
        """
        tensors = input_tensors(args, kwargs)
        signature = _past_first_dimension(tensors)
        self._leading.add(tuple(t.shape[0] if t.dim() else -1 for t in tensors))
        self._left -= 1
        if self._left <= 0:
            self.active = False
        if self._first is None:
            self._first = signature
            return False
        if signature != self._first or len(self._leading) >= LEADING_SIZES_THAT_VARY:
            self.varies = True
            self.active = False
            return True
        return False
