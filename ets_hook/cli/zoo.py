"""A zoo of small, real training workloads on synthetic data (demo, dataset collection, benchmarks).

Each ``Workload`` builds a model, a loss, an optimizer and a batch source that yields tensors on
the requested device. Families cover what the ETS paper and our users train: MLPs, ResNet-, VGG-
and MobileNet-like CNNs, LSTM/GRU sequence models, transformer encoders, GPT-style decoders, an
embedding-heavy recommender, temporal (1-D) convolution nets and convolutional autoencoders.
Sizes are chosen so that one step takes milliseconds to ~0.1 s on a 2-core CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
BatchMaker = Callable[[int, torch.Generator], Batch]


@dataclass(frozen=True)
class Workload:
    """A named training job: ``build(device)`` returns a fresh ``Job``.

    ``batches(batch_size)`` returns the batch maker for a batch size, so one workload can be run
    at several batch sizes (``with_batch_size``).

    Attributes:
        name: unique name, encoding the sizes (``mlp-w512-d3-b64``).
        family: model family (``mlp``, ``resnet``, ``gpt``, ...).
        batch_size: samples per batch.
        make_model: builds a fresh model on the CPU.
        batches: batch size -> batch maker ``(index, generator) -> (inputs, targets)`` (CPU).
        loss: ``"mse"``; any other value means cross-entropy.
        optimizer: ``"adam"``, ``"adamw"``; any other value means SGD with momentum 0.9.
        lr: learning rate.
        params: the sizes, for the record.
    """

    name: str
    family: str
    batch_size: int
    make_model: Callable[[], nn.Module]
    batches: Callable[[int], BatchMaker]
    loss: str = "cross_entropy"
    optimizer: str = "sgd"
    lr: float = 0.01
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def make_batch(self) -> BatchMaker:
        """The batch maker at this workload's ``batch_size``."""
        return self.batches(self.batch_size)

    def with_batch_size(self, batch_size: int) -> Workload:
        """The same workload at another batch size.

        Args:
            batch_size: the new batch size (>= 1).

        Returns:
            A copy with that batch size, its name's ``-b<old>`` replaced by ``-b<batch_size>``
            (or ``-b<batch_size>`` appended if the name has none).

        Raises:
            ValueError: ``batch_size`` < 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        base = self.name.rsplit(f"-b{self.batch_size}", 1)
        name = f"-b{batch_size}".join(base) if len(base) == 2 else f"{self.name}-b{batch_size}"
        return dataclasses.replace(self, name=name, batch_size=batch_size)

    def build(self, device: str | torch.device = "cpu", seed: int = 0) -> Job:
        """Build a fresh model, optimizer and loss on ``device``.

        Args:
            device: where the model and the batches go.
            seed: seeds the model's initialisation (through ``torch.manual_seed``, which sets
                the global RNG) and the job's batch stream.

        Returns:
            The ``Job``.
        """
        torch.manual_seed(seed)
        model = self.make_model().to(device)
        if self.optimizer == "adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
        elif self.optimizer == "adamw":
            optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.9)
        loss_fn: nn.Module = nn.MSELoss() if self.loss == "mse" else nn.CrossEntropyLoss()
        return Job(self, model, optimizer, loss_fn, torch.device(device), seed)


@dataclass
class Job:
    """One built workload, ready to train: model and optimizer on ``device``, loss, seed."""

    workload: Workload
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module
    device: torch.device
    seed: int

    def batches(self) -> Iterator[Batch]:
        """An endless stream of synthetic batches, generated on the CPU then moved.

        Each call starts the same stream again (a generator seeded with ``seed``).
        """
        generator = torch.Generator().manual_seed(self.seed)
        index = 0
        while True:
            x, y = self.workload.make_batch(index, generator)
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            index += 1

    def loss(self, batch: Batch) -> torch.Tensor:
        """Forward pass and loss of one batch (3-D sequence outputs flattened over time)."""
        x, y = batch
        out = self.model(x)
        if out.dim() == 3:  # sequence models: (batch, time, classes)
            out = out.reshape(-1, out.shape[-1])
            y = y.reshape(-1)
        return self.loss_fn(out, y)

    def train_step(self, batch: Batch) -> float:
        """One training step: zero grads, forward, backward, optimizer step.

        Returns:
            The loss value (reading it waits for the device).
        """
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


# ---------------------------------------------------------------------------------------------
# Model families


def _mlp(width: int, depth: int, in_features: int = 256, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    features = in_features
    for _ in range(depth):
        layers += [nn.Linear(features, width), nn.ReLU()]
        features = width
    layers.append(nn.Linear(features, classes))
    return nn.Sequential(*layers)


class _BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                nn.BatchNorm2d(channels_out),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def _resnet(width: int, blocks_per_stage: int, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    channels = width
    for stage in range(3):
        out_channels = width * (2**stage)
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(_BasicBlock(channels, out_channels, stride))
            channels = out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


def _vgg(width: int, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for out_channels in (width, width * 2, width * 4):
        layers += [
            nn.Conv2d(channels, out_channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        channels = out_channels
    layers += [nn.Flatten(), nn.Linear(channels * 4 * 4, 128), nn.ReLU(), nn.Linear(128, classes)]
    return nn.Sequential(*layers)


def _mobilenet(width: int, classes: int = 10) -> nn.Module:
    def separable(channels_in: int, channels_out: int, stride: int) -> list[nn.Module]:
        return [
            nn.Conv2d(channels_in, channels_in, 3, stride, 1, groups=channels_in, bias=False),
            nn.BatchNorm2d(channels_in),
            nn.ReLU6(),
            nn.Conv2d(channels_in, channels_out, 1, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU6(),
        ]

    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width)]
    channels = width
    for multiplier, stride in ((2, 1), (4, 2), (4, 1), (8, 2)):
        layers += separable(channels, width * multiplier, stride)
        channels = width * multiplier
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


class _RNNClassifier(nn.Module):
    def __init__(self, cell: str, vocab: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        rnn_type = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_type(hidden, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embedding(tokens))
        return self.head(out[:, -1])


class _TransformerClassifier(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embedding(tokens)).mean(dim=1))


class _GPTBlock(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(channels, dim=2)
        shape = (batch, time, self.heads, channels // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, channels))
        return x + self.mlp(self.norm2(x))


class _GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*[_GPTBlock(d_model, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        return self.head(self.norm(self.blocks(x)))


class _Recommender(nn.Module):
    """DLRM-like: sparse features through embedding bags, dense through an MLP, then a top MLP."""

    def __init__(self, tables: int, rows: int, dim: int, dense: int) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 128), nn.ReLU(), nn.Linear(128, 2))
        self.dense = dense

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        dense = features[:, : self.dense]
        sparse = features[:, self.dense :].long()
        pooled = [bag(sparse[:, i : i + 1]) for i, bag in enumerate(self.bags)]
        return self.top(torch.cat([self.bottom(dense), *pooled], dim=1))


# ---------------------------------------------------------------------------------------------
# Batch makers


def _tcn(channels: int, levels: int, in_channels: int = 8, classes: int = 10) -> nn.Module:
    """Temporal convolution net: dilated 1-D convolutions over a (batch, channels, time) signal."""
    layers: list[nn.Module] = []
    features = in_channels
    for level in range(levels):
        dilation = 2**level
        layers += [
            nn.Conv1d(features, channels, 3, padding=dilation, dilation=dilation),
            nn.BatchNorm1d(channels),
            nn.ReLU(),
        ]
        features = channels
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


def _autoencoder(width: int) -> nn.Module:
    """Convolutional autoencoder: strided convolutions down, transposed convolutions back up."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, 2, 1),
        nn.ReLU(),
        nn.ConvTranspose2d(2 * width, width, 4, 2, 1),
        nn.ReLU(),
        nn.ConvTranspose2d(width, 3, 4, 2, 1),
        nn.Sigmoid(),
    )


def _signals(batch: int, channels: int, length: int, classes: int = 10) -> BatchMaker:
    def make(_index: int, generator: torch.Generator) -> Batch:
        x = torch.randn(batch, channels, length, generator=generator)
        return x, torch.randint(0, classes, (batch,), generator=generator)

    return make


def _reconstruction(batch: int, size: int) -> BatchMaker:
    def make(_index: int, generator: torch.Generator) -> Batch:
        x = torch.rand(batch, 3, size, size, generator=generator)
        return x, x

    return make


def _images(batch: int, size: int, classes: int = 10) -> BatchMaker:
    def make(_index: int, generator: torch.Generator) -> Batch:
        x = torch.randn(batch, 3, size, size, generator=generator)
        return x, torch.randint(0, classes, (batch,), generator=generator)

    return make


def _vectors(batch: int, features: int, classes: int = 10) -> BatchMaker:
    def make(_index: int, generator: torch.Generator) -> Batch:
        x = torch.randn(batch, features, generator=generator)
        return x, torch.randint(0, classes, (batch,), generator=generator)

    return make


def _tokens(
    batch: int, length: int, vocab: int, classes: int, *, next_token: bool = False
) -> BatchMaker:
    def make(_index: int, generator: torch.Generator) -> Batch:
        x = torch.randint(0, vocab, (batch, length), generator=generator)
        if next_token:
            return x, torch.randint(0, vocab, (batch, length), generator=generator)
        return x, torch.randint(0, classes, (batch,), generator=generator)

    return make


def _recsys(batch: int, dense: int, tables: int, rows: int) -> BatchMaker:
    def make(_index: int, generator: torch.Generator) -> Batch:
        dense_part = torch.randn(batch, dense, generator=generator)
        sparse_part = torch.randint(0, rows, (batch, tables), generator=generator).float()
        x = torch.cat([dense_part, sparse_part], dim=1)
        return x, torch.randint(0, 2, (batch,), generator=generator)

    return make


def workloads() -> dict[str, Workload]:
    """Every built-in workload by name (several sizes and batch sizes per family)."""
    items: list[Workload] = []
    for width, depth, batch in ((128, 2, 32), (512, 3, 64), (1024, 4, 128)):
        items.append(
            Workload(
                f"mlp-w{width}-d{depth}-b{batch}",
                "mlp",
                batch,
                lambda w=width, d=depth: _mlp(w, d),
                lambda b: _vectors(b, 256),
                params={"width": width, "depth": depth},
            )
        )
    for width, blocks, batch, size in ((8, 1, 16, 32), (16, 2, 32, 32), (16, 1, 16, 64)):
        items.append(
            Workload(
                f"resnet-w{width}-x{blocks}-b{batch}-s{size}",
                "resnet",
                batch,
                lambda w=width, b=blocks: _resnet(w, b),
                lambda b, s=size: _images(b, s),
                params={"width": width, "blocks": blocks, "image": size},
            )
        )
    for width, batch in ((8, 16), (16, 32)):
        items.append(
            Workload(
                f"vgg-w{width}-b{batch}",
                "vgg",
                batch,
                lambda w=width: _vgg(w),
                lambda b: _images(b, 32),
                params={"width": width, "image": 32},
            )
        )
    for width, batch, size in ((8, 16, 32), (16, 32, 64)):
        items.append(
            Workload(
                f"mobilenet-w{width}-b{batch}-s{size}",
                "mobilenet",
                batch,
                lambda w=width: _mobilenet(w),
                lambda b, s=size: _images(b, s),
                params={"width": width, "image": size},
            )
        )
    for cell in ("lstm", "gru"):
        for hidden, layers, batch, length in ((64, 1, 32, 32), (128, 2, 32, 64)):
            items.append(
                Workload(
                    f"{cell}-h{hidden}-l{layers}-b{batch}-t{length}",
                    cell,
                    batch,
                    lambda c=cell, h=hidden, n=layers: _RNNClassifier(c, 1000, h, n, 10),
                    lambda b, t=length: _tokens(b, t, 1000, 10),
                    optimizer="adam",
                    lr=1e-3,
                    params={"hidden": hidden, "layers": layers, "seq": length},
                )
            )
    for d_model, layers, batch, length in ((64, 2, 16, 32), (128, 4, 16, 64)):
        items.append(
            Workload(
                f"transformer-d{d_model}-l{layers}-b{batch}-t{length}",
                "transformer",
                batch,
                lambda d=d_model, n=layers: _TransformerClassifier(1000, d, 4, n, 10),
                lambda b, t=length: _tokens(b, t, 1000, 10),
                optimizer="adamw",
                lr=1e-3,
                params={"d_model": d_model, "layers": layers, "seq": length},
            )
        )
    for d_model, layers, batch, length in ((64, 2, 8, 64), (128, 3, 8, 128)):
        items.append(
            Workload(
                f"gpt-d{d_model}-l{layers}-b{batch}-t{length}",
                "gpt",
                batch,
                lambda d=d_model, n=layers, t=length: _GPT(2000, d, 4, n, t),
                lambda b, t=length: _tokens(b, t, 2000, 2000, next_token=True),
                optimizer="adamw",
                lr=3e-4,
                params={"d_model": d_model, "layers": layers, "seq": length},
            )
        )
    for tables, rows, batch in ((4, 10_000, 256), (8, 50_000, 512)):
        items.append(
            Workload(
                f"recsys-t{tables}-r{rows}-b{batch}",
                "recsys",
                batch,
                lambda t=tables, r=rows: _Recommender(t, r, 32, 13),
                lambda b, t=tables, r=rows: _recsys(b, 13, t, r),
                optimizer="adam",
                lr=1e-3,
                params={"tables": tables, "rows": rows},
            )
        )
    for channels, levels, batch, length in ((32, 4, 32, 128), (64, 5, 16, 256)):
        items.append(
            Workload(
                f"tcn-c{channels}-l{levels}-b{batch}-t{length}",
                "tcn",
                batch,
                lambda c=channels, n=levels: _tcn(c, n),
                lambda b, t=length: _signals(b, 8, t),
                optimizer="adam",
                lr=1e-3,
                params={"channels": channels, "levels": levels, "seq": length},
            )
        )
    for width, batch, size in ((16, 16, 32), (32, 8, 64)):
        items.append(
            Workload(
                f"autoencoder-w{width}-b{batch}-s{size}",
                "autoencoder",
                batch,
                lambda w=width: _autoencoder(w),
                lambda b, s=size: _reconstruction(b, s),
                loss="mse",
                optimizer="adam",
                lr=1e-3,
                params={"width": width, "image": size},
            )
        )
    return {w.name: w for w in items}
