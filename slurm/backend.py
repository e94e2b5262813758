"""The narrow interface through which fthsdp acts on Slurm.

Everything that submits, requeues, drains or queries goes through `SlurmBackend`, so the recovery
path (failure -> report -> policy -> Slurm action) has exactly one place where it touches Slurm,
and tests can swap the class rather than patch subprocess calls.

`CommandBackend` drives Slurm's own commands (`sbatch`, `scontrol`, `squeue --json`,
`sinfo --json`), which work on every Slurm; DESIGN.md fact 6: 22.05's `scontrol` has no `--json`,
so queries use `squeue`/`sinfo`. Each command runs with a timeout and a bounded number of retries
with backoff, because slurmctld restarts and slow answers are normal on a busy cluster.
`PyslurmBackend` is picked by `default_backend()` only when pyslurm imports and matches the running
Slurm (DESIGN.md fact 9: `import pyslurm` can kill the process, so the import is guarded in a
child process first).

Drain reasons are owned by prefix: `resume` refuses to touch a node whose reason is not ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import hostlist

DRAIN_PREFIX = "fthsdp:"
#: sinfo shows 20 characters of a reason by default; scontrol shows it all.
REASON_MAX = 120
#: Seconds after `release` at which a requeued job may start (see `CommandBackend.release`).
RELEASE_DELAY_S = 2


class SlurmCommandError(RuntimeError):
    """A Slurm command failed (after its retries); carries the command and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{' '.join(argv)} failed ({returncode}): {self.stderr}")


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job (one het component per record) as squeue reports it."""

    job_id: str
    name: str
    state: str
    nodes: str
    restarts: int
    reason: str
    het_job_id: str | None = None
    het_offset: int = 0
    eligible_time: int = 0
    partition: str = ""
    comment: str = ""
    #: Nodes the job may not run on (squeue's `excluded_nodes`, a hostlist).
    excluded: str = ""

    @property
    def base_id(self) -> str:
        """The id to act on: the het leader's id for a het component, else the job's own."""
        return self.het_job_id or self.job_id


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""
    gres: str = ""
    partitions: tuple[str, ...] = field(default_factory=tuple)
    #: NodeAddr: where to reach the node (differs from its name when names do not resolve, as
    #: on the dev cluster where every node is 127.0.0.1); empty when Slurm does not say.
    address: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state.lower().startswith("drain")

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(DRAIN_PREFIX)


class SlurmBackend(Protocol):
    """What fthsdp needs from Slurm, and nothing more."""

    def submit(self, script: Path, args: Sequence[str] = ()) -> str: ...
    def requeue(self, job_id: str) -> None: ...
    def release(self, job_id: str, exclude: Sequence[str] = ()) -> None: ...
    def cancel(self, job_ids: Iterable[str]) -> None: ...
    def drain(self, node: str, reason: str) -> bool: ...
    def resume(self, node: str) -> bool: ...
    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]: ...
    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]: ...


def drain_reason(check: str, detail: str) -> str:
    """`fthsdp: <check>: <detail>`, single-line and short so sinfo shows the check's name."""
    text = f"{DRAIN_PREFIX} {check}: {detail}".replace("\n", " ").replace('"', "'")
    return text[:REASON_MAX]


class CommandBackend:
    """`SlurmBackend` over Slurm's command-line tools (the default; works on any Slurm)."""

    def __init__(
        self,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        env: dict[str, str] | None = None,
    ) -> None:
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.env = env

    # -- plumbing -------------------------------------------------------------------------

    def _run(self, argv: Sequence[str], retry: bool = True) -> str:
        """Run a Slurm command; retry transient failures (timeouts, slurmctld unreachable)."""
        attempts = self.retries if retry else 1
        last: SlurmCommandError | None = None
        for attempt in range(attempts):
            try:
                r = subprocess.run(
                    list(argv),
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                    env=self.env,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                last = SlurmCommandError(argv, -1, f"timed out after {self.timeout:.0f}s")
            except FileNotFoundError:
                raise SlurmCommandError(argv, 127, f"{argv[0]}: command not found") from None
            else:
                if r.returncode == 0:
                    return r.stdout
                last = SlurmCommandError(argv, r.returncode, r.stderr or r.stdout)
                if not _transient(last.stderr):
                    raise last
            if attempt + 1 < attempts:
                time.sleep(self.backoff * (2**attempt))
        assert last is not None
        raise last

    # -- jobs -----------------------------------------------------------------------------

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        """sbatch a script; returns the job id (the het leader's id for a het job)."""
        out = self._run(["sbatch", "--parsable", *args, str(script)], retry=False)
        return out.strip().split(";")[0].split("+")[0]

    def test_only(self, script: Path, args: Sequence[str] = ()) -> str:
        """`sbatch --test-only`: Slurm validates the script and says where it would run."""
        r = subprocess.run(
            ["sbatch", "--test-only", *args, str(script)],
            capture_output=True,
            text=True,
            timeout=self.timeout,
            env=self.env,
            check=False,
        )
        if r.returncode != 0:
            raise SlurmCommandError(["sbatch", "--test-only", str(script)], r.returncode, r.stderr)
        return r.stderr.strip() or r.stdout.strip()

    def requeue(self, job_id: str) -> None:
        self._run(["scontrol", "requeue", job_id])

    def release(self, job_id: str, exclude: Sequence[str] = (), settle: float = 30.0) -> None:
        """Make a requeued job eligible now (DESIGN.md fact 2: otherwise held back ~120 s),
        keeping it off the nodes in `exclude` for the rest of its life (`ExcNodeList`, added to
        what it already excludes): the way to move a replica off a node without draining it.

        Right after `scontrol requeue` the job is still COMPLETING, and Slurm sets the
        held-back begin time only when it has completed: an update sent earlier is overwritten
        (seen on 22.05 with het jobs). So this waits (up to `settle` s) until every component is
        back to PENDING, then sets the begin time, and repeats while a later one is in place.

        The begin time is now + `RELEASE_DELAY_S`, not now: slurmd revoked the old run's job
        credential when it was killed, and a restart in that same second is refused ("Killing
        non-startable batch JobId=N: Job credential revoked", seen on 22.05), which ends the
        job instead of restarting it. The held-back ~120 s exists for this; 2 s suffice.
        """
        deadline = time.monotonic() + settle
        while not self._settled(job_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        if exclude:
            self._exclude(job_id, exclude)
        while True:
            self._run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{RELEASE_DELAY_S}"])
            ahead = [
                j
                for j in self.jobs([job_id])
                if j.state.upper() == "PENDING"
                and j.eligible_time > time.time() + RELEASE_DELAY_S + 1
            ]
            if not ahead or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        # A job requeued after a prolog failure may also be held; release is a no-op otherwise.
        with contextlib.suppress(SlurmCommandError):
            self._run(["scontrol", "release", job_id], retry=False)

    def _exclude(self, job_id: str, nodes: Sequence[str]) -> None:
        """Add `nodes` to a pending job's ExcNodeList (Slurm accepts it only while pending)."""
        current: set[str] = set()
        for job in self.jobs([job_id]):
            if job.job_id == job_id and job.excluded:
                current.update(hostlist.expand_hostlist(job.excluded))
        wanted = sorted(current | set(nodes))
        self._run(
            [
                "scontrol",
                "update",
                f"JobId={job_id}",
                f"ExcNodeList={hostlist.collect_hostlist(wanted)}",
            ]
        )

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = list(job_ids)
        if ids:
            self._run(["scancel", *ids])

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        """Jobs known to slurmctld; with `job_ids`, those jobs (all components of het jobs).

        22.05's `squeue --json` ignores `--jobs`/`--name` and returns every job, so the
        filters are passed (later Slurms honour them) and applied here as well.
        """
        argv = ["squeue", "--json"]
        ids = list(job_ids)
        if ids:
            argv.append(f"--jobs={','.join(ids)}")
        if name:
            argv.append(f"--name={name}")
        try:
            out = self._run(argv)
        except SlurmCommandError as exc:
            # squeue errors on ids that have aged out of slurmctld; they are simply gone.
            if ids and "Invalid job id" in exc.stderr:
                return []
            raise
        return filter_jobs(parse_squeue_json(out), ids, name)

    def _settled(self, job_id: str) -> bool:
        """True once every component of `job_id` is back in the queue (PENDING or held).

        Uses text squeue, whose `--jobs` filter works on every version, and whose %T shows
        COMPLETING (the JSON form reports a completing requeued job as PENDING already).
        """
        try:
            out = self._run(["squeue", "-h", f"--jobs={job_id}", "-o", "%T"])
        except SlurmCommandError:
            return True
        states = {line.strip() for line in out.splitlines() if line.strip()}
        return states <= {"PENDING", "REQUEUE_HOLD", "SPECIAL_EXIT"}

    # -- nodes ----------------------------------------------------------------------------

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        wanted = set(names)
        out = parse_sinfo_json(self._run(["sinfo", "--json"]))
        return [n for n in out if not wanted or n.name in wanted]

    def drain(self, node: str, reason: str) -> bool:
        """Drain `node` with `reason` unless an admin (not fthsdp) already drained it.

        Returns True if the node is now drained with our reason.
        """
        current = self.nodes([node])
        if current and current[0].drained and not current[0].drained_by_us:
            return False
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return True

    def resume(self, node: str) -> bool:
        """Resume `node` only if fthsdp drained it; admin drains are never touched."""
        current = self.nodes([node])
        if not current or not current[0].drained_by_us:
            return False
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return True


_TRANSIENT = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "Slurm temporarily unable",
    "timed out",
)


def _transient(stderr: str) -> bool:
    return any(t in stderr for t in _TRANSIENT)


def filter_jobs(jobs: list[JobInfo], ids: Iterable[str], name: str | None) -> list[JobInfo]:
    """Keep jobs whose id or het leader id is in `ids` (if any) and whose name is `name`."""
    wanted = set(ids)
    return [
        j
        for j in jobs
        if (not wanted or j.job_id in wanted or j.base_id in wanted)
        and (name is None or j.name == name)
    ]


def parse_squeue_json(text: str) -> list[JobInfo]:
    """Jobs from `squeue --json` (22.05 schema; later versions nest some fields, handled)."""
    data = json.loads(text)
    out = []
    for j in data.get("jobs", []):
        het_id = _scalar(j.get("het_job_id"))
        state = j.get("job_state")
        if isinstance(state, list):
            state = state[0] if state else ""
        out.append(
            JobInfo(
                job_id=str(_scalar(j.get("job_id"))),
                name=str(j.get("name", "")),
                state=str(state),
                nodes=str(j.get("nodes", "") or ""),
                restarts=int(_scalar(j.get("restart_cnt")) or 0),
                reason=str(j.get("state_reason", "") or ""),
                het_job_id=str(het_id) if het_id else None,
                het_offset=int(_scalar(j.get("het_job_offset")) or 0),
                eligible_time=int(_scalar(j.get("eligible_time")) or 0),
                partition=str(j.get("partition", "") or ""),
                comment=str(j.get("comment", "") or ""),
                excluded=str(j.get("excluded_nodes", "") or ""),
            )
        )
    return out


def parse_sinfo_json(text: str) -> list[NodeInfo]:
    data = json.loads(text)
    out: dict[str, NodeInfo] = {}
    for n in data.get("nodes", []):
        name = n.get("name") or n.get("hostname")
        if not name:
            continue
        state = n.get("state", "")
        flags = list(n.get("state_flags", []) or [])
        if isinstance(state, list):  # newer Slurm: state is a list of flags
            flags += state[1:]
            state = state[0] if state else ""
        out[name] = NodeInfo(
            name=name,
            state=str(state).lower(),
            flags=tuple(str(f).upper() for f in flags),
            reason=str(n.get("reason", "") or ""),
            gres=str(n.get("gres", "") or ""),
            partitions=tuple(n.get("partitions", []) or []),
            address=str(n.get("address", "") or ""),
        )
    return list(out.values())


def _scalar(value: Any) -> Any:
    """Slurm >= 23 wraps numbers as {"set": bool, "number": n}; 22.05 gives them plain."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) else None
    return value


def versions_match(pyslurm_version: str, slurm_version: str) -> bool:
    """pyslurm X.Y.* is built for Slurm X.Y (e.g. pyslurm 23.2.2 for Slurm 23.02.7)."""

    def major_minor(text: str) -> tuple[int, int] | None:
        m = re.search(r"(\d+)\.(\d+)", text)
        return (int(m.group(1)), int(m.group(2))) if m else None

    a, b = major_minor(pyslurm_version), major_minor(slurm_version)
    return a is not None and a == b


def pyslurm_usable() -> bool:
    """True if pyslurm imports in a child process without killing it (DESIGN.md fact 9)
    and was built for the Slurm that `sinfo --version` reports."""
    probe = "import pyslurm; print(getattr(pyslurm, '__version__', '') or pyslurm.version())"
    try:
        r = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=os.environ.copy(),
        )
        if r.returncode != 0:
            return False
        v = subprocess.run(
            ["sinfo", "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return v.returncode == 0 and versions_match(r.stdout.strip(), v.stdout.strip())


def default_backend() -> SlurmBackend:
    """The backend fthsdp uses unless told otherwise: Slurm's commands.

    pyslurm exists on the package index only for Slurm versions that do not match Debian's
    22.05, and where it is installed it offers nothing this toolkit needs that the commands do
    not; it is therefore used only when `FTHSDP_BACKEND=pyslurm` asks for it, it imports, and its
    version matches the running Slurm.
    """
    if os.environ.get("FTHSDP_BACKEND") == "pyslurm" and pyslurm_usable():
        from slurm.backend_pyslurm import PyslurmBackend

        return PyslurmBackend()
    return CommandBackend()
