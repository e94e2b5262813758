"""The durable checkpoint's asynchronous save on two real gloo ranks of one replica.

The step loop goes on while DCP writes: the checkpoint must hold the state as it was when the
save began (the staging copy), be marked complete only once written, agree on the next save
across ranks whose clocks differ, and load back into a fresh model.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.checkpoint import COMPLETE_MARKER, DurableCheckpointer, latest_complete
from runtime.sim.reliability import RunFailureModel


class _Replica:
    """What the checkpointer reads of `FTHSDP`: a step, a state dict, step times, events."""

    def __init__(self, rank: int, world: int, model: torch.nn.Module, run: Path) -> None:
        self.model = model
        self.step = 0
        self.env = SimpleNamespace(world_size=world, is_leader=rank == 0)
        # the ranks' clocks differ: the leader's figures must decide
        self.steps = SimpleNamespace(step_times=deque([0.01 * (rank + 1)] * 5))
        self.events: list[dict[str, Any]] = []
        self.run = run

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(self.model), "fthsdp": {"step": self.step}}

    def event(self, name: str, **fields: Any) -> None:
        self.events.append({"event": name, **fields})


def _worker(rank: int, world: int, run: str) -> None:
    from torch.distributed.fsdp import fully_shard

    # a file rendezvous: no port to race other tests for
    dist.init_process_group(
        "gloo", init_method=f"file://{run}/rendezvous", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    fully_shard(model)
    ft = _Replica(rank, world, model, Path(run))
    # a failure model with a short run-loss MTBF: the next save comes a few steps later
    fm = RunFailureModel(nodes=1, failures_per_1000_nodes_day=0.0, run_losses_per_day=8640.0)
    ckpt = DurableCheckpointer(Path(run) / "checkpoints", 0, None, fm, replicas=1)
    ft.step = 1
    path = ckpt.maybe_save(ft, participant=0)
    assert path is not None
    saved = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():  # the next optimizer step, while the write runs
        for p in model.parameters():
            p.to_local().add_(1.0)
    assert ckpt.maybe_save(ft, participant=None) is None  # not participant 0: never saves
    ckpt.close(ft)  # type: ignore[arg-type]
    assert ckpt.last_cadence is not None
    mine = {"next_due": ckpt._next_due, "interval_steps": ckpt.last_cadence.interval_steps}
    # restore into a fresh, different model
    torch.manual_seed(1)
    fresh = torch.nn.Linear(64, 64)
    fully_shard(fresh)
    ft2 = _Replica(rank, world, fresh, Path(run))
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    found = latest_complete(Path(run) / "checkpoints")
    state = ft2.state_dict()
    dcp.load(state, checkpoint_id=str(found))
    set_model_state_dict(fresh, state["model"])
    same = all(torch.equal(p.to_local(), saved[n]) for n, p in fresh.named_parameters())
    (Path(run) / f"rank{rank}.json").write_text(
        json.dumps({**mine, "same": same, "events": [e["event"] for e in ft.events]})
    )
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_async_save_holds_the_state_at_its_start_and_ranks_agree(tmp_path: Path) -> None:
    mp.start_processes(_worker, args=(2, str(tmp_path)), nprocs=2, start_method="spawn")
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(o["same"] for o in out), out
    assert out[0]["next_due"] == out[1]["next_due"] > 1, out
    assert out[0]["events"] == ["checkpoint"] and out[1]["events"] == [], out
    done = latest_complete(tmp_path / "checkpoints")
    assert done is not None and done.name == "step_00000001"
    assert (done / COMPLETE_MARKER).read_text() == "1"
