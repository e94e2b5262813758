"""The state a healing peer fetches, and how a fetched state goes back into the local shards.

torchft's checkpoint transport serves `state_dict` callbacks on its quorum thread. The quorum
overlaps the forward pass, during which FSDP swaps the module's parameters for unsharded ones,
so the served state is a snapshot taken on the main thread after the vote (`snapshot`): local
shards only, since a `full_tensor()` there would be a collective on the transport thread
(docs/design-facts.md, torchft trap 1). A fetched state is written back into the parameters'
local shards (`load_into`, trap 2), the optimizer state re-wrapped as DTensors where the
parameters are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runtime import ledger


def local_shard(p: torch.Tensor) -> torch.Tensor:
    """This rank's local shard of a (DTensor) parameter or gradient; a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return p.to_local() if isinstance(p, DTensor) else p


def snapshot(
    model: nn.Module,
    optim: torch.optim.Optimizer,
    ledger_state: ledger.LedgerState,
    extra_state: dict[str, Any],
) -> dict[str, Any]:
    """The state a healing peer may fetch (main thread, outside forward/backward)."""
    from torch.distributed.tensor import DTensor

    params = {name: local_shard(p) for name, p in model.named_parameters()}
    names: dict[Any, str] = {p: name for name, p in model.named_parameters()}
    opt_state: dict[str, dict[str, Any]] = {}
    for p, st in optim.state.items():
        opt_state[names[p]] = {
            k: (("d", v.to_local()) if isinstance(v, DTensor) else ("t", v)) for k, v in st.items()
        }
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optim.param_groups]
    return {
        "params": params,
        "optim": opt_state,
        "groups": groups,
        "ledger": ledger_state.to_json(),
        "extra": dict(extra_state),
    }


def load_into(
    state: dict[str, Any], model: nn.Module, optim: torch.optim.Optimizer, device: torch.device
) -> tuple[ledger.LedgerState, dict[str, Any]]:
    """Write a peer's state into this rank's local shards and optimizer state (main thread, in
    should_commit); returns the peer's ledger state and extra state."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        by_name = dict(model.named_parameters())
        for name, p in by_name.items():
            local_shard(p).copy_(state["params"][name])
        for name, st in state["optim"].items():
            p = by_name[name]
            new: dict[str, Any] = {}
            for k, (kind, v) in st.items():
                v = v.to(device)
                if kind == "d" and isinstance(p, DTensor):
                    new[k] = DTensor.from_local(
                        v.clone(),
                        p.device_mesh,
                        p.placements,
                        run_check=False,
                        shape=p.shape,
                        stride=p.stride(),
                    )
                else:
                    new[k] = v.clone()
            optim.state[p] = new
        for group, saved in zip(optim.param_groups, state["groups"], strict=True):
            group.update(saved)
    return ledger.LedgerState.from_json(state["ledger"]), state["extra"]
