"""The user's API: FT-HSDP in four calls on top of torchft and torch's `fully_shard`.

    ft = FTHSDP.from_env()
    model = ft.shard(model)                       # HSDP inside the replica
    opt = ft.optimizer(torch.optim.AdamW(model.parameters()))
    for batch in ft.data(dataset, batch_size=8):  # per-step quorum + data ledger
        opt.zero_grad()
        loss_fn(model(batch)).backward()          # FSDP reduce-scatter, then FT allreduce
        opt.step()                                # commit vote; optimizer steps only on "yes"
    ft.finish()

What each piece maps to (the paper's protocol, torchft's mechanism):

* per-step quorum, off the critical path: `ft.data` starts torchft's `Manager.start_quorum` at
  the top of each step and yields this replica's batch at once: the data ledger
  (`runtime.ledger`) decides it from the committed state and the replica id alone, not from the
  participants. The quorum completes while the forward pass runs (the gradient allreduce waits
  for it, as in torchft's own DDP wrapper). The replica's one-hot slot rides in the same
  allreduce, so every replica learns which slots contributed; units of the others are re-issued
  at later steps. The quorum is waited up front only where the step's kind depends on it: a
  worker's first quorum, after an aborted step, and the final sync step.
* HSDP: `fully_shard` on the replica's own 1-D mesh (the shard dimension: the ranks of one
  replica, gloo on CPU, NCCL on CUDA). The replicate dimension is torchft's reconfigurable process
  group: once backward is over, all of a rank's reduce-scattered gradient shards go through ONE
  `Manager.allreduce`, which averages over the quorum's participants and survives a peer's death
  (the paper's FTAR), as torchft's DDP does with its bucket. A one-rank replica keeps a plain
  module (nothing to shard).
* commit vote: `opt.step()` calls `Manager.should_commit()`: every rank of the replica votes,
  the replica leader's manager server decides "all yes"; on "no" nothing is stepped and the
  replica redoes the step (it heals from a peer at the next quorum if the others moved on).
* catch-up: a replica behind the quorum's max step fetches the committed state from a healthy
  peer over torchft's checkpoint transport. It waited for that quorum (its first, or the one
  after an aborted step), so it loads the state before its forward pass and trains its slot in
  that same step; the others' quorum stays overlapped. The state it fetches is the snapshot of
  `runtime.worker.heal`: local shards only (a `full_tensor()` there would be a collective on
  the transport thread, docs/design-facts.md, torchft trap 1), written back into the
  parameters' local shards (trap 2).
* steps whose quorum max step is 0 or past the last step are data-free *sync steps*: at step 0
  torchft heals every non-primary replica from the primary (`init_sync`) and at the end a lagging
  replica heals from a finished one; no replica takes data or steps the optimizer there, so the
  gradient scale and the ledger stay exact.
* a quorum of fresh replicas (max step 0) with a complete durable checkpoint on disk votes
  its step down and loads it on every participant (`runtime.checkpoint`): the run lost every
  replica that held its state. A replica restarted beside live peers never reads the disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import IO, Any

import torch
import torch.distributed as dist
from torch import nn

from runtime import ledger, rendezvous
from runtime.env import EnvError, WorkerEnv, parse_env
from runtime.protocol import ExitCode
from runtime.report.metrics import MAX_METRICS, MetricError, check_metrics
from runtime.worker import heal
from runtime.worker.control_wait import ControlRestartWait, wait_for_lighthouse
from runtime.worker.errors import FatalWorkerError
from runtime.worker.manager import build_manager
from runtime.worker.step import StepProtocol
from slurm import contract

__all__ = ["FTHSDP", "MAX_METRICS", "FTOptimizer", "MetricError"]

#: The worker's log level (a knob for debugging a worker by hand; the scripts leave it unset).
LOG_LEVEL_ENV = "FTHSDP_LOG_LEVEL"


class FTHSDP:
    """One rank of one FT-HSDP replica. Build it with `from_env()`."""

    def __init__(self, env: WorkerEnv, *, init_sync: bool = True, resume: bool = True) -> None:
        self.env = env
        self.init_sync = init_sync
        self.resume = resume
        self.incarnation = uuid.uuid4().hex[:12]
        self.device = (
            torch.device("cuda", env.local_rank)
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.ledger_state = ledger.LedgerState()
        self.extra_state: dict[str, Any] = {}
        self.model: nn.Module | None = None
        self.optim: torch.optim.Optimizer | None = None
        self.steps = StepProtocol(self, started_at=time.time())
        self._heal_snapshot: dict[str, Any] | None = None
        self._progress_file: Any = None
        self.ledger_log: IO[str] | None = None
        self.reporter: Any = None
        self.checkpointer: Any = None
        self.watchdog: Any = None
        self.manager: Any = None

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            addr, port = rendezvous.resolve(env)
        except rendezvous.RendezvousError as exc:
            raise FatalWorkerError(str(exc), ExitCode.PROCESS_FAULT) from None
        env = self.env = replace(env, master_addr=addr, master_port=port)
        os.environ.update(
            {
                contract.MASTER_ADDR: env.master_addr,
                contract.MASTER_PORT: str(env.master_port),
                contract.RANK: str(env.rank),
                contract.WORLD_SIZE: str(env.world_size),
            }
        )
        self._joined = False
        if env.waiting_warm:
            # A warm spare slot: everything up to the model and the node check happens now; the
            # replica's identity, its quorum service and its Manager come in `data()`.
            self._init_replica_group()
            self._start_watchdog()
            self._check_node("the warm slot's node check")
            return
        lighthouse = wait_for_lighthouse(env, env.timeouts.join_s)
        self.control = ControlRestartWait(env, lighthouse)
        self._init_replica_group()
        self._join(lighthouse)
        self._start_watchdog()

    def _init_replica_group(self) -> None:
        """The process group of this replica's own ranks (the shard dimension)."""
        dist.init_process_group(
            self.backend,
            rank=self.env.rank,
            world_size=self.env.world_size,
            timeout=timedelta(seconds=self.env.timeouts.join_s),
        )

    def _join(self, lighthouse: str, **start: Any) -> None:
        """Become a member of the run: torchft's Manager, the logs and the report channel."""
        env = self.env
        # The gate's address is what the control file names; the Manager goes through the
        # supervisor's forwarder, which proves the run's key to the gate.
        self._ft_pg, self.manager = build_manager(
            env,
            self.backend,
            env.lighthouse_forwarder or lighthouse,
            init_sync=self.init_sync,
            epoch=self.control.epoch,
        )
        self.manager.register_state_dict_fn("fthsdp", self._load_heal_state, self._heal_state)
        self._joined = True
        self._open_logs(**start)
        self._start_side_services()

    def _join_warm(self) -> None:
        """Wait for the replica this warm slot becomes, re-check the node, then join as it."""
        from runtime import warm_handoff

        path = self.env.warm_handoff
        assert path is not None
        if self.env.is_leader:
            warm_handoff.mark_ready(path, pid=os.getpid(), node=self._node_name())
        waiting = time.time()
        try:
            handoff = warm_handoff.wait_for_handoff(path, self.env.num_replicas)
        except warm_handoff.HandoffError as exc:
            raise FatalWorkerError(str(exc), ExitCode.BAD_ENV) from None
        named = time.time()
        os.environ.update(handoff.environ())
        try:
            env = parse_env(os.environ)
        except EnvError as exc:
            raise FatalWorkerError(f"bad environment: {exc}", ExitCode.BAD_ENV) from None
        self.env = replace(env, master_addr=self.env.master_addr, master_port=self.env.master_port)
        self._check_node("the node check before a warm slot joins")
        lighthouse = wait_for_lighthouse(self.env, self.env.timeouts.join_s)
        self.control = ControlRestartWait(self.env, lighthouse)
        self.steps.started_at = time.time()
        self._join(lighthouse, warm=True, warm_for_s=round(named - waiting, 3),
                   named_at=named)  # fmt: skip

    def _check_node(self, what: str) -> None:
        """Run the cheap checks once; a node that fails them is a node fault now."""
        if self.watchdog is None:
            return
        found = self.watchdog.check_once()
        if found is not None:
            reason, evidence = found
            raise FatalWorkerError(f"{what}: {reason}", ExitCode.NODE_FAULT, evidence)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, **kwargs: Any) -> FTHSDP:
        """Build from the environment; a bad variable exits 2 naming it, no quorum service 3."""
        logging.basicConfig(
            level=os.environ.get(LOG_LEVEL_ENV, "WARNING"),
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        try:
            env = parse_env(os.environ)
        except EnvError as exc:
            print(f"fthsdp: bad environment: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(int(ExitCode.BAD_ENV)) from None
        try:
            return cls(env, **kwargs)
        except FatalWorkerError as exc:
            print(f"fthsdp: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(int(exc.exit_code)) from None

    def _open_logs(self, **start: Any) -> None:
        if not self.env.is_leader:
            return
        for sub in ("progress", "ledger"):
            (self.env.run_dir / sub).mkdir(parents=True, exist_ok=True)
        name = f"r{self.env.replica_id}.jsonl"
        self._progress_file = open(self.env.run_dir / "progress" / name, "a", buffering=1)  # noqa: SIM115
        self.ledger_log = open(self.env.run_dir / "ledger" / name, "a", buffering=1)  # noqa: SIM115
        self.event("start", step=self.manager.current_step(), **start)

    def _start_side_services(self) -> None:
        from runtime.checkpoint import DurableCheckpointer
        from runtime.report_sender import ReportClient

        if self.env.is_leader:
            self.reporter = ReportClient.for_worker(self.env, self.incarnation)
        self.checkpointer = DurableCheckpointer.for_worker(self.env)

    def _start_watchdog(self) -> None:
        if self.env.health_checks:
            from runtime.watchdog import NodeWatchdog

            self.watchdog = NodeWatchdog(self.env.health_checks, on_fault=self._node_fault)
            self.watchdog.start()

    def event(self, event: str, **fields: Any) -> None:
        """Append one record to this replica's progress log (`progress/rK.jsonl`, leader only)."""
        if self._progress_file is not None:
            record = {"t": time.time(), "event": event, "incarnation": self.incarnation, **fields}
            self._progress_file.write(json.dumps(record) + "\n")

    def record(self, **scalars: Any) -> None:
        """Record scalars of the current step (`ft.record(loss=loss)`) in the replica's progress
        file, for `fthsdp report`; only the replica leader writes, the other ranks check only.

        Each value is a finite number or a one-element tensor (`.item()` is called: on a GPU
        that waits for the step's kernels). At most `MAX_METRICS` names, each 1-32 of
        `A-Z a-z 0-9 _ .` (`runtime.report.metrics`); anything else raises `MetricError` on
        every rank alike, before anything is written.
        """
        values = metric_values(scalars)
        plan = self.steps.plan
        step = plan.step if plan is not None else self.step
        self.event("metrics", step=step, metrics=values)

    # ------------------------------------------------------------------ the four calls
    def shard(self, model: nn.Module, blocks: Sequence[nn.Module] | None = None) -> nn.Module:
        """Shard `model` with `fully_shard` inside the replica and route its gradients through
        the fault-tolerant allreduce across replicas.

        `blocks` are the submodules to shard as their own units (transformer blocks); by default
        every direct child that holds parameters. The root is sharded last. A replica of one rank
        has nothing to shard: its model stays a plain module (FSDP there would only copy each
        parameter and gradient once more per step) and its gradients take the same allreduce.
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        model = model.to(self.device)
        self.model = model
        if self.env.world_size == 1:
            for param in model.parameters():
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(lambda _: self.steps.queue_reduce())
            return model
        mesh = init_device_mesh(self.device.type, (self.env.world_size,), mesh_dim_names=("shard",))
        units = (
            list(blocks)
            if blocks is not None
            else [m for m in model.children() if any(True for _ in m.parameters())]
        )
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # called per unit after its reduce-scatter
                module.set_all_reduce_hook(lambda _: self.steps.queue_reduce())
        return model

    def optimizer(self, optim: torch.optim.Optimizer) -> FTOptimizer:
        """Wrap an optimizer: `step()` runs only if the replica's commit vote passes."""
        self.optim = optim
        self.snapshot()
        return FTOptimizer(self, optim)

    def durable_restore_due(self) -> bool:
        """Whether this rank may start from the run's durable checkpoint (`resume`) and one is
        complete; asked at a quorum of fresh replicas only (`StepProtocol`), so a replica with
        live peers never pays for a load from disk."""
        return (
            self.resume
            and self.checkpointer is not None
            and self.model is not None
            and self.checkpointer.has_complete()
        )

    def restore_durable(self) -> int | None:
        """Load the newest complete durable checkpoint; step, ledger and heal snapshot follow."""
        assert self.checkpointer is not None
        step: int | None = self.checkpointer.maybe_restore(self)
        self.snapshot()
        return step

    def data(
        self,
        dataset: Any,
        batch_size: int,
        collate: Callable[[list[Any]], Any] | None = None,
        shuffle_seed: int | None = None,
    ) -> Iterator[Any]:
        """Yield this rank's batch of each step, as the data ledger assigns it.

        `dataset` is map-style (`len` and `[i]`); sample id `n` of the global stream is item
        `n % len(dataset)` of epoch `n // len(dataset)` (shuffled per epoch when
        `shuffle_seed` is given). `batch_size` is per rank; a replica takes
        `batch_size * ranks` samples per step.
        """
        from torch.utils.data import default_collate

        if not self._joined:
            self._join_warm()
        self.steps.replica_batch = batch_size * self.env.world_size
        collate_fn = collate or default_collate
        n = len(dataset)
        perms: dict[int, list[int]] = {}

        def item(sample: int) -> Any:
            epoch, offset = divmod(sample, n)
            if shuffle_seed is None:
                return dataset[offset]
            if epoch not in perms:
                gen = torch.Generator().manual_seed(shuffle_seed + epoch)
                perms.clear()
                perms[epoch] = torch.randperm(n, generator=gen).tolist()
            return dataset[perms[epoch][offset]]

        while True:
            plan = self.steps.begin_step()
            if plan is None:
                return
            mine = plan.slot.rank_slice(self.env.rank, self.env.world_size)
            batch = collate_fn([item(i) for i in mine.ids()])
            yield _to_device(batch, self.device)

    # ------------------------------------------------------------------ progress
    @property
    def step(self) -> int:
        """Training steps committed so far (torchft's step minus the initial sync step)."""
        if not self._joined:
            return 0
        return min(max(0, self.manager.current_step() - 1), self.env.steps)

    @property
    def cursor(self) -> int:
        """The ledger's cursor: samples below it were issued (trained, or pending re-issue)."""
        return self.ledger_state.cursor

    def report_error(self, exc: Exception) -> None:
        """Mark this rank's step as bad (e.g. a non-finite loss): the replica votes "no"."""
        self.manager.report_error(exc)

    # ------------------------------------------------------------------ state
    def _heal_state(self) -> dict[str, Any]:
        """State a healing peer fetches (runs on torchft's quorum thread): the snapshot taken on
        the main thread after the last vote. The quorum overlaps the forward pass, during which
        FSDP swaps the module's parameters for unsharded ones, so the quorum thread must not walk
        the module itself; the snapshot holds the sharded tensors, which change only in
        `opt.step()`, after the vote has closed the checkpoint server."""
        if self._heal_snapshot is None:
            raise RuntimeError("no state to send yet: ft.optimizer(...) was not called")
        return self._heal_snapshot

    def snapshot(self) -> None:
        """Take the state a healing peer may fetch (main thread, outside forward/backward)."""
        assert self.model is not None and self.optim is not None
        self._heal_snapshot = heal.snapshot(
            self.model, self.optim, self.ledger_state, self.extra_state
        )

    def _load_heal_state(self, state: dict[str, Any]) -> None:
        """Write a peer's state into this rank's local shards (main thread, in should_commit)."""
        assert self.model is not None and self.optim is not None
        self.ledger_state, extra = heal.load_into(state, self.model, self.optim, self.device)
        self.extra_state.clear()
        self.extra_state.update(extra)

    def state_dict(self) -> dict[str, Any]:
        """Durable state (DTensor shards + ledger cursor + extra state) for DCP."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        assert self.model is not None and self.optim is not None
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {
            "model": model_sd,
            "optim": optim_sd,
            "fthsdp": {
                "manager_step": self.manager.current_step(),
                "batches_committed": self.manager.batches_committed(),
                "ledger": self.ledger_state.to_json(),
                "extra": dict(self.extra_state),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        assert self.model is not None and self.optim is not None
        set_state_dict(
            self.model, self.optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        meta = state["fthsdp"]
        self.manager.load_state_dict(
            {"step": int(meta["manager_step"]), "batches_committed": int(meta["batches_committed"])}
        )
        self.ledger_state = ledger.LedgerState.from_json(meta["ledger"])
        self.extra_state.clear()
        self.extra_state.update(meta["extra"])

    # ------------------------------------------------------------------ faults and the end
    def _node_fault(self, reason: str, evidence: list[str]) -> None:
        """Called by the watchdog thread: report a node fault and exit NODE_FAULT."""
        self.fatal(FatalWorkerError(reason, ExitCode.NODE_FAULT, evidence))

    def check_watchdog(self) -> None:
        """Raise the watchdog's node fault, if it found one."""
        if self.watchdog is not None and self.watchdog.verdict is not None:
            reason, evidence = self.watchdog.verdict
            raise FatalWorkerError(reason, ExitCode.NODE_FAULT, evidence)

    def fatal(self, exc: BaseException) -> None:
        """Send the final classified report (leader) and exit with the class's code."""
        from runtime.failure_class import classify_failure

        verdict = classify_failure(exc, node=self._node_name())
        self.event("fatal", step=self.step, error=str(exc)[:500], exit_code=verdict.exit_code)
        if self.reporter is not None:
            self.reporter.fatal(
                step=self.step,
                last_error=str(exc)[:2000],
                failure=verdict.failure,
                failed_node=verdict.node,
                evidence=verdict.evidence,
                exit_code=int(verdict.exit_code),
            )
        print(f"fthsdp: fatal ({verdict.failure or 'user'}): {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(int(verdict.exit_code))

    def _node_name(self) -> str:
        """The Slurm node this rank runs on (dev nodes share one host, so not the hostname)."""
        return os.environ.get(contract.SLURMD_NODENAME) or socket.gethostname()

    def finish(self) -> None:
        """Write this rank's final local shards, stop the side services, shut torchft down."""
        if self.model is not None and self.steps.reached_end:
            final = self.env.run_dir / "final"
            final.mkdir(parents=True, exist_ok=True)
            shards = {
                n: heal.local_shard(p).detach().cpu().clone()
                for n, p in self.model.named_parameters()
            }
            path = final / f"r{self.env.replica_id}_rank{self.env.rank}.pt"
            torch.save({"step": self.step, "cursor": self.cursor, "params": shards}, path)
        if self.checkpointer is not None:
            self.checkpointer.close(self)
        self.event("done", step=self.step, cursor=self.cursor)
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.reporter is not None:
            self.reporter.close()
        if self._joined:
            self.manager.shutdown(wait=False)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

    @contextlib.contextmanager
    def running(self) -> Iterator[FTHSDP]:
        """`with ft.running():` turns any escaping exception into a classified fatal exit."""
        try:
            yield self
        except SystemExit:
            raise
        except BaseException as exc:
            self.fatal(exc)
        self.finish()


class FTOptimizer:
    """The user's optimizer behind the replica's commit vote (see `FTHSDP.optimizer`)."""

    def __init__(self, ft: FTHSDP, optim: torch.optim.Optimizer) -> None:
        self.ft = ft
        self.optim = optim

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def step(self) -> bool:
        """Vote; step the optimizer only if every rank of the replica voted yes. Returns that."""
        ok = self.ft.steps.commit()
        if ok:
            self.optim.step()
        self.ft.snapshot()  # before a checkpoint or the next quorum reads the state
        if ok:
            self.ft.steps.after_commit()
        return ok

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optim.load_state_dict(state)


def metric_values(scalars: dict[str, Any]) -> dict[str, float]:
    """`record`'s arguments as plain floats (a one-element tensor becomes its number), or
    `MetricError` naming the first bad one (`runtime.report.metrics` has the bounds)."""
    plain = {}
    for name, value in scalars.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise MetricError(
                    f"ft.record: metric {name} is a tensor of {value.numel()} elements; "
                    "a one-element tensor or a number"
                )
            value = value.detach().item()
        plain[name] = value
    return check_metrics(plain)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
