"""The baselines FT-HSDP is measured against, on the same model and the same data order.

* `plain`: static HSDP, `fully_shard` on a 2-D (replicate x shard) mesh over one fixed world of
  R x W processes. No fault tolerance: one death stops everyone. The equivalence test compares
  FT-HSDP's final weights with this one's; the overhead benchmark compares step times.
* `ddp`: torchft's own `DistributedDataParallel` wrapper with a `Manager` (one process per
  replica), the fault-tolerant baseline torchft ships.

Both train the example's model (`examples/train_tiny.py`, or the file `FTHSDP_BASELINE_EXAMPLE`
names, loaded by path so there is one definition: its `make_model`, `make_dataset`, `loss_fn`,
`make_optimizer` and `BATCH_SIZE`) on the data ledger's order with every replica participating:
step t, replica r, rank w trains samples `cursor + r*B*W + w*B ... + B` with `cursor = t*R*B*W`.
An example with `evaluate(model)` and `eval_due(step)` (`examples/train_digits.py`) is evaluated
by `plain` as FT-HSDP's trainer does it: before step t when `eval_due(t)`, and after the last
step, into `progress/plain.jsonl` as "metrics" events of that step.

Run one rank as `python -m runtime.baselines plain|ddp` with RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT (global for `plain`, per replica for `ddp`) and the FTHSDP_* variables; `spawn`
starts a whole baseline run and waits for it.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from slurm import contract

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_tiny.py"
#: The example file the baselines train (its path); `examples/train_tiny.py` when unset.
EXAMPLE_ENV = "FTHSDP_BASELINE_EXAMPLE"


def load_example() -> dict[str, Any]:
    path = os.environ.get(EXAMPLE_ENV) or str(EXAMPLE)
    return runpy.run_path(path, run_name="fthsdp_example")


def _batch(dataset: Any, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import default_collate

    n = len(dataset)
    out: tuple[torch.Tensor, torch.Tensor] = default_collate(
        [dataset[i % n] for i in range(lo, hi)]
    )
    return out


def _write(run_dir: Path, replica: int, rank: int, model: nn.Module, times: list[float]) -> None:
    from torch.distributed.tensor import DTensor

    (run_dir / "final").mkdir(parents=True, exist_ok=True)
    (run_dir / "times").mkdir(parents=True, exist_ok=True)
    shards = {
        n: (p.to_local() if isinstance(p, DTensor) else p).detach().cpu().clone()
        for n, p in model.named_parameters()
    }
    torch.save({"params": shards}, run_dir / "final" / f"r{replica}_rank{rank}.pt")
    (run_dir / "times" / f"r{replica}_rank{rank}.json").write_text(json.dumps(times))


def _save(run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = run_dir / "checkpoints" / f"step_{step:08d}"
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        (path / "COMPLETE").write_text(str(step))


def _restore(run_dir: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from runtime.checkpoint import latest_complete

    path = latest_complete(run_dir / "checkpoints")
    if path is None:
        return 0
    msd, osd = get_state_dict(model, opt)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(path.name.split("_")[1])


def plain_worker() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ex = load_example()
    replicas = int(os.environ[contract.NUM_REPLICAS])
    steps = int(os.environ[contract.STEPS])
    run_dir = Path(os.environ[contract.RUN_DIR])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = world // replicas
    replica, w = divmod(rank, shard)
    mesh = init_device_mesh("cpu", (replicas, shard), mesh_dim_names=("replicate", "shard"))
    model = ex["make_model"]()
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = ex["make_optimizer"](model.parameters())
    data = ex["make_dataset"]()
    loss_fn, batch = ex["loss_fn"], int(ex["BATCH_SIZE"])
    evaluate, eval_due = ex.get("evaluate"), ex.get("eval_due")
    rb = batch * shard
    times = []
    every = int(os.environ.get(contract.CHECKPOINT_EVERY_STEPS, "0"))
    sleep_s = float(ex.get("STEP_SLEEP_S", 0.0))
    first = _restore(run_dir, model, opt) if every else 0
    progress = None
    if rank == 0:
        (run_dir / "progress").mkdir(parents=True, exist_ok=True)
        progress = open(run_dir / "progress" / "plain.jsonl", "a", buffering=1)  # noqa: SIM115

    def event(kind: str, step: int, **fields: Any) -> None:
        if progress is not None:
            record = {"t": time.time(), "event": kind, "step": step, **fields}
            progress.write(json.dumps(record) + "\n")

    def heldout(step: int) -> None:
        if evaluate is not None:
            event("metrics", step, metrics=evaluate(model))  # every rank: a sharded forward

    event("joined", first)
    for t in range(first, steps):
        if eval_due is not None and eval_due(t):
            heldout(t)
        start = time.perf_counter()
        lo = t * replicas * rb + replica * rb + w * batch
        x, y = _batch(data, lo, lo + batch)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        if sleep_s:
            time.sleep(sleep_s)
        opt.step()
        times.append(time.perf_counter() - start)
        if every and (t + 1) % every == 0:
            _save(run_dir, t + 1, model, opt)
        event("commit", t)
    heldout(steps)
    _write(run_dir, replica, w, model, times)
    # Tear down together: a rank that destroys its gloo group while a peer's last collective
    # still talks to it can abort in gloo's teardown ("terminate called without an active
    # exception") after all its work was written.
    dist.barrier()
    dist.destroy_process_group()


def ddp_worker() -> None:
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    ex = load_example()
    replica = int(os.environ[contract.REPLICA_ID])
    replicas = int(os.environ[contract.NUM_REPLICAS])
    steps = int(os.environ[contract.STEPS])
    run_dir = Path(os.environ[contract.RUN_DIR])
    model = ex["make_model"]()
    inner = ex["make_optimizer"](model.parameters())

    def load(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    def save() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    # the Manager connects to the replica's store as a client; one process per replica hosts it
    store = dist.TCPStore(
        os.environ[contract.MASTER_ADDR],
        int(os.environ[contract.MASTER_PORT]),
        is_master=True,
        wait_for_workers=False,
    )
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        load_state_dict=load,
        state_dict=save,
        min_replica_size=replicas,
        timeout=timedelta(seconds=5),
        quorum_timeout=timedelta(seconds=30),
        replica_id=f"ddp_r{replica}",
        lighthouse_addr=os.environ[contract.LIGHTHOUSE],
        init_sync=False,
    )
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    data = ex["make_dataset"]()
    loss_fn, batch = ex["loss_fn"], int(ex["BATCH_SIZE"])
    times = []
    t = 0
    while manager.current_step() < steps:
        start = time.perf_counter()
        lo = t * replicas * batch + replica * batch
        x, y = _batch(data, lo, lo + batch)
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        t = manager.current_step()
        times.append(time.perf_counter() - start)
    _write(run_dir, replica, 0, model, times)
    manager.shutdown(wait=False)
    del store


def start(
    mode: str,
    run_dir: Path,
    replicas: int,
    ranks: int,
    steps: int,
    lighthouse: str | None = None,
    extra_env: dict[str, str] | None = None,
    tag: str = "",
) -> list[subprocess.Popen[bytes]]:
    """Start every rank of a baseline run; the caller waits for (or kills) them."""
    from runtime.net import free_port

    run_dir.mkdir(parents=True, exist_ok=True)
    base = {
        **os.environ,
        contract.RUN_DIR: str(run_dir),
        contract.NUM_REPLICAS: str(replicas),
        contract.STEPS: str(steps),
        "OMP_NUM_THREADS": "1",
        "RUST_LOG": "warn",
        **(extra_env or {}),
    }
    procs: list[subprocess.Popen[bytes]] = []
    port = free_port()
    for r in range(replicas):
        if mode == "ddp":
            port = free_port()
        for w in range(ranks):
            env = dict(base)
            if mode == "plain":
                env.update(RANK=str(r * ranks + w), WORLD_SIZE=str(replicas * ranks))
            else:
                env.update(
                    RANK=str(w),
                    WORLD_SIZE=str(ranks),
                    FTHSDP_REPLICA_ID=str(r),
                    FTHSDP_LIGHTHOUSE=lighthouse or "",
                )
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(w))
            log = open(run_dir / f"{mode}_r{r}_w{w}{tag}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "runtime.baselines", mode],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()
    return procs


def spawn(
    mode: str,
    run_dir: Path,
    replicas: int,
    ranks: int,
    steps: int,
    lighthouse: str | None = None,
    timeout_s: float = 300.0,
    extra_env: dict[str, str] | None = None,
) -> list[float]:
    """Run a whole baseline (all ranks) and return every rank's step times."""
    procs = start(mode, run_dir, replicas, ranks, steps, lighthouse, extra_env)
    try:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(
                    f"{mode} baseline rank failed with {p.returncode}; see {run_dir}"
                )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    times: list[float] = []
    for f in sorted((run_dir / "times").glob("*.json")):
        times += json.loads(f.read_text())
    return times


if __name__ == "__main__":
    {"plain": plain_worker, "ddp": ddp_worker}[sys.argv[1]]()
