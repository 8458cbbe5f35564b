"""The input pipeline as its own part of the step: a real DataLoader-bound loop under the hook."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ets_hook import ETSHook, Phase, Prediction, Trace
from ets_hook.capture.batch_clock import TimedCollate
from ets_hook.ets.rows import ets_rows
from ets_hook.forecast.text import format_prediction
from ets_hook.trace.breakdown import breakdown_iteration


class AugmentedVectors(Dataset):
    """Per-sample tensor work in ``__getitem__`` (a decode + augment stand-in)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(256, generator=g).sort().values[:16]
        return (x - x.mean()) / (x.std() + 1e-6), torch.tensor(index % 4)


@dataclass
class LoaderRun:
    trace: Trace  # the window's
    prediction: Prediction  # once the trace was ready


@pytest.fixture(scope="module", params=["native", "profiler"])
def loader_run(request) -> LoaderRun:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=12,
        capture_steps=3,
        op_capture=request.param,
        log_every=None,
    )
    loader = DataLoader(AugmentedVectors(), batch_size=16, num_workers=0)
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 11:
            break
    trace = hook.wait_for_trace(60)
    prediction = hook.prediction
    hook.close()
    assert trace is not None, hook.capture_status
    assert request.param in trace.capture.op_capture
    assert prediction is not None
    return LoaderRun(trace, prediction)


def whole_steps(trace):
    """Steps captured from their start (on the profiler path, with shapes on the first step only,
    capture restarts at the next forward: later steps begin after their data loading)."""
    partial = set(trace.metadata.get("partial_steps", ()))
    whole = [it for it in trace.iterations if it.step not in partial]
    assert whole
    return whole


def test_the_datasets_ops_are_input_work(loader_run: LoaderRun) -> None:
    loader_trace = loader_run.trace
    for iteration in whole_steps(loader_trace):
        names = {op.name for op in iteration.ops if op.phase is Phase.INPUT}
        assert {"aten::randn", "aten::sort", "aten::stack"} <= names
        # No model op is input work, and no input op is a row of the ETS sequence.
        assert not {
            op.name for op in iteration.ops if op.phase is Phase.INPUT and "linear" in op.name
        }
        assert all(iteration.ops[i].phase is not Phase.INPUT for i in ets_rows(iteration))
        assert any(iteration.ops[i].phase is Phase.FORWARD for i in ets_rows(iteration))


def test_input_work_counts_as_data_wait(loader_run: LoaderRun) -> None:
    loader_trace = loader_run.trace
    for iteration in whole_steps(loader_trace):
        b = breakdown_iteration(iteration)
        input_top_s = (
            sum(op.duration_ns for op in iteration.ops if op.phase is Phase.INPUT and op.depth == 0)
            / 1e9
        )
        assert b.data_wait_s >= input_top_s > 0
        first_model = min(op.start_ns for op in iteration.ops if op.phase is not Phase.INPUT)
        assert b.data_wait_s == pytest.approx((first_model - iteration.start_ns) / 1e9)


def test_the_input_wait_reaches_predictions(loader_run: LoaderRun) -> None:
    """The prediction carries the whole captured steps' median wait for input (the Dataset's
    per-sample work, num_workers=0, is inside it) and its share of the median step."""
    prediction = loader_run.prediction
    whole = whole_steps(loader_run.trace)
    steps = [breakdown_iteration(it) for it in whole]
    assert prediction.data_wait_s == pytest.approx(statistics.median(b.data_wait_s for b in steps))
    assert prediction.data_wait_share == pytest.approx(
        prediction.data_wait_s / statistics.median(b.wall_s for b in steps)
    )
    input_work_s = statistics.median(
        sum(op.duration_ns for op in it.ops if op.phase is Phase.INPUT and op.depth == 0) / 1e9
        for it in whole
    )
    assert prediction.data_wait_s >= input_work_s > 0  # each step's wait holds its input work
    said = "% of a step waits for input" in format_prediction(prediction)
    assert said == prediction.waits_for_input


def test_a_loop_without_input_work_does_not_wait_for_input() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 4))  # ~1 ms a step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=12, capture_steps=3, log_every=None)
    x, y = torch.randn(256, 256), torch.randint(0, 4, (256,))
    for _ in range(12):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert hook.wait_for_trace(60) is not None, hook.capture_status
    prediction = hook.prediction
    hook.close()
    assert prediction is not None and prediction.data_wait_share is not None
    assert prediction.data_wait_share < 0.5  # only the loop's own Python between steps


def _phase(prediction, name):
    return next((p for p in prediction.phases if p.name == name), None)


def test_an_epochs_start_up_is_a_phase_not_step_time() -> None:
    """A loop whose every epoch begins with a 60 ms wait (a stand-in for worker start-up)."""
    import time

    from ets_hook.forecast.epochs import EPOCH_START

    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model, optimizer=opt, total_steps=40, steps_per_epoch=8, capture_steps=0, log_every=None
    )
    for step in range(24):
        if step % 8 == 0:
            time.sleep(0.060)
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    prediction = hook.prediction
    hook.close()
    phase = _phase(prediction, EPOCH_START)
    assert phase is not None and phase.occurrences == 2  # epochs 2 and 3; the first is warm-up
    assert phase.spent_s >= 2 * 0.050
    assert phase.remaining == 2  # epochs starting at steps 24 and 32
    assert phase.remaining_s == pytest.approx(2 * phase.mean_s)
    # The start-up is out of the step times: epoch-start steps look like the others.
    times = hook.step_times_s
    assert max(times[8], times[16]) < 0.050
    assert prediction.iteration_s < 0.050


def test_a_loader_that_restarts_its_workers_seeds_the_phase_from_the_first_step() -> None:
    from ets_hook.forecast.epochs import EPOCH_START

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        torch.utils.data.Subset(AugmentedVectors(), range(96)), batch_size=16, num_workers=1
    )
    hook = ETSHook(
        model, optimizer=opt, dataloader=loader, epochs=3, capture_steps=0, log_every=None
    )
    seen: list[int] = []
    predictions = []
    for _epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prediction = hook.prediction
            predictions.append(prediction)
            phase = _phase(prediction, EPOCH_START)
            seen.append(phase.occurrences if phase is not None else 0)
    hook.close()
    assert prediction.total_steps == 18
    # Seeded from the workers' clocks as soon as step 0 ends (the loop's wait for them, before
    # the first forward), then one occurrence per later epoch.
    assert seen[:6] == [1] * 6
    assert _phase(predictions[0], EPOCH_START).remaining == 2  # epochs 2 and 3, priced at once
    # The seed happened before or inside the first step: it is not taken out of the later
    # steps' wall time (counted there, the per-step overhead would go negative by seed / 3).
    seed_s = _phase(predictions[3], EPOCH_START).spent_s  # the worker's start-up (>= 0)
    assert predictions[3].overhead_per_step_s > -0.1 * seed_s / 3 - 1e-4
    assert seen[6] == 2 and seen[12] == 3
    assert phase.remaining == 0


#: CPU seconds each worker of ``test_the_first_epochs_worker_start_up_seeds_the_phase`` spends
#: starting (``worker_init_fn``), before it makes a batch.
WORKER_START_CPU_S = 0.12


def busy_worker_start(worker_id: int) -> None:
    """A worker's start-up (imports, opening files): CPU work before its first batch."""
    import time

    until = time.process_time() + WORKER_START_CPU_S
    while time.process_time() < until:
        pass


def _one_worker_job(worker_init_fn, samples: int):
    """A small classifier, its optimizer and a one-worker loader of ``samples`` samples (16 a
    batch) whose worker runs ``worker_init_fn`` first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        torch.utils.data.Subset(AugmentedVectors(), range(samples)),
        batch_size=16,
        num_workers=1,
        worker_init_fn=worker_init_fn,
    )
    return model, opt, loader


def test_the_first_epochs_worker_start_up_seeds_the_phase() -> None:
    """``for x, y in loader`` starts the workers and waits for the first batch before the first
    training forward, where step 0's clock starts: that wait is in no step. The workers' own
    clocks measure it, and it seeds the epoch start-up's cost (a lower bound: a worker that
    also waited for a core began earlier than its CPU time says) until epoch 2 measures one."""
    from ets_hook.forecast.epochs import EPOCH_START

    model, opt, loader = _one_worker_job(busy_worker_start, samples=160)
    hook = ETSHook(
        model, optimizer=opt, dataloader=loader, epochs=3, capture_steps=0, log_every=None
    )
    seeded = None
    for _epoch in range(2):
        for step, (x, y) in enumerate(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            phase = _phase(hook.prediction, EPOCH_START)
            if seeded is None and phase is not None and phase.occurrences:
                seeded = phase
            if _epoch == 0 and step == 4:
                first_epoch = hook.prediction
    hook.close()
    assert seeded is not None and seeded.occurrences == 1
    assert seeded.spent_s >= WORKER_START_CPU_S * 0.9, seeded
    # It is projected over the epochs to come, as a lower bound on a later start-up: priced at
    # the middle of SEED_TO_LATER_START times it, that range its interval.
    from ets_hook.forecast.epochs import SEED_TO_LATER_START

    low, high = SEED_TO_LATER_START
    projected = _phase(first_epoch, EPOCH_START)
    assert projected.remaining == 2
    assert projected.mean_s == pytest.approx(seeded.spent_s * (low + high) / 2)
    assert projected.mean_ci_s == pytest.approx(seeded.spent_s * (high - low) / 2)
    assert projected.remaining_s >= 2 * 0.9 * WORKER_START_CPU_S


WORKER_START_WAIT_S = 0.25


def waiting_worker_start(worker_id: int) -> None:
    """A worker's start-up spent waiting, not computing (files on network storage, a busy
    core): its CPU time does not show it."""
    import time

    time.sleep(WORKER_START_WAIT_S)


def _first_epoch_seed(hook: ETSHook, opt: torch.optim.Optimizer, batches):
    """Train one epoch over ``batches`` under ``hook``, then close it; the epoch start-up
    phase as first seeded (at the first step's end)."""
    from ets_hook.forecast.epochs import EPOCH_START

    seeded = None
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(hook.model(x), y).backward()
        opt.step()
        phase = _phase(hook.prediction, EPOCH_START)
        if seeded is None and phase is not None and phase.occurrences:
            seeded = phase
    hook.close()
    return seeded


def test_a_workers_start_up_spent_waiting_counts_in_the_first_epochs_wait() -> None:
    """The workers' start is when their processes started, not their CPU time's start: a
    worker that slept before its first batch (waiting for files or a core) still kept the loop
    waiting for that long."""
    model, opt, loader = _one_worker_job(waiting_worker_start, samples=96)
    hook = ETSHook(
        model, optimizer=opt, dataloader=loader, epochs=3, capture_steps=0, log_every=None
    )
    seeded = _first_epoch_seed(hook, opt, loader)
    assert seeded is not None and seeded.occurrences == 1
    assert seeded.spent_s >= 0.9 * WORKER_START_WAIT_S, seeded


def test_a_first_batch_held_before_the_hook_counts_only_its_making() -> None:
    """A first batch made and held before the hook existed (a framework's prefetch, or the user
    looking at one batch, as here): the epoch's start-up is its making, from the worker's start
    to the batch's finish, not the time it was held until training began."""
    import itertools
    import time

    from ets_hook.capture.batch_clock import BatchClock

    model, opt, loader = _one_worker_job(waiting_worker_start, samples=96)
    clock = BatchClock.attach(loader)  # as the Lightning callback does before the first iter()
    assert clock is not None
    made_from_s = time.perf_counter()
    batches = iter(loader)
    first = next(batches)
    made_s = time.perf_counter() - made_from_s  # the worker's start-up and the first batch
    held_s = 0.6
    time.sleep(held_s)
    hook = ETSHook(
        model, optimizer=opt, dataloader=loader, epochs=3, capture_steps=0, log_every=None
    )
    seeded = _first_epoch_seed(hook, opt, itertools.chain([first], batches))
    assert seeded is not None and seeded.occurrences == 1
    # Its making (however long a loaded machine made it), not the time it was held after.
    assert 0.9 * WORKER_START_WAIT_S <= seeded.spent_s <= made_s, (seeded, made_s)


class SlowBatches(Dataset):
    """A loader-bound input pipeline: every sample (one per batch) takes ``SLOW_SAMPLE_S``."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import time

        time.sleep(SLOW_SAMPLE_S)
        return torch.randn(16), torch.tensor(index % 4)


SLOW_SAMPLE_S = 0.030


def one_epoch(model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader) -> None:
    """One pass over a loader of one-sample batches."""
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y.view(1)).backward()
        opt.step()


class SlowStream(torch.utils.data.IterableDataset):
    """An iterable dataset (no ``len()``): 16 samples, each ``SLOW_SAMPLE_S`` to make."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        import time

        for index in range(16):
            time.sleep(SLOW_SAMPLE_S)
            yield torch.randn(16), torch.tensor(index % 4)


def test_an_iterable_loader_is_accepted_and_its_workers_timed() -> None:
    """``dataloader=`` an IterableDataset's loader (no ``len()``), the length from
    ``total_steps``: no error, no epochs, and its worker's pace is the floor as for any loader
    (it raised 'dataloader has no len()' before)."""
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowStream(), batch_size=1, num_workers=1)
    hook = ETSHook(model, optimizer=opt, total_steps=16, dataloader=loader, log_every=None)
    one_epoch(model, opt, loader)
    prediction = hook.prediction
    hook.close()
    assert hook._epochs is None and hook.steps_completed == 16
    assert prediction is not None and prediction.input_period_s is not None
    assert prediction.input_period_s >= 0.9 * SLOW_SAMPLE_S


def test_prefetched_batches_do_not_hide_slower_workers() -> None:
    """The loop's first steps take batches its worker made in advance (4 prefetched) and run
    at the model's pace; the worker's own clock says the job will run at its pace."""
    import time

    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowBatches(), batch_size=1, num_workers=1, prefetch_factor=4)
    original_collate = loader.collate_fn
    hook = ETSHook(
        model, optimizer=opt, dataloader=loader, epochs=1, capture_steps=0, log_every=None
    )
    batches = iter(loader)
    time.sleep(8 * SLOW_SAMPLE_S)  # the worker fills its prefetch queue meanwhile
    for _ in range(4):
        x, y = next(batches)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y.view(1)).backward()
        opt.step()
    prediction = hook.prediction
    del batches
    hook.close()
    assert prediction.total_steps == 16
    assert prediction.input_period_s is not None
    assert prediction.input_period_s >= 0.9 * SLOW_SAMPLE_S  # the worker's sleeps bound it
    assert prediction.source == "input"
    assert prediction.iteration_s == pytest.approx(prediction.input_period_s)
    assert prediction.iteration_s > 3 * prediction.measured_iteration_s
    assert loader.collate_fn is original_collate  # given back at close


def test_a_loader_given_after_creation_is_timed_and_its_restarts_known() -> None:
    """``time_dataloader_workers``: a framework's loader, built after the hook, is timed as a
    ``dataloader=`` would be, and its worker restarts seed the first epoch's start-up."""
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, steps_per_epoch=16, total_steps=32, log_every=None)
    assert hook.time_dataloader_workers(DataLoader(SlowBatches(), num_workers=0)) is False

    class Hostile:
        @property
        def num_workers(self) -> int:
            raise RuntimeError("no")

    assert hook.time_dataloader_workers(Hostile()) is False  # refused, never raised
    loader = DataLoader(SlowBatches(), batch_size=1, num_workers=1)
    original_collate = loader.collate_fn
    assert hook._epochs is not None and not hook._epochs.restarts
    assert hook.time_dataloader_workers(loader) is True
    assert hook._epochs.restarts  # non-persistent workers start again each epoch
    assert hook.time_dataloader_workers(loader) is False  # timed already
    other = DataLoader(SlowBatches(), num_workers=1, persistent_workers=True)
    assert hook.time_dataloader_workers(other) is True  # a second loader (combined loaders)
    assert hook._epochs.restarts  # a persistent second loader takes no restart away
    one_epoch(model, opt, loader)
    prediction = hook.prediction
    hook.close()
    assert prediction is not None and prediction.input_period_s is not None
    assert prediction.input_period_s >= 0.9 * SLOW_SAMPLE_S
    assert loader.collate_fn is original_collate  # given back at close
    assert not isinstance(other.collate_fn, TimedCollate)
    assert hook.time_dataloader_workers(loader) is False  # closed


@pytest.mark.parametrize(
    "bad", [{"optimizer": object()}, {"grad_accum_steps": 0}, {"record_shapes": "bogus"}]
)
def test_a_hook_that_refuses_its_arguments_leaves_the_loader_alone(bad) -> None:
    loader = DataLoader(SlowBatches(), batch_size=1, num_workers=1)
    original = loader.collate_fn
    with pytest.raises(ValueError):
        ETSHook(nn.Linear(16, 4), dataloader=loader, log_every=None, **bad)
    assert loader.collate_fn is original


def test_a_failing_input_wait_never_costs_the_window_its_trace(monkeypatch, tmp_path) -> None:
    from ets_hook.forecast.forecaster import Forecaster

    def broken(self, data_wait_s: float, step_wall_s: float) -> None:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(Forecaster, "set_input_wait", broken)
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(
        model,
        optimizer=opt,
        total_steps=10,
        capture_steps=2,
        log_every=None,
        trace_path=tmp_path / "run.ets",
    )
    for _ in range(8):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    trace = hook.wait_for_trace(60)
    prediction = hook.prediction
    hook.close()
    assert trace is not None and len(trace.iterations) == 2, hook.capture_status
    assert "fail" not in hook.capture_status, hook.capture_status
    assert (tmp_path / "run.ets").is_file()  # saved after the input wait: the window went on
    assert prediction is not None and prediction.data_wait_share is None


def _loop_over_a_loader(hook_options: dict, steps: int = 14) -> list[str]:
    """A plain loop over a DataLoader; the hook's info lines about a DataLoader."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(AugmentedVectors(), batch_size=16)
    options = {"total_steps": 100, "capture_steps": 3, "log_every": None, **hook_options}
    if options.pop("give_loader", False):
        options["dataloader"] = loader
        options.pop("total_steps")
    hook = ETSHook(model, optimizer=opt, **options)
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "DataLoader" in record.getMessage():
                lines.append(record.getMessage())

    keep = Keep(logging.INFO)
    ours = logging.getLogger("ets_hook")
    ours.addHandler(keep)
    level = ours.level
    ours.setLevel(logging.INFO)  # setLevel: the logger's cached answers are cleared
    try:
        for step, (x, y) in enumerate(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if step == 8:
                assert hook.wait_for_trace(60) is not None, hook.capture_status
            if step == steps - 1:
                break
        hook.close()
    finally:
        ours.removeHandler(keep)
        ours.setLevel(level)
    return lines


def test_a_loader_not_given_to_the_hook_is_named_once_the_window_saw_it() -> None:
    said = _loop_over_a_loader({})
    assert len(said) == 1 and "pass dataloader=" in said[0], said
    assert _loop_over_a_loader({"give_loader": True}) == []  # given: nothing to say
    assert _loop_over_a_loader({"steps_per_epoch": 256}) == []  # its epochs known
