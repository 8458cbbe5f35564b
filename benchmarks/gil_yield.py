"""Does a background Python thread that gives the GIL up often cost an op-bound loop less?

The window's decode runs on a background thread in pure Python for most of its time; the
training loop, which takes the GIL back between its ops, then all but stops
(``benchmarks/decode_cost.py --lost-time``). This runs a stand-in for the decode (list building,
~20 ms of CPU) beside the zoo's op-bound MLP, giving the GIL up with ``time.sleep(0)`` every
``N`` chunks of its work (0: never), and prints what the loop lost over its median step while
it ran. Rounds alternate the variants.

    OMP_NUM_THREADS=1 python benchmarks/gil_yield.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from ets_hook.cli.zoo import workloads


def work(chunks: int, per_chunk: int, yield_every: int) -> list[int]:
    """The stand-in decode: ``chunks`` lists of ``per_chunk`` ints built and summed."""
    acc = []
    for c in range(chunks):
        x = [i * 2 for i in range(per_chunk)]
        acc.append(sum(x))
        if yield_every and c % yield_every == 0:
            time.sleep(0)
    return acc


def trial(
    job: object, batches: object, yield_every: int, chunks: int = 2000, per_chunk: int = 200
) -> tuple[float, list[float]]:
    """The stand-in on a thread, the loop's steps meanwhile: (its wall s, the steps' s)."""
    t = threading.Thread(target=work, args=(chunks, per_chunk, yield_every))
    steps = []
    t0 = time.perf_counter()
    t.start()
    while t.is_alive():
        s = time.perf_counter()
        job.train_step(next(batches))  # type: ignore[attr-defined]
        steps.append(time.perf_counter() - s)
    return time.perf_counter() - t0, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = workloads()["mlp-w128-d2-b32"].build("cpu")
    batches = job.batches()
    for _ in range(50):
        job.train_step(next(batches))
    base = []
    for _ in range(100):
        s = time.perf_counter()
        job.train_step(next(batches))
        base.append(time.perf_counter() - s)
    b = statistics.median(base)
    s0 = time.thread_time()
    work(2000, 200, 0)
    alone = time.thread_time() - s0
    print(f"median step {b * 1e3:.2f} ms; the stand-in alone {alone * 1e3:.1f} ms of CPU")
    for _ in range(args.rounds):
        for every in (0, 1, 4, 16):
            wall, steps = trial(job, batches, every)
            lost = sum(steps) - len(steps) * b
            print(
                f"sleep(0) every {every:2d} chunks: stand-in wall {wall * 1e3:6.1f} ms, "
                f"{len(steps):3d} steps ran, the loop lost {lost * 1e3:6.1f} ms"
            )


if __name__ == "__main__":
    main()
