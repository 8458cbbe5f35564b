"""Minor page faults per training step, per epoch, in a Lightning fit with and without ets-hook.

Why: the frameworks benchmark's Lightning CNN changes pace between epochs (7-20% slower or
faster steps) in runs with and without the hook. Page faults per step (``getrusage``'s
``ru_minflt``: a count, unaffected by other processes' load) show the cause: glibc trimming the
top of its heap after a step (and faulting it in again in the next) or not, a mode a process
settles into depending on where long-lived allocations happened to land.

Each run is a fresh process (the heap's history is what is measured): the same CNN as
``accuracy_frameworks.py``'s ``pl-cnn+val+ckpt`` on random data, ``--batches`` batches of
``--batch-size`` (128 as there) an epoch, validation of 8 batches and a ``ModelCheckpoint``
each epoch, the TQDM bar; with
``--hook`` alternating runs add ``ETSCallback``. Prints one line per run: the median faults and
CPU ms per step in each epoch.

    OMP_NUM_THREADS=1 python benchmarks/allocator_faults.py --runs 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def fit(with_hook: bool, batches: int, epochs: int, batch_size: int) -> dict[str, Any]:
    """One Lightning fit in this process; per-epoch medians of faults and CPU ms per step."""
    import lightning.pytorch as L
    import torch
    from accuracy_frameworks import lightning_classifier, small_cnn
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    net = small_cnn(48)

    faults: list[int] = []
    cpu_s: list[float] = []

    class Counter(L.Callback):
        """Faults and CPU time of each training batch."""

        def on_train_batch_start(self, *args: Any) -> None:
            self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            self.cpu = time.process_time()

        def on_train_batch_end(self, *args: Any) -> None:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults)
            cpu_s.append(time.process_time() - self.cpu)

    g = torch.Generator().manual_seed(0)
    n = batch_size * batches
    n_val = batch_size * 8
    train = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,)))
    val = TensorDataset(torch.randn(n_val, 3, 32, 32, generator=g), torch.randint(0, 10, (n_val,)))
    with tempfile.TemporaryDirectory() as checkpoints:
        callbacks: list[Any] = [Counter(), ModelCheckpoint(dirpath=checkpoints, save_last=True)]
        if with_hook:
            from ets_hook.integrations.lightning import ETSCallback

            callbacks.append(ETSCallback(verbose=False))
        trainer = L.Trainer(
            max_epochs=epochs,
            callbacks=callbacks,
            logger=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            num_sanity_val_steps=0,
        )
        trainer.fit(
            lightning_classifier(net),
            DataLoader(train, batch_size=batch_size, shuffle=True),
            DataLoader(val, batch_size=batch_size),
        )
    per_epoch = [slice(i, i + batches) for i in range(0, epochs * batches, batches)]
    return {
        "hook": with_hook,
        "faults_per_step": [round(statistics.median(faults[e])) for e in per_epoch],
        "cpu_ms_per_step": [round(1e3 * statistics.median(cpu_s[e])) for e in per_epoch],
    }


def main(argv: list[str] | None = None) -> int:
    """Run ``--runs`` fresh processes per variant, alternating; print one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs per variant")
    parser.add_argument("--batches", type=int, default=12, help="training batches per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="samples per batch")
    parser.add_argument("--one", choices=("bare", "hook"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:  # a child: one fit
        print(json.dumps(fit(args.one == "hook", args.batches, args.epochs, args.batch_size)))
        return 0
    if min(args.runs, args.batches, args.epochs, args.batch_size) < 1:
        parser.error("--runs, --batches, --epochs and --batch-size must be >= 1")
    print(f"load average {os.getloadavg()}", flush=True)
    for _ in range(args.runs):
        for variant in ("bare", "hook"):
            child = subprocess.run(
                [sys.executable, __file__, "--one", variant, "--batches", str(args.batches),
                 "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            print(child.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
