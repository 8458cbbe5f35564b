"""The raw-op name vocabulary: which operator events are ops, annotations or autograd nodes.

One place for the names and record scopes that every stage reads off raw operator events (the
decoder nesting them, the FLOP rules mapping backward nodes to their forward op, the ETS row
selection). The scope numbers are PyTorch's ``RecordScope`` values, kept here as plain ints so
that nothing below the capture stage imports torch.
"""

from __future__ import annotations

#: The engine's wrapper event around each autograd node ("...: AddmmBackward0").
AUTOGRAD_NODE_PREFIX = "autograd::engine::evaluate_function:"
#: ``record_function`` annotations opened by ``torch.optim`` ("Optimizer.step#SGD.step").
OPTIMIZER_ANNOTATION_PREFIX = "Optimizer."
#: Annotations that mark steps or optimizer calls: never ops, whatever their scope.
STEP_ANNOTATION_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#", "ProfilerStep#")
#: Names that may show up at depth 0 of a decoded or imported trace but are never ETS rows: the
#: step annotations, the DataLoader's iterator annotation and user ``record_function("## ...")``.
NON_ROW_PREFIXES = (*STEP_ANNOTATION_PREFIXES, "enumerate(DataLoader)", "## ")

#: ``torch.autograd.RecordScope.USER_SCOPE``: ``record_function`` annotations.
USER_SCOPE = 7
#: ``torch.autograd.RecordScope.BACKWARD_FUNCTION``: autograd nodes.
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
