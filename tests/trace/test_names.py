"""trace.names: the record-scope numbers match PyTorch's, and which raw events are annotations
or autograd nodes, by name and by scope (also on events a real profiler records)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ets_hook.trace.names import (
    AUTOGRAD_NODE_PREFIX,
    BACKWARD_SCOPE,
    USER_SCOPE,
    canonical_op_name,
    is_annotation,
    is_autograd_node,
    is_backward_name,
)

# torch exposes the enum as torch.profiler.RecordScope (the same object as
# torch._C._profiler.RecordScope); there is no torch.autograd.RecordScope.
RecordScope = torch._C._profiler.RecordScope
FUNCTION = int(RecordScope.FUNCTION.value)


def test_scope_numbers_are_torchs() -> None:
    assert torch.profiler.RecordScope is RecordScope
    assert int(RecordScope.USER_SCOPE.value) == USER_SCOPE
    assert int(RecordScope.BACKWARD_FUNCTION.value) == BACKWARD_SCOPE
    assert type(USER_SCOPE) is int and type(BACKWARD_SCOPE) is int  # plain ints, not the enum


def test_names_does_not_import_torch() -> None:
    code = "import sys, ets_hook.trace.names; print('torch' in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("name", "scope", "expected"),
    [
        ("## data loading", USER_SCOPE, True),  # any record_function annotation
        ("aten::linear", USER_SCOPE, True),  # the scope decides, whatever the name
        ("Optimizer.step#SGD.step", FUNCTION, True),  # step annotations, whatever the scope
        ("Optimizer.zero_grad#Adam.zero_grad", FUNCTION, True),
        ("ProfilerStep#12", FUNCTION, True),
        ("aten::add_", FUNCTION, False),
        ("## data loading", FUNCTION, False),  # a user prefix alone is not a user scope
        ("Optimizer.other#SGD", FUNCTION, False),  # only step / zero_grad annotations
        ("my Optimizer.step#SGD.step", FUNCTION, False),  # prefixes, not substrings
        ("optimizer.step#SGD.step", FUNCTION, False),  # case matters
        ("AddmmBackward0", BACKWARD_SCOPE, False),
        (f"{AUTOGRAD_NODE_PREFIX} AddmmBackward0", FUNCTION, False),
    ],
)
def test_is_annotation(name: str, scope: int, expected: bool) -> None:
    assert is_annotation(name, scope) is expected


@pytest.mark.parametrize(
    ("name", "scope", "expected"),
    [
        ("autograd::engine::evaluate_function: AddmmBackward0", FUNCTION, True),
        ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", FUNCTION, True),
        ("AddmmBackward0", BACKWARD_SCOPE, True),  # the node itself, by its scope
        ("anything", BACKWARD_SCOPE, True),
        ("AddmmBackward0", FUNCTION, False),  # a Backward name alone is not a node
        ("aten::mm", FUNCTION, False),
        ("aten::mm", USER_SCOPE, False),
        ("wrapped autograd::engine::evaluate_function: X", FUNCTION, False),
    ],
)
def test_is_autograd_node(name: str, scope: int, expected: bool) -> None:
    assert is_autograd_node(name, scope) is expected


def test_prefixes_are_the_names_torch_records() -> None:
    """Classify the events of one real profiled step: the names and scopes torch records."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof:
        with torch.profiler.record_function("## forward"):
            loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    events = [(e.name, int(e.scope)) for e in prof.events()]
    annotations = {name for name, scope in events if is_annotation(name, scope)}
    assert "## forward" in annotations
    assert any(n.startswith("Optimizer.step#") for n in annotations)
    assert any(n.startswith("Optimizer.zero_grad#") for n in annotations)
    assert not any(n.startswith("aten::") for n in annotations)

    nodes = [(name, scope) for name, scope in events if is_autograd_node(name, scope)]
    wrappers = [n for n, s in nodes if n.startswith(AUTOGRAD_NODE_PREFIX)]
    by_scope = [n for n, s in nodes if s == BACKWARD_SCOPE]
    assert any(n.endswith("AddmmBackward0") for n in wrappers)
    # every wrapper names the node it evaluates, and that node is recorded with BACKWARD_SCOPE
    assert {n.removeprefix(AUTOGRAD_NODE_PREFIX).strip() for n in wrappers} == set(by_scope)
    assert not any(is_autograd_node(n, s) for n, s in events if n.startswith("aten::"))


def test_op_types_strip_namespaces_and_map_backward_nodes_to_their_forward_op() -> None:
    assert canonical_op_name("aten::linear") == "linear"
    assert canonical_op_name("autograd::engine::evaluate_function: AddmmBackward0") == "addmm"
    assert canonical_op_name("MaxPool2DWithIndicesBackward0") == "max_pool2d_with_indices"
    assert canonical_op_name("NativeBatchNormBackward0") == "native_batch_norm"
    assert canonical_op_name("torch::autograd::AccumulateGrad") == "accumulate_grad"
    assert canonical_op_name("conv2d") == "conv2d"
    assert is_backward_name("autograd::engine::evaluate_function: TBackward0")
    assert not is_backward_name("aten::threshold_backward")
