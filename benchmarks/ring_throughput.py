"""Throughput of the native SPSC ring buffer (ets_hook._C.RingBuffer).

Measurements, each the median of ``--runs`` runs:

- ``push``:   a C++ loop claims slots and writes every record field in place (the producer side
              of the CUPTI collector), one ring-full per round; only the push is timed.
- ``drain``:  the same rounds, timing only the copy out to numpy: ``drain()`` (allocates the
              result) and ``drain_into()`` (reuses a preallocated array).
  Both run twice: with a ring that stays in the CPU caches (``--capacity``, default 4096 records =
  256 KiB: the steady state of a consumer that keeps up) and with a large ring (``--big-capacity``,
  default 2**20 records = 64 MiB: memory bound).
- ``thread``: a C++ producer thread writes ``--records`` records while Python drains concurrently
              into a reused array, sleeping briefly when less than a quarter ring is ready (the
              producer waits when the ring is full, so nothing is lost); wall time from start
              until the last record is in numpy.

Targets (issue 2): push >= 100 M records/s, drain >= 50 M records/s, judged on the cache-resident
rows. Usage::

    python benchmarks/ring_throughput.py [--records 10000000] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from ets_hook import _C
from ets_hook.capture.cupti import RECORD_DTYPE, RingBuffer

TARGETS = {"push": 100e6, "drain": 50e6}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if "model name" in line), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "record_bytes": RECORD_DTYPE.itemsize,
    }


def run_rounds(records: int, capacity: int) -> dict[str, float]:
    """One run of push + drain rounds; returns records/s for push, drain, drain_into."""
    ring = RingBuffer(capacity)
    capacity = ring.capacity
    rounds = max(1, records // capacity)
    out = np.empty(capacity, dtype=RECORD_DTYPE)
    push_s = drain_s = drain_into_s = 0.0
    for r in range(rounds):
        first = r * capacity
        t0 = time.perf_counter()
        pushed = _C._testing.push_sequence(ring, first, capacity, capacity)
        t1 = time.perf_counter()
        if r % 2 == 0:
            got = ring.drain().size
            drain_s += time.perf_counter() - t1
        else:
            got = _C._testing.ring_drain_into(ring, out)
            drain_into_s += time.perf_counter() - t1
        push_s += t1 - t0
        if pushed != capacity or got != capacity:
            raise RuntimeError(f"round {r}: pushed {pushed}, drained {got}, capacity {capacity}")
    drain_rounds = (rounds + 1) // 2
    into_rounds = rounds // 2
    return {
        "push": rounds * capacity / push_s,
        "drain": drain_rounds * capacity / drain_s,
        "drain_into": into_rounds * capacity / drain_into_s if into_rounds else float("nan"),
    }


def run_thread(records: int, capacity: int, idle_sleep_s: float = 20e-6) -> float:
    """C++ producer thread -> Python drain; records/s over the wall time."""
    ring = RingBuffer(capacity)
    out = np.empty(ring.capacity, dtype=RECORD_DTYPE)
    received = 0
    t0 = time.perf_counter()
    producer = _C._testing.Producer(ring, 0, records, wait_when_full=True)
    while True:
        done = producer.done  # read before draining: nothing is published after done
        n = _C._testing.ring_drain_into(ring, out)
        received += n
        if n == 0 and done:
            break
        if n < ring.capacity // 4:
            time.sleep(idle_sleep_s)
    elapsed = time.perf_counter() - t0
    producer.join()
    if received != records or ring.dropped:
        raise RuntimeError(f"received {received} of {records}, dropped {ring.dropped}")
    return records / elapsed


LABELS = {
    "push": "push, C++ loop in place",
    "drain": "drain() -> new numpy",
    "drain_into": "drain_into() -> numpy",
    "push_big": "push, 64 MiB ring",
    "drain_big": "drain(), 64 MiB ring",
    "drain_into_big": "drain_into(), 64 MiB ring",
    "thread": "C++ thread -> Python drain",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="records per run")
    parser.add_argument("--capacity", type=int, default=1 << 12, help="cache-resident ring")
    parser.add_argument("--big-capacity", type=int, default=1 << 20, help="memory-bound ring")
    parser.add_argument("--thread-capacity", type=int, default=1 << 15, help="ring for 'thread'")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args(argv)
    for name in ("records", "capacity", "big_capacity", "thread_capacity", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    samples: dict[str, list[float]] = {key: [] for key in LABELS}
    for _ in range(args.runs):
        for key, value in run_rounds(args.records, args.capacity).items():
            samples[key].append(value)
        for key, value in run_rounds(args.records, args.big_capacity).items():
            samples[f"{key}_big"].append(value)
        samples["thread"].append(run_thread(args.records, args.thread_capacity))
    medians = {key: statistics.median(values) for key, values in samples.items()}

    info = machine()
    record_bytes = info["record_bytes"]
    print(f"machine: {info['cpu']}, {info['usable_cpus']} usable CPUs, {info['platform']}")
    capacities = {
        "cache_resident": RingBuffer(args.capacity).capacity,
        "big": RingBuffer(args.big_capacity).capacity,
        "thread": RingBuffer(args.thread_capacity).capacity,
    }
    print(
        f"{args.records:,} records per run, {record_bytes} B/record, median of {args.runs} runs; "
        f"ring capacities (records): {capacities}"
    )
    print(f"{'measurement':<28}{'M records/s':>12}{'GB/s':>8}   target")
    for key, label in LABELS.items():
        rate = medians[key]
        target = TARGETS.get(key)
        verdict = (
            ""
            if target is None
            else f">= {target / 1e6:.0f} " + ("ok" if rate >= target else "MISSED")
        )
        print(f"{label:<28}{rate / 1e6:>12.1f}{rate * record_bytes / 1e9:>8.2f}   {verdict}")

    if args.json:
        result = {
            "benchmark": "ring_throughput",
            "machine": info,
            "records_per_run": args.records,
            "capacities": capacities,
            "runs": args.runs,
            "median_records_per_s": medians,
            "samples_records_per_s": samples,
            "targets_records_per_s": TARGETS,
            "targets_met": {k: medians[k] >= v for k, v in TARGETS.items()},
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
