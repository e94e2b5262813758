"""The wire protocol: what a replica leader tells the coordinator, and how it is authenticated.

This module is the protocol's one home: the messages (`ReplicaReport`, `RequeueRequest`), their
field validation, the exit codes, the per-replica keys (`derive_key`, `replica_key_id`) and the
request signature (`sign`, `verify`, `signed_headers`, `check_fresh`), the coordinator's signed
answers (`answer_headers`, `verify_answer`) and the directive a supervisor acts on
(`DirectiveAnswer`). The run secret the keys derive from is the run directory's
(`slurm.rundir.secret`).

Group rank 0 of each replica sends a `ReplicaReport` every few steps and a final one, with the
failure classified, when it dies. The coordinator acts on these reports (requeue a job, drain a
node), so a report must be provably from the run: the body is signed with HMAC-SHA256 using the
replica's own key, derived from the run's secret (`run_dir/secret`, mode 0600), over the method,
path, timestamp, nonce and body (`sign`). The coordinator rejects a request whose signature is
wrong, whose timestamp is outside a window, or whose nonce it has seen (a replay), and a report
whose fields are not all of the documented type, size and range (`ReplicaReport.from_dict`).
The exit codes below are the worker's contract with the replica job's supervisor.

The answers go the other way and are signed too: whoever answers at `control.json`'s address
(the port is free while the control job is requeued, and the traffic is plain HTTP) must not be
able to end a replica with `{"directive": "exit"}`. The coordinator's answer to a signed request
carries a MAC under the same key, over the request's method, path and nonce and the answer's
body (`answer_headers`); the supervisor acts only on an answer whose MAC verifies for the nonce
it sent itself, with every field in range (`DirectiveAnswer.from_answer`).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import math
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SIGNATURE_HEADER = "X-Fthsdp-Signature"
KEY_HEADER = "X-Fthsdp-Key"
TIMESTAMP_HEADER = "X-Fthsdp-Timestamp"
NONCE_HEADER = "X-Fthsdp-Nonce"
#: The MAC of the coordinator's answer (`answer_headers`).
ANSWER_HEADER = "X-Fthsdp-Answer-Signature"
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
        """Build from decoded JSON; every field's type, size and range is checked (`ValueError`).

        A report is journaled and replayed, so a value the policy or `/v1/state` cannot use
        must be refused here, before anything is stored.
        """
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown report fields: {sorted(unknown)[:5]}")
        return cls(
            replica=_int(data, "replica", 0, MAX_REPLICAS, required=True),
            incarnation=_text(data, "incarnation", 128, required=True),
            seq=_int(data, "seq", 0, MAX_INT, required=True),
            kind=_choice(data, "kind", ("status", "fatal"), "status"),
            job_id=_job_id(data, "job_id"),
            nodes=_node_list(data, "nodes", MAX_NODES),
            step=_int(data, "step", 0, MAX_INT) or 0,
            quorum_id=_int(data, "quorum_id", -1, MAX_INT, default=-1),
            participants=_int(data, "participants", 0, MAX_REPLICAS) or 0,
            healing=_bool(data, "healing"),
            step_time_s=_seconds(data, "step_time_s"),
            compute_s=_seconds(data, "compute_s"),
            allreduce_wait_s=_seconds(data, "allreduce_wait_s"),
            rank_compute_s=_seconds_list(data, "rank_compute_s", MAX_RANKS),
            cursor=_int(data, "cursor", 0, MAX_INT),
            last_error=_text(data, "last_error", 2000),
            failure=_choice(data, "failure", ("process", "node"), None),
            failed_node=_node(data, "failed_node"),
            evidence=_text_list(data, "evidence", 16, 500),
            exit_code=_int(data, "exit_code", -255, 255),
            launch=_int(data, "launch", 0, MAX_INT),
            restarts=_int(data, "restarts", 0, MAX_INT),
            sent_at=_number(data, "sent_at", 0.0, 1e11, default=time.time()) or 0.0,
        )


# -- field checks (shared by every message type) ---------------------------------------------

#: Largest replica index / participant count accepted, and the largest counter.
MAX_REPLICAS = 100_000
MAX_INT = 2**62
MAX_NODES = 4096
MAX_RANKS = 65_536
#: One Slurm node name: no hostlist expressions (`[`, `,`), no spaces, no shell metacharacters.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: A plain Slurm job id (replica jobs are neither array nor heterogeneous components).
JOB_ID = re.compile(r"[0-9]{1,12}")
_MISSING = object()


def _get(data: dict[str, Any], key: str, required: bool) -> Any:
    value = data.get(key, _MISSING)
    if value is _MISSING and required:
        raise ValueError(f"field {key!r} is required")
    return None if value is _MISSING else value


def _int(
    data: dict[str, Any],
    key: str,
    low: int,
    high: int,
    required: bool = False,
    default: int | None = None,
) -> Any:
    value = _get(data, key, required)
    if value is None:
        if required:
            raise ValueError(f"field {key!r} must be an integer")
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"field {key!r} must be an integer in {low}..{high}, got {value!r:.40}")
    return value


def _number(
    data: dict[str, Any], key: str, low: float, high: float, default: float | None = None
) -> float | None:
    value = _get(data, key, False)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"field {key!r} must be a number in {low:g}..{high:g}, got {value!r:.40}")
    return float(value)


def _seconds(data: dict[str, Any], key: str) -> float | None:
    return _number(data, key, 0.0, 1e7)


def _bool(data: dict[str, Any], key: str) -> bool:
    value = _get(data, key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"field {key!r} must be true or false, got {value!r:.40}")
    return value


def _text(data: dict[str, Any], key: str, size: int, required: bool = False) -> Any:
    value = _get(data, key, required)
    if value is None and not required:
        return None
    if not isinstance(value, str) or len(value) > size:
        raise ValueError(f"field {key!r} must be a string of at most {size} characters")
    return value


def _choice(data: dict[str, Any], key: str, allowed: tuple[str, ...], default: Any) -> Any:
    value = _get(data, key, False)
    if value is None:
        return default
    if value not in allowed:
        raise ValueError(f"field {key!r} must be one of {allowed}, got {value!r:.40}")
    return value


def check_node(value: Any, key: str = "node") -> str:
    """One Slurm node name, or `ValueError` (a list, a hostlist expression, a wrong type)."""
    if not isinstance(value, str) or not NODE_NAME.fullmatch(value):
        raise ValueError(f"field {key!r} must be one Slurm node name, got {value!r:.40}")
    return value


def _node(data: dict[str, Any], key: str) -> str | None:
    value = _get(data, key, False)
    return None if value is None else check_node(value, key)


def _node_list(data: dict[str, Any], key: str, size: int) -> list[str]:
    value = _get(data, key, False)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > size:
        raise ValueError(f"field {key!r} must be a list of at most {size} node names")
    return [check_node(v, key) for v in value]


def _job_id(data: dict[str, Any], key: str) -> str | None:
    value = _get(data, key, False)
    if value is None:
        return None
    if not isinstance(value, str) or not JOB_ID.fullmatch(value):
        raise ValueError(f"field {key!r} must be a Slurm job id (digits), got {value!r:.40}")
    return value


def _text_list(data: dict[str, Any], key: str, count: int, size: int) -> list[str]:
    value = _get(data, key, False)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > count:
        raise ValueError(f"field {key!r} must be a list of at most {count} strings")
    if not all(isinstance(v, str) and len(v) <= size for v in value):
        raise ValueError(f"field {key!r} must hold strings of at most {size} characters")
    return list(value)


def _seconds_list(data: dict[str, Any], key: str, count: int) -> list[float]:
    value = _get(data, key, False)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > count:
        raise ValueError(f"field {key!r} must be a list of at most {count} numbers")
    return [float(_number({key: v}, key, 0.0, 1e7) or 0.0) for v in value]


@dataclass(frozen=True)
class RequeueRequest:
    """`POST /v1/requeue` (`fthsdp requeue`, signed with the control key)."""

    replica: int
    drain: str | None = None
    reason: str = "requeued by operator"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequeueRequest:
        unknown = set(data) - {"replica", "drain", "reason"}
        if unknown:
            raise ValueError(f"unknown requeue fields: {sorted(unknown)[:5]}")
        reason = _text(data, "reason", 200) or "requeued by operator"
        if not reason.isprintable():
            raise ValueError("field 'reason' must be printable text on one line")
        return cls(
            replica=_int(data, "replica", 0, MAX_REPLICAS, required=True),
            drain=_node(data, "drain"),
            reason=reason,
        )


#: Key ids: each replica signs with its own key, the operator's commands with another.
CONTROL_KEY = "control"


def replica_key_id(replica: int) -> str:
    return f"replica-{replica}"


def derive_key(secret: bytes, key_id: str) -> bytes:
    """The signing key for `key_id` (`control` or `replica-K`), derived from the run secret.

    A report signed with replica 2's key is refused for replica 3 and on the operator's
    endpoints, so a buggy or stale process of one replica cannot speak for another or
    requeue through `/v1/requeue`.
    """
    return hmac.new(secret, b"fthsdp-key:" + key_id.encode(), hashlib.sha256).digest()


def _mac(key: bytes, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    head = "\n".join((method.upper(), path, timestamp, nonce)).encode()
    return hmac.new(key, head + b"\n" + body, hashlib.sha256).hexdigest()


def sign(
    secret: bytes,
    key_id: str,
    method: str,
    path: str,
    body: bytes = b"",
    now: float | None = None,
) -> dict[str, str]:
    """Headers that authenticate `method path` with `body` for the coordinator.

    The MAC covers the method, the path (with its query string), the timestamp, the nonce and
    the body, so a signed request cannot be replayed to another endpoint.
    """
    timestamp = str(int(now if now is not None else time.time()))
    nonce = secrets.token_hex(12)
    key = derive_key(secret, key_id)
    return {
        KEY_HEADER: key_id,
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: _mac(key, method, path, timestamp, nonce, body),
    }


class SignatureError(ValueError):
    """The report is not authentic, or is stale."""


_KEY_ID = re.compile(r"control|replica-[0-9]{1,6}")
_NONCE = re.compile(r"[0-9a-f]{8,64}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")


def signed_headers(headers: Any) -> tuple[str, str, str, str]:
    """(key id, timestamp, nonce, signature) if all are present and well formed."""
    try:
        key_id = str(headers[KEY_HEADER])
        timestamp = str(headers[TIMESTAMP_HEADER])
        nonce = str(headers[NONCE_HEADER])
        signature = str(headers[SIGNATURE_HEADER])
    except KeyError as exc:
        raise SignatureError(f"missing header {exc.args[0]}") from None
    if not _KEY_ID.fullmatch(key_id) or not _NONCE.fullmatch(nonce):
        raise SignatureError("bad key id or nonce")
    # ASCII only: `str.isdigit` takes "²", and `hmac.compare_digest` raises on non-ASCII text.
    if not _TIMESTAMP.fullmatch(timestamp) or not _SIGNATURE.fullmatch(signature):
        raise SignatureError("bad timestamp or signature")
    return key_id, timestamp, nonce, signature


def check_fresh(timestamp: str, now: float | None = None) -> None:
    current = now if now is not None else time.time()
    if abs(current - int(timestamp)) > MAX_CLOCK_SKEW_S:
        raise SignatureError(f"stale request ({current - int(timestamp):.0f}s old)")


def verify(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str] | Any,
    now: float | None = None,
) -> str:
    """Check a signed request made with `key`; returns the nonce (the caller refuses replays)."""
    _, timestamp, nonce, signature = signed_headers(headers)
    expected = _mac(key, method, path, timestamp, nonce, body)
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("bad signature")
    check_fresh(timestamp, now)
    return nonce


def _answer_mac(key: bytes, method: str, path: str, nonce: str, body: bytes) -> str:
    # The leading tag keeps an answer's MAC from ever equalling a request's under the same key.
    head = "\n".join(("fthsdp-answer", method.upper(), path, nonce)).encode()
    return hmac.new(key, head + b"\n" + body, hashlib.sha256).hexdigest()


def answer_headers(key: bytes, method: str, path: str, nonce: str, body: bytes) -> dict[str, str]:
    """The header that authenticates the coordinator's answer `body` to the signed request
    `method path` with `nonce`: an answer cannot be replayed to another request or endpoint."""
    return {ANSWER_HEADER: _answer_mac(key, method, path, nonce, body)}


def verify_answer(
    key: bytes, method: str, path: str, nonce: str, body: bytes, headers: Any
) -> None:
    """Check that `body` answers our request `method path` with `nonce`; `SignatureError` if not."""
    given = headers.get(ANSWER_HEADER) if headers is not None else None
    if not isinstance(given, str) or len(given) != 64 or not given.isascii():
        raise SignatureError("answer not signed")
    if not hmac.compare_digest(_answer_mac(key, method, path, nonce, body), given):
        raise SignatureError("bad answer signature")


#: What a supervisor may be told after its step ended (`runtime.control.supervisor`).
DIRECTIVES = ("continue", "relaunch", "requeue", "exit")
#: The longest wait before a relaunch a directive may ask for; the coordinator caps its backoff
#: here, and a supervisor refuses a longer one.
MAX_DIRECTIVE_DELAY_S = 3600.0


@dataclass(frozen=True)
class DirectiveAnswer:
    """The answer to `GET /v1/replicas/{k}/directive`, for the epoch (restarts, launch) asked."""

    directive: str
    delay_s: float
    restarts: int
    launch: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_answer(cls, body: bytes, restarts: int, launch: int) -> DirectiveAnswer:
        """The answer in `body`, for the epoch asked about; `ValueError` for anything else (not
        JSON, NaN, a directive outside `DIRECTIVES`, a delay outside 0..MAX_DIRECTIVE_DELAY_S,
        another epoch)."""
        data = json.loads(body, parse_constant=_no_constant)
        if not isinstance(data, dict):
            raise ValueError("the answer is not a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown answer fields: {sorted(unknown)[:5]}")
        found = cls(
            directive=_choice(data, "directive", DIRECTIVES, None),
            delay_s=_number(data, "delay_s", 0.0, MAX_DIRECTIVE_DELAY_S, default=0.0) or 0.0,
            restarts=_int(data, "restarts", 0, MAX_INT, required=True),
            launch=_int(data, "launch", 0, MAX_INT, required=True),
        )
        if found.directive is None:
            raise ValueError("field 'directive' is required")
        if (found.restarts, found.launch) != (restarts, launch):
            raise ValueError(
                f"answer for epoch {found.restarts}.{found.launch}, not {restarts}.{launch}"
            )
        return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
