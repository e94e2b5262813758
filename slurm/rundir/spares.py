"""spares.json: the hot-spare pool's file, its format and its one strict reader.

A run with `[spares]` keeps replica-sized slot jobs that hold health-checked nodes idle for it.
The pool (`Pool`: the target, each `Slot` and the replica it hosts, the last moves and fallbacks,
the retired slots) is written only by `fthsdp submit` and then by the coordinator's pool manager
(`runtime.control.spares`), 0600 and atomically; a slot job's agent reads it to learn which
replica to run. `read_pool` checks the whole file: a pool that cannot be read is a
`PoolFileError`, never taken as "no slots" (a slot job outlives a control plane that died and
holds its nodes).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm.rundir.paths import SPARES_FILE, write_private
from slurm.rundir.shape import RunFileError, read_trusted

#: What a slot may run: a replica script `fthsdp submit` wrote (a bare file name, never a path).
REPLICA_SCRIPT = re.compile(r"replica-[0-9]{1,7}\.sbatch")
#: A slot's Slurm job id (a plain job, never an array task).
SLOT_JOB_ID = re.compile(r"[0-9]{1,12}")


class PoolFileError(ValueError):
    """spares.json is not what this version writes."""


@dataclass(frozen=True)
class Slot:
    job_id: str
    #: The replica this slot runs, once it was moved here.
    replica: int | None = None
    script: str | None = None
    since: float | None = None


@dataclass(frozen=True)
class Move:
    replica: int
    from_job: str
    to_job: str
    nodes: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class Fallback:
    replica: int
    job_id: str
    at: float
    why: str


@dataclass(frozen=True)
class Pool:
    #: Slots to keep available (running idle or waiting in the queue): `[spares] nodes` divided
    #: by `replicas.nodes`.
    target: int
    slots: tuple[Slot, ...] = ()
    moves: tuple[Move, ...] = ()
    fallbacks: tuple[Fallback, ...] = ()
    #: Slot jobs retired because a node of theirs failed a health check.
    retired: tuple[str, ...] = ()

    def slot(self, job_id: str) -> Slot | None:
        return next((s for s in self.slots if s.job_id == job_id), None)

    def moved_from(self, job_id: str) -> Move | None:
        return next((m for m in self.moves if m.from_job == job_id), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Pool:
        """A pool read back from spares.json; `PoolFileError` naming what is wrong."""
        try:
            if not isinstance(data, dict):
                raise TypeError("not an object")
            target = data["target"]
            if not isinstance(target, int) or isinstance(target, bool) or target < 0:
                raise ValueError(f"target {target!r}")
            slots = tuple(_slot(s) for s in data.get("slots", []))
            moves = tuple(
                Move(int(m["replica"]), _job(m["from_job"]), _job(m["to_job"]),
                     tuple(str(n) for n in m["nodes"]), float(m["at"]))
                for m in data.get("moves", [])
            )  # fmt: skip
            falls = tuple(
                Fallback(int(f["replica"]), _job(f["job_id"]), float(f["at"]), str(f["why"]))
                for f in data.get("fallbacks", [])
            )
            retired = tuple(_job(j) for j in data.get("retired", []))
        except (KeyError, TypeError, ValueError) as exc:
            raise PoolFileError(f"{SPARES_FILE}: {type(exc).__name__}: {exc}") from None
        return cls(target, slots, moves, falls, retired)


def _job(value: Any) -> str:
    if not isinstance(value, str) or not SLOT_JOB_ID.fullmatch(value):
        raise ValueError(f"job id {value!r}")
    return value


def _slot(raw: Any) -> Slot:
    if not isinstance(raw, dict):
        raise TypeError(f"slot {raw!r}")
    replica, script = raw.get("replica"), raw.get("script")
    if replica is not None and (not isinstance(replica, int) or replica < 0):
        raise ValueError(f"slot replica {replica!r}")
    if script is not None and not (isinstance(script, str) and REPLICA_SCRIPT.fullmatch(script)):
        raise ValueError(f"slot script {script!r}")
    if (replica is None) != (script is None):
        raise ValueError("slot replica and script go together")
    since = raw.get("since")
    return Slot(_job(raw["job_id"]), replica, script, None if since is None else float(since))


def read_pool(run_dir: Path) -> Pool | None:
    """The pool of `run_dir`, or None when the run has no spares."""
    path = Path(run_dir) / SPARES_FILE
    try:
        text = read_trusted(path)
    except RunFileError as exc:
        raise PoolFileError(str(exc)) from None
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PoolFileError(f"{path}: not JSON ({exc})") from None
    return Pool.from_dict(data)


def write_pool(run_dir: Path, pool: Pool) -> None:
    write_private(Path(run_dir) / SPARES_FILE, json.dumps(pool.to_dict(), indent=1) + "\n")
