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
  that same step; the others' quorum stays overlapped. The state it fetches is
  `FTHSDP._heal_state`: local shards only (a `full_tensor()` there would be a collective on the
  transport thread, docs/design-facts.md, torchft trap 1), written back into the parameters'
  local shards (trap 2).
* steps whose quorum max step is 0 or past the last step are data-free *sync steps*: at step 0
  torchft heals every non-primary replica from the primary (`init_sync`) and at the end a lagging
  replica heals from a finished one; no replica takes data or steps the optimizer there, so the
  gradient scale and the ledger stay exact.
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
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch import nn

from runtime import ledger, rendezvous
from runtime.api_files import FINISHED_MARKER
from runtime.env import EnvError, WorkerEnv, parse_env
from runtime.protocol import ExitCode
from runtime.steptiming import SLOW_FACTOR_ENV, SlowFault, StepTimer, rank_timing_every

log = logging.getLogger("fthsdp.runtime")

#: Test hook: "REPLICA:RANK:STEP" makes that rank vote "no" once at that training step.
INJECT_VOTE_NO_ENV = "FTHSDP_INJECT_VOTE_NO"
#: "0" waits for every quorum before the step takes data (the benchmark's comparison point).
OVERLAP_QUORUM_ENV = "FTHSDP_OVERLAP_QUORUM"


class FatalWorkerError(RuntimeError):
    """A failure the worker cannot continue from; carries the exit code for its class."""

    def __init__(self, message: str, exit_code: ExitCode, evidence: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.evidence = list(evidence)


def lighthouse_reachable(address: str) -> bool:
    parsed = urlparse(address)
    if not parsed.hostname or not parsed.port:
        return False
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=1.0):
            return True
    except OSError:
        return False


def wait_for_lighthouse(env: WorkerEnv, deadline_s: float) -> str:
    """Return the lighthouse URL once it accepts TCP connections; re-reads the control file.

    Retries with backoff (0.1 s doubling to 2 s) and prints one message while waiting; raises
    `FatalWorkerError(NO_QUORUM_SERVICE)` after `deadline_s`.
    """
    start = time.monotonic()
    delay = 0.1
    told = False
    last = "no control file yet"
    while True:
        found = env.endpoints()
        if found is not None:
            parsed = urlparse(found.lighthouse)
            host, port = parsed.hostname, parsed.port
            if host and port:
                try:
                    with socket.create_connection((host, port), timeout=1.0):
                        return found.lighthouse
                except OSError as exc:
                    last = f"{found.lighthouse}: {exc}"
            else:
                last = f"bad lighthouse address {found.lighthouse!r}"
        if time.monotonic() - start > deadline_s:
            raise FatalWorkerError(
                f"quorum service unreachable after {deadline_s:.0f}s ({last})",
                ExitCode.NO_QUORUM_SERVICE,
            )
        if not told:
            print(f"fthsdp: waiting for the quorum service ({last})", file=sys.stderr, flush=True)
            told = True
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


@dataclass
class StepPlan:
    """This replica's step as it starts (before its quorum may have completed)."""

    step: int
    slot: ledger.Slot
    started: float


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
        self._plan: StepPlan | None = None
        self._saver = False  # this replica was the lowest contributing slot of the last commit
        self._replica_batch = 0
        self._overlap_next = False  # the next quorum may overlap the step (steady state)
        overlap = os.environ.get(OVERLAP_QUORUM_ENV, "1")
        if overlap not in ("0", "1"):
            raise FatalWorkerError(
                f"bad {OVERLAP_QUORUM_ENV}={overlap!r}: 0 or 1", ExitCode.BAD_ENV
            )
        self._overlap = overlap == "1"
        # this step's cross-replica gradient allreduce: done yet, and the slots it found
        self._reduced = False
        self._reduce_queued = False
        self._contrib: list[int] | None = None
        self._quorum_error: Exception | None = None
        self._heal_snapshot: dict[str, Any] | None = None
        self._step_times: list[float] = []
        # Straggler measurements (runtime.steptiming): own compute vs. cross-replica wait.
        self._timer = StepTimer()
        try:
            self._slow = SlowFault.from_env(os.environ)
        except ValueError as exc:
            raise FatalWorkerError(f"bad {SLOW_FACTOR_ENV}: {exc}", ExitCode.BAD_ENV) from None
        self._rank_timing_every = rank_timing_every()
        self._rank_compute: list[float] = []
        self._inject = self._parse_injection()
        self._first_quorum = True
        self._finished = False
        self._reached_end = False
        self._progress_file: Any = None
        self._ledger_file: Any = None
        self.reporter: Any = None
        self.checkpointer: Any = None
        self.watchdog: Any = None
        self._t0 = time.time()

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            addr, port = rendezvous.resolve(env)
        except rendezvous.RendezvousError as exc:
            raise FatalWorkerError(str(exc), ExitCode.PROCESS_FAULT) from None
        env = self.env = replace(env, master_addr=addr, master_port=port)
        os.environ.update(
            {
                "MASTER_ADDR": env.master_addr,
                "MASTER_PORT": str(env.master_port),
                "RANK": str(env.rank),
                "WORLD_SIZE": str(env.world_size),
            }
        )
        lighthouse = wait_for_lighthouse(env, env.timeouts.join_s)
        self._lighthouse = lighthouse
        found = env.endpoints()
        self._control_started_at = found.started_at if found else None
        dist.init_process_group(
            self.backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=env.timeouts.join_s),
        )
        from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

        allreduce = timedelta(seconds=env.timeouts.allreduce_s)
        pg = ProcessGroupNCCL(timeout=allreduce) if self.backend == "nccl" else None
        self._ft_pg = pg if pg is not None else ProcessGroupGloo(timeout=allreduce)
        self.manager = _manager_class()(
            pg=self._ft_pg,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=env.min_replicas,
            use_async_quorum=False,
            timeout=allreduce,
            quorum_timeout=timedelta(seconds=env.timeouts.quorum_s),
            connect_timeout=timedelta(seconds=env.timeouts.quorum_s),
            rank=env.rank,
            world_size=env.world_size,
            store_addr=env.master_addr,
            store_port=env.master_port,
            lighthouse_addr=lighthouse,
            replica_id=f"{env.job_name}_r{env.replica_id}",
            hostname=socket.gethostname() if env.nodes else "localhost",
            heartbeat_interval=timedelta(seconds=min(0.1, env.timeouts.heartbeat_s / 4)),
            init_sync=init_sync,
        )
        self.manager.register_state_dict_fn("fthsdp", self._load_heal_state, self._heal_state)
        self._open_logs()
        self._start_side_services()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, **kwargs: Any) -> FTHSDP:
        """Build from the environment; a bad variable exits 2 naming it, no quorum service 3."""
        logging.basicConfig(
            level=os.environ.get("FTHSDP_LOG_LEVEL", "WARNING"),
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

    def _parse_injection(self) -> tuple[int, int, int] | None:
        raw = os.environ.get(INJECT_VOTE_NO_ENV)
        if not raw:
            return None
        try:
            replica, rank, step = (int(x) for x in raw.split(":"))
        except ValueError:
            raise EnvError(INJECT_VOTE_NO_ENV, raw, "REPLICA:RANK:STEP") from None
        return replica, rank, step

    def _open_logs(self) -> None:
        if not self.env.is_leader:
            return
        for sub in ("progress", "ledger"):
            (self.env.run_dir / sub).mkdir(parents=True, exist_ok=True)
        name = f"r{self.env.replica_id}.jsonl"
        self._progress_file = open(self.env.run_dir / "progress" / name, "a", buffering=1)  # noqa: SIM115
        self._ledger_file = open(self.env.run_dir / "ledger" / name, "a", buffering=1)  # noqa: SIM115
        self._event("start", step=self.manager.current_step())

    def _start_side_services(self) -> None:
        from runtime.checkpoint import DurableCheckpointer
        from runtime.report_sender import ReportClient

        if self.env.is_leader:
            self.reporter = ReportClient.for_worker(self.env, self.incarnation)
        self.checkpointer = DurableCheckpointer.for_worker(self.env)
        if self.env.health_checks:
            from runtime.watchdog import NodeWatchdog

            self.watchdog = NodeWatchdog(self.env.health_checks, on_fault=self._node_fault)
            self.watchdog.start()

    def _event(self, event: str, **fields: Any) -> None:
        if self._progress_file is not None:
            record = {"t": time.time(), "event": event, "incarnation": self.incarnation, **fields}
            self._progress_file.write(json.dumps(record) + "\n")

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
                    param.register_post_accumulate_grad_hook(lambda _: self._queue_reduce())
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
                module.set_all_reduce_hook(lambda _: self._queue_reduce())
        return model

    def _queue_reduce(self) -> None:
        """During backward: have the gradients cross replicas in ONE allreduce once backward is
        over (torchft's DDP has one bucket for such a model), not one per unit. Autograd runs the
        callback after FSDP's own end-of-backward callback, queued before any unit's hook."""
        if not self._reduce_queued:
            self._reduce_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_after_backward)

    def optimizer(self, optim: torch.optim.Optimizer) -> FTOptimizer:
        """Wrap an optimizer: `step()` runs only if the replica's commit vote passes."""
        self.optim = optim
        if self.resume and self.checkpointer is not None and self.model is not None:
            self.checkpointer.maybe_restore(self)
        self._snapshot()
        return FTOptimizer(self, optim)

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

        self._replica_batch = batch_size * self.env.world_size
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
            plan = self._begin_step()
            if plan is None:
                return
            mine = plan.slot.rank_slice(self.env.rank, self.env.world_size)
            batch = collate_fn([item(i) for i in mine.ids()])
            yield _to_device(batch, self.device)

    # ------------------------------------------------------------------ the step protocol
    @property
    def step(self) -> int:
        """Training steps committed so far (torchft's step minus the initial sync step)."""
        return min(max(0, self.manager.current_step() - 1), self.env.steps)

    @property
    def cursor(self) -> int:
        """The ledger's cursor: samples below it were issued (trained, or pending re-issue)."""
        return self.ledger_state.cursor

    def _quorum(self) -> None:
        timeout = self.env.timeouts.join_s if self._first_quorum else self.env.timeouts.quorum_s
        give_up = time.monotonic() + self.env.timeouts.join_s
        while True:
            self.manager.start_quorum(timeout=timedelta(seconds=timeout))
            try:
                self.manager.wait_quorum()
                break
            except Exception as exc:
                self._wait_out_control_restart(exc, give_up)
            # torchft's start_quorum re-raises the failed quorum's error; this one is handled.
            self.manager._quorum_future = None
        if self._first_quorum:
            self._first_quorum = False
            self._event("joined", step=self.manager.current_step())
        self._apply_heal()

    def _apply_heal(self) -> None:
        """After a waited quorum that made this replica heal: load the fetched state now, before
        the step takes data and runs forward, so the replica trains its slot in this very step
        (torchft's synchronous-quorum healing). Every replica counts every quorum member as a
        participant (`_manager_class`). A failed fetch leaves the replica healing (it
        contributes zeros and the step is voted down)."""
        m = self.manager
        if m._healing and m.errored() is None:
            m._apply_pending_state_dict()
            m._healing = False
            self._event("healed", step=m.current_step())

    def _await_quorum(self) -> bool:
        """Wait for an overlapped quorum; False (and the step is voted down) if it failed."""
        if self._quorum_error is not None:
            return False
        try:
            self.manager.wait_quorum()
            return True
        except Exception as exc:
            self._quorum_error = exc
            self.manager.report_error(exc)
            return False

    def _reduce_after_backward(self) -> None:
        """Autograd's end-of-backward callback (`_queue_reduce`): every gradient (shard) is in
        `param.grad` by now."""
        self._reduce_queued = False
        self._reduce_grads()

    def _reduce_grads(self) -> list[int] | None:
        """The step's ONE cross-replica allreduce: every gradient shard of this rank and this
        replica's one-hot slot, flattened into one buffer (torchft zeroes all of it when the
        replica does not participate). Afterwards `param.grad` holds the average over the
        quorum's participants, as after torchft's DDP, and every replica knows which slots
        trained. Returns those slots; None when the allreduce failed or they do not match the
        quorum (then the step is voted down: the average divides by the participants, so they
        must be exactly the contributors).

        A second backward in the step (gradient accumulation) reduces again: the participants
        all hold the same average from the first, so the new average adds the mean of the new
        gradients to it, exactly.
        """
        self._reduced = True
        self._contrib = None
        with self._timer.waiting():  # the quorum waits for the slowest replica too
            if not self._await_quorum():
                return None
        from torch.distributed import ReduceOp

        assert self.model is not None
        grads = []
        with torch.no_grad():
            for p in self.model.parameters():
                if not p.requires_grad:
                    continue
                if p.grad is None:  # same buffer layout on every replica
                    p.grad = torch.zeros_like(p)
                grads.append(_local(p.grad))
            dtypes = {g.dtype for g in grads}
            dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
            n = sum(g.numel() for g in grads)
            slots_n = self.env.num_replicas
            flat = torch.empty(n + slots_n, dtype=dtype, device=self.device)
            offset = 0
            for g in grads:
                flat[offset : offset + g.numel()].copy_(g.reshape(-1))
                offset += g.numel()
            flat[n:].zero_()
            flat[n + self.env.replica_id] = 1.0
            with self._timer.waiting():
                self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
            if self.manager.errored() is not None:
                return None
            counts = flat[n:].tolist()
            slots = [i for i, v in enumerate(counts) if v > 0.5]
            k = self.manager.num_participants()
            if k < 1 or len(slots) != k or any(abs(v - round(v)) > 1e-3 or v > 1.5 for v in counts):
                self.manager.report_error(
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
        self._contrib = slots
        return slots

    def _wait_out_control_restart(self, exc: Exception, give_up: float) -> None:
        """After a failed quorum: return (to retry it) if the control job was restarted and its
        Lighthouse is back at the same address; raise the process fault otherwise.

        torchft's Manager keeps the Lighthouse address it was built with and reconnects to it;
        it cannot follow a Lighthouse that moved, so then this rank exits with a process fault
        and its supervisor relaunches the step in place with the new address.
        """
        failed = FatalWorkerError(f"quorum failed: {exc}", ExitCode.PROCESS_FAULT, [repr(exc)])
        found = self.env.endpoints()
        restarted = found is not None and found.started_at != self._control_started_at
        if not restarted and found is not None and lighthouse_reachable(found.lighthouse):
            raise failed from exc  # the quorum service is up and unchanged: a real failure
        remaining = give_up - time.monotonic()
        try:
            lighthouse = wait_for_lighthouse(self.env, max(0.0, remaining))
        except FatalWorkerError:
            raise failed from exc
        if lighthouse != self._lighthouse:
            raise FatalWorkerError(
                f"the quorum service moved from {self._lighthouse} to {lighthouse} (control job "
                "restarted elsewhere); exiting to be relaunched with the new address",
                ExitCode.PROCESS_FAULT,
            ) from exc
        found = self.env.endpoints()
        self._control_started_at = found.started_at if found else None
        log.warning("quorum failed while the control plane restarted; retrying: %s", exc)
        self._event("quorum-retry", step=self.manager.current_step(), error=str(exc)[:300])

    def _sync_step(self, reason: str) -> bool:
        """A data-free step: apply a pending heal, vote, step nothing. True if committed.

        A one-element allreduce across the quorum comes first: it cannot complete before every
        healing peer has fetched its checkpoint, so no sender closes its checkpoint server (which
        `should_commit` does) while a peer is still reading it. A training step gets the same
        ordering from its gradient allreduce.
        """
        self.manager.allreduce(torch.zeros(1, device=self.device)).wait()
        ok = self.manager.should_commit()
        self._snapshot()
        self._event("sync", reason=reason, committed=ok, step=self.manager.current_step())
        return ok

    def _begin_step(self) -> StepPlan | None:
        """Quorum for the next step; None when training is over."""
        if self._finished:
            return None
        if self._first_quorum and (self.env.run_dir / FINISHED_MARKER).exists():
            print("fthsdp: the run has already finished; nothing to do", file=sys.stderr)
            self._finished = True
            return None
        while True:
            self._check_watchdog()
            self._quorum_error = None
            self._reduced = self._reduce_queued = False
            self._contrib = None
            if self._overlap_next and self.manager.current_step() - 1 < self.env.steps:
                # steady state: this replica just committed with the others, so the quorum
                # will find it at the max step, in a training step; it completes meanwhile
                self.manager.start_quorum(timeout=timedelta(seconds=self.env.timeouts.quorum_s))
                return self._start_plan(self.manager.current_step() - 1)
            self._quorum()
            max_step = self.manager.current_step()
            if max_step == 0:
                self._sync_step("init")
                continue
            if max_step == 1 and self._behind_the_run():
                self._refuse_fresh_start()
                continue
            if max_step - 1 >= self.env.steps:
                self._sync_step("final")
                self._finished = True
                self._reached_end = True
                if self.env.is_leader:
                    (self.env.run_dir / FINISHED_MARKER).write_text(str(self.env.steps))
                return None
            return self._start_plan(max_step - 1)

    def _start_plan(self, step: int) -> StepPlan:
        slot = ledger.take(
            self.ledger_state, self.env.replica_id, self.env.num_replicas, self._replica_batch
        )
        self._plan = StepPlan(step=step, slot=slot, started=time.monotonic())
        self._timer.begin()
        return self._plan

    def _behind_the_run(self) -> bool:
        """A quorum of fresh replicas (data step 0) while the run's ledger already holds later
        commits: the replicas with the run's state are alive but were missed (a slow heartbeat,
        a long heal) and will be back. Training now would restart the data stream from sample 0
        beside them, so a fresh group waits for them, up to the join timeout; past it the state
        is taken as lost and the run starts over (the ledger then shows the repeat)."""
        if time.time() - self._t0 > self.env.timeouts.join_s:
            return False
        for path in (self.env.run_dir / "ledger").glob("r*.jsonl"):
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, f.seek(0, 2) - 4096))
                    tail = f.read().decode(errors="replace").splitlines()
            except OSError:
                continue
            for line in reversed(tail):
                try:
                    if int(json.loads(line)["step"]) > 0:
                        return True
                except (ValueError, KeyError, TypeError):
                    continue
        return False

    def _refuse_fresh_start(self) -> None:
        """Vote no on this step (every fresh peer does the same) and ask for a quorum again."""
        self._event("wait", reason="fresh quorum behind the run", step=self.manager.current_step())
        self.manager.report_error(RuntimeError("fresh quorum behind the run; waiting for state"))
        self.manager.allreduce(torch.zeros(1, device=self.device)).wait()
        self.manager.should_commit()
        self._snapshot()
        time.sleep(0.5)

    def report_error(self, exc: Exception) -> None:
        """Mark this rank's step as bad (e.g. a non-finite loss): the replica votes "no"."""
        self.manager.report_error(exc)

    def _commit(self) -> bool:
        plan = self._plan
        if plan is None:
            raise RuntimeError("opt.step() outside a step: iterate ft.data(...) around it")
        if self._inject == (self.env.replica_id, self.env.rank, plan.step):
            self._inject = None
            self.manager.report_error(RuntimeError("injected vote 'no' (test hook)"))
        compute_s = self._measure_compute(plan)
        # no backward in this step (or no unit's hook ran): reduce now, so every replica issues
        # the same allreduces
        contributors = self._contrib if self._reduced else self._reduce_grads()
        if self._quorum_error is None:
            plan.step = self.manager.current_step() - 1  # moved if this replica heals
            if not 0 <= plan.step < self.env.steps:
                # cannot happen after a commit with the others; never train into a sync step
                self.manager.report_error(RuntimeError(f"quorum moved to sync step {plan.step}"))
        healing = not self.manager.is_participating()
        k = self.manager.num_participants() if self._quorum_error is None else 0
        try:
            ok = self._quorum_error is None and self.manager.should_commit()
        except Exception as exc:
            raise FatalWorkerError(
                f"commit vote failed: {exc}", ExitCode.PROCESS_FAULT, [repr(exc)]
            ) from exc
        self._plan = None
        step_s = time.monotonic() - plan.started
        error = self.manager.errored() or self._quorum_error
        if self._quorum_error is not None:
            # the overlapped quorum failed (every rank of the replica sees the same): wait out a
            # control-plane restart like a waited quorum does, and redo the step
            self.manager._quorum_future = None
            self._wait_out_control_restart(
                self._quorum_error, time.monotonic() + self.env.timeouts.join_s
            )
        self._overlap_next = ok and self._overlap
        if ok and contributors is not None:
            state = self.ledger_state  # after a heal: the peer's state, loaded in should_commit
            if self._ledger_file is not None:
                rec = ledger.LedgerRecord.make(
                    plan.step,
                    self.env.replica_id,
                    state,
                    contributors,
                    self.env.num_replicas,
                    self._replica_batch,
                )
                self._ledger_file.write(rec.to_json() + "\n")
            self.ledger_state = ledger.commit(
                state, contributors, self.env.num_replicas, self._replica_batch
            )
            self._step_times.append(step_s)
            self._saver = contributors[0] == self.env.replica_id
        elif ok:
            # committed without knowing the contributors: the allreduce failed after the vote
            # could see it, which torchft's error tracking rules out; never guess
            raise FatalWorkerError(
                "step committed without its contributing slots", ExitCode.PROCESS_FAULT
            )
        elif self.checkpointer is not None:
            self.checkpointer.failures_seen += 1
        self._event(
            "commit" if ok else "abort",
            step=plan.step,
            participants=k,
            healing=healing,
            step_s=step_s,
            compute_s=compute_s,
            wait_s=self._timer.wait_s,
            error=str(error) if error else None,
        )
        if self.reporter is not None:
            self.reporter.status(
                step=self.step,
                quorum_id=self.manager._quorum_id,
                participants=k,
                healing=healing,
                step_time_s=step_s,
                compute_s=compute_s,
                allreduce_wait_s=self._timer.wait_s,
                rank_compute_s=list(self._rank_compute),
                cursor=self.cursor,
                last_error=str(error).splitlines()[0] if error else None,
            )
        return ok

    def _measure_compute(self, plan: StepPlan) -> float:
        """This rank's compute in the step (slowed by the slow fault), gathered to the leader
        every few steps so the coordinator can name the slow rank's node."""
        compute_s = self._timer.compute_s(plan.started)
        delay = self._slow.delay_s(compute_s) if self._slow.active else 0.0
        if delay > 0:
            time.sleep(delay)
            compute_s += delay
        if plan.step % self._rank_timing_every == 0 and self.env.world_size > 1:
            mine = torch.tensor([compute_s], dtype=torch.float64, device=self.device)
            parts = [torch.zeros_like(mine) for _ in range(self.env.world_size)]
            dist.all_gather(parts, mine)
            self._rank_compute = [float(t.item()) for t in parts]
        elif self.env.world_size == 1:
            self._rank_compute = [compute_s]
        return compute_s

    def _after_commit(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.maybe_save(self, 0 if self._saver else None)

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

    def _snapshot(self) -> None:
        """Take the state a healing peer may fetch (main thread, outside forward/backward)."""
        from torch.distributed.tensor import DTensor

        assert self.model is not None and self.optim is not None
        params = {name: _local(p) for name, p in self.model.named_parameters()}
        names: dict[Any, str] = {p: name for name, p in self.model.named_parameters()}
        opt_state: dict[str, dict[str, Any]] = {}
        for p, st in self.optim.state.items():
            opt_state[names[p]] = {
                k: (("d", v.to_local()) if isinstance(v, DTensor) else ("t", v))
                for k, v in st.items()
            }
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optim.param_groups]
        self._heal_snapshot = {
            "params": params,
            "optim": opt_state,
            "groups": groups,
            "ledger": self.ledger_state.to_json(),
            "extra": dict(self.extra_state),
        }

    def _load_heal_state(self, state: dict[str, Any]) -> None:
        """Write a peer's state into this rank's local shards (main thread, in should_commit)."""
        from torch.distributed.tensor import DTensor

        assert self.model is not None and self.optim is not None
        with torch.no_grad():
            by_name = dict(self.model.named_parameters())
            for name, p in by_name.items():
                _local(p).copy_(state["params"][name])
            for name, st in state["optim"].items():
                p = by_name[name]
                new: dict[str, Any] = {}
                for k, (kind, v) in st.items():
                    v = v.to(self.device)
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
                self.optim.state[p] = new
            for group, saved in zip(self.optim.param_groups, state["groups"], strict=True):
                group.update(saved)
        self.ledger_state = ledger.LedgerState.from_json(state["ledger"])
        self.extra_state.clear()
        self.extra_state.update(state["extra"])

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

    def _check_watchdog(self) -> None:
        if self.watchdog is not None and self.watchdog.verdict is not None:
            reason, evidence = self.watchdog.verdict
            raise FatalWorkerError(reason, ExitCode.NODE_FAULT, evidence)

    def fatal(self, exc: BaseException) -> None:
        """Send the final classified report (leader) and exit with the class's code."""
        from runtime.failure_class import classify_failure

        verdict = classify_failure(exc, node=self._node_name())
        self._event("fatal", step=self.step, error=str(exc)[:500], exit_code=verdict.exit_code)
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
        return os.environ.get("SLURMD_NODENAME") or socket.gethostname()

    def finish(self) -> None:
        """Write this rank's final local shards, stop the side services, shut torchft down."""
        if self.model is not None and self._reached_end:
            final = self.env.run_dir / "final"
            final.mkdir(parents=True, exist_ok=True)
            shards = {n: _local(p).detach().cpu().clone() for n, p in self.model.named_parameters()}
            path = final / f"r{self.env.replica_id}_rank{self.env.rank}.pt"
            torch.save({"step": self.step, "cursor": self.cursor, "params": shards}, path)
        self._event("done", step=self.step, cursor=self.cursor)
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.reporter is not None:
            self.reporter.close()
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
        ok = self.ft._commit()
        if ok:
            self.optim.step()
        self.ft._snapshot()  # before a checkpoint or the next quorum reads the state
        if ok:
            self.ft._after_commit()
        return ok

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optim.load_state_dict(state)


def _local(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return p.to_local() if isinstance(p, DTensor) else p


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _manager_class() -> type:
    """torchft's Manager with synchronous-quorum participation and an asynchronous start.

    Every quorum member counts as a participant (torchft's `use_async_quorum=False`), so a replica
    that heals at a waited quorum trains in that same step, while `start_quorum` still returns at
    once and the quorum overlaps forward and backward. A replica that finds itself behind at an
    overlapped quorum has already run forward on its old state: it stays "healing", torchft zeroes
    its contribution and the slot count votes the step down for everyone; it loads the state at
    the vote and is in step at the next quorum.
    """
    from torchft.manager import Manager

    class _Manager(Manager):
        def start_quorum(
            self,
            allow_heal: bool = True,
            shrink_only: bool = False,
            timeout: timedelta | None = None,
        ) -> None:
            # torchft's start_quorum without its wait for a synchronous quorum
            previous: Any = self._quorum_future  # type: ignore[has-type]
            if previous is not None:
                previous.result()
            self._errored = None
            self._healing = False
            self._quorum_future = self._executor.submit(
                self._async_quorum,
                allow_heal=allow_heal,
                shrink_only=shrink_only,
                quorum_timeout=timeout or self._quorum_timeout,
                curr_device=(
                    torch.accelerator.current_device_index()
                    if torch.accelerator.is_available()
                    else -1
                ),
            )

        def is_participating(self) -> bool:
            # torchft asserts an asynchronous quorum when healing; here healing = not in step
            return self._participating_replica_rank is not None and not self._healing

    return _Manager
