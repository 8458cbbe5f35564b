#!/usr/bin/env python
"""What an epoch's start-up costs a plain loop whose DataLoader restarts its workers, against
the first epoch's start-up that seeds its price (``forecast.epochs.SEED_TO_LATER_START``).

Each run is a fresh process: a 256-512-512-10 MLP trained on ``_AugmentedVectors`` (per-sample
CPU work, as ``accuracy.py``'s ``mlp-loader-w2-*`` jobs) by a DataLoader with ``--workers``
non-persistent workers, ``--epochs`` epochs of ``--steps-per-epoch`` steps, under an
``ETSHook(dataloader=..., epochs=...)``. Per run it prints the loader's own times (``iter()``
plus the first batch; the ``next()`` that raised ``StopIteration``, which shuts the old workers
down), the seed (the first epoch's start-up as the workers' clocks measured it), the phase's
price at step 5, the later start-ups' measured mean by the end, and their ratios.

``--loop transformers`` runs a Hugging Face ``Trainer`` instead (a 2-layer, 64-wide BERT
classifier built from its config, random tokens made with per-sample CPU work by
``dataloader_num_workers`` workers, ``ETSTrainerCallback``): the Trainer owns the loop, so the
loader's own times are not printed.

    OMP_NUM_THREADS=1 python benchmarks/epoch_starts.py --runs 4 [--loop transformers]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

PRICE_STEP = 5


def one_run(workers: int, epochs: int, steps_per_epoch: int, batch: int) -> dict[str, Any]:
    """One job in this process; the loader's times and the epoch start-up's price and cost."""
    import torch
    from accuracy import LOADER_FEATURES, _AugmentedVectors  # benchmarks/ is sys.path[0]

    from ets_hook import ETSHook
    from ets_hook.forecast.epochs import EPOCH_START

    torch.manual_seed(0)
    width = 512
    model = torch.nn.Sequential(
        torch.nn.Linear(LOADER_FEATURES, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        _AugmentedVectors(steps_per_epoch * batch, LOADER_FEATURES, 10_000),
        batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
    )  # fmt: skip
    hook = ETSHook(model, opt, dataloader=loader, epochs=epochs, log_every=None, verbose=False)

    def epoch_start() -> Any:
        prediction = hook.prediction
        phases = prediction.phases if prediction is not None else ()
        return next((p for p in phases if p.name == EPOCH_START), None)

    first_batch_s, stop_s = [], []
    seed_s = price_s = None
    step = 0
    for _ in range(epochs):
        started = time.perf_counter()
        batches = iter(loader)
        x, y = next(batches)
        first_batch_s.append(time.perf_counter() - started)
        while True:
            loss = torch.nn.functional.cross_entropy(model(x), y % 10)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == PRICE_STEP:
                phase = epoch_start()
                if phase is not None and phase.occurrences:
                    seed_s, price_s = phase.spent_s, phase.mean_s
            started = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                stop_s.append(time.perf_counter() - started)
                break
    hook.close()
    final = epoch_start()
    later_s = final.mean_s if final is not None and final.occurrences > 1 else None
    return {
        "first_batch_s": first_batch_s,
        "stop_iteration_s": stop_s,
        "seed_s": seed_s,
        "price_at_step_5_s": price_s,
        "later_mean_s": later_s,
        "later_over_seed": later_s / seed_s if later_s and seed_s else None,
        "price_error_pct": 100 * (price_s / later_s - 1) if later_s and price_s else None,
    }


def one_trainer_run(workers: int, epochs: int, steps_per_epoch: int, batch: int) -> dict[str, Any]:
    """``one_run`` under a Hugging Face ``Trainer`` (module docs); the same keys, the loader's
    own times empty."""
    import tempfile

    import torch
    from accuracy_frameworks import _Tokens  # benchmarks/ is sys.path[0]
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from ets_hook.forecast.epochs import EPOCH_START
    from ets_hook.integrations.transformers import ETSTrainerCallback

    class SlowTokens(_Tokens):
        """Random token sequences, each made with some CPU work (a decode, an augmentation)."""

        def __getitem__(self, index: int) -> Any:
            torch.randn(20_000).sort()
            return super().__getitem__(index)

    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=32, num_labels=4)  # fmt: skip
    ets = ETSTrainerCallback(verbose=False, log_every=None)
    price: dict[str, float] = {}

    def epoch_start() -> Any:
        prediction = ets.prediction
        phases = prediction.phases if prediction is not None else ()
        return next((p for p in phases if p.name == EPOCH_START), None)

    class AtStep5(TrainerCallback):
        """Reads the phase's price after optimizer step 5."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            phase = epoch_start()
            if state.global_step == PRICE_STEP and phase is not None and phase.occurrences:
                price.update(seed_s=phase.spent_s, price_s=phase.mean_s)

    with tempfile.TemporaryDirectory(prefix="ets-epoch-starts-") as out:
        args = TrainingArguments(
            output_dir=out, num_train_epochs=epochs, per_device_train_batch_size=batch,
            dataloader_num_workers=workers, report_to=[], save_strategy="no",
            eval_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True,
        )  # fmt: skip
        train = SlowTokens(steps_per_epoch * batch, 32, 1000, 4, seed=0)
        model = BertForSequenceClassification(config)
        Trainer(model=model, args=args, train_dataset=train, callbacks=[ets, AtStep5()]).train()
    final = epoch_start()
    later_s = final.mean_s if final is not None and final.occurrences > 1 else None
    seed_s, price_s = price.get("seed_s"), price.get("price_s")
    return {
        "first_batch_s": [],
        "stop_iteration_s": [],
        "seed_s": seed_s,
        "price_at_step_5_s": price_s,
        "later_mean_s": later_s,
        "later_over_seed": later_s / seed_s if later_s and seed_s else None,
        "price_error_pct": 100 * (price_s / later_s - 1) if later_s and price_s else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="fresh processes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--loop", choices=("plain", "transformers"), default="plain")
    parser.add_argument("--in-process", action="store_true", help="one run in this process")
    args = parser.parse_args(argv)
    if min(args.runs, args.workers, args.steps_per_epoch, args.batch) < 1 or args.epochs < 2:
        parser.error("--runs, --workers, --steps-per-epoch, --batch >= 1 and --epochs >= 2")
    settings = (args.workers, args.epochs, args.steps_per_epoch, args.batch)
    if args.in_process:
        runner = one_trainer_run if args.loop == "transformers" else one_run
        print(json.dumps(runner(*settings)))
        return 0
    runs = []
    for _ in range(args.runs):
        child = subprocess.run(
            [sys.executable, __file__, "--in-process", "--loop", args.loop,
             "--workers", str(args.workers),
             "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps_per_epoch),
             "--batch", str(args.batch)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        run = json.loads(child.stdout.strip().splitlines()[-1])
        runs.append(run)
        print(json.dumps(run), flush=True)
    ratios = [r["later_over_seed"] for r in runs if r["later_over_seed"] is not None]
    if ratios:
        print(
            f"later start-up / seed: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} runs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
