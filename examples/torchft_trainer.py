"""A small data-parallel trainer written against torchft's public API only (gloo, CPU).

It stands in for a trainer someone already has: it knows nothing of fthsdp. Like torchft's own
examples it reads its replica group from `REPLICA_GROUP_ID` / `NUM_REPLICA_GROUPS`, the
Lighthouse from `TORCHFT_LIGHTHOUSE` (torchft's Manager reads it), the group's store from
`MASTER_ADDR` / `MASTER_PORT`, and its rank from `RANK` / `WORLD_SIZE` (torchrun) or
`SLURM_PROCID` / `SLURM_NTASKS` (one srun task per rank). It prints one `step: N  loss: X` line
per committed step; a group that (re)joins late heals from a peer through torchft's checkpoint
transport, so its first step line is the peers' step, not 1.

Gradients are averaged through `Manager.allreduce`, not torchft's `DistributedDataParallel`: in
torchft 0.2.0 that wrapper's comm hook fails `assert fut._fut` when a peer dies during the
allreduce (the work's `wait()` raised, so its future was never set), which takes a healthy
trainer down with the dead one. `Manager.allreduce`'s work reports the error to the Manager
instead, and the step is not committed.

    python examples/torchft_trainer.py --steps 200 [--step-sleep 0.2] [--progress-file F]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn, optim
from torch.distributed import TCPStore
from torchft import Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing import HTTPTransport


def _rank() -> tuple[int, int]:
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))
    return rank, world


def average_gradients(manager: Manager, model: nn.Module) -> None:
    """Average every gradient over the participating groups. A failed allreduce is reported to
    the Manager by `wait()`, which then votes against committing this step."""
    works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
    for work in works:
        work.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of 'compute'")
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--progress-file", default=None, help="also append {'step': N} JSONL")
    args = parser.parse_args()

    group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    rank, world = _rank()
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    store = None
    if rank == 0 and "TORCHELASTIC_RUN_ID" not in os.environ:
        # Without torchrun nobody serves the group's store: group rank 0 does.
        store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=True,
            wait_for_workers=False,
        )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    inner = optim.AdamW(model.parameters(), lr=1e-3)
    timeout = timedelta(seconds=args.timeout_s)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.min_replicas,
        replica_id=f"torchft_trainer_{group}",
        timeout=timeout,
        quorum_timeout=timeout * 3,
        checkpoint_transport=HTTPTransport(timeout=timeout, num_chunks=0),
    )
    optimizer = Optimizer(manager, inner)
    target = nn.Linear(16, 4)
    progress = open(args.progress_file, "a") if args.progress_file and rank == 0 else None  # noqa: SIM115
    try:
        while manager.current_step() < args.steps:
            gen = torch.Generator().manual_seed(manager.current_step() * 1000 + group)
            x = torch.randn(32, 16, generator=gen)
            with torch.no_grad():
                y = target(x)
            optimizer.zero_grad()  # starts the quorum; heals from a peer when behind
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            average_gradients(manager, model)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            optimizer.step()  # steps only when every participant voted to commit
            step = manager.current_step()
            if rank == 0:
                print(
                    f"step: {step}  loss: {loss.item():.5f}  "
                    f"participants: {manager.num_participants()}",
                    flush=True,
                )
                if progress is not None:
                    progress.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
                    progress.flush()
    finally:
        manager.shutdown(wait=False)
        if progress is not None:
            progress.close()
        del store


if __name__ == "__main__":
    main()
