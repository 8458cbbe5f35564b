"""The raw-op name vocabulary: which operator events are ops, annotations or autograd nodes.

One place for the names and record scopes that every stage reads off raw operator events (the
decoder nesting them, the op types of the FLOP rules and features, with backward nodes mapped to
their forward op, the ETS row selection). The scope numbers are PyTorch's ``RecordScope``
values, kept here as plain ints so that nothing below the capture stage imports torch.
"""

from __future__ import annotations

import functools
import re

#: The engine's wrapper event around each autograd node ("...: AddmmBackward0").
AUTOGRAD_NODE_PREFIX = "autograd::engine::evaluate_function:"
#: ``record_function`` annotations opened by ``torch.optim`` ("Optimizer.step#SGD.step").
OPTIMIZER_ANNOTATION_PREFIX = "Optimizer."
#: Annotations that mark steps or optimizer calls: never ops, whatever their scope.
STEP_ANNOTATION_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#", "ProfilerStep#")
#: Names that may show up at depth 0 of a decoded or imported trace but are never ETS rows: the
#: step annotations, the DataLoader's iterator annotation and user ``record_function("## ...")``.
#: The DataLoader iterator's annotation (``_BaseDataLoaderIter.__next__``): its ops are input work.
INPUT_ANNOTATION_PREFIX = "enumerate(DataLoader)"
NON_ROW_PREFIXES = (*STEP_ANNOTATION_PREFIXES, INPUT_ANNOTATION_PREFIX, "## ")

#: Collective communication ops (c10d's dispatcher ops, the profiler's backend annotations):
#: time in them is communication or waiting for other ranks, not this rank's own work.
COLLECTIVE_PREFIXES = ("c10d::", "c10d:", "gloo:", "nccl:", "record_param_comms", "mpi:", "ucc:")

#: ``torch.profiler.RecordScope.USER_SCOPE``: ``record_function`` annotations.
USER_SCOPE = 7
#: ``torch.profiler.RecordScope.BACKWARD_FUNCTION``: autograd nodes.
BACKWARD_SCOPE = 1


def is_annotation(name: str, scope: int) -> bool:
    """True when a raw event is an annotation (a user scope or a step annotation), not an op.

    Args:
        name: the event's name as recorded.
        scope: its ``RecordScope`` value.

    Returns:
        Whether the event only annotates the ops inside it.
    """
    return scope == USER_SCOPE or name.startswith(STEP_ANNOTATION_PREFIXES)


def is_autograd_node(name: str, scope: int) -> bool:
    """True when a raw event is an autograd node (everything inside it is backward work).

    Args:
        name: the event's name as recorded.
        scope: its ``RecordScope`` value.

    Returns:
        Whether the event is the engine's evaluation of one autograd node.
    """
    return name.startswith(AUTOGRAD_NODE_PREFIX) or scope == BACKWARD_SCOPE


#: Distinct names whose answers are kept (a trace repeats a few hundred names thousands of
#: times; a hostile one with millions of distinct names only evicts).
NAME_CACHE_SIZE = 4096

_NAMESPACES = ("aten::", "torch::autograd::", "prim::", "c10d::", "torchvision::", "autograd::")

_BACKWARD_RE = re.compile(r"^([A-Za-z0-9_]+?)Backward\d*$")


def _camel_to_snake(name: str) -> str:
    name = re.sub(r"(\d)D", r"\1d", name)  # MaxPool2DWithIndices -> MaxPool2dWithIndices
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return name.lower()


@functools.lru_cache(maxsize=NAME_CACHE_SIZE)
def is_backward_name(name: str) -> bool:
    """True for an autograd node (``AddmmBackward0``, ``AccumulateGrad``) or its engine wrapper.

    Args:
        name: a raw op name, with or without namespace. ATen gradient kernels
            (``aten::convolution_backward``) are not autograd nodes.
    """
    stripped = name.strip()
    if stripped.startswith(AUTOGRAD_NODE_PREFIX):
        return True
    for ns in _NAMESPACES:
        if stripped.startswith(ns):
            stripped = stripped[len(ns) :]
            break
    return bool(_BACKWARD_RE.match(stripped)) or stripped == "AccumulateGrad"


@functools.lru_cache(maxsize=NAME_CACHE_SIZE)
def canonical_op_name(name: str) -> str:
    """A short, stable op type: namespaces stripped, backward nodes mapped to the forward op.

    ``"aten::linear"`` → ``"linear"``; ``"autograd::engine::evaluate_function: AddmmBackward0"``
    → ``"addmm"``; ``"MaxPool2DWithIndicesBackward0"`` → ``"max_pool2d_with_indices"``;
    ``"torch::autograd::AccumulateGrad"`` → ``"accumulate_grad"``. Names without a namespace
    (the ETS artifact's ``"conv2d"``) are returned unchanged.
    """
    n = name.strip()
    if n.startswith(AUTOGRAD_NODE_PREFIX):
        n = n[len(AUTOGRAD_NODE_PREFIX) :].strip()
    for ns in _NAMESPACES:
        if n.startswith(ns):
            n = n[len(ns) :]
            break
    m = _BACKWARD_RE.match(n)
    if m:
        return _camel_to_snake(m.group(1))
    if n and n[0].isupper():  # an autograd node without the Backward suffix: AccumulateGrad
        return _camel_to_snake(n)
    return n


def is_collective(name: str) -> bool:
    """True when an op is a collective (all-reduce, broadcast, barrier, ...) of torch.distributed.

    Args:
        name: the op's name as recorded (``"c10d::allreduce_"``, ``"nccl:all_reduce"``).

    Returns:
        Whether time inside it is communication (or waiting for other ranks) rather than this
        rank's own compute.
    """
    return name.startswith(COLLECTIVE_PREFIXES)
