"""Durable checkpoints: the run survives even when every replica dies at once.

Healing from a live peer covers a replica that fails while others keep training; it cannot cover
the loss of all replicas (a power event, the whole run requeued). So one replica (the quorum's
participant 0 of the committed step) writes a `torch.distributed.checkpoint` (DCP) checkpoint of
its shards, the optimizer, torchft's step and the ledger cursor to `run_dir/checkpoints/step_N`
every `checkpoint_every_steps` steps or `checkpoint_every_s` seconds, and marks it complete only
after DCP has finished. A starting worker loads the newest complete checkpoint before its first
quorum; the quorum then heals whoever is behind, so a lone restarted replica still catches up
from its live peers and a cold restart resumes from disk with the cursor where it was.

The interval is a trade-off: writing costs time, and failing loses the work since the last write.
Each save logs the Young/Daly interval (`runtime.sim.reliability`, the formula the simulator
uses too) for the measured write time and the failure rate this replica has observed.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.env import WorkerEnv
from runtime.sim.reliability import young_daly_interval_s

if TYPE_CHECKING:
    from runtime.api import FTHSDP

log = logging.getLogger("fthsdp.checkpoint")
COMPLETE_MARKER = "COMPLETE"


@dataclass(frozen=True)
class Suggestion:
    write_s: float
    mtbf_s: float
    mtbf_is_lower_bound: bool
    interval_s: float
    interval_steps: int

    def line(self) -> str:
        bound = ">= " if self.mtbf_is_lower_bound else ""
        return (
            f"checkpoint write {self.write_s:.2f}s, observed MTBF {bound}{self.mtbf_s:.0f}s: "
            f"Young/Daly interval ~{self.interval_s:.0f}s (~{self.interval_steps} steps)"
        )


def suggest(write_s: float, failures: int, elapsed_s: float, step_s: float) -> Suggestion:
    """Young/Daly suggestion from measured write time and observed failures over elapsed time.

    With no failure seen yet the MTBF is only known to exceed the elapsed time; that bound is used.
    """
    lower_bound = failures == 0
    mtbf = elapsed_s / max(failures, 1)
    mtbf = max(mtbf, write_s, 1e-3)
    interval = young_daly_interval_s(max(write_s, 1e-6), mtbf)
    steps = max(1, round(interval / step_s)) if step_s > 0 else 1
    return Suggestion(write_s, mtbf, lower_bound, interval, steps)


def latest_complete(root: Path) -> Path | None:
    """The newest checkpoint folder that carries the completion marker."""
    if not root.is_dir():
        return None
    done = [p for p in root.glob("step_*") if (p / COMPLETE_MARKER).exists()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


class DurableCheckpointer:
    def __init__(self, root: Path, every_steps: int, every_s: float, keep: int = 2) -> None:
        self.root = root
        self.every_steps = every_steps
        self.every_s = every_s
        self.keep = keep
        self._last_save = time.monotonic()
        self._started = time.monotonic()
        self.last_suggestion: Suggestion | None = None
        self.failures_seen = 0

    @classmethod
    def for_worker(cls, env: WorkerEnv) -> DurableCheckpointer:
        return cls(env.run_dir / "checkpoints", env.checkpoint_every_steps, env.checkpoint_every_s)

    @property
    def enabled(self) -> bool:
        return self.every_steps > 0 or self.every_s > 0

    def _due(self, ft: FTHSDP) -> bool:
        step = ft.step
        due = self.every_steps > 0 and step > 0 and step % self.every_steps == 0
        if not due and self.every_s > 0:
            # every rank of the replica must decide the same: the leader's clock decides
            import torch
            import torch.distributed as dist

            flag = torch.tensor([1 if time.monotonic() - self._last_save >= self.every_s else 0])
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
        return due

    def maybe_save(self, ft: FTHSDP, participant: int | None) -> Path | None:
        """Save if due and this replica was participant 0 of the step that just committed."""
        if not self.enabled or not self._due(ft) or participant != 0:
            return None
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        path = self.root / f"step_{ft.step:08d}"
        start = time.monotonic()
        dcp.save(ft.state_dict(), checkpoint_id=str(path))
        dist.barrier()
        write_s = time.monotonic() - start
        self._last_save = time.monotonic()
        if ft.env.is_leader:
            (path / COMPLETE_MARKER).write_text(str(ft.step))
            self._prune()
            step_s = (
                sorted(ft.steps.step_times)[len(ft.steps.step_times) // 2]
                if ft.steps.step_times
                else 0.0
            )
            self.last_suggestion = suggest(
                write_s, self.failures_seen, time.monotonic() - self._started, step_s
            )
            log.warning("step %d: %s", ft.step, self.last_suggestion.line())
            ft.event(
                "checkpoint", step=ft.step, write_s=write_s, suggestion=self.last_suggestion.line()
            )
        return path

    def _prune(self) -> None:
        done = sorted(
            (p for p in self.root.glob("step_*") if (p / COMPLETE_MARKER).exists()),
            key=lambda p: int(p.name.split("_")[1]),
        )
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

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
