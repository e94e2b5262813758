"""What a replica leader tells the coordinator, and how the message is authenticated.

Group rank 0 of each replica sends a `ReplicaReport` every few steps and a final one, with the
failure classified, when it dies. The coordinator acts on these reports (requeue a job, drain a
node), so a report must be provably from the run: the body is signed with HMAC-SHA256 using the
run's secret (`run_dir/secret`, mode 0600), over `timestamp.nonce.body`. The coordinator rejects a
report whose signature is wrong, whose timestamp is outside a window, or whose nonce it has seen
(a replay). The exit codes below are the worker's contract with the replica job's supervisor.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SIGNATURE_HEADER = "X-Fthsdp-Signature"
TIMESTAMP_HEADER = "X-Fthsdp-Timestamp"
NONCE_HEADER = "X-Fthsdp-Nonce"
#: Reports older or newer than this (seconds, wall clock) are refused as stale.
MAX_CLOCK_SKEW_S = 300
#: Bodies larger than this are refused before parsing.
MAX_REPORT_BYTES = 64 * 1024

FailureClass = Literal["process", "node"]
ReportKind = Literal["status", "fatal"]


class ExitCode(enum.IntEnum):
    """How a replica worker exits; the supervisor and the coordinator key off these."""

    OK = 0
    #: Error in the worker's own code or in the user's script: relaunching will not help.
    USER_ERROR = 1
    #: Environment missing or inconsistent (replica id >= count, rank out of range).
    BAD_ENV = 2
    #: The quorum service (Lighthouse) was not reachable within the join timeout.
    NO_QUORUM_SERVICE = 3
    #: A process fault on healthy nodes (peer died, collective timed out): relaunch in place.
    PROCESS_FAULT = 10
    #: The node is bad (Xid, GPU lost, ECC, failed health check): drain it and requeue.
    NODE_FAULT = 11


@dataclass
class ReplicaReport:
    """One leader report. `seq` rises per incarnation so duplicates and reordering are visible."""

    replica: int
    incarnation: str
    seq: int
    kind: ReportKind = "status"
    job_id: str | None = None
    nodes: list[str] = field(default_factory=list)
    step: int = 0
    quorum_id: int = -1
    participants: int = 0
    healing: bool = False
    step_time_s: float | None = None
    compute_s: float | None = None
    allreduce_wait_s: float | None = None
    rank_compute_s: list[float] = field(default_factory=list)
    cursor: int | None = None
    last_error: str | None = None
    failure: FailureClass | None = None
    failed_node: str | None = None
    evidence: list[str] = field(default_factory=list)
    exit_code: int | None = None
    #: The supervisor's launch number within this Slurm job run (0, 1, ... after relaunches);
    #: set by the supervisor's own reports, optional for the worker's (it may read
    #: `FTHSDP_LAUNCH`). The coordinator keys its decisions on (job, restarts, launch).
    launch: int | None = None
    #: Slurm's restart count of the job (`SLURM_RESTART_COUNT`), when the sender knows it.
    restarts: int | None = None
    sent_at: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaReport:
        """Build from decoded JSON, refusing unknown keys and wrong basic types."""
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown report fields: {sorted(unknown)}")
        for key in ("replica", "seq"):
            if not isinstance(data.get(key), int) or isinstance(data.get(key), bool):
                raise ValueError(f"report field {key!r} must be an integer")
        if not isinstance(data.get("incarnation"), str):
            raise ValueError("report field 'incarnation' must be a string")
        if data.get("kind", "status") not in ("status", "fatal"):
            raise ValueError("report field 'kind' must be 'status' or 'fatal'")
        for key in ("launch", "restarts"):
            value = data.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"report field {key!r} must be null or an integer")
        if data.get("failure") not in (None, "process", "node"):
            raise ValueError("report field 'failure' must be null, 'process' or 'node'")
        return cls(**data)


def create_secret(path: Path) -> bytes:
    """Create the run secret with mode 0600 (atomically: it is never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return read_secret(path)


def read_secret(path: Path) -> bytes:
    return path.read_text().strip().encode()


def _mac(secret: bytes, timestamp: str, nonce: str, body: bytes) -> str:
    msg = timestamp.encode() + b"." + nonce.encode() + b"." + body
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def sign(secret: bytes, body: bytes, now: float | None = None) -> dict[str, str]:
    """Headers that authenticate `body` for the coordinator."""
    timestamp = str(int(now if now is not None else time.time()))
    nonce = secrets.token_hex(12)
    return {
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: _mac(secret, timestamp, nonce, body),
    }


class SignatureError(ValueError):
    """The report is not authentic, or is stale."""


def verify(
    secret: bytes, body: bytes, headers: dict[str, str] | Any, now: float | None = None
) -> str:
    """Check a signed body; returns the nonce (the caller rejects nonces it has seen)."""
    try:
        timestamp = headers[TIMESTAMP_HEADER]
        nonce = headers[NONCE_HEADER]
        signature = headers[SIGNATURE_HEADER]
    except KeyError as exc:
        raise SignatureError(f"missing header {exc.args[0]}") from None
    expected = _mac(secret, timestamp, nonce, body)
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("bad signature")
    try:
        sent = int(timestamp)
    except ValueError:
        raise SignatureError("bad timestamp") from None
    current = now if now is not None else time.time()
    if abs(current - sent) > MAX_CLOCK_SKEW_S:
        raise SignatureError(f"stale report ({current - sent:.0f}s old)")
    return str(nonce)
