"""The DataLoader workers' batch finish times (``capture.batch_clock``), on real loaders."""

from __future__ import annotations

import copy
import pickle
import time
from itertools import pairwise

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from ets_hook.capture.batch_clock import SLOTS_PER_WORKER, BatchClock, TimedCollate

SAMPLE_SLEEP_S = 0.002
BATCH = 4


class SlowSamples(Dataset):
    """Each sample sleeps ``SAMPLE_SLEEP_S``: a worker needs at least BATCH x that per batch."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(SAMPLE_SLEEP_S)
        return torch.full((3,), float(index))


def test_each_worker_records_when_it_finished_each_batch() -> None:
    loader = DataLoader(SlowSamples(), batch_size=BATCH, num_workers=2)
    original = loader.collate_fn
    clock = BatchClock.attach(loader)
    assert clock is not None and clock.workers == 2
    assert isinstance(loader.collate_fn, TimedCollate)
    batches = list(loader)
    # The user's batches, unchanged.
    assert torch.equal(torch.cat(batches)[:, 0], torch.arange(64, dtype=torch.float32))
    reading = clock.read()
    assert clock.read() is reading  # no batch since: the same reading
    times, cpu_times = reading
    assert [len(t) for t in times] == [8, 8]  # 16 batches, round-robin over two workers
    assert [len(t) for t in cpu_times] == [8, 8]
    for worker_times, worker_cpu in zip(times, cpu_times, strict=True):
        gaps = [b - a for a, b in pairwise(worker_times)]
        # Each gap is at least one batch's sleeps (the clock is the worker's own) ...
        assert min(gaps) >= 0.9 * BATCH * SAMPLE_SLEEP_S
        # ... of which a sleeping worker spends little on the CPU (its own process's time).
        cpu_gaps = [b - a for a, b in pairwise(worker_cpu)]
        assert min(cpu_gaps) >= 0
        assert sum(cpu_gaps) < sum(gaps)
    clock.detach()
    assert loader.collate_fn is original
    clock.detach()  # idempotent
    assert loader.collate_fn is original


def test_recording_stops_when_a_workers_slots_are_full() -> None:
    loader = DataLoader(TensorDataset(torch.arange(SLOTS_PER_WORKER + 8)), num_workers=1)
    clock = BatchClock.attach(loader)
    assert clock is not None
    assert len(list(loader)) == SLOTS_PER_WORKER + 8
    assert [len(t) for t in clock.read()[0]] == [SLOTS_PER_WORKER]


def test_workers_beyond_the_recorded_ones_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    import ets_hook.capture.batch_clock as batch_clock

    monkeypatch.setattr(batch_clock, "MAX_WORKERS", 1)
    loader = DataLoader(TensorDataset(torch.arange(8)), num_workers=2)
    clock = BatchClock.attach(loader)
    assert clock is not None and (clock.workers, clock.num_workers) == (1, 2)
    assert len(list(loader)) == 8
    finish, cpu = clock.read()
    assert [len(t) for t in finish] == [4, 0]  # worker 1 unrecorded, but there
    assert [len(t) for t in cpu] == [4, 0]


def test_the_users_collate_errors_reach_the_user_unchanged() -> None:
    def refuse(batch):
        raise KeyError("bad sample")

    loader = DataLoader(TensorDataset(torch.arange(4)), collate_fn=refuse, num_workers=1)
    assert BatchClock.attach(loader) is not None
    with pytest.raises(KeyError, match="bad sample"):
        next(iter(loader))


def test_nothing_is_attached_where_nothing_can_be_timed() -> None:
    data = TensorDataset(torch.arange(8))
    assert BatchClock.attach(DataLoader(data, num_workers=0)) is None
    assert BatchClock.attach(range(8)) is None
    assert BatchClock.attach(None) is None
    persistent = DataLoader(data, num_workers=1, persistent_workers=True)
    iterator = iter(persistent)  # workers started: they hold the old collate_fn
    assert BatchClock.attach(persistent) is None
    assert persistent.collate_fn is default_collate
    del iterator
    twice = DataLoader(data, num_workers=1)
    first = BatchClock.attach(twice)
    assert first is not None
    assert BatchClock.attach(twice) is first  # a second reader shares the clock attached
    assert BatchClock.attached_to(twice) is first
    assert BatchClock.attached_to(DataLoader(data, num_workers=1)) is None
    assert BatchClock.attached_to(None) is None
    # A framework's copy of the loader (Lightning's, for a distributed sampler) carries the same
    # wrapper: the same clock, and it is given back at detach too.
    copy_of = DataLoader(data, num_workers=1, collate_fn=twice.collate_fn)
    assert BatchClock.attach(copy_of) is first
    first.detach()
    assert twice.collate_fn is default_collate and copy_of.collate_fn is default_collate
    # Attached before its first iter(), a persistent loader stays timed once its workers run
    # (a framework's callback attaches it before the framework starts the iterator).
    early = DataLoader(data, num_workers=1, persistent_workers=True)
    clock = BatchClock.attach(early)
    assert clock is not None
    assert len(list(early)) == len(data)
    assert BatchClock.attach(early) is clock
    assert len(clock.read()[0][0]) == len(data)
    # In the training process (no worker) the wrapper only collates.
    clock_less = DataLoader(data, num_workers=1)
    clock = BatchClock.attach(clock_less)
    assert clock_less.collate_fn([torch.tensor(1)]).tolist() == [1]
    assert clock.read() == ([[]], [[]])


def test_a_copied_or_pickled_loader_gets_the_users_collate_fn() -> None:
    # Shared memory cannot be stored: outside a worker's spawning the clock copies as the
    # user's collate_fn alone, and the copy works as the original did.
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=1)
    clock = BatchClock.attach(loader)
    assert clock is not None
    copied = copy.deepcopy(loader)
    assert copied.collate_fn is not loader.collate_fn
    assert not isinstance(copied.collate_fn, TimedCollate)
    assert [b[0].tolist() for b in copied] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    restored = pickle.loads(pickle.dumps(loader.collate_fn))
    assert restored is default_collate
    assert [len(t) for t in clock.read()[0]] == [0]  # the copy's batches were not timed


class Counting(torch.utils.data.IterableDataset):
    """An iterable dataset split between the workers (each yields its share)."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(start, 16, step))


def test_iterable_datasets_and_unbatched_loaders_are_timed_and_unchanged() -> None:
    batched = DataLoader(Counting(), batch_size=4, num_workers=2)
    clock = BatchClock.attach(batched)
    assert clock is not None
    batches = [b.tolist() for b in batched]
    assert sorted(x for b in batches for x in b) == list(range(16))
    assert [len(t) for t in clock.read()[0]] == [2, 2]  # two batches of four per worker
    # batch_size=None: no collation, collate_fn converts each sample; each one is timed.
    unbatched = DataLoader(TensorDataset(torch.arange(6)), batch_size=None, num_workers=1)
    clock = BatchClock.attach(unbatched)
    assert clock is not None
    assert [s[0].item() for s in unbatched] == list(range(6))
    assert [len(t) for t in clock.read()[0]] == [6]


def test_spawned_workers_get_the_clock_too() -> None:
    # Under "spawn" the wrapper and its shared arrays are pickled into each worker.
    loader = DataLoader(
        TensorDataset(torch.arange(12)),
        batch_size=2,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    clock = BatchClock.attach(loader)
    assert clock is not None
    before_s = time.monotonic()
    assert sum(len(b[0]) for b in loader) == 12
    assert [len(t) for t in clock.read()[0]] == [6]
    # The worker's process start (10 ms ticks on Linux): after iter() began, before its first
    # batch was done; the first batch's wait runs from there.
    started_s = clock._process_starts[0]
    first_finish_s = clock.read()[0][0][0]
    assert before_s - 0.011 <= started_s <= first_finish_s
    wait_s = clock.first_batch_wait_s(first_finish_s + 1.0, hook_created_s=before_s)
    assert wait_s is not None and wait_s >= 1.0 + (first_finish_s - started_s) - 1e-9
