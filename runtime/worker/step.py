"""The step and commit protocol of one rank: per-step quorum, gradient allreduce, commit vote.

* per-step quorum, off the critical path: `begin_step` starts torchft's `Manager.start_quorum`
  at the top of each step and returns this replica's slot at once: the data ledger
  (`runtime.ledger`) decides it from the committed state and the replica id alone, not from the
  participants. The quorum completes while the forward pass runs (the gradient allreduce waits
  for it). The quorum is waited up front only where the step's kind depends on it: a worker's
  first quorum, after an aborted step, and the final sync step.
* commit vote: `commit` calls `Manager.should_commit()`: every rank of the replica votes, the
  replica leader's manager server decides "all yes"; on "no" nothing is stepped and the replica
  redoes the step (it heals from a peer at the next quorum if the others moved on).
* steps whose quorum max step is 0 or past the last step are data-free *sync steps*: at step 0
  torchft heals every non-primary replica from the primary (`init_sync`) and at the end a
  lagging replica heals from a finished one; no replica takes data or steps the optimizer there.
* a quorum of fresh replicas (max step 0) with a complete durable checkpoint on disk votes its
  step down and loads it on every participant: the run lost every replica that held its state.
  A replica restarted beside live peers heals from them and never reads the disk.

The protocol runs inside the worker facade (`runtime.api.FTHSDP`), which holds the model, the
ledger state and the side services; `StepHost` names what the protocol uses of it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from runtime import ledger
from runtime.control.straggler.steptiming import (
    SLOW_FACTOR_ENV,
    SlowFault,
    StepTimer,
    rank_timing_every,
)
from runtime.env import EnvError, WorkerEnv
from runtime.protocol import ExitCode
from runtime.worker.allreduce import allreduce_gradients
from runtime.worker.control_wait import ControlRestartWait
from runtime.worker.errors import FatalWorkerError
from runtime.worker.outputs import FINISHED_MARKER

#: Test hook: "REPLICA:RANK:STEP" makes that rank vote "no" once at that training step.
INJECT_VOTE_NO_ENV = "FTHSDP_INJECT_VOTE_NO"
#: "0" waits for every quorum before the step takes data (the benchmark's comparison point).
OVERLAP_QUORUM_ENV = "FTHSDP_OVERLAP_QUORUM"
#: Committed steps whose wall time the checkpointer's cadence takes the median of.
STEP_TIMES_KEPT = 101


def parse_vote_no_injection(environ: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(replica, rank, step) of `FTHSDP_INJECT_VOTE_NO`, or None when it is unset."""
    raw = environ.get(INJECT_VOTE_NO_ENV)
    if not raw:
        return None
    try:
        replica, rank, step = (int(x) for x in raw.split(":"))
    except ValueError:
        raise EnvError(INJECT_VOTE_NO_ENV, raw, "REPLICA:RANK:STEP") from None
    return replica, rank, step


@dataclass
class StepPlan:
    """This replica's step as it starts (before its quorum may have completed)."""

    step: int
    slot: ledger.Slot
    started: float


class StepHost(Protocol):
    """What the step protocol uses of the worker it runs in (`runtime.api.FTHSDP`)."""

    env: WorkerEnv
    device: torch.device
    manager: Any
    control: ControlRestartWait
    model: nn.Module | None
    ledger_state: ledger.LedgerState
    ledger_log: IO[str] | None
    reporter: Any
    checkpointer: Any

    @property
    def step(self) -> int: ...

    @property
    def cursor(self) -> int: ...

    def event(self, event: str, **fields: Any) -> None: ...

    def snapshot(self) -> None: ...
    def durable_restore_due(self) -> bool: ...
    def restore_durable(self) -> int | None: ...

    def check_watchdog(self) -> None: ...


class StepProtocol:
    """The per-step state of one rank and the protocol that moves it (see the module doc)."""

    def __init__(self, ft: StepHost, started_at: float) -> None:
        self.ft = ft
        #: When the worker started (wall clock): a fresh group waits for the run's state this long.
        self.started_at = started_at
        self.plan: StepPlan | None = None
        self._saver = False  # this replica was the lowest contributing slot of the last commit
        self.replica_batch = 0
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
        #: Wall time of the last committed steps (the checkpointer's cadence reads their median).
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        # Straggler measurements (runtime.control.straggler.steptiming): own compute vs.
        # cross-replica wait.
        self._timer = StepTimer()
        try:
            self._slow = SlowFault.from_env(os.environ)
        except ValueError as exc:
            raise FatalWorkerError(f"bad {SLOW_FACTOR_ENV}: {exc}", ExitCode.BAD_ENV) from None
        self._rank_timing_every = rank_timing_every()
        self._rank_compute: list[float] = []
        self._inject = parse_vote_no_injection(os.environ)
        self._first_quorum = True
        self._finished = False
        #: This worker took part in the final sync step (its shards are the run's result).
        self.reached_end = False

    def queue_reduce(self) -> None:
        """During backward: have the gradients cross replicas in ONE allreduce once backward is
        over (torchft's DDP has one bucket for such a model), not one per unit. Autograd runs the
        callback after FSDP's own end-of-backward callback, queued before any unit's hook."""
        if not self._reduce_queued:
            self._reduce_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_after_backward)

    def _quorum(self) -> None:
        timeout = (
            self.ft.env.timeouts.join_s if self._first_quorum else self.ft.env.timeouts.quorum_s
        )
        give_up = self.ft.control.deadline()
        while True:
            self.ft.manager.start_quorum(timeout=timedelta(seconds=timeout))
            try:
                self.ft.manager.wait_quorum()
                break
            except Exception as exc:
                self._wait_out_control_restart(exc, give_up)
            # torchft's start_quorum re-raises the failed quorum's error; this one is handled.
            self.ft.manager.forget_quorum()
        if self._first_quorum:
            self._first_quorum = False
            self.ft.event("joined", step=self.ft.manager.current_step())
        self._apply_heal()

    def _apply_heal(self) -> None:
        """After a waited quorum that made this replica heal: load the fetched state now, before
        the step takes data and runs forward, so the replica trains its slot in this very step
        (torchft's synchronous-quorum healing). Every replica counts every quorum member as a
        participant (`runtime.worker.manager.manager_class`). A failed fetch leaves the replica
        healing (it contributes zeros and the step is voted down)."""
        m = self.ft.manager
        if m.apply_pending_heal():
            self.ft.event("healed", step=m.current_step())

    def _await_quorum(self) -> bool:
        """Wait for an overlapped quorum; False (and the step is voted down) if it failed."""
        if self._quorum_error is not None:
            return False
        try:
            self.ft.manager.wait_quorum()
            return True
        except Exception as exc:
            self._quorum_error = exc
            self.ft.manager.report_error(exc)
            return False

    def _reduce_after_backward(self) -> None:
        """Autograd's end-of-backward callback (`queue_reduce`): every gradient (shard) is in
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
        assert self.ft.model is not None
        slots = allreduce_gradients(
            self.ft.model,
            self.ft.manager,
            self.ft.env.replica_id,
            self.ft.env.num_replicas,
            self.ft.device,
            self._timer,
        )
        if slots is None:
            return None
        self._contrib = slots
        return slots

    def _wait_out_control_restart(self, exc: Exception, give_up: float) -> None:
        """After a failed quorum: return to retry it if the control job was restarted and its
        Lighthouse is back at the same address; raise the process fault otherwise
        (`ControlRestartWait.wait_out`)."""
        self.ft.control.wait_out(exc, give_up)
        self.ft.event("quorum-retry", step=self.ft.manager.current_step(), error=str(exc)[:300])

    def _sync_step(self, reason: str) -> bool:
        """A data-free step: apply a pending heal, vote, step nothing. True if committed.

        A one-element allreduce across the quorum comes first: it cannot complete before every
        healing peer has fetched its checkpoint, so no sender closes its checkpoint server (which
        `should_commit` does) while a peer is still reading it. A training step gets the same
        ordering from its gradient allreduce.
        """
        self.ft.manager.allreduce(torch.zeros(1, device=self.ft.device)).wait()
        ok = self.ft.manager.should_commit()
        self.ft.snapshot()
        self.ft.event("sync", reason=reason, committed=ok, step=self.ft.manager.current_step())
        return ok

    def begin_step(self) -> StepPlan | None:
        """Quorum for the next step; None when training is over."""
        if self._finished:
            return None
        if self._first_quorum and (self.ft.env.run_dir / FINISHED_MARKER).exists():
            print("fthsdp: the run has already finished; nothing to do", file=sys.stderr)
            self._finished = True
            return None
        while True:
            self.ft.check_watchdog()
            self._quorum_error = None
            self._reduced = self._reduce_queued = False
            self._contrib = None
            if self._overlap_next and self.ft.manager.current_step() - 1 < self.ft.env.steps:
                # steady state: this replica just committed with the others, so the quorum
                # will find it at the max step, in a training step; it completes meanwhile
                self.ft.manager.start_quorum(
                    timeout=timedelta(seconds=self.ft.env.timeouts.quorum_s)
                )
                return self._start_plan(self.ft.manager.current_step() - 1)
            self._quorum()
            max_step = self.ft.manager.current_step()
            if max_step == 0 and self.ft.durable_restore_due():
                if self._state_alive_elsewhere():
                    self._refuse_fresh_start()
                else:
                    self._restore_durable()
                continue
            if max_step == 0:
                self._sync_step("init")
                continue
            if max_step == 1 and self._behind_the_run():
                self._refuse_fresh_start()
                continue
            if max_step - 1 >= self.ft.env.steps:
                self._sync_step("final")
                self._finished = True
                self.reached_end = True
                if self.ft.env.is_leader:
                    (self.ft.env.run_dir / FINISHED_MARKER).write_text(str(self.ft.env.steps))
                return None
            return self._start_plan(max_step - 1)

    def _start_plan(self, step: int) -> StepPlan:
        slot = ledger.take(
            self.ft.ledger_state,
            self.ft.env.replica_id,
            self.ft.env.num_replicas,
            self.replica_batch,
        )
        self.plan = StepPlan(step=step, slot=slot, started=time.monotonic())
        self._timer.begin()
        return self.plan

    def _behind_the_run(self) -> bool:
        """A quorum of fresh replicas (data step 0) while the run's ledger already holds later
        commits: the replicas with the run's state are alive but were missed (a slow heartbeat,
        a long heal) and will be back. Training now would restart the data stream from sample 0
        beside them, so a fresh group waits for them, up to the join timeout; past it the state
        is taken as lost and the run starts over (the ledger then shows the repeat)."""
        if time.time() - self.started_at > self.ft.env.timeouts.join_s:
            return False
        for path in (self.ft.env.run_dir / "ledger").glob("r*.jsonl"):
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

    def _state_alive_elsewhere(self) -> bool:
        """A quorum of fresh replicas with a checkpoint on disk, while a replica that holds the
        run's state committed after this one started: that replica is alive and was only missed
        by this quorum. Restoring now would train from the checkpoint's step beside it, on a
        second history, so the fresh group waits for it instead, up to the join timeout."""
        if time.time() - self.started_at > self.ft.env.timeouts.join_s:
            return False
        return ledger.appended_since(self.ft.env.run_dir / "ledger", self.started_at)

    def _restore_durable(self) -> None:
        """A quorum of fresh replicas with a complete durable checkpoint on disk: every
        participant sees the same quorum and takes this branch. It votes the step down (no one
        trains from the initial weights), then loads the checkpoint, so the next quorum finds
        them all at its step."""
        m = self.ft.manager
        m.report_error(RuntimeError("restoring the run from its durable checkpoint"))
        m.allreduce(torch.zeros(1, device=self.ft.device)).wait()
        m.should_commit()
        self.ft.restore_durable()

    def _refuse_fresh_start(self) -> None:
        """Vote no on this step (every fresh peer does the same) and ask for a quorum again."""
        self.ft.event(
            "wait", reason="fresh quorum behind the run", step=self.ft.manager.current_step()
        )
        self.ft.manager.report_error(RuntimeError("fresh quorum behind the run; waiting for state"))
        self.ft.manager.allreduce(torch.zeros(1, device=self.ft.device)).wait()
        self.ft.manager.should_commit()
        self.ft.snapshot()
        time.sleep(0.5)

    def commit(self) -> bool:
        plan = self.plan
        if plan is None:
            raise RuntimeError("opt.step() outside a step: iterate ft.data(...) around it")
        if self._inject == (self.ft.env.replica_id, self.ft.env.rank, plan.step):
            self._inject = None
            self.ft.manager.report_error(RuntimeError("injected vote 'no' (test hook)"))
        compute_s = self._measure_compute(plan)
        # no backward in this step (or no unit's hook ran): reduce now, so every replica issues
        # the same allreduces
        contributors = self._contrib if self._reduced else self._reduce_grads()
        if self._quorum_error is None:
            plan.step = self.ft.manager.current_step() - 1  # moved if this replica heals
            if not 0 <= plan.step < self.ft.env.steps:
                # cannot happen after a commit with the others; never train into a sync step
                self.ft.manager.report_error(RuntimeError(f"quorum moved to sync step {plan.step}"))
        healing = not self.ft.manager.is_participating()
        k = self.ft.manager.num_participants() if self._quorum_error is None else 0
        try:
            ok = self._quorum_error is None and self.ft.manager.should_commit()
        except Exception as exc:
            raise FatalWorkerError(
                f"commit vote failed: {exc}", ExitCode.PROCESS_FAULT, [repr(exc)]
            ) from exc
        self.plan = None
        step_s = time.monotonic() - plan.started
        error = self.ft.manager.errored() or self._quorum_error
        if self._quorum_error is not None:
            # the overlapped quorum failed (every rank of the replica sees the same): wait out a
            # control-plane restart like a waited quorum does, and redo the step
            self.ft.manager.forget_quorum()
            self._wait_out_control_restart(self._quorum_error, self.ft.control.deadline())
        self._overlap_next = ok and self._overlap
        if ok and contributors is not None:
            state = self.ft.ledger_state  # after a heal: the peer's state, loaded in should_commit
            if self.ft.ledger_log is not None:
                rec = ledger.LedgerRecord.make(
                    plan.step,
                    self.ft.env.replica_id,
                    state,
                    contributors,
                    self.ft.env.num_replicas,
                    self.replica_batch,
                )
                self.ft.ledger_log.write(rec.to_json() + "\n")
            self.ft.ledger_state = ledger.commit(
                state, contributors, self.ft.env.num_replicas, self.replica_batch
            )
            self.step_times.append(step_s)
            self._saver = contributors[0] == self.ft.env.replica_id
        elif ok:
            # committed without knowing the contributors: the allreduce failed after the vote
            # could see it, which torchft's error tracking rules out; never guess
            raise FatalWorkerError(
                "step committed without its contributing slots", ExitCode.PROCESS_FAULT
            )
        self.ft.event(
            "commit" if ok else "abort",
            step=plan.step,
            participants=k,
            healing=healing,
            step_s=step_s,
            compute_s=compute_s,
            wait_s=self._timer.wait_s,
            error=str(error) if error else None,
        )
        if self.ft.reporter is not None:
            self.ft.reporter.status(
                step=self.ft.step,
                quorum_id=self.ft.manager.current_quorum_id(),
                participants=k,
                healing=healing,
                step_time_s=step_s,
                compute_s=compute_s,
                allreduce_wait_s=self._timer.wait_s,
                rank_compute_s=list(self._rank_compute),
                cursor=self.ft.cursor,
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
        if plan.step % self._rank_timing_every == 0 and self.ft.env.world_size > 1:
            mine = torch.tensor([compute_s], dtype=torch.float64, device=self.ft.device)
            parts = [torch.zeros_like(mine) for _ in range(self.ft.env.world_size)]
            dist.all_gather(parts, mine)
            self._rank_compute = [float(t.item()) for t in parts]
        elif self.ft.env.world_size == 1:
            self._rank_compute = [compute_s]
        return compute_s

    def after_commit(self) -> None:
        if self.ft.checkpointer is not None:
            self.ft.checkpointer.maybe_save(self.ft, 0 if self._saver else None)
