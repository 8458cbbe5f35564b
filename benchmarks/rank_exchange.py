"""What a rank exchange costs (``ets_hook.distributed``): on the training thread, and per exchange.

1. Training thread: ``RankCoordinator.on_step`` at an exchange step (build the ``RankForecast``
   from the current prediction, queue it) and off-schedule (one comparison). Timed over
   ``--calls`` calls each, median and P90 in microseconds.
2. Per exchange, with ``N`` simulated ranks in one process (one ``RankExchange`` and one
   ``TCPStore`` client each, against one ``TCPStore`` server, as under torchrun): the time from
   the last rank's publish until every rank has the job view, and the store requests made
   (``set``/``check``/``get``/``multi_get``/``delete_key``), per rank and on the server in all.
   Repeated ``--rounds`` times per N; medians.

Threads of one process share the GIL and the 2 cores of this machine, so the latency of part 2
is an upper bound for N ranks on N machines; the request counts do not depend on it.

    python benchmarks/rank_exchange.py [--sizes 2,8,32,128] [--rounds 5] [--calls 20000]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import threading
import time
from collections import Counter
from typing import Any

import torch.distributed as dist

from ets_hook.distributed.coordinator import RankCoordinator
from ets_hook.distributed.exchange import RankExchange
from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.forecast.ranks import JobView, RankForecast


class CountingStore:
    """A store client that counts its requests by kind."""

    def __init__(self, inner: Any, counts: Counter[str], lock: threading.Lock) -> None:
        self._inner, self._counts, self._lock = inner, counts, lock

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def call(*args: Any) -> Any:
            with self._lock:
                self._counts[name] += 1
            return method(*args)

        return call


def training_thread_cost(calls: int) -> dict[str, float]:
    """Microseconds per ``on_step`` call, at exchange steps and off them."""
    forecaster = Forecaster(JobModel(total_steps=10**6), start_s=0.0, rank=1, world_size=2)
    for step in range(50):
        forecaster.on_step_end(step, 0.01, 0.01 * (step + 1))

    class NullStore:
        def set(self, *args: Any) -> None: ...
        def delete_key(self, *args: Any) -> None: ...
        def check(self, *args: Any) -> bool:
            return False

    coordinator = RankCoordinator(
        1,
        2,
        namespace="bench",
        timeout_s=0.001,
        first_step=1,
        current=lambda: forecaster.prediction,
        apply=lambda view: None,
        log_here=False,
        start_wall_s=time.time(),
        store_factory=NullStore,
    )
    on_schedule, off_schedule = [], []
    for _ in range(calls):
        coordinator.next_exchange_step = 7
        start = time.perf_counter_ns()
        coordinator.on_step(7)
        on_schedule.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        coordinator.on_step(8)
        off_schedule.append(time.perf_counter_ns() - start)
    coordinator.close()

    def q(values: list[int], p: float) -> float:
        return statistics.quantiles(values, n=100)[int(p) - 1] / 1e3

    return {
        "exchange_step_median_us": statistics.median(on_schedule) / 1e3,
        "exchange_step_p90_us": q(on_schedule, 90),
        "other_step_median_us": statistics.median(off_schedule) / 1e3,
        "other_step_p90_us": q(off_schedule, 90),
    }


def one_exchange(size: int, server: Any, round_number: int) -> tuple[float, Counter[str]]:
    """Seconds from the last publish until all ``size`` ranks have the view; request counts."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    got = threading.Barrier(size + 1)
    views: list[JobView | None] = [None] * size
    exchanges = []
    for rank in range(size):
        client = dist.TCPStore(
            "127.0.0.1",
            server.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=30),
        )
        store = CountingStore(client, counts, lock)

        def on_view(view: JobView, rank: int = rank) -> None:
            views[rank] = view
            got.wait()

        def on_skip(exchange: int, reason: str) -> None:
            raise SystemExit(f"exchange skipped: {reason}")

        exchanges.append(
            RankExchange(
                rank,
                size,
                namespace=f"bench/{size}/{round_number}",
                timeout_s=30.0,
                on_view=on_view,
                on_skip=on_skip,
                store_factory=lambda store=store: store,
            )
        )
    now = time.time()
    start = time.perf_counter()
    for rank, exchange in enumerate(exchanges):
        exchange.publish(
            0,
            RankForecast(
                rank=rank,
                step=100,
                start_wall_s=now,
                finish_wall_s=now + 1000.0 + rank,
                finish_ci_s=50.0,
                iteration_s=0.1,
                compute_s=0.05,
                data_wait_s=0.01,
                busy_s=0.06,
                host=f"node{rank // 8}",
            ),
        )
    got.wait()
    elapsed = time.perf_counter() - start
    for exchange in exchanges:
        exchange.close()
    assert all(v == views[0] for v in views)
    return elapsed, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,8,32,128")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)

    cost = training_thread_cost(args.calls)
    print("training thread, RankCoordinator.on_step (us):")
    for name, value in cost.items():
        print(f"  {name:28s} {value:8.2f}")

    server = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        timeout=datetime.timedelta(seconds=30),
        wait_for_workers=False,
    )
    print("\nper exchange (N simulated ranks, one TCPStore server):")
    print(
        f"{'N':>5} {'latency ms (median)':>20} {'spread ms':>14} {'requests/rank':>14}"
        f" {'server requests':>16}  by kind"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        latencies, totals = [], Counter()
        for round_number in range(args.rounds):
            elapsed, counts = one_exchange(size, server, round_number)
            latencies.append(elapsed * 1e3)
            totals.update(counts)
        per_round = {k: v / args.rounds for k, v in totals.items()}
        requests = sum(per_round.values())
        print(
            f"{size:>5} {statistics.median(latencies):>20.1f}"
            f" {min(latencies):>6.1f}-{max(latencies):<7.1f} {requests / size:>14.1f}"
            f" {requests:>16.0f}  "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(per_round.items()))
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
