"""capture.input_shapes: telling batches that change shape (steps of different lengths by
design) from batches that do not, through the step detector's module hook and the hook."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ets_hook import ETSHook
from ets_hook.capture.input_shapes import (
    MAX_SIGNATURE_TENSORS,
    InputShapeWatch,
    input_signature,
)
from ets_hook.capture.steps import StepDetector


def test_the_signature_leaves_the_batch_dimension_out_and_reads_kwargs_and_batch_dicts() -> None:
    ids = torch.zeros(4, 7, dtype=torch.long)
    mask = torch.ones(4, 7)
    # Positional, keyword and one-level-down (a batch dict passed as one argument) inputs.
    assert input_signature((ids,), None) == ((7,),)
    assert input_signature((), {"input_ids": ids, "attention_mask": mask}) == ((7,), (7,))
    assert input_signature(({"mask": mask, "ids": ids},), None) == ((7,), (7,))
    assert input_signature(([ids, mask], 3), {"flag": True}) == ((7,), (7,))
    # A partial last batch differs in its first dimension only: the same signature.
    assert input_signature((ids[:3],), None) == input_signature((ids,), None)
    assert input_signature((torch.tensor(1.0),), None) == ((),)
    many = [torch.zeros(2, 3)] * 1000
    assert len(input_signature((many,), None)) == MAX_SIGNATURE_TENSORS  # bounded work


def test_the_watch_says_once_when_a_shape_beyond_the_batch_dimension_changes() -> None:
    watch = InputShapeWatch(forwards=10)
    assert not watch.observe((torch.zeros(8, 5),), None)
    assert not watch.observe((torch.zeros(3, 5),), None)  # a partial batch: not a change
    assert watch.active and not watch.varies
    assert watch.observe((torch.zeros(8, 6),), None)  # a longer sequence
    assert watch.varies and not watch.active
    steady = InputShapeWatch(forwards=3)
    for _ in range(3):
        assert not steady.observe((), {"x": torch.zeros(2, 4)})
    assert not steady.active and not steady.varies  # it stops looking after its forwards
    with pytest.raises(ValueError, match="forwards"):
        InputShapeWatch(forwards=0)


def test_rows_that_vary_in_number_make_the_inputs_vary_a_partial_batch_does_not() -> None:
    """Inputs whose first dimension is tokens, nodes or packed sequences change only there:
    three different sets of first-dimension sizes mean steps of different lengths; the full
    batch and an epoch's last partial one (two sizes, however often) do not."""
    tokens = InputShapeWatch(forwards=10)
    assert not tokens.observe((torch.zeros(40, 16),), None)
    assert not tokens.observe((torch.zeros(57, 16),), None)
    assert tokens.observe((torch.zeros(33, 16),), None)  # a third token count
    assert tokens.varies
    epochs = InputShapeWatch(forwards=20)
    for size in [8, 8, 8, 3] * 5:  # epochs of three full batches and a partial one
        assert not epochs.observe((torch.zeros(size, 16), torch.zeros(size)), None)
    assert not epochs.varies
    packed_watch = InputShapeWatch(forwards=10)
    for lengths in [(5, 3), (7, 2), (4, 4)]:
        packed = torch.nn.utils.rnn.pack_sequence([torch.zeros(n, 4) for n in lengths])
        packed_watch.observe((packed,), None)  # a PackedSequence: data (tokens, 4), batch sizes
    assert packed_watch.varies


class TokenModel(nn.Module):
    """Takes token ids of any length as a keyword argument, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids).mean(dim=1))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, lengths: list[int]) -> None:
    generator = torch.Generator().manual_seed(0)
    for length in lengths:
        ids = torch.randint(0, 50, (4, length), generator=generator)
        loss = model(input_ids=ids).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize(
    ("lengths", "calls"), [([8, 8, 8, 8], 0), ([8, 8, 12, 5, 9], 1)], ids=["fixed", "varying"]
)
def test_the_step_detector_reports_varying_keyword_inputs_once(
    lengths: list[int], calls: int
) -> None:
    model = TokenModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[int] = []
    boundaries: list[str] = []
    detector = StepDetector(
        model, [optimizer], boundaries.append, on_inputs_vary=lambda: seen.append(1)
    )
    try:
        _train(model, optimizer, lengths)
    finally:
        detector.close()
    assert len(seen) == calls
    assert len(boundaries) == len(lengths)  # the kwargs-aware hook still marks every step


def _hooked_run(lengths: list[int]) -> tuple[bool, str | None, bool]:
    """Train on batches of these lengths under a hook (a fixed 3-step window): whether the
    forecaster was told the steps vary, the prediction's source, and whether the trace and its
    estimate were made."""
    model = TokenModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model,
        optimizer=optimizer,
        total_steps=100,
        log_every=None,
        deadline=False,
        capture_steps=3,
        skip_steps=1,
    )
    try:
        _train(model, optimizer, lengths)
        traced = hook.wait_for_trace(60) is not None and hook._forecaster._trace is not None
        prediction = hook.prediction
        return (
            hook._forecaster._variable_steps,
            prediction.source if prediction is not None else None,
            traced,
        )
    finally:
        hook.close()


def test_a_hook_on_varying_batches_predicts_from_the_mean_without_the_trace_estimate() -> None:
    """Batches of random lengths: the forecaster is told, and the prediction rests on the
    measured mean alone, though the trace and its estimate were made; batches of one length
    fuse the trace estimate as usual."""
    varying = _hooked_run([8, 16, 4, 32, 8, 64, 4, 16, 8, 32, 4, 16])
    assert varying == (True, "measured", True)
    assert _hooked_run([8] * 12) == (False, "fused", True)
