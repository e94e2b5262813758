"""A tiny FT-HSDP training script: an MLP regressing synthetic data on CPU (or GPU).

It uses only the `runtime.FTHSDP` API, so the same file runs under the local launcher
(`fthsdp run --local examples/tiny.toml`) and under Slurm (`fthsdp submit examples/tiny.toml`):
the launcher sets the environment (see docs/runtime.md), the API does the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import nn

from runtime.api import FTHSDP

DIM = int(os.environ.get("TINY_DIM", "32"))
HIDDEN = int(os.environ.get("TINY_HIDDEN", "64"))
STEP_SLEEP_S = float(os.environ.get("TINY_STEP_SLEEP_S", "0"))
# a stand-in for a real model's build and data loading, between the API's start and the first step
START_SLEEP_S = float(os.environ.get("TINY_START_SLEEP_S", "0"))
# gradient accumulation: the batch in this many backward passes (the same step's gradient)
MICROBATCHES = int(os.environ.get("TINY_MICROBATCHES", "1"))
#: Samples per rank per step.
BATCH_SIZE = 8


class SyntheticRegression(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i is a fixed (x, y) pair derived from i alone, so every process sees the same data."""

    def __init__(self, size: int = 4096, dim: int = DIM) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, dim, generator=gen)
        teacher = torch.randn(dim, 4, generator=gen)
        self.y = torch.tanh(self.x @ teacher)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 4),
    )


def make_dataset() -> SyntheticRegression:
    return SyntheticRegression()


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


def make_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2)


def main() -> None:
    ft = FTHSDP.from_env()
    with ft.running():
        model = ft.shard(make_model())
        opt = ft.optimizer(make_optimizer(model.parameters()))
        if START_SLEEP_S:
            import time

            time.sleep(START_SLEEP_S)
        for x, y in ft.data(make_dataset(), batch_size=BATCH_SIZE):
            opt.zero_grad()
            step_loss = 0.0
            for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True):
                loss = loss_fn(model(xs), ys) / MICROBATCHES
                loss.backward()
                step_loss += loss.item()
            ft.record(loss=step_loss)  # the leader's loss, for `fthsdp report`
            if STEP_SLEEP_S:
                import time

                time.sleep(STEP_SLEEP_S)
            opt.step()


if __name__ == "__main__":
    main()
