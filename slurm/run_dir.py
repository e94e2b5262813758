"""A run's directory: what `fthsdp submit` leaves there, and what later commands read back.

`run_dir` (on a shared filesystem) is the run's single source of truth outside Slurm:

- `control.sbatch`, `replica-NN.sbatch`: the scripts that were submitted;
- `spec.json`: the resolved spec (defaults filled in, overrides applied);
- `jobs.json`: which Slurm job id belongs to which replica (`RunRecord`);
- `secret`: the run's HMAC key for the leaders' reports (mode 0600);
- `logs/`: every job's stdout/stderr; `control.json`: written by the control plane.

Commands that act on a run (`status`, `cancel`, `requeue`) start from `jobs.json`, never from
job-name guesses, so two runs with the same name on one cluster do not interfere. A directory
whose recorded jobs are still in the queue holds a *live* run: `submit` refuses it, forced or
not, naming the jobs and `fthsdp cancel RUN_DIR`, so no job is left running outside jobs.json.
A directory with a finished run's state (`RUN_STATE`: jobs.json, the journal, progress, ledger,
the `finished` marker, logs, ...) is refused unless `--force`, which first moves that state to
`archive/<UTC time>/` (a new run that found the old `finished` marker would end at once).

Every file is read here, by pure loaders that check its whole shape before anything acts on it:
a missing, empty, truncated or hand-edited file is an `InputError` naming the file and what is
wrong (one line, exit 2), never a traceback and never a half-understood record that a command
would drain or requeue by. The directory is private to its owner (0700) and the files that hold
the run's state or key are 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_type_hints

from slurm.backend import JobInfo, SlurmBackend
from slurm.errors import InputError

JOBS_FILE = "jobs.json"
SPEC_FILE = "spec.json"
CONTROL_FILE = "control.json"
SECRET_FILE = "secret"
LOG_DIR = "logs"
#: The run directory and logs/: the owner only (the run's key and state live there).
RUN_DIR_MODE = 0o700
#: jobs.json, spec.json, secret.
PRIVATE_FILE_MODE = 0o600
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


class RunFileError(InputError):
    """A run file that is missing a part, corrupt or of the wrong shape: `PATH: problem`."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(str(path), None, problem)

    def __str__(self) -> str:
        return f"{self.field}: {self.allowed}"


def _bad(path: Path, problem: str) -> InputError:
    return RunFileError(path, problem)


def parse_json_file(path: Path, text: str) -> Any:
    """The JSON value in `text` (the contents of `path`); InputError when empty or not JSON."""
    if not text.strip():
        raise _bad(path, "the file is empty (a crash while it was written?)")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _bad(path, f"not valid JSON ({exc})") from None


def _type_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def _want(path: Path, where: str, value: Any, ok: bool, wanted: str) -> None:
    if not ok:
        raise _bad(path, f"{where} must be {wanted}, not {_type_of(value)} {value!r:.60}")


def _object(path: Path, where: str, value: Any) -> dict[str, Any]:
    _want(path, where, value, isinstance(value, dict), "an object")
    out: dict[str, Any] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _job_id(path: Path, where: str, value: Any) -> None:
    ok = isinstance(value, str) and JOB_ID.fullmatch(value) is not None
    _want(path, where, value, ok, 'a Slurm job id string such as "1234"')


def check_job_record(path: Path, where: str, data: Any, role: str) -> None:
    job = _object(path, where, data)
    missing = sorted({"role", "job_id", "job_name", "script"} - set(job))
    if missing:
        raise _bad(path, f"{where} lacks {', '.join(missing)}")
    unknown = sorted(set(job) - {"role", "job_id", "job_name", "script", "replica"})
    if unknown:
        raise _bad(path, f"{where} has unknown keys {', '.join(unknown)}")
    _want(path, f"{where}.role", job["role"], job["role"] == role, f"{role!r}")
    _job_id(path, f"{where}.job_id", job["job_id"])
    for key in ("job_name", "script"):
        _want(path, f"{where}.{key}", job[key], isinstance(job[key], str), "a string")
    replica = job.get("replica")
    if role == "replica":
        ok = isinstance(replica, int) and not isinstance(replica, bool) and replica >= 0
        _want(path, f"{where}.replica", replica, ok, "an integer >= 0")
    else:
        _want(path, f"{where}.replica", replica, replica is None, "null")


def check_jobs_data(path: Path, data: Any) -> None:
    """jobs.json as `fthsdp submit` writes it (`RunRecord.to_json`)."""
    top = _object(path, "the file", data)
    for key in ("name", "run_dir"):
        if key not in top:
            raise _bad(path, f"lacks {key!r}")
        _want(path, key, top[key], isinstance(top[key], str), "a string")
    if "submitted_at" in top:
        _want(
            path, "submitted_at", top["submitted_at"], _is_number(top["submitted_at"]), "a number"
        )
    if top.get("control") is not None:
        check_job_record(path, "control", top["control"], "control")
    replicas = top.get("replicas", [])
    _want(path, "replicas", replicas, isinstance(replicas, list), "a list")
    seen: set[int] = set()
    for k, rec in enumerate(replicas):
        check_job_record(path, f"replicas[{k}]", rec, "replica")
        if rec["replica"] in seen:
            raise _bad(path, f"replicas[{k}]: replica {rec['replica']} is listed twice")
        seen.add(rec["replica"])


def job_ids_from_data(path: Path, data: Any) -> dict[int, str]:
    """Replica -> job id from jobs.json: `submit`'s record, or `{"replicas": {"0": "12"}}`."""
    top = _object(path, "the file", data)
    raw = top.get("replicas", {})
    if isinstance(raw, dict):
        out = {}
        for key, job_id in raw.items():
            ok = key.isdigit()
            _want(path, f"replicas key {key!r}", key, ok, 'a replica index such as "0"')
            _job_id(path, f"replicas.{key}", job_id)
            out[int(key)] = str(job_id)
        return out
    check_jobs_data(path, top)
    return {int(r["replica"]): str(r["job_id"]) for r in raw}


def check_control_data(path: Path, data: Any) -> dict[str, Any]:
    """control.json as the control plane writes it: its addresses and who wrote it."""
    top = _object(path, "the file", data)
    for key in ("coordinator", "lighthouse"):
        value = top.get(key)
        ok = value is None or (isinstance(value, str) and value.startswith(("http://", "https://")))
        _want(path, key, value, ok, "an http:// URL or null")
    for key in ("host", "job_id"):
        value = top.get(key)
        _want(path, key, value, value is None or isinstance(value, str), "a string or null")
    for key in ("pid",):
        value = top.get(key)
        _want(path, key, value, value is None or _is_int(value), "an integer or null")
    for key in ("started_at",):
        value = top.get(key)
        _want(path, key, value, value is None or _is_number(value), "a number or null")
    return top


def check_spec_data(path: Path, data: Any) -> dict[str, Any]:
    """spec.json: every section an object, every field of the type its spec field has.

    Fields may be missing (a control plane started by hand writes only what it needs), but
    `replicas.count` must be there: it is what the control plane cannot guess.
    """
    from slurm.spec import parse_spec
    from slurm.spec.model import SECTIONS

    top = _object(path, "the file", data)
    sections: Mapping[str, type] = SECTIONS
    for name, value in top.items():
        if name == "source":
            _want(path, name, value, isinstance(value, str), "a string")
            continue
        if name not in sections:
            raise _bad(path, f"unknown section {name!r} (allowed: {', '.join(sorted(sections))})")
        section = _object(path, name, value)
        _check_fields(path, sections[name], name, section)
    replicas = top.get("replicas")
    if not isinstance(replicas, dict) or "count" not in replicas:
        raise _bad(path, "lacks replicas.count")
    count = replicas["count"]
    _want(path, "replicas.count", count, _is_int(count) and count >= 1, "an integer >= 1")
    if {"job", "replicas", "train"} <= set(top):
        # A whole spec (what submit writes): its cross-field rules hold too.
        plain = {name: _without_nulls(table) for name, table in top.items() if name != "source"}
        try:
            parse_spec(plain)
        except InputError as exc:
            raise _bad(path, str(exc)) from None
    return top


def _without_nulls(table: dict[str, Any]) -> dict[str, Any]:
    """`table` without its null fields, nested tables (replicas.helper) included: the spec
    writes unset optional fields as null, and the spec parser reads a missing one as unset."""
    kept = {k: v for k, v in table.items() if v is not None}
    return {k: _without_nulls(v) if isinstance(v, dict) else v for k, v in kept.items()}


def _check_fields(path: Path, cls: type, where: str, table: dict[str, Any]) -> None:
    from slurm.spec.coerce import coerce
    from slurm.spec.model import NESTED

    hints = get_type_hints(cls)
    for key, value in table.items():
        dotted = f"{where}.{key}"
        if key not in hints:
            raise _bad(path, f"unknown field {dotted}")
        nested = NESTED.get((cls, key))
        if nested is not None:
            if value is not None:
                _check_fields(path, nested, dotted, _object(path, dotted, value))
            continue
        if value is None:
            continue  # optional fields are written as null
        try:
            coerce(dotted, value, hints[key])
        except InputError as exc:
            raise _bad(path, f"{dotted}: got {value!r:.60}; {exc.allowed}") from None


# -- file access -----------------------------------------------------------------------------


def read_json(path: Path, missing: str | None = None) -> Any:
    """The JSON value of `path`. A missing file is an InputError saying `missing` (what was
    expected there), or None when `missing` is None; unreadable, empty or bad JSON is too."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if missing is None:
            return None
        raise InputError("RUN_DIR", str(Path(path).parent), missing) from None
    except IsADirectoryError:
        raise _bad(path, "is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot be read ({exc})") from None
    return parse_json_file(path, text)


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


def read_control(run_dir: Path) -> dict[str, Any] | None:
    """`run_dir/control.json` checked (None before the control plane first wrote it)."""
    path = Path(run_dir) / CONTROL_FILE
    data = read_json(path)
    return None if data is None else check_control_data(path, data)


def read_spec_data(run_dir: Path) -> dict[str, Any] | None:
    """`run_dir/spec.json` checked field by field (None when there is none)."""
    path = Path(run_dir) / SPEC_FILE
    data = read_json(path)
    return None if data is None else check_spec_data(path, data)


def check_control_inputs(run_dir: Path) -> None:
    """What the control plane reads at start (spec.json, jobs.json, either may be absent),
    checked, so a corrupt file stops it with one line instead of a crash loop."""
    read_spec_data(run_dir)
    read_job_ids(run_dir)


def check_run_files(run_dir: Path, control: bool = True, spec: bool = True) -> RunRecord:
    """jobs.json (required), and control.json and spec.json when present, all checked: what
    a command that reads a run directory calls first. Returns the run's record."""
    record = read_run(run_dir)
    if control:
        read_control(run_dir)
    if spec:
        read_spec_data(run_dir)
    return record


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, mode 0600 from the start (never briefly readable)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, PRIVATE_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_run(record: RunRecord) -> Path:
    """Write `jobs.json` atomically (a reader never sees half a file), mode 0600."""
    path = Path(record.run_dir) / JOBS_FILE
    write_private(path, record.to_json())
    return path


def new_record(run_dir: Path, name: str) -> RunRecord:
    return RunRecord(name=name, run_dir=str(run_dir), submitted_at=time.time(), control=None)


def is_live(job: JobInfo) -> bool:
    return job.state.upper() not in TERMINAL_STATES


def live_jobs(record: RunRecord, backend: SlurmBackend, extra: Sequence[str] = ()) -> list[JobInfo]:
    """The run's jobs (and `extra` ones) that Slurm still has pending, running, held or
    requeued."""
    ids = [*record.job_ids, *extra]
    if not ids:
        return []
    return [j for j in backend.jobs(ids) if is_live(j)]


def _slot_jobs(run_dir: Path) -> list[str]:
    """The run's spare slot jobs (`spares.json`): a slot outlives a control plane that died,
    holds its nodes and would run a replica's script if it was assigned one. A pool file
    that cannot be read is refused, never taken as "no slots"."""
    from runtime.control.spares import PoolFileError, read_pool

    try:
        pool = read_pool(run_dir)
    except (PoolFileError, OSError) as exc:
        raise InputError(
            "job.run_dir",
            str(run_dir),
            f"a readable spare pool, not {exc}; cancel its slot jobs with scancel, or use "
            "another run_dir",
        ) from None
    return [s.job_id for s in pool.slots] if pool else []


#: What a run leaves in its directory besides its scripts, spec.json and secret (which a new
#: submit replaces): moved to `archive/<time>/` by `submit --force`.
RUN_STATE = (
    JOBS_FILE,
    CONTROL_FILE,
    "control.sqlite",
    "control.sqlite-wal",
    "control.sqlite-shm",
    "control.log",
    "finished",
    "progress",
    "ledger",
    "final",
    "checkpoints",
    "rendezvous",
    LOG_DIR,
)
ARCHIVE_DIR = "archive"


def previous_state(run_dir: Path) -> list[str]:
    """The entries of `RUN_STATE` that `run_dir` holds (an empty logs/ does not count)."""
    found = []
    for name in RUN_STATE:
        path = Path(run_dir) / name
        if name == LOG_DIR and path.is_dir() and not any(path.iterdir()):
            continue
        if path.exists() or path.is_symlink():
            found.append(name)
    return found


def check_resubmit(run_dir: Path, backend: SlurmBackend, force: bool = False) -> list[str]:
    """What of an earlier run in `run_dir` a submit must archive first (`previous_state`).

    Refuses a run whose recorded jobs are still queued or running, even with `force` (they
    would run on outside the new jobs.json), and an earlier run's state without `force`.
    """
    run_dir = Path(run_dir)
    if (run_dir / JOBS_FILE).exists():
        live = live_jobs(read_run(run_dir), backend, _slot_jobs(run_dir))
        if live:
            ids = ",".join(sorted({j.base_id for j in live}))
            raise InputError(
                "job.run_dir",
                str(run_dir),
                f"holds a live run (jobs {ids}); cancel it first with "
                f"'fthsdp cancel {run_dir}', or use another run_dir",
            )
    state = previous_state(run_dir)
    if state and not force:
        shown = ", ".join(state[:4]) + (", ..." if len(state) > 4 else "")
        raise InputError(
            "job.run_dir",
            str(run_dir),
            f"holds a finished run ({shown}); pass --force to move it to "
            f"{run_dir / ARCHIVE_DIR}/ and submit anew, or use another run_dir",
        )
    return state


def archive_state(run_dir: Path, names: Iterable[str], now: float | None = None) -> Path:
    """Move `names` of `run_dir` into a new `run_dir/archive/<UTC time>/` (0700); its path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = Path(run_dir) / ARCHIVE_DIR
    base.mkdir(mode=RUN_DIR_MODE, exist_ok=True)
    dest = base / stamp
    for n in range(1, 1000):
        try:
            dest.mkdir(mode=RUN_DIR_MODE)
            break
        except FileExistsError:
            dest = base / f"{stamp}.{n}"
    for name in names:
        os.replace(Path(run_dir) / name, dest / name)
    return dest


def restore_archive(run_dir: Path, archived: Path) -> None:
    """Undo `archive_state` (a submit that failed puts the earlier run back)."""
    for path in sorted(archived.iterdir()):
        target = Path(run_dir) / path.name
        if not target.exists():
            os.replace(path, target)
    with contextlib.suppress(OSError):
        archived.rmdir()


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
