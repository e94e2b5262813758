"""What fthsdp reads from Slurm: job and node records, the Slurm version, and the errors raised
when a Slurm command fails or answers in a shape fthsdp does not know.

These live apart from `slurm.backend` (which runs the commands) and `slurm.slurm_json` (which
parses their output) so that both, and every caller, share one definition without importing
each other. `slurm.backend` re-exports all of them.

The errors matter most. A query whose answer cannot be read must never look like an empty
cluster: an empty node list once let a drain skip its admin-drain guard. So an unknown output
raises `SlurmOutputError`, a `SlurmCommandError`, which every caller already treats as "Slurm
could not be asked": nothing is done, and the message says which command, on which Slurm, and
what was unexpected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from slurm.errors import InputError

#: Every drain reason fthsdp writes starts with this; any other reason belongs to someone else.
DRAIN_PREFIX = "fthsdp:"

#: One Slurm node name: letters, digits, '-', '_', '.'; no hostlist brackets, commas or spaces.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SlurmCommandError(RuntimeError):
    """A Slurm command failed (after its retries); carries the command and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{' '.join(argv)} failed ({returncode}): {self.stderr}")


#: What Slurm's commands say when slurmctld cannot be asked at all (stopped, restarting,
#: unreachable); 22.05's `squeue --json` says only "Failed while looking for jobs".
UNREACHABLE_SIGNS = (
    "Unable to contact",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "timed out",
    "Failed while looking for jobs",
)

#: What slurmctld says when it was asked but cannot answer now: busy ("Slurm temporarily unable
#: to accept job", "Resource temporarily unavailable"), or an RPC answered by a slurmctld in the
#: middle of a restart (SLURM_UNEXPECTED_MSG_ERROR, seen on `scontrol update JobId=..` then).
BUSY_SIGNS = ("temporarily", "Unexpected message received")


def unreachable(exc: SlurmCommandError) -> bool:
    """Whether Slurm could not be asked at all (no verdict on what was asked of it)."""
    if isinstance(exc, SlurmAwayOutput):
        return True
    return exc.returncode == -1 or any(t in exc.stderr for t in UNREACHABLE_SIGNS)


def retryable(exc: SlurmCommandError) -> bool:
    """Whether the same call may succeed later: Slurm away or busy, not a refusal."""
    return unreachable(exc) or any(t in exc.stderr for t in BUSY_SIGNS)


class SlurmOutputError(SlurmCommandError):
    """A Slurm command answered, but not in a shape fthsdp knows for that Slurm version.

    Raised instead of returning an empty or partial result, so no caller acts on a misread.
    """

    def __init__(self, argv: Sequence[str], version: SlurmVersion | None, what: str) -> None:
        self.version = version
        self.what = what
        on = f"Slurm {version}" if version is not None else "a Slurm of unknown version"
        self.argv = list(argv)
        self.returncode = 0
        self.stderr = f"unexpected output on {on}: {what}"
        RuntimeError.__init__(self, f"{' '.join(self.argv)} on {on}: unexpected output: {what}")


class SlurmAwayOutput(SlurmOutputError):
    """A JSON answer with no records and only the errors a command gives when it could not
    reach slurmctld: 22.05's `sinfo --json` exits 0 with `errors: [{"error": "Unspecified
    error", "errno": -1}]` then (its `squeue --json` says "Failed while looking for jobs"), where
    later releases exit 1 with "Unable to contact slurm controller". No verdict: `unreachable`."""


class JobNotSettled(Exception):
    """A requeued job still COMPLETING on its old nodes when `release` gave up waiting: the begin
    time it was given is overwritten when the job completes (Slurm holds a requeued job back
    ~120 s then, and again when the old node's Epilog fails), so the release is not done yet."""

    def __init__(self, job_id: str, waited_s: float) -> None:
        super().__init__(f"job {job_id} still completing on its old nodes after {waited_s:g} s")
        self.job_id = job_id


class NodeNotFound(SlurmOutputError):
    """Slurm's answer was read, and it holds no record of the node asked for."""

    def __init__(self, argv: Sequence[str], version: SlurmVersion, node: str) -> None:
        super().__init__(argv, version, f"no record of node {node}")
        self.node = node


class NodeNameError(InputError, SlurmCommandError):
    """A drain or resume was asked for something that is not one plain Slurm node name.

    An `InputError` (the CLI answers exit 2 with one line) and a `SlurmCommandError` (the
    coordinator and the prolog, which catch those, log it and do nothing). Slurm would expand a
    hostlist such as `node[1-4]` itself, so anything but one name is refused before Slurm sees it.
    """

    def __init__(self, value: object, action: str) -> None:
        InputError.__init__(
            self,
            "node",
            value,
            f"one Slurm node name (letters, digits, '-', '_', '.'), not a hostlist, list or "
            f"other type; nothing was done ({action})",
        )
        self.argv = ["scontrol", "update", "NodeName=?"]
        self.returncode = 2
        self.stderr = str(self)


def check_node_name(value: object, action: str) -> str:
    """`value` if it is exactly one node name in Slurm's charset, else `NodeNameError`."""
    if not isinstance(value, str) or not NODE_NAME.fullmatch(value):
        raise NodeNameError(value, action)
    return value


@dataclass(frozen=True, order=True)
class SlurmVersion:
    """A Slurm release as `scontrol --version` prints it (`slurm 24.11.5`)."""

    major: int
    minor: int
    micro: int

    @property
    def release(self) -> str:
        """`24.11`: the release series; JSON shapes change between series, not within one."""
        return f"{self.major:02d}.{self.minor:02d}"

    def __str__(self) -> str:
        return f"{self.release}.{self.micro}"


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


def lead_record(jobs: Iterable[JobInfo], job_id: str) -> JobInfo | None:
    """The record that speaks for job `job_id` among `jobs`: the job's own, or component 0's for
    a het job (squeue lists one record per component, each with the leader's id as `base_id`);
    None when `jobs` holds none."""
    return next((j for j in jobs if j.base_id == job_id and j.het_offset == 0), None)


#: Node state flags under which Slurm starts no job there.
_OUT_OF_SERVICE = frozenset(
    ("DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "MAINTENANCE",
     "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN")
)  # fmt: skip


@dataclass(frozen=True)
class NodeInfo:
    """One node as Slurm reports it; `state` is the base state, `flags` the rest (DRAIN, ...)."""

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
    def in_service(self) -> bool:
        """Slurm would start a job on it now: up, responding, and neither drained nor failing."""
        return self.state.lower() in ("idle", "mixed", "allocated", "completing") and not (
            _OUT_OF_SERVICE.intersection(f.upper() for f in self.flags)
        )

    @property
    def responding(self) -> bool:
        """slurmctld hears from its slurmd: neither DOWN nor NOT_RESPONDING (it may be drained)."""
        return self.state.lower() not in ("down", "unknown", "future") and (
            "NOT_RESPONDING" not in (f.upper() for f in self.flags)
        )

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(DRAIN_PREFIX)

    @property
    def foreign_reason(self) -> bool:
        """True when someone other than fthsdp (an admin, Slurm itself) set the node's reason."""
        return bool(self.reason) and not self.reason.startswith(DRAIN_PREFIX)
