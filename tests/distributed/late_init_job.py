"""A 2-process gloo job started by ``torch.multiprocessing.spawn`` (no launcher variables) whose
workers create their ``ETSHook`` before ``init_process_group``; for
``tests/distributed/test_late_init.py`` (not a test module).

Usage: ``python late_init_job.py OUT_DIR PORT``. Each rank trains a tiny MLP under DDP for
``STEPS`` steps and writes its log (``log.rank<N>.txt``), its trace and status files, and
``result.rank<N>.json`` (its last prediction and job view).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ddp_job import (  # the sibling script (this file's folder is on sys.path)
    log_to_file,
    wait_for_exchange,
)
from torch.nn.parallel import DistributedDataParallel

from ets_hook import ETSHook

STEPS = 12
EXCHANGE_TIMEOUT_S = 1.0


def worker(rank: int, out: str, port: int) -> None:
    torch.set_num_threads(1)
    log_to_file(out, rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # Before init_process_group: the hook sees one process here.
    hook = ETSHook(
        model,
        optimizer,
        total_steps=STEPS,
        capture_steps=2,
        skip_steps=1,
        trace_path=os.path.join(out, "trace.ets"),
        status_path=os.path.join(out, "eta.json"),
        log_every=5,
        rank_exchange_timeout_s=EXCHANGE_TIMEOUT_S,
    )
    created_as = (hook.trace_path.name if hook.trace_path else None, hook.job_view)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ddp = DistributedDataParallel(model)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    for _ in range(STEPS):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # Exchanges after local steps 5 and 10: wait (bounded) for the second one's view.
    wait_for_exchange(hook, 1)
    view = hook.job_view
    prediction = hook.prediction
    result = {
        "created_trace_name": created_as[0],
        "trace_name": hook.trace_path.name if hook.trace_path else None,
        "view": json.loads(view.to_json()) if view is not None else None,
        "prediction": prediction.to_dict() if prediction is not None else None,
    }
    hook.close()
    with open(os.path.join(out, f"result.rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=2)
