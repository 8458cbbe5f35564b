"""capture.host_load: other processes' CPU and steal time, sampled from CPU-time counters."""

from __future__ import annotations

import dataclasses
import time
from collections import namedtuple

import pytest

from ets_hook.capture.host_load import (
    MAX_INTERVAL_S,
    MAX_SAMPLE_COST_S,
    HostLoad,
    HostLoadSampler,
    ProcessTreeCpu,
)
from ets_hook.forecast.prediction import Prediction
from ets_hook.forecast.text import format_prediction

Machine = namedtuple("Machine", "user nice system idle iowait irq softirq steal guest guest_nice")
Own = namedtuple("Own", "user system")


class FakeHost:
    """CPU-time counters the test advances by hand, and a clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.machine = dict.fromkeys(Machine._fields, 0.0)
        self.own = {"user": 0.0, "system": 0.0}

    def sampler(self, interval_s: float = 1.0) -> HostLoadSampler:
        return HostLoadSampler(
            interval_s,
            machine_times=lambda: Machine(**self.machine),
            process_times=lambda: Own(**self.own),
            cpus=4,
            clock=lambda: self.now,
        )

    def run(self, seconds: float, *, own: float, others: float, steal: float = 0.0) -> None:
        """``seconds`` pass; this process uses ``own`` CPU-seconds, others ``others``."""
        self.now += seconds
        self.own["user"] += own
        self.machine["user"] += own + others
        self.machine["steal"] += steal
        self.machine["guest"] += 0.5 * others  # inside user already: must not count twice
        self.machine["idle"] += 4 * seconds - own - others - steal


def test_other_processes_and_steal_are_shares_of_the_machine() -> None:
    host = FakeHost()
    sampler = host.sampler()
    host.run(2.0, own=2.0, others=3.0, steal=0.4)  # 8 CPU-seconds of capacity
    load = sampler.sample()
    assert load == HostLoad(
        foreign_cpu=pytest.approx(3 / 8), steal=pytest.approx(0.05), interval_s=2.0
    )
    assert sampler.latest is load


def test_this_process_alone_is_no_foreign_load() -> None:
    host = FakeHost()
    sampler = host.sampler()
    host.run(1.0, own=1.0, others=0.0)
    load = sampler.sample()
    assert load is not None and load.foreign_cpu == 0.0 and load.steal == 0.0


def test_samples_come_at_most_once_per_interval() -> None:
    host = FakeHost()
    sampler = host.sampler(interval_s=1.0)
    host.run(0.5, own=0.5, others=1.0)
    assert sampler.sample() is None  # too soon
    host.run(0.6, own=0.6, others=0.0)
    load = sampler.sample()
    assert load is not None and load.interval_s == pytest.approx(1.1)
    assert load.foreign_cpu == pytest.approx(1.0 / (1.1 * 4))


def test_a_failing_read_turns_the_sampler_off_without_raising() -> None:
    host = FakeHost()
    calls = {"n": 0}

    def machine() -> Machine:
        calls["n"] += 1
        if calls["n"] > 1:
            raise PermissionError("/proc/stat")
        return Machine(**host.machine)

    sampler = HostLoadSampler(
        machine_times=machine, process_times=lambda: Own(0.0, 0.0), cpus=2, clock=lambda: host.now
    )
    host.now += 5
    assert sampler.sample() is None and not sampler.enabled
    assert sampler.sample() is None


def test_the_real_machine_can_be_sampled() -> None:
    sampler = HostLoadSampler(interval_s=1e-6)
    sum(i * i for i in range(200_000))  # some CPU time of our own
    load = sampler.sample()
    if not sampler.enabled:
        pytest.skip("psutil cannot read CPU times here")
    assert load is not None
    assert 0.0 <= load.foreign_cpu <= 1.0 and 0.0 <= load.steal <= 1.0


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        HostLoadSampler(0)


def _prediction(**kw: object) -> Prediction:
    base = dict(
        step=10,
        total_steps=100,
        remaining_steps=90,
        iteration_s=0.5,
        iteration_ci_s=0.01,
        total_s=50.0,
        total_ci_s=1.0,
        eta_s=45.0,
        elapsed_s=5.0,
        finish_time=None,
        converged=True,
        source="measured",
    )
    return Prediction(**{**base, **kw})  # type: ignore[arg-type]


def test_a_busy_host_shows_in_the_log_line() -> None:
    quiet = format_prediction(_prediction(host_foreign_cpu=0.1, host_steal=0.0))
    assert "host busy" not in quiet
    assert not _prediction(host_foreign_cpu=0.1).host_busy
    assert _prediction(host_steal=0.05).host_busy
    busy = format_prediction(_prediction(host_foreign_cpu=0.42, host_steal=0.06))
    assert busy.endswith(" · host busy: other processes 42% CPU, steal 6%")
    assert "steal" not in format_prediction(_prediction(host_foreign_cpu=0.3))
    assert dataclasses.asdict(_prediction(host_foreign_cpu=0.3))["host_foreign_cpu"] == 0.3


def test_the_hook_puts_the_hosts_load_into_its_predictions(monkeypatch) -> None:
    import functools

    import torch

    import ets_hook.hook as hook_module
    from ets_hook import ETSHook

    monkeypatch.setattr(
        hook_module, "HostLoadSampler", functools.partial(HostLoadSampler, interval_s=1e-9)
    )
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=20, capture_steps=0, log_every=None)
    for _ in range(6):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    prediction = hook.prediction
    hook.close()
    if not HostLoadSampler().enabled:
        pytest.skip("psutil cannot read CPU times here")
    assert prediction is not None
    assert 0.0 <= prediction.host_foreign_cpu <= 1.0
    assert 0.0 <= prediction.host_steal <= 1.0
    assert prediction.to_dict()["host_foreign_cpu"] == prediction.host_foreign_cpu


# ---------------------------------------------------------------------------------------------
# The job's own processes


class FakeProcess:
    """A ``psutil.Process`` stand-in: CPU times, and descendants (or an error listing them)."""

    Times = namedtuple("Times", "user system children_user children_system")

    def __init__(self, cpu: tuple[float, float, float, float], children=(), gone=False):
        self.cpu, self.gone = cpu, gone
        self._children = children if isinstance(children, Exception) else list(children)

    def cpu_times(self):
        if self.gone:
            raise FakePsutil.Error("no such process")
        return self.Times(*self.cpu)

    def children(self, recursive: bool = False):
        assert recursive
        if isinstance(self._children, Exception):
            raise self._children
        return self._children


class FakePsutil:
    class Error(Exception):
        pass


def test_the_jobs_own_cpu_counts_its_live_descendants_and_reaped_children() -> None:
    worker = FakeProcess((2.0, 0.5, 0.0, 0.0))
    compiler = FakeProcess((1.0, 0.25, 0.5, 0.25))  # with a reaped child of its own
    vanished = FakeProcess((9.0, 9.0, 0.0, 0.0), gone=True)  # ended since it was listed
    parent = FakeProcess((3.0, 1.0, 0.75, 0.25), [worker, compiler, vanished])
    assert ProcessTreeCpu(FakePsutil, parent)() == pytest.approx(4.0 + 1.0 + 2.5 + 2.0)
    # Listing the descendants failed: this process's own total still counts.
    lonely = FakeProcess((3.0, 1.0, 0.0, 0.0), FakePsutil.Error("denied"))
    assert ProcessTreeCpu(FakePsutil, lonely)() == pytest.approx(4.0)


def test_a_job_whose_workers_are_busy_is_not_a_busy_host() -> None:
    """The DataLoader's workers use the CPU: the job's own, not other processes'. With this
    process's time alone, two busy workers read as 'other processes 90% CPU'."""
    host = FakeHost()
    workers = {"cpu": 0.0}
    sampler = HostLoadSampler(
        1.0,
        machine_times=lambda: Machine(**host.machine),
        process_times=lambda: host.own["user"] + host.own["system"] + workers["cpu"],
        cpus=4,
        clock=lambda: host.now,
    )
    host.run(2.0, own=1.0, others=6.0)  # the machine's other busy time ...
    workers["cpu"] += 6.0  # ... is the job's two workers'
    load = sampler.sample()
    assert load is not None and load.foreign_cpu == pytest.approx(0.0)


def test_a_costly_sample_doubles_the_interval_up_to_the_cap() -> None:
    host = FakeHost()

    def costly_own() -> float:
        started = time.thread_time()
        while time.thread_time() - started < 2 * MAX_SAMPLE_COST_S:
            pass
        return host.own["user"]

    sampler = HostLoadSampler(
        1.0,
        machine_times=lambda: Machine(**host.machine),
        process_times=costly_own,
        cpus=4,
        clock=lambda: host.now,
    )
    intervals = []
    for _ in range(8):
        host.run(sampler.interval_s, own=0.1, others=0.0)
        assert sampler.sample() is not None
        intervals.append(sampler.interval_s)
    assert intervals == [2.0, 4.0, 8.0, 16.0, MAX_INTERVAL_S, MAX_INTERVAL_S, MAX_INTERVAL_S, 30.0]


def test_a_real_child_process_counts_as_the_jobs_own() -> None:
    psutil = pytest.importorskip("psutil")
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    child = context.Process(target=_burn_until, args=(stop,))
    child.start()
    try:
        tree = ProcessTreeCpu(psutil, psutil.Process())
        me, worker = psutil.Process(), psutil.Process(child.pid)
        time.sleep(0.5)  # the child starts burning
        before_tree, before_me, before_child = tree(), me.cpu_times(), worker.cpu_times()
        time.sleep(0.5)
        after_tree, after_me, after_child = tree(), me.cpu_times(), worker.cpu_times()
    finally:
        stop.set()
        child.join(30)
    child_s = (after_child.user + after_child.system) - (before_child.user + before_child.system)
    me_s = (after_me.user + after_me.system) - (before_me.user + before_me.system)
    assert child_s > 0.0  # the premise: the child ran
    # The tree's total grew by the child's time (read just before and after it, so within
    # the CPU time that passed between those reads) and this process's own.
    assert after_tree - before_tree >= child_s + me_s - 0.05


def _burn_until(stop) -> None:  # a spawned child's target: module level, picklable
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _sample_beside_a_busy_sibling(results, stop) -> None:  # spawned: module level
    """Two samplers over the same second while a sibling process burns CPU: one counting
    only this process's tree, one its parent's (the job's other ranks on this node)."""
    import psutil

    alone, job = (
        HostLoadSampler(interval_s=0.01),
        HostLoadSampler(interval_s=0.01, include_siblings=True),
    )
    time.sleep(1.0)
    results.put((alone.sample().foreign_cpu, job.sample().foreign_cpu, psutil.cpu_count()))
    stop.set()


def test_other_ranks_on_the_node_are_the_jobs_own_load() -> None:
    """A single-node DDP job: every rank read its siblings as other processes, so every such
    job read as "host busy". With ``include_siblings`` the parent's tree is the job's."""
    pytest.importorskip("psutil")
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    burner = context.Process(target=_burn_until, args=(stop,))
    burner.start()
    sampler = context.Process(target=_sample_beside_a_busy_sibling, args=(results, stop))
    try:
        time.sleep(0.5)  # the burner starts burning
        sampler.start()
        alone, job, cpus = results.get(timeout=60)
    finally:
        stop.set()
        burner.join(30)
        sampler.join(30)
    # The sibling burned about one CPU of the machine's: foreign to the lone tree, not to the
    # job's (other processes on this shared machine count in both alike).
    assert alone - job > 0.5 / cpus
