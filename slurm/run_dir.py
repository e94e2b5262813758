"""A run's directory: what `fthsdp submit` leaves there, and what later commands read back.

`run_dir` (on a shared filesystem) is the run's single source of truth outside Slurm:

- `control.sbatch`, `replica-NN.sbatch`: the scripts that were submitted;
- `spec.json`: the resolved spec (defaults filled in, overrides applied);
- `jobs.json`: which Slurm job id belongs to which replica (`RunRecord`);
- `secret`: the run's HMAC key for the leaders' reports (mode 0600);
- `logs/`: every job's stdout/stderr; `control.json`: written by the control plane.

Commands that act on a run (`status`, `cancel`, `requeue`) start from `jobs.json`, never from
job-name guesses, so two runs with the same name on one cluster do not interfere. A directory
whose recorded jobs are still in the queue holds a *live* run; `submit` refuses to write over
it unless forced.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from slurm.backend import JobInfo, SlurmBackend
from slurm.errors import InputError

JOBS_FILE = "jobs.json"
SPEC_FILE = "spec.json"
SECRET_FILE = "secret"
LOG_DIR = "logs"
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
        control = data.get("control")
        return cls(
            name=str(data["name"]),
            run_dir=str(data["run_dir"]),
            submitted_at=float(data.get("submitted_at", 0.0)),
            control=JobRecord(**control) if control else None,
            replicas=tuple(JobRecord(**r) for r in data.get("replicas", [])),
        )


def read_run(run_dir: Path) -> RunRecord:
    """Read `run_dir/jobs.json`; InputError if the directory holds no submitted run."""
    path = Path(run_dir) / JOBS_FILE
    try:
        data = json.loads(path.read_text())
        return RunRecord.from_dict(data)
    except FileNotFoundError:
        raise InputError("RUN_DIR", str(run_dir), f"a run directory with {JOBS_FILE}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(
            str(path), "(unreadable)", f"a jobs file written by fthsdp: {exc}"
        ) from None


def write_run(record: RunRecord) -> Path:
    """Write `jobs.json` atomically (a reader never sees half a file)."""
    path = Path(record.run_dir) / JOBS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, path)
    return path


def new_record(run_dir: Path, name: str) -> RunRecord:
    return RunRecord(name=name, run_dir=str(run_dir), submitted_at=time.time(), control=None)


def is_live(job: JobInfo) -> bool:
    return job.state.upper() not in TERMINAL_STATES


def live_jobs(record: RunRecord, backend: SlurmBackend) -> list[JobInfo]:
    """The run's jobs that Slurm still has pending, running, held or requeued."""
    ids = record.job_ids
    if not ids:
        return []
    return [j for j in backend.jobs(ids) if is_live(j)]


def check_not_live(run_dir: Path, backend: SlurmBackend, force: bool = False) -> None:
    """Refuse a `run_dir` whose recorded jobs are still queued or running (unless forced)."""
    if force or not (Path(run_dir) / JOBS_FILE).exists():
        return
    live = live_jobs(read_run(run_dir), backend)
    if live:
        ids = ",".join(sorted({j.base_id for j in live}))
        raise InputError(
            "job.run_dir",
            str(run_dir),
            f"holds a live run (jobs {ids}); cancel it with 'fthsdp cancel', "
            "use another run_dir, or pass --force",
        )


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
