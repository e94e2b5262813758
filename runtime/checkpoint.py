"""Durable checkpoints: the run survives even when every replica dies at once.

Healing from a live peer covers a replica that fails while others keep training; it cannot cover
the loss of all replicas (a power event, the whole run requeued). So one replica (the quorum's
participant 0 of the committed step) writes a `torch.distributed.checkpoint` (DCP) checkpoint of
its shards, the optimizer, torchft's step and the ledger cursor to `run_dir/checkpoints/step_N`,
and marks it complete only after DCP has finished. A replica restarted beside live peers heals
from them at its first quorum and never reads the disk. Only a quorum of fresh replicas (every
participant at step 0: the run lost every replica that held its state) loads the newest complete
checkpoint, every participant alike, and resumes with the cursor where it was.

The save is DCP's asynchronous one: the step loop pays only for copying the state into staging
memory, and the write runs on a thread over a gloo group of its own, so that its collectives
never interleave with the training group's. A save that comes due while the previous one is
still writing waits for it on every rank (the ranks must agree on which saves exist).

The cadence is a trade-off: writing costs the step loop time, and losing the run loses the work
since the last write. By default it is Young/Daly's (`runtime.sim.reliability`, the formula the
simulator uses too) for the measured staging time against the run's expected whole-run loss
(`RunFailureModel`); `checkpoint_every_steps` or `checkpoint_every_s` fix it instead. A time
cadence is turned into a step count by the leader after each save and broadcast to its ranks,
so that no per-step collective is needed to agree when the next save is due.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.env import WorkerEnv
from runtime.sim.reliability import RunFailureModel, young_daly_interval_s

if TYPE_CHECKING:
    from runtime.api import FTHSDP

log = logging.getLogger("fthsdp.checkpoint")
COMPLETE_MARKER = "COMPLETE"
#: A checkpoint group's collectives give up after this long (a peer rank died mid-save).
SAVE_GROUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Cadence:
    """When the next save is due, and why: what a save's log line and event say."""

    interval_s: float
    interval_steps: int
    basis: str

    def line(self) -> str:
        if math.isinf(self.interval_s):
            return f"no further checkpoint ({self.basis})"
        return f"next in ~{self.interval_s:.0f}s (~{self.interval_steps} steps; {self.basis})"


def cadence(
    every_s: float | None,
    stage_s: float,
    write_s: float,
    step_s: float,
    model: RunFailureModel,
    replicas: int,
) -> Cadence:
    """The interval to the next save: `every_s` if fixed, else Young/Daly's for the step loop's
    cost of a save (`stage_s`) against the run-loss MTBF; never shorter than the last write took,
    so a save does not wait for the one before it."""
    if every_s is not None:
        interval, basis = every_s, f"checkpoint_every_s = {every_s:g}"
    else:
        mtbf = model.run_loss_mtbf_s(replicas)
        interval = young_daly_interval_s(stage_s, mtbf)
        basis = f"Young/Daly: save costs {stage_s:.2f}s, run-loss MTBF {mtbf / 3600:.1f}h"
    interval = max(interval, write_s)
    if math.isinf(interval):
        return Cadence(math.inf, sys.maxsize, basis)
    steps = max(1, math.ceil(interval / step_s)) if step_s > 0 else 1
    return Cadence(interval, steps, basis)


def latest_complete(root: Path) -> Path | None:
    """The newest checkpoint folder that carries the completion marker."""
    if not root.is_dir():
        return None
    done = [p for p in root.glob("step_*") if (p / COMPLETE_MARKER).exists()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


@dataclass
class _Write:
    """A save whose DCP write is still running."""

    future: Future[Any]
    path: Path
    step: int
    started: float
    stage_s: float


class DurableCheckpointer:
    def __init__(
        self,
        root: Path,
        every_steps: int,
        every_s: float | None,
        model: RunFailureModel | None = None,
        replicas: int = 1,
        keep: int = 2,
    ) -> None:
        self.root = root
        self.every_steps = every_steps
        #: None: Young/Daly's cadence; 0: no time cadence.
        self.every_s = every_s
        self.model = model or RunFailureModel()
        self.replicas = replicas
        self.keep = keep
        #: A time cadence's next save: the first committed step measures the save's cost.
        self._next_due = 1
        self._writing: _Write | None = None
        self._last_write_s = 0.0
        self._group: Any = None
        self.last_cadence: Cadence | None = None

    @classmethod
    def for_worker(cls, env: WorkerEnv) -> DurableCheckpointer:
        return cls(
            env.run_dir / "checkpoints",
            env.checkpoint_every_steps,
            env.checkpoint_every_s,
            env.failure_model,
            env.num_replicas,
        )

    @property
    def enabled(self) -> bool:
        return self.every_steps > 0 or self.every_s is None or self.every_s > 0

    @property
    def _timed(self) -> bool:
        return self.every_s is None or self.every_s > 0

    def _due(self, step: int) -> bool:
        if self.every_steps > 0 and step > 0 and step % self.every_steps == 0:
            return True
        return self._timed and step >= self._next_due

    def maybe_save(self, ft: FTHSDP, participant: int | None) -> Path | None:
        """Start a save if one is due and this replica was participant 0 of the step that just
        committed; mark the previous one complete once its write has finished."""
        self._poll(ft, wait=False)
        if not self.enabled or participant != 0 or not self._due(ft.step):
            return None
        self._poll(ft, wait=True)
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if self._group is None:
            self._group = dist.new_group(
                backend="gloo", timeout=timedelta(seconds=SAVE_GROUP_TIMEOUT_S)
            )
        path = self.root / f"step_{ft.step:08d}"
        start = time.monotonic()
        future = dcp.async_save(ft.state_dict(), checkpoint_id=str(path), process_group=self._group)
        assert isinstance(future, Future)
        stage_s = time.monotonic() - start
        self._writing = _Write(future, path, ft.step, start, stage_s)
        self._schedule_next(ft, stage_s)
        return path

    def _schedule_next(self, ft: FTHSDP, stage_s: float) -> None:
        if not self._timed:
            return
        times = sorted(ft.steps.step_times)
        step_s = times[len(times) // 2] if times else 0.0
        self.last_cadence = cadence(
            self.every_s, stage_s, self._last_write_s, step_s, self.model, self.replicas
        )
        next_due = min(ft.step + self.last_cadence.interval_steps, sys.maxsize >> 2)
        if ft.env.world_size > 1:
            # every rank must agree when the next save is due: the leader's figures decide
            import torch
            import torch.distributed as dist

            agreed = torch.tensor([next_due], dtype=torch.int64)
            dist.broadcast(agreed, src=0)
            next_due = int(agreed.item())
        self._next_due = next_due

    def _poll(self, ft: FTHSDP, wait: bool) -> None:
        """Finish the running write if it is done (or `wait`): the leader marks it complete."""
        w = self._writing
        if w is None or not (wait or w.future.done()):
            return
        self._writing = None
        try:
            w.future.result()
        except Exception as exc:  # a failed write is reported, and never marked complete
            log.error("checkpoint step %d failed: %s", w.step, exc)
            ft.event("checkpoint_failed", step=w.step, error=str(exc)[:500])
            return
        write_s = time.monotonic() - w.started
        self._last_write_s = write_s
        if not ft.env.is_leader:
            return
        (w.path / COMPLETE_MARKER).write_text(str(w.step))
        self._prune()
        why = self.last_cadence.line() if self.last_cadence is not None else "step cadence"
        log.warning(
            "checkpoint step %d: staged in %.2fs, written in %.2fs; %s",
            w.step,
            w.stage_s,
            write_s,
            why,
        )
        ft.event("checkpoint", step=w.step, stage_s=w.stage_s, write_s=write_s, cadence=why)

    def close(self, ft: FTHSDP) -> None:
        """Wait for the running write, so the run's last checkpoint is complete on disk."""
        self._poll(ft, wait=True)

    def _prune(self) -> None:
        """Keep the newest `keep` complete checkpoints; drop older ones, and any incomplete one
        older than the newest complete (a write its process did not live to finish)."""
        folders = sorted(self.root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        done = [p for p in folders if (p / COMPLETE_MARKER).exists()]
        kept = set(done[-self.keep :])
        newest = int(done[-1].name.split("_")[1]) if done else -1
        for old in folders:
            if old not in kept and int(old.name.split("_")[1]) < newest:
                shutil.rmtree(old, ignore_errors=True)

    def has_complete(self) -> bool:
        return latest_complete(self.root) is not None

    def maybe_restore(self, ft: FTHSDP) -> int | None:
        """Load the newest complete checkpoint into `ft`; returns its step (None: nothing)."""
        path = latest_complete(self.root)
        if path is None:
            return None
        import torch.distributed.checkpoint as dcp

        state = ft.state_dict()
        dcp.load(state, checkpoint_id=str(path))
        ft.load_state_dict(state)
        ft.event("restored", step=ft.step, path=str(path))
        return ft.step
