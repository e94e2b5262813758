"""What the replica supervisor is told: its run, replica and step, and how long it waits.

`SupervisorConfig.from_env` reads the replica job's environment: Slurm's job id, restart count and
node list, and the variables the replica's batch script exports (the train mode and, for a
foreign torchft trainer, how its progress is read and when it counts as hung). A bad number is an
`InputError` naming the variable, before anything is launched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurm import contract, hostlist
from slurm.errors import InputError


@dataclass
class SupervisorConfig:
    run_dir: Path
    replica: int
    command: list[str]
    job_id: str | None = None
    restarts: int = 0
    nodes: list[str] = field(default_factory=list)
    #: How long to keep asking while the coordinator says `continue`.
    decision_wait_s: float = 30.0
    #: How long to wait for Slurm to stop this job after a `requeue` directive.
    requeue_wait_s: float = 180.0
    http_timeout_s: float = 5.0
    max_launches: int = 1000
    #: How long to wait for the control plane before a launch (`train.control_wait_s`).
    control_wait_s: float = contract.DEFAULT_CONTROL_WAIT_S
    #: How often to ask Slurm whether the control job still runs while waiting for it.
    control_check_s: float = 15.0
    #: Uncounted relaunches in a row of a step that could not reach the quorum service.
    max_unreached: int = 3
    #: "fthsdp" (native worker) or "torchft" (foreign trainer; the supervisor reports for it).
    mode: str = "fthsdp"
    progress_regex: str | None = None
    progress_file: str | None = None
    #: torchft mode: seconds without progress after which the step is hung; 0 = never.
    progress_timeout_s: float = 0.0
    health_checks: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, run_dir: Path, replica: int, command: list[str]) -> SupervisorConfig:
        env = os.environ
        nodelist = env.get(contract.SLURM_JOB_NODELIST_HET_GROUP_0) or env.get(
            contract.SLURM_JOB_NODELIST, ""
        )
        control_wait_s = _seconds(
            env, contract.CONTROL_WAIT_S, f"{contract.DEFAULT_CONTROL_WAIT_S:g}", "seconds >= 0"
        )
        # Seconds without progress after which a foreign trainer's step is hung (0: off).
        progress_timeout_s = _seconds(
            env, contract.PROGRESS_TIMEOUT_S, "0", "seconds >= 0 (0: off)"
        )
        return cls(
            run_dir=run_dir,
            replica=replica,
            command=command,
            job_id=env.get(contract.SLURM_JOB_ID),
            restarts=int(env.get(contract.SLURM_RESTART_COUNT, "0") or 0),
            nodes=hostlist.expand(nodelist, contract.SLURM_JOB_NODELIST) if nodelist else [],
            control_wait_s=control_wait_s,
            mode=env.get(contract.TRAIN_MODE) or "fthsdp",
            progress_regex=env.get(contract.PROGRESS_REGEX) or None,
            progress_file=env.get(contract.PROGRESS_FILE) or None,
            progress_timeout_s=progress_timeout_s,
            health_checks=tuple(c for c in env.get(contract.HEALTH_CHECKS, "").split(",") if c),
        )


def _seconds(env: Mapping[str, str], name: str, default: str, allowed: str) -> float:
    """A finite, non-negative number of seconds from the environment; InputError otherwise."""
    raw = env.get(name) or default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(name, raw, allowed)
    return value
