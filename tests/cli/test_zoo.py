"""The workload zoo: every job builds and trains; batch-size variants keep their family."""

from __future__ import annotations

import math

import pytest
import torch

from ets_hook.cli.demo import DEMO_MODELS
from ets_hook.cli.zoo import workloads

ZOO = workloads()


def test_zoo_covers_at_least_ten_families_with_several_sizes() -> None:
    families: dict[str, int] = {}
    for w in ZOO.values():
        families[w.family] = families.get(w.family, 0) + 1
    assert len(families) >= 10, families
    assert all(count >= 2 for count in families.values()), families
    assert set(DEMO_MODELS.values()) <= set(ZOO)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_workload_trains(name: str) -> None:
    job = ZOO[name].with_batch_size(4).build("cpu", seed=0)
    batches = job.batches()
    before = [p.detach().clone() for p in job.model.parameters()]
    losses = [job.train_step(next(batches)) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses)
    changed = [not torch.equal(a, b) for a, b in zip(before, job.model.parameters(), strict=True)]
    assert any(changed)


def test_with_batch_size_renames_and_rejects_bad_sizes() -> None:
    w = ZOO["mlp-w128-d2-b32"]
    v = w.with_batch_size(8)
    assert v.name == "mlp-w128-d2-b8" and v.batch_size == 8 and v.family == w.family
    x, _ = v.make_batch(0, torch.Generator().manual_seed(0))
    assert x.shape[0] == 8
    with pytest.raises(ValueError, match="0"):
        w.with_batch_size(0)
