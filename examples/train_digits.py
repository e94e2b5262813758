"""An FT-HSDP classifier on real data: a small MLP on scikit-learn's digits (8x8 images).

The model-quality benchmark (`benchmarks/quality.py`) trains it under faults and compares the
held-out loss and accuracy with static HSDP (`runtime.baselines` `plain`, which loads this file
for the model, data, loss, optimizer and evaluation, so both sides share one definition).

The digits ship inside scikit-learn (no download). A fixed permutation (seed 0) splits the 1,797
images into 1,400 for training and 397 held out; the training order is the data ledger's. Every
`DIGITS_EVAL_EVERY` steps, before the step trains, and once more after the last step, the
held-out set is evaluated and recorded (`heldout_loss`, `heldout_acc`) with the step it belongs
to: the weights after that many committed steps. `DIGITS_SEED` seeds the model's initial weights.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import torch
from torch import nn

from runtime.api import FTHSDP

SEED = int(os.environ.get("DIGITS_SEED", "0"))
HIDDEN = int(os.environ.get("DIGITS_HIDDEN", "64"))
LR = float(os.environ.get("DIGITS_LR", "1e-2"))
EVAL_EVERY = int(os.environ.get("DIGITS_EVAL_EVERY", "10"))
#: Samples per rank per step (a replica of W ranks takes W times as many).
BATCH_SIZE = int(os.environ.get("DIGITS_BATCH", "16"))
#: Seconds of stand-in compute per step, so that a step is not only CPU noise on a shared
#: machine and a slowed replica (`slow_replica`) has compute to stretch.
STEP_SLEEP_S = float(os.environ.get("DIGITS_STEP_SLEEP_S", "0"))
TRAIN_SIZE = 1400
SPLIT_SEED = 0


def _split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train, held = order[:TRAIN_SIZE], order[TRAIN_SIZE:]
    return x[train], y[train], x[held], y[held]


class Digits(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The training split, map-style, in the split's fixed order."""

    def __init__(self) -> None:
        self.x, self.y, _, _ = _split()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def make_dataset() -> Digits:
    return Digits()


def make_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)


def make_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR)


def eval_due(step: int) -> bool:
    """Whether the weights after `step` committed steps are evaluated (the end is, always)."""
    return step % EVAL_EVERY == 0


_HELDOUT: tuple[torch.Tensor, torch.Tensor] | None = None


@torch.no_grad()
def evaluate(model: nn.Module) -> dict[str, float]:
    """Held-out cross-entropy and accuracy. Every rank of a sharded model must call it together
    (the forward pass all-gathers the shards)."""
    global _HELDOUT
    if _HELDOUT is None:
        _, _, hx, hy = _split()
        _HELDOUT = hx, hy
    hx, hy = _HELDOUT
    device = next(model.parameters()).device
    out = model(hx.to(device))
    loss = loss_fn(out, hy.to(device)).item()
    acc = (out.argmax(dim=1).cpu() == hy).float().mean().item()
    return {"heldout_loss": loss, "heldout_acc": acc}


def main() -> None:
    ft = FTHSDP.from_env()
    with ft.running():
        model = ft.shard(make_model())
        opt = ft.optimizer(make_optimizer(model.parameters()))
        for x, y in ft.data(make_dataset(), batch_size=BATCH_SIZE):
            if eval_due(ft.step):
                ft.record(**evaluate(model))
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            ft.record(loss=loss)
            if STEP_SLEEP_S:
                time.sleep(STEP_SLEEP_S)
            opt.step()
        if ft.step == ft.env.steps:  # not a replica that started after the run had finished
            ft.record(**evaluate(model))  # the final weights, at step == steps


if __name__ == "__main__":
    main()
