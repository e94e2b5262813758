"""The environment contract between a replica's launcher and its worker processes.

The sbatch scripts (under Slurm) and the local launcher (`runtime.local.launcher`) both start the
worker with the same `FTHSDP_*` variables (named once, in `slurm.contract`); the worker's ranks come
from torchrun-style `RANK`/`WORLD_SIZE`/`LOCAL_RANK`/`MASTER_ADDR`/`MASTER_PORT` when those are set,
else from `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID` with the replica's first node as the
rendezvous host and a provisional port derived from the job id (the worker settles both with
`runtime.rendezvous`: the node's Slurm address when its name does not resolve, and a free port that
group rank 0 publishes in the run directory). Parsing is pure (a mapping in, a `WorkerEnv` out) so
it is tested by tables; a missing or inconsistent variable raises `EnvError` naming it, which the
worker turns into one line and exit code 2 (`ExitCode.BAD_ENV`).

The control file (`run_dir/control.json`: `{"lighthouse": ..., "coordinator": ...}`) is re-read
whenever the lighthouse or the coordinator is unreachable, because the control job can be
requeued onto another host.

Timeouts must be ordered heartbeat < allreduce < quorum < join: a dead peer is noticed by the
lighthouse (heartbeat) before a collective gives up on it (allreduce), a quorum waits longer than
one failed collective, and a replica's first quorum waits longest of all, for peers to start.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runtime.sim.reliability import RunFailureModel
from slurm import contract
from slurm.rundir import RunFileError, read_control_file

#: Base of the rendezvous port derived from a Slurm job id.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000
KNOWN_HEALTH_CHECKS = ("xid", "gpu-count", "ecc")


class EnvError(ValueError):
    """A worker environment variable is missing or inconsistent."""

    def __init__(self, variable: str, value: str | None, allowed: str) -> None:
        self.variable = variable
        self.value = value
        self.allowed = allowed
        shown = "unset" if value is None else repr(value)
        super().__init__(f"{variable}: {shown}; {allowed}")


@dataclass(frozen=True)
class Timeouts:
    heartbeat_s: float = contract.DEFAULT_HEARTBEAT_TIMEOUT_S
    allreduce_s: float = contract.DEFAULT_ALLREDUCE_TIMEOUT_S
    quorum_s: float = contract.DEFAULT_QUORUM_TIMEOUT_S
    join_s: float = contract.DEFAULT_JOIN_TIMEOUT_S
    #: How long a worker waits out a control-plane outage after a failed quorum, its model and
    #: optimizer in memory (at least `join_s`).
    control_s: float = contract.DEFAULT_CONTROL_WAIT_S

    def problem(self) -> str | None:
        """Why heartbeat < allreduce < quorum < join <= control does not hold (None if it does)."""
        order = [
            ("heartbeat", self.heartbeat_s),
            ("allreduce", self.allreduce_s),
            ("quorum", self.quorum_s),
            ("join", self.join_s),
        ]
        for (a, va), (b, vb) in itertools.pairwise(order):
            if not va < vb:
                return f"{a} timeout ({va}s) must be below {b} timeout ({vb}s)"
        if self.heartbeat_s <= 0:
            return "timeouts must be positive"
        if self.control_s < self.join_s:
            return f"control-plane wait ({self.control_s}s) must be at least the join timeout"
        return None


@dataclass(frozen=True)
class ControlEndpoints:
    lighthouse: str
    coordinator: str | None = None
    #: When the control plane that wrote the file started (a new value = it was restarted).
    started_at: float | None = None


@dataclass(frozen=True)
class WorkerEnv:
    run_dir: Path
    replica_id: int
    num_replicas: int
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    job_name: str = "fthsdp"
    min_replicas: int = 1
    timeouts: Timeouts = field(default_factory=Timeouts)
    checkpoint_every_steps: int = 0
    #: None: Young/Daly's cadence against `failure_model` (`runtime.checkpoint`); 0: off.
    checkpoint_every_s: float | None = 0.0
    failure_model: RunFailureModel = field(default_factory=RunFailureModel)
    steps: int = 100
    health_checks: tuple[str, ...] = ()
    control_file: Path | None = None
    static_lighthouse: str | None = None
    #: The supervisor's forwarder to the gated Lighthouse, which the Manager uses when set.
    lighthouse_forwarder: str | None = None
    slurm_job_id: str | None = None
    nodes: tuple[str, ...] = ()
    #: A warm spare slot's step: the file that will name its replica (`runtime.warm_handoff`);
    #: `replica_id` is -1 until then.
    warm_handoff: Path | None = None

    @property
    def is_leader(self) -> bool:
        """Group rank 0: the replica leader that reports and votes for the replica."""
        return self.rank == 0

    @property
    def waiting_warm(self) -> bool:
        """A warm slot's step that has no replica yet."""
        return self.replica_id < 0

    @property
    def rendezvous_name(self) -> str:
        """Whose rendezvous this step publishes: its replica's, or its warm slot's."""
        if self.waiting_warm and self.warm_handoff is not None:
            return f"w{self.warm_handoff.stem}"
        return f"r{self.replica_id}"

    def endpoints(self) -> ControlEndpoints | None:
        """Lighthouse and coordinator, re-read from the control file on every call."""
        if self.control_file is not None:
            found = read_control(self.control_file)
            if found is not None:
                return found
        if self.static_lighthouse:
            return ControlEndpoints(lighthouse=self.static_lighthouse)
        return None


def read_control(path: Path) -> ControlEndpoints | None:
    """The control file's endpoints, or None while it is absent, half-written or names no
    Lighthouse (the control job may be being requeued: the caller retries)."""
    try:
        found = read_control_file(path)
    except RunFileError:
        return None
    if found is None or not found.lighthouse:
        return None
    return ControlEndpoints(found.lighthouse, found.coordinator, found.started_at)


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise EnvError(name, None, "required (an integer)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(name, raw, "must be an integer") from None
    if value < minimum:
        raise EnvError(name, raw, f"must be >= {minimum}")
    return value


def _float(
    env: Mapping[str, str], name: str, default: float, what: str = "a number of seconds"
) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(name, raw, f"must be {what}") from None
    if not 0 <= value < math.inf:
        raise EnvError(name, raw, "must be a finite number >= 0")
    return value


def _failure_model(env: Mapping[str, str], replicas: int) -> RunFailureModel:
    """The `auto` cadence's failure model; an unset variable keeps `RunFailureModel`'s default."""
    d = RunFailureModel()
    return RunFailureModel(
        nodes=_int(env, contract.RUN_NODES, default=replicas, minimum=1),
        failures_per_1000_nodes_day=_float(
            env, contract.NODE_FAILURES_PER_1000_DAY, d.failures_per_1000_nodes_day, "a rate"
        ),
        run_losses_per_day=_float(env, contract.RUN_LOSSES_PER_DAY, d.run_losses_per_day, "a rate"),
        requeue_cost_s=_float(env, contract.REQUEUE_COST_S, d.requeue_cost_s),
    )


def _checkpoint_every_s(env: Mapping[str, str]) -> float | None:
    """The checkpoint time cadence: `auto` (the default) is Young/Daly's, None here."""
    if env.get(contract.CHECKPOINT_EVERY_S, contract.CHECKPOINT_AUTO) == contract.CHECKPOINT_AUTO:
        return None if _int(env, contract.CHECKPOINT_EVERY_STEPS, default=0) == 0 else 0.0
    return _float(
        env, contract.CHECKPOINT_EVERY_S, 0.0, what=f"seconds or {contract.CHECKPOINT_AUTO}"
    )


def slurm_port(job_id: str) -> int:
    """The replica's rendezvous port, derived from its Slurm job id (same on every node)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return SLURM_PORT_BASE + int(digits) % SLURM_PORT_SPAN


def _ranks(env: Mapping[str, str]) -> tuple[int, int, int, str, int, tuple[str, ...], str | None]:
    job_id = env.get(contract.SLURM_JOB_ID)
    if env.get(contract.RANK) is not None and env.get(contract.WORLD_SIZE) is not None:
        world = _int(env, contract.WORLD_SIZE, minimum=1)
        rank = _int(env, contract.RANK)
        if rank >= world:
            raise EnvError(contract.RANK, env[contract.RANK], f"must be below WORLD_SIZE={world}")
        local = _int(env, contract.LOCAL_RANK, default=rank)
        addr = env.get(contract.MASTER_ADDR)
        if not addr:
            raise EnvError(contract.MASTER_ADDR, None, "required when RANK is set")
        port = _int(env, contract.MASTER_PORT, minimum=1)
        return rank, world, local, addr, port, (), job_id
    if env.get(contract.SLURM_PROCID) is None:
        raise EnvError(
            contract.RANK, None, "set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT or run under srun"
        )
    world = _int(env, contract.SLURM_NTASKS, minimum=1)
    rank = _int(env, contract.SLURM_PROCID)
    if rank >= world:
        raise EnvError(
            contract.SLURM_PROCID, env[contract.SLURM_PROCID], f"must be below SLURM_NTASKS={world}"
        )
    local = _int(env, contract.SLURM_LOCALID, default=0)
    nodelist = env.get(contract.SLURM_STEP_NODELIST) or env.get(contract.SLURM_JOB_NODELIST)
    if not nodelist:
        raise EnvError(
            contract.SLURM_STEP_NODELIST, None, "required under srun (or SLURM_JOB_NODELIST)"
        )
    from slurm import hostlist
    from slurm.errors import InputError

    try:
        nodes = tuple(hostlist.expand(nodelist, contract.SLURM_STEP_NODELIST))
    except InputError:
        raise EnvError(contract.SLURM_STEP_NODELIST, nodelist, "must be a Slurm hostlist") from None
    if job_id is None:
        raise EnvError(
            contract.SLURM_JOB_ID, None, "required under srun (it fixes the rendezvous port)"
        )
    return rank, world, local, nodes[0], slurm_port(job_id), nodes, job_id


def parse_env(env: Mapping[str, str]) -> WorkerEnv:
    """Validate the worker environment; raises `EnvError` naming the first bad variable."""
    run_dir_raw = env.get(contract.RUN_DIR)
    if not run_dir_raw:
        raise EnvError(contract.RUN_DIR, None, "required (the run directory)")
    num = _int(env, contract.NUM_REPLICAS, minimum=1)
    warm_raw = env.get(contract.WARM_HANDOFF) or None
    if warm_raw is not None and not env.get(contract.REPLICA_ID):
        replica = -1  # a warm slot's step: its replica comes with the handoff
    else:
        replica = _int(env, contract.REPLICA_ID)
    if replica >= num:
        raise EnvError(
            contract.REPLICA_ID,
            env[contract.REPLICA_ID],
            f"must be below FTHSDP_NUM_REPLICAS={num}",
        )
    min_replicas = _int(env, contract.MIN_REPLICAS, default=1, minimum=1)
    if min_replicas > num:
        raise EnvError(
            contract.MIN_REPLICAS, env[contract.MIN_REPLICAS], f"must be <= {num} replicas"
        )
    timeouts = Timeouts(
        heartbeat_s=_float(env, contract.HEARTBEAT_TIMEOUT_S, contract.DEFAULT_HEARTBEAT_TIMEOUT_S),
        allreduce_s=_float(env, contract.ALLREDUCE_TIMEOUT_S, contract.DEFAULT_ALLREDUCE_TIMEOUT_S),
        quorum_s=_float(env, contract.QUORUM_TIMEOUT_S, contract.DEFAULT_QUORUM_TIMEOUT_S),
        join_s=_float(env, contract.JOIN_TIMEOUT_S, contract.DEFAULT_JOIN_TIMEOUT_S),
        control_s=_float(env, contract.CONTROL_WAIT_S, contract.DEFAULT_CONTROL_WAIT_S),
    )
    if timeouts.control_s < timeouts.join_s:
        raise EnvError(
            contract.CONTROL_WAIT_S,
            env.get(contract.CONTROL_WAIT_S),
            f"must be >= the join timeout ({timeouts.join_s:g}s)",
        )
    if (why := timeouts.problem()) is not None:
        raise EnvError(contract.ALLREDUCE_TIMEOUT_S, env.get(contract.ALLREDUCE_TIMEOUT_S), why)
    checks_raw = env.get(contract.HEALTH_CHECKS, "")
    checks = tuple(c.strip() for c in checks_raw.split(",") if c.strip())
    for check in checks:
        if check not in KNOWN_HEALTH_CHECKS:
            raise EnvError(contract.HEALTH_CHECKS, checks_raw, f"known: {KNOWN_HEALTH_CHECKS}")
    rank, world, local, addr, port, nodes, job_id = _ranks(env)
    control_raw = env.get(contract.CONTROL_FILE)
    control = Path(control_raw) if control_raw else None
    lighthouse = env.get(contract.LIGHTHOUSE) or env.get(contract.TORCHFT_LIGHTHOUSE)
    if control is None and not lighthouse:
        raise EnvError(
            contract.CONTROL_FILE, None, "set it, or FTHSDP_LIGHTHOUSE / TORCHFT_LIGHTHOUSE"
        )
    return WorkerEnv(
        run_dir=Path(run_dir_raw),
        replica_id=replica,
        num_replicas=num,
        rank=rank,
        world_size=world,
        local_rank=local,
        master_addr=addr,
        master_port=port,
        job_name=env.get(contract.JOB_NAME, "fthsdp"),
        min_replicas=min_replicas,
        timeouts=timeouts,
        checkpoint_every_steps=_int(env, contract.CHECKPOINT_EVERY_STEPS, default=0),
        checkpoint_every_s=_checkpoint_every_s(env),
        failure_model=_failure_model(env, num),
        steps=_int(env, contract.STEPS, default=100, minimum=1),
        health_checks=checks,
        control_file=control,
        static_lighthouse=lighthouse,
        lighthouse_forwarder=env.get(contract.LIGHTHOUSE_FORWARDER) or None,
        slurm_job_id=job_id,
        nodes=nodes,
        warm_handoff=Path(warm_raw) if warm_raw else None,
    )
