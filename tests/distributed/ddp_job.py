"""A 2-rank gloo job for tests/distributed (run under torchrun; not a test module).

Usage: ``torchrun --nproc_per_node=2 ddp_job.py OUT_DIR``. Two parts, one launch:

1. DDP on a tiny MLP, 40 steps; rank 1 sleeps ``SLOW_DATA_S`` before each forward (a slow input
   pipeline), so rank 0 waits for it inside the all-reduce. Writes per-rank traces, status
   files and log files, and ``result.rank<N>.json`` with the last job view and prediction.
2. No collectives: each rank trains its own copy; rank 1 stops calling its hook after 4 steps
   (closes it and idles), rank 0 goes on for 30 steps. Records rank 0's step times and whether
   it ever waited for rank 1 (``stall.rank<N>.json``).
3. FSDP2 (``fully_shard`` per layer and at the root, gloo on CPU), 20 steps: per-rank traces
   ``fsdp.rank<N>.ets`` and ``fsdp.rank<N>.json`` (steps counted, the job view).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ets_hook import ETSHook

SLOW_DATA_S = 0.012
STEPS = 40
EXCHANGE_TIMEOUT_S = 1.0


def wait_for_exchange(hook: ETSHook, exchange: int, timeout_s: float = 10.0) -> None:
    """Wait (at most ``timeout_s``) until ``hook.job_view`` is that of exchange ``exchange``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = hook.job_view
        if view is not None and view.exchange == exchange:
            return
        time.sleep(0.01)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))


def ddp_part(out: str, rank: int) -> None:
    model = DistributedDataParallel(tiny_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model,
        optimizer,
        total_steps=STEPS,
        capture_steps=5,
        skip_steps=1,
        trace_path=os.path.join(out, "trace.ets"),
        status_path=os.path.join(out, "eta.json"),
        log_every=10,
        rank_exchange_timeout_s=EXCHANGE_TIMEOUT_S,
    )
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    for _ in range(STEPS):
        if rank == 1:
            time.sleep(SLOW_DATA_S)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # Exchanges after local steps 8, 16, 32: wait (bounded) for the last one's view.
    wait_for_exchange(hook, 2)
    prediction = hook.prediction
    view = hook.job_view
    result = {
        "view": json.loads(view.to_json()) if view is not None else None,
        "prediction": prediction.to_dict() if prediction is not None else None,
        "exchange_cost_s": hook._ranks.exchange.last_cost_s if hook._ranks else None,
    }
    hook.close()
    with open(os.path.join(out, f"result.rank{rank}.json"), "w") as f:
        json.dump(result, f)


def stall_part(out: str, rank: int) -> None:
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model,
        optimizer,
        total_steps=30,
        capture_steps=2,
        skip_steps=1,
        log_every=None,
        rank_exchange_timeout_s=EXCHANGE_TIMEOUT_S,
    )
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    steps = 4 if rank == 1 else 30
    step_s = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_s.append(time.perf_counter() - start)
    if rank == 0:
        # Exchange 0 (after local step 5) was skipped; give its log line time to appear.
        deadline = time.monotonic() + 4 * EXCHANGE_TIMEOUT_S
        while hook._ranks.exchange.exchanges_skipped == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    result = {
        "step_s": step_s,
        "view": hook.job_view is not None,
        "skipped": hook._ranks.exchange.exchanges_skipped,
        "done": hook._ranks.exchange.exchanges_done,
    }
    hook.close()
    with open(os.path.join(out, f"stall.rank{rank}.json"), "w") as f:
        json.dump(result, f)


def fsdp_part(out: str, rank: int) -> None:
    from torch.distributed.fsdp import fully_shard

    model = tiny_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(
        model,
        optimizer,
        total_steps=20,
        capture_steps=3,
        skip_steps=1,
        trace_path=os.path.join(out, "fsdp.ets"),
        log_every=None,
        rank_exchange_timeout_s=EXCHANGE_TIMEOUT_S,
    )
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    deadline = time.monotonic() + 10  # exchanges after local steps 6 and 12
    while time.monotonic() < deadline:
        view = hook.job_view
        if view is not None and view.exchange == 1:
            break
        time.sleep(0.01)
    view = hook.job_view
    result = {
        "steps": hook.steps_completed,
        "view": json.loads(view.to_json()) if view is not None else None,
    }
    hook.close()
    with open(os.path.join(out, f"fsdp.rank{rank}.json"), "w") as f:
        json.dump(result, f)


def log_to_file(out: str, rank: int) -> None:
    """ets-hook's log lines of this rank (INFO and up) into ``out/log.rank{rank}.txt``."""
    handler = logging.FileHandler(os.path.join(out, f"log.rank{rank}.txt"))
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger("ets_hook").addHandler(handler)
    logging.getLogger("ets_hook").setLevel(logging.INFO)


def main() -> None:
    out = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log_to_file(out, rank)
    ddp_part(out, rank)
    dist.barrier()
    stall_part(out, rank)
    dist.barrier()
    fsdp_part(out, rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
