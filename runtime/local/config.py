"""What a local run is: `LaunchConfig`, by hand or from a job spec (`config_from_spec`).

The config carries the replica layout, torchft's timeouts, the restart budget and the faults to
inject (one kill at a step, chaos kills, a slow replica); the CLI's options override the spec's
values here, and bad ones are refused with the option's name.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.env import Timeouts
from runtime.sim.reliability import RunFailureModel


@dataclass
class LaunchConfig:
    run_dir: Path
    command: list[str]
    replicas: int = 2
    ranks_per_replica: int = 2
    steps: int = 50
    min_replicas: int = 1
    max_restarts_per_replica: int = 5
    restart_window_s: float = 600.0
    timeouts: Timeouts = field(default_factory=Timeouts)
    checkpoint_every_steps: int = 0
    #: None: Young/Daly's cadence against `failure_model`; 0: no time cadence.
    checkpoint_every_s: float | None = None
    failure_model: RunFailureModel = field(default_factory=RunFailureModel)
    job_name: str = "fthsdp"
    kill_replica: int | None = None
    kill_at_step: int | None = None
    #: More kills at chosen steps: each (replica, step) is `kill_replica`/`kill_at_step` again,
    #: so that a run has exactly as many kills as listed (chaos kills come at random times).
    kill_schedule: tuple[tuple[int, int], ...] = ()
    #: A listed kill lands a random time in [0, kill_jitter_s) after its step is reached (drawn
    #: from `seed`), so that kills fall anywhere inside a step, not only at its report.
    kill_jitter_s: float = 0.0
    chaos_mtbf_s: float | None = None
    seed: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    run_timeout_s: float = 600.0
    lighthouse_join_timeout_s: float | None = None
    #: Wait this long after a replica died before restarting it: the local stand-in for the
    #: time Slurm takes to requeue, allocate and run the prolog.
    restart_delay_s: float = 0.0
    #: Restart a replica killed by `kill_replica`/`kill_schedule` only once another replica has
    #: committed this many steps past the kill: an outage of a known share of the run, however
    #: fast the machine steps (the restart's own time comes on top).
    restart_after_steps: int = 0
    #: Keep this many seconds of warm-up before the first chaos kill.
    chaos_warmup_s: float = 3.0
    #: No chaos kill once a replica passed this fraction of the steps, so that restarted
    #: replicas can rejoin before the end and the final weights of all of them can be compared.
    chaos_stop_fraction: float = 0.7
    #: Straggler chaos: this replica's first incarnation runs `slow_factor` times slower (its
    #: "node" is bad); a restart lands on a healthy "node". Detection and eviction run here as
    #: the coordinator runs them on Slurm (`runtime.control.straggler`); eviction = restart.
    slow_replica: int | None = None
    slow_factor: float = 2.0
    straggler_window_steps: int = 50
    straggler_evict: bool = True
    #: The local restart cost the eviction decision weighs until the run measured its own.
    straggler_requeue_cost_s: float = 5.0
    #: The slow replica runs at its normal pace up to this step, then its "node" degrades (a
    #: straggler is slow against its own recent pace too, so it needs a pace to be slower than).
    slow_after_step: int = 20
    #: Straggler detection and eviction hold off while another replica is recovering and for
    #: this long after it trains again.
    straggler_recovery_hold_s: float = 1.0


def resolve_command(command: str | list[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def config_from_spec(
    spec: Any,
    *,
    replicas: int | None = None,
    ranks_per_replica: int | None = None,
    steps: int | None = None,
    run_dir: Path | None = None,
    **faults: Any,
) -> LaunchConfig:
    """A `LaunchConfig` from a `slurm.spec.JobSpec` (CLI options override the spec)."""
    from slurm.errors import InputError

    train = spec.train
    timeouts = Timeouts(
        heartbeat_s=float(train.heartbeat_timeout_s),
        allreduce_s=float(train.allreduce_timeout_s),
        quorum_s=float(train.quorum_timeout_s),
        join_s=float(train.join_timeout_s),
        control_s=float(train.control_wait_in_effect_s),
    )
    if (why := timeouts.problem()) is not None:
        raise InputError("train.allreduce_timeout_s", train.allreduce_timeout_s, why)
    per_node = spec.replicas.tasks_per_node or max(spec.replicas.gpus_per_node, 1)
    count = replicas if replicas is not None else spec.replicas.count
    if count < 1:
        raise InputError("--replicas", count, "at least 1")
    ranks = ranks_per_replica if ranks_per_replica is not None else spec.replicas.nodes * per_node
    if ranks < 1:
        raise InputError("--ranks-per-replica", ranks, "at least 1")
    kill = faults.get("kill_replica")
    if kill is not None and not 0 <= kill < count:
        raise InputError("--kill-replica", kill, f"a replica id in 0..{count - 1}")
    slow = faults.get("slow_replica")
    if slow is not None and not 0 <= slow < count:
        raise InputError("--slow-replica", slow, f"a replica id in 0..{count - 1}")
    factor = faults.get("slow_factor", 2.0)
    if not 1.0 <= factor <= 100.0:
        raise InputError("--slow-factor", factor, "a factor in [1, 100]")
    return LaunchConfig(
        run_dir=run_dir if run_dir is not None else Path(spec.job.run_dir),
        command=resolve_command(train.command),
        replicas=count,
        ranks_per_replica=ranks,
        steps=steps if steps is not None else (train.steps or 100),
        min_replicas=min(train.min_replicas, count),
        max_restarts_per_replica=train.max_restarts_per_replica,
        restart_window_s=float(train.restart_window_s),
        timeouts=timeouts,
        checkpoint_every_steps=train.checkpoint_every_steps,
        checkpoint_every_s=train.checkpoint_every_s_in_effect,
        failure_model=RunFailureModel(
            nodes=count,
            failures_per_1000_nodes_day=train.failures_per_1000_nodes_day,
            run_losses_per_day=train.run_losses_per_day,
            requeue_cost_s=train.straggler_requeue_cost_s,
        ),
        job_name=spec.job.name,
        **faults,
    )
