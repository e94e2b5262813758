"""The step's one cross-replica allreduce: every gradient shard of a rank plus its replica's slot.

All of a rank's reduce-scattered gradient shards and this replica's one-hot slot go into ONE
flat buffer and through ONE `Manager.allreduce` (the paper's FTAR; torchft's DDP does the same
with its bucket), which survives a peer's death; torchft zeroes the whole buffer when the
replica does not participate. Afterwards `param.grad` holds the average over the quorum's
participants, and the slot counts say which replicas trained, which the data ledger commits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runtime.control.straggler.steptiming import StepTimer
from runtime.worker.heal import local_shard


def allreduce_gradients(
    model: nn.Module,
    manager: Any,
    replica_id: int,
    num_replicas: int,
    device: torch.device,
    timer: StepTimer,
) -> list[int] | None:
    """Average the gradients over the quorum's participants; the contributing slots, or None
    when the allreduce failed or they do not match the quorum (then the step is voted down: the
    average divides by the participants, so they must be exactly the contributors)."""
    from torch.distributed import ReduceOp

    grads = []
    with torch.no_grad():
        for p in model.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:  # same buffer layout on every replica
                p.grad = torch.zeros_like(p)
            grads.append(local_shard(p.grad))
        dtypes = {g.dtype for g in grads}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        n = sum(g.numel() for g in grads)
        slots_n = num_replicas
        flat = torch.empty(n + slots_n, dtype=dtype, device=device)
        offset = 0
        for g in grads:
            flat[offset : offset + g.numel()].copy_(g.reshape(-1))
            offset += g.numel()
        flat[n:].zero_()
        flat[n + replica_id] = 1.0
        with timer.waiting():
            manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        if manager.errored() is not None:
            return None
        counts = flat[n:].tolist()
        slots = [i for i, v in enumerate(counts) if v > 0.5]
        k = manager.num_participants()
        if k < 1 or len(slots) != k or any(abs(v - round(v)) > 1e-3 or v > 1.5 for v in counts):
            manager.report_error(
                RuntimeError(
                    f"contributing slots {slots} do not match the quorum's {k} participants"
                )
            )
            return None
        flat[:n].div_(k)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    return slots
