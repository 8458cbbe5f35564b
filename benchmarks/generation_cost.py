#!/usr/bin/env python
"""What an evaluation that generates costs against a training step, on CPU.

The Hugging Face callback prices a ``Seq2SeqTrainer`` evaluation with ``predict_with_generate``
before the first one is measured: per batch a forward pass (``FORWARD_SHARE`` of a training
step) plus, per generated token, ``GENERATED_TOKEN_FORWARD_SHARE`` of that forward, times
``num_beams ** BEAM_COST_EXPONENT`` (``ets_hook.forecast.job``). This script measures those
shares on small encoder-decoders (T5, BART) built from configs: for each model and batch shape,
the median over rounds (variants alternated within each round) of a training step (AdamW), a
no-grad forward with labels, and ``generate`` at fixed lengths (``min_length = max_length``, so
every sequence runs to the end) with 1 and 4 beams. Printed: each as a multiple of the
training step, and per generated token as a share of the step and of the forward.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/generation_cost.py [--rounds 3] [--models t5-d64-l2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

LENGTHS_BEAMS = ((32, 1), (64, 1), (64, 4))


def models() -> Iterator[tuple[str, Any]]:
    """The encoder-decoders measured, named by width and depth."""
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    yield "t5-d64-l2", T5ForConditionalGeneration(
        T5Config(
            vocab_size=200, d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        )
    )  # fmt: skip
    yield "t5-d256-l4", T5ForConditionalGeneration(
        T5Config(
            vocab_size=1000, d_model=256, d_ff=1024, num_layers=4, num_heads=4, d_kv=64,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        )
    )  # fmt: skip
    yield "bart-d128-l2", BartForConditionalGeneration(
        BartConfig(
            vocab_size=500, d_model=128, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
            decoder_ffn_dim=256, max_position_embeddings=256,
        )
    )  # fmt: skip


def variants(model: Any, batch: int, tokens: int) -> dict[str, Callable[[], Any]]:
    """The timed calls for one model and batch shape."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(2, 200, (batch, tokens))
    y = torch.randint(2, 200, (batch, tokens))

    def train() -> None:
        model.train()
        optimizer.zero_grad()
        model(input_ids=x, labels=y).loss.backward()
        optimizer.step()

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            model(input_ids=x, labels=y)

    calls: dict[str, Callable[[], Any]] = {"train": train, "forward": forward}
    for length, beams in LENGTHS_BEAMS:

        def generate(length: int = length, beams: int = beams) -> None:
            model.eval()
            with torch.no_grad():
                model.generate(
                    input_ids=x, max_length=length, min_length=length, num_beams=beams,
                    do_sample=False,
                )  # fmt: skip

        calls[f"generate {length} tokens, {beams} beam(s)"] = generate
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--models", default="", help="comma-separated names to measure (default: all)"
    )
    parser.add_argument(
        "--shapes", default="8x32,16x64", help="comma-separated batch x tokens shapes"
    )
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    except ValueError:
        parser.error(f"--shapes must be like 8x32,16x64, got {args.shapes!r}")
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        parser.error(f"--shapes must be like 8x32,16x64, got {args.shapes!r}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    wanted = {n for n in args.models.split(",") if n}
    for name, model in models():
        if wanted and name not in wanted:
            continue
        for batch, tokens in shapes:
            calls = variants(model, batch, tokens)
            for call in calls.values():
                call()  # warm-up
            times: dict[str, list[float]] = {key: [] for key in calls}
            for _ in range(args.rounds):
                for key, call in calls.items():
                    start = time.perf_counter()
                    call()
                    times[key].append(time.perf_counter() - start)
            median = {key: statistics.median(v) for key, v in times.items()}
            step, forward = median["train"], median["forward"]
            print(f"{name} batch {batch}x{tokens}: training step {1e3 * step:.1f} ms, "
                  f"forward {forward / step:.2f} of it")  # fmt: skip
            for key, seconds in median.items():
                if not key.startswith("generate"):
                    continue
                length = int(key.split()[1])
                per_token = seconds / length
                print(f"  {key}: {seconds / step:.2f} steps; per token {per_token / step:.3f} "
                      f"of a step, {per_token / forward:.2f} of the forward")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
