"""jobs.json: which Slurm job belongs to which replica of a run, and what Slurm says of them.

Commands that act on a run (`status`, `cancel`, `requeue`) start from `jobs.json`, never from
job-name guesses, so two runs with the same name on one cluster do not interfere. `fthsdp
submit` writes it (`write_run`, 0600, atomically); `read_run` is its one strict reader and
`read_job_ids` the control plane's (which also takes a hand-written `{"replicas": {"0": "12"}}`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from slurm.backend import JobInfo, SlurmBackend
from slurm.errors import InputError
from slurm.rundir.paths import JOBS_FILE, write_private
from slurm.rundir.shape import an_object, bad, is_number, read_json, want

#: A Slurm job id as sbatch --parsable prints it (array tasks as ID_TASK).
JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")
#: squeue states after which a job will not run again by itself.
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


@dataclass(frozen=True)
class JobRecord:
    """One submitted job of a run."""

    role: Literal["control", "replica"]
    job_id: str
    job_name: str
    script: str
    replica: int | None = None


@dataclass(frozen=True)
class RunRecord:
    """The contents of `jobs.json`."""

    name: str
    run_dir: str
    submitted_at: float
    control: JobRecord | None
    replicas: tuple[JobRecord, ...] = field(default_factory=tuple)

    @property
    def jobs(self) -> list[JobRecord]:
        return ([self.control] if self.control else []) + list(self.replicas)

    @property
    def job_ids(self) -> list[str]:
        return [j.job_id for j in self.jobs]

    def replica(self, replica: int) -> JobRecord:
        for r in self.replicas:
            if r.replica == replica:
                return r
        ids = ", ".join(str(r.replica) for r in self.replicas)
        raise InputError("replica", replica, f"a replica of this run ({ids})")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """A record from jobs.json's data, whose shape `check_jobs_data` has accepted."""
        control = data.get("control")
        return cls(
            name=str(data["name"]),
            run_dir=str(data["run_dir"]),
            submitted_at=float(data.get("submitted_at", 0.0)),
            control=JobRecord(**control) if control else None,
            replicas=tuple(JobRecord(**r) for r in data.get("replicas", [])),
        )


# -- pure shape checks (each raises InputError naming the file) --------------------------------


def _job_id(path: Path, where: str, value: Any) -> None:
    ok = isinstance(value, str) and JOB_ID.fullmatch(value) is not None
    want(path, where, value, ok, 'a Slurm job id string such as "1234"')


def check_job_record(path: Path, where: str, data: Any, role: str) -> None:
    job = an_object(path, where, data)
    missing = sorted({"role", "job_id", "job_name", "script"} - set(job))
    if missing:
        raise bad(path, f"{where} lacks {', '.join(missing)}")
    unknown = sorted(set(job) - {"role", "job_id", "job_name", "script", "replica"})
    if unknown:
        raise bad(path, f"{where} has unknown keys {', '.join(unknown)}")
    want(path, f"{where}.role", job["role"], job["role"] == role, f"{role!r}")
    _job_id(path, f"{where}.job_id", job["job_id"])
    for key in ("job_name", "script"):
        want(path, f"{where}.{key}", job[key], isinstance(job[key], str), "a string")
    replica = job.get("replica")
    if role == "replica":
        ok = isinstance(replica, int) and not isinstance(replica, bool) and replica >= 0
        want(path, f"{where}.replica", replica, ok, "an integer >= 0")
    else:
        want(path, f"{where}.replica", replica, replica is None, "null")


def check_jobs_data(path: Path, data: Any) -> None:
    """jobs.json as `fthsdp submit` writes it (`RunRecord.to_json`)."""
    top = an_object(path, "the file", data)
    for key in ("name", "run_dir"):
        if key not in top:
            raise bad(path, f"lacks {key!r}")
        want(path, key, top[key], isinstance(top[key], str), "a string")
    if "submitted_at" in top:
        want(path, "submitted_at", top["submitted_at"], is_number(top["submitted_at"]), "a number")
    if top.get("control") is not None:
        check_job_record(path, "control", top["control"], "control")
    replicas = top.get("replicas", [])
    want(path, "replicas", replicas, isinstance(replicas, list), "a list")
    seen: set[int] = set()
    for k, rec in enumerate(replicas):
        check_job_record(path, f"replicas[{k}]", rec, "replica")
        if rec["replica"] in seen:
            raise bad(path, f"replicas[{k}]: replica {rec['replica']} is listed twice")
        seen.add(rec["replica"])


def job_ids_from_data(path: Path, data: Any) -> dict[int, str]:
    """Replica -> job id from jobs.json: `submit`'s record, or `{"replicas": {"0": "12"}}`."""
    top = an_object(path, "the file", data)
    raw = top.get("replicas", {})
    if isinstance(raw, dict):
        out = {}
        for key, job_id in raw.items():
            ok = key.isdigit()
            want(path, f"replicas key {key!r}", key, ok, 'a replica index such as "0"')
            _job_id(path, f"replicas.{key}", job_id)
            out[int(key)] = str(job_id)
        return out
    check_jobs_data(path, top)
    return {int(r["replica"]): str(r["job_id"]) for r in raw}


# -- file access -----------------------------------------------------------------------------


def read_run(run_dir: Path) -> RunRecord:
    """Read `run_dir/jobs.json`; InputError if the directory holds no submitted run or the file
    is not one `fthsdp submit` wrote."""
    path = Path(run_dir) / JOBS_FILE
    data = read_json(path, f"a run directory with {JOBS_FILE}")
    check_jobs_data(path, data)
    return RunRecord.from_dict(data)


def read_job_ids(run_dir: Path) -> dict[int, str] | None:
    """Replica -> job id from `run_dir/jobs.json` (None when there is none yet)."""
    path = Path(run_dir) / JOBS_FILE
    data = read_json(path)
    return None if data is None else job_ids_from_data(path, data)


def write_run(record: RunRecord) -> Path:
    """Write `jobs.json` atomically (a reader never sees half a file), mode 0600."""
    path = Path(record.run_dir) / JOBS_FILE
    write_private(path, record.to_json())
    return path


def new_record(run_dir: Path, name: str) -> RunRecord:
    return RunRecord(name=name, run_dir=str(run_dir), submitted_at=time.time(), control=None)


# -- the record against Slurm's queue --------------------------------------------------------


def is_live(job: JobInfo) -> bool:
    return job.state.upper() not in TERMINAL_STATES


def live_jobs(record: RunRecord, backend: SlurmBackend, extra: Sequence[str] = ()) -> list[JobInfo]:
    """The run's jobs (and `extra` ones) that Slurm still has pending, running, held or
    requeued."""
    ids = [*record.job_ids, *extra]
    if not ids:
        return []
    return [j for j in backend.jobs(ids) if is_live(j)]


def job_rows(record: RunRecord, queued: Iterable[JobInfo]) -> list[dict[str, Any]]:
    """Join `jobs.json` with squeue records: one plain row per job of the run.

    A het replica job appears in squeue as one record per component; the row takes state,
    restarts and reason from component 0 and lists every component's nodes.
    """
    by_base: dict[str, list[JobInfo]] = {}
    for j in queued:
        by_base.setdefault(j.base_id, []).append(j)
    rows = []
    for rec in record.jobs:
        comps = sorted(by_base.get(rec.job_id, []), key=lambda j: j.het_offset)
        lead = comps[0] if comps else None
        rows.append(
            {
                "role": rec.role,
                "replica": rec.replica,
                "job_id": rec.job_id,
                "job_name": rec.job_name,
                "state": lead.state if lead else "GONE",
                "nodes": [c.nodes for c in comps],
                "restarts": lead.restarts if lead else None,
                "reason": lead.reason if lead else "",
                "eligible_time": lead.eligible_time if lead else None,
            }
        )
    return rows
