"""Faults a local run injects: `kill -9`s of a replica at chosen steps, or chaos kills.

Chaos kills come with an exponential inter-arrival time (`chaos_mtbf_s`) after a warm-up and stop
once a replica passed `chaos_stop_fraction` of the steps, so that restarted replicas can rejoin
before the end. A kill is only injected while another replica is healthy and not healing, because
the committed state lives only in live replicas between durable checkpoints. The injector decides
whom and when; the launcher carries the kill out and records the `Failure`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.local.config import LaunchConfig
from runtime.local.replicas import LocalReplica


@dataclass
class Failure:
    replica: int
    kind: str  # "injected" | "chaos" | "crash"
    step: int
    t_kill: float
    t_restart: float | None = None
    t_joined: float | None = None
    t_rejoin: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    detail: str = ""


@dataclass(eq=False)
class ListedKill:
    """A kill of `replica` once it reached `step` (`LaunchConfig.kill_schedule`); with a jitter,
    it lands at `lands_at` (monotonic), drawn when the step is first seen reached."""

    replica: int
    step: int
    lands_at: float | None = None


def healthy_others(victim: LocalReplica, replicas: list[LocalReplica]) -> bool:
    """Another replica trains, committed within the last 2 s, and all its processes live."""
    now = time.time()
    # The launcher's view of a replica lags its processes: one that just died on its own still
    # reads "training" until the launcher collects it, so ask the processes too.
    return any(
        o is not victim
        and o.state == "training"
        and o.last_commit_t is not None
        and now - o.last_commit_t < 2.0
        and all(p.poll() is None for p in o.procs)
        for o in replicas
    )


class FaultInjector:
    """Calls `inject(replica, kind)` when the configured kill or a chaos kill is due."""

    def __init__(self, cfg: LaunchConfig, inject: Callable[[LocalReplica, str], None]) -> None:
        self.cfg = cfg
        self.inject = inject
        self.rng = random.Random(cfg.seed)
        #: The listed kills not injected yet, in the order given.
        self.pending_kills = [ListedKill(r, step) for r, step in cfg.kill_schedule]
        if cfg.kill_replica is not None and cfg.kill_at_step is not None:
            self.pending_kills.insert(0, ListedKill(cfg.kill_replica, cfg.kill_at_step))
        self.next_chaos: float | None = None

    def tick(self, replicas: list[LocalReplica], run_ending: bool) -> None:
        """One pass of the launcher's loop; `run_ending` once a replica has finished."""
        cfg = self.cfg
        for kill in list(self.pending_kills):
            rs = replicas[kill.replica]
            due = rs.state == "training" and rs.step >= kill.step
            if due and cfg.kill_jitter_s > 0:
                now = time.monotonic()
                if kill.lands_at is None:
                    kill.lands_at = now + self.rng.uniform(0, cfg.kill_jitter_s)
                if now < kill.lands_at:
                    break  # the listed kills land in their order
            if due and (healthy_others(rs, replicas) or cfg.replicas == 1):
                self.pending_kills.remove(kill)
                self.inject(rs, "injected")
        if cfg.chaos_mtbf_s:
            now = time.monotonic()
            if self.next_chaos is None:
                self.next_chaos = (
                    now + cfg.chaos_warmup_s + self.rng.expovariate(1 / cfg.chaos_mtbf_s)
                )
            elif (
                now >= self.next_chaos
                and not run_ending
                and max(r.step for r in replicas) < cfg.chaos_stop_fraction * cfg.steps
            ):
                candidates = [
                    r for r in replicas if r.state == "training" and healthy_others(r, replicas)
                ]
                if candidates:
                    self.inject(self.rng.choice(candidates), "chaos")
                    self.next_chaos = now + self.rng.expovariate(1 / cfg.chaos_mtbf_s)
