"""Whether the Epilog acts on a run's drain request, and the root-owned ledger that limits them.

A job user may not drain a node, so a run that finds a node bad (a straggler, a silent replica,
a hung trainer, an operator's `fthsdp requeue --drain`) writes a request into its own job's
comment (`slurm.drain_request`) and requeues the job; the Epilog, as root on each node of the
ending job, reads the comment from slurmctld. Everything in the comment is the user's, so the
Epilog believes only what Slurm itself says: the job id, the job's owner (`SLURM_JOB_USER` /
`SLURM_JOB_UID`, set by slurmd), and that the Epilog runs on this node (Slurm runs a job's
Epilog only on the nodes it held). `judge` is the pure policy, tested by tables:

- `off`: every request is logged and ignored;
- `recheck` (the default): the node's full suite runs now and the node is drained only on a
  finding, its reason saying which job and user asked (`annotate`);
- `trust`: the node is drained `fthsdp: requested: job J user U: KIND: DETAIL`.

Whatever the policy, a request is refused when it names another node, when its (job, seq) was
handled here before (a requeued job's Epilog sees the same comment again), when its user made
`limit` requests here in the last day, when (under `trust`) the user's requests already keep
`limit` nodes of the cluster drained, or when the node carries someone else's drain. A
`requested` drain is resumed by HealthCheckProgram like a fault drain once the node passes its
checks, but not within `hold_s` of the drain (`resume_hold`), so a user cannot keep a healthy
node out for long, and an operator can still see it.

The ledger is one JSON file in the hooks' root-owned state_dir, 0600, written whole and renamed,
under an flock of its own. It is read strictly: a file of the wrong owner, mode or shape is not
repaired or guessed at; every request is refused (and logged) until an operator removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prolog_epilog.config import POLICIES
from prolog_epilog.state import flock_within
from slurm.backend import drain_reason
from slurm.drain_request import DrainRequest, printable
from slurm.records import NodeInfo

#: The drain kind a trusted request gives; HealthCheckProgram resumes it after `hold_s`.
REQUESTED = "requested"
LEDGER_FILE = "drain_requests.json"
LEDGER_LOCK = "drain_requests.lock"
LEDGER_VERSION = 1
#: A request counts against its user's limit for this long.
DAY_S = 86400.0
#: Handled (job, seq) pairs are remembered this long: a job requeued within it is not re-judged.
KEEP_S = 30 * DAY_S
#: The most events kept; the oldest go first (each is one ended job on this node).
KEEP_MAX = 20000
_EVENT_KEYS = {"job": str, "seq": int, "user": str, "at": float, "counted": bool}


class LedgerError(RuntimeError):
    """The ledger cannot be trusted or read; the message is one line naming the file."""


@dataclass(frozen=True)
class Event:
    """One request judged on this node: `counted` when it counts against the user's limit."""

    job: str
    seq: int
    user: str
    at: float
    counted: bool


@dataclass(frozen=True)
class Verdict:
    """What the Epilog does about a request: `refuse` (log `why`), `skip` (handled before),
    `recheck` (run the full suite; drain only on a finding) or `drain` (with `reason`).
    `record` is the event to add to the ledger (None: the ledger is not changed)."""

    action: str
    why: str
    reason: str | None = None
    record: Event | None = None


def requested_reason(job: str, user: str, request: DrainRequest) -> str:
    """`fthsdp: requested: job J user U: KIND: DETAIL`, cut to Slurm's reason length (the
    job, user and kind come first, so they survive the cut)."""
    return drain_reason(REQUESTED, f"job {job} user {user}: {request.kind}: {request.detail}")


def annotate(reason: str, job: str, user: str) -> str:
    """A finding's drain reason with who asked for the check inserted after its kind:
    `fthsdp: xid: requested by job J user U: Xid 79 ...` (the kind stays the finding's, so the
    drain is resumed like any fault drain)."""
    _, _, rest = reason.partition(":")
    kind, _, detail = rest.strip().partition(":")
    return drain_reason(kind.strip(), f"requested by job {job} user {user}: {detail.strip()}")


_REQUESTED_BY = re.compile(r"^fthsdp: requested: job [0-9]+ user (?P<user>[^:\s]+):")


def requested_user(reason: str) -> str | None:
    """The user whose trusted request made this drain reason, else None."""
    m = _REQUESTED_BY.match(reason)
    return m["user"] if m else None


def nodes_drained_for(user: str, nodes: Sequence[NodeInfo]) -> int:
    """How many of `nodes` are drained now by `user`'s trusted requests."""
    return sum(1 for n in nodes if n.drained and requested_user(n.reason) == user)


def judge(
    request: DrainRequest,
    *,
    policy: str,
    job: str,
    user: str | None,
    node: str,
    events: Sequence[Event] | None,
    limit: int,
    node_info: NodeInfo | None,
    user_drained: int | None,
    now: float,
) -> Verdict:
    """The Epilog's answer to one well-formed request of job `job` on node `node`.

    `events` is the ledger (None: unreadable); `node_info` this node as Slurm shows it now (None:
    unreadable); `user_drained` how many nodes the user's trusted requests keep drained now
    (None: unreadable; only read under `trust`). Anything unreadable refuses: no action is
    taken on a guess.
    """
    if policy not in POLICIES or policy == "off":
        return Verdict("refuse", f"drain requests are {policy!r} (actions.drain_requests)")
    if not user:
        return Verdict("refuse", "the job's owner is unknown (no SLURM_JOB_USER/SLURM_JOB_UID)")
    if request.node != node:
        return Verdict("refuse", f"names node {request.node}, not {node}, where the job ran")
    if events is None:
        return Verdict("refuse", "the drain-request ledger is unusable")
    if any(e.job == job and e.seq == request.seq for e in events):
        return Verdict("skip", f"seq {request.seq} of job {job} was handled before")
    seen = Event(job, request.seq, user, now, False)
    used = sum(1 for e in events if e.counted and e.user == user and now - e.at < DAY_S)
    if used >= limit:
        return Verdict(
            "refuse", f"user {user} made {used} requests here in 24 h (limit {limit})", None, seen
        )
    counted = Event(job, request.seq, user, now, True)
    if node_info is None:  # not recorded: a later Epilog of the job may read it
        return Verdict("refuse", "the node's state is unreadable")
    if node_info.foreign_reason:
        return Verdict(
            "refuse",
            f"the node carries another drain ({node_info.reason}), left as is",
            None,
            seen,
        )
    if policy == "recheck":
        return Verdict("recheck", "the node's full checks run now", None, counted)
    if node_info.drained:
        return Verdict("refuse", f"already drained by fthsdp ({node_info.reason})", None, seen)
    if user_drained is None:
        return Verdict("refuse", "the cluster's drained nodes are unreadable")
    if user_drained >= limit:
        return Verdict(
            "refuse",
            f"user {user}'s requests keep {user_drained} nodes drained (limit {limit})",
            None,
            seen,
        )
    return Verdict("drain", "trusted request", requested_reason(job, user, request), counted)


def resume_hold(
    reason: str, drained_at: float | None, now: float, hold_s: float
) -> tuple[str | None, float | None]:
    """(why a passing node is not resumed yet, the drain time to remember) for HealthCheckProgram.

    Only a `requested` drain is held. Its time comes from the state the Epilog wrote when it
    drained; when that is missing (drained by an older hook, a lost state file) the hold starts
    now, so such a drain is still resumed, `hold_s` later.
    """
    if not reason.startswith(f"fthsdp: {REQUESTED}:"):
        return None, None
    at = drained_at if drained_at is not None and drained_at <= now else now
    left = at + hold_s - now
    if left > 0:
        return f"a requested drain is held {hold_s:.0f}s ({left:.0f}s left)", at
    return None, at


# -- the ledger -------------------------------------------------------------------------------


def parse_ledger(text: str, where: str) -> list[Event]:
    """The events in a ledger file's text; anything but the exact shape raises LedgerError."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise LedgerError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict) or set(data) != {"version", "events"}:
        raise LedgerError(f"{where}: not a ledger (keys version, events)")
    if data["version"] != LEDGER_VERSION:
        raise LedgerError(f"{where}: version {data['version']!r}, not {LEDGER_VERSION}")
    if not isinstance(data["events"], list):
        raise LedgerError(f"{where}: events is not a list")
    out = []
    for i, raw in enumerate(data["events"]):
        if not isinstance(raw, dict) or set(raw) != set(_EVENT_KEYS):
            raise LedgerError(f"{where}: events[{i}] has not the keys {sorted(_EVENT_KEYS)}")
        for key, kind in _EVENT_KEYS.items():
            value = raw[key]
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
            if kind is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok:
                raise LedgerError(f"{where}: events[{i}].{key} is {value!r}, not {kind.__name__}")
        out.append(Event(raw["job"], raw["seq"], raw["user"], float(raw["at"]), raw["counted"]))
    return out


def ledger_text(events: Sequence[Event], now: float) -> str:
    """The file text for `events`, without those older than `KEEP_S` and at most `KEEP_MAX`."""
    kept = [e for e in events if now - e.at < KEEP_S][-KEEP_MAX:]
    return json.dumps(
        {"version": LEDGER_VERSION, "events": [e.__dict__ for e in kept]}, sort_keys=True
    )


def _trusted(st: os.stat_result, what: str) -> None:
    if st.st_uid not in (0, os.geteuid()):
        raise LedgerError(f"{what}: owned by uid {st.st_uid}, not root")
    if st.st_mode & 0o077:
        raise LedgerError(f"{what}: mode {stat.S_IMODE(st.st_mode):o}, not 0600")


class Ledger:
    """The ledger in `directory` (the hooks' state_dir, which `state.private_dir` vouches for)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LEDGER_FILE

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Hold the ledger's own flock for a read-judge-write; LedgerError when not had in time."""
        lock = self.directory / LEDGER_LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise LedgerError(f"{lock}: {exc.strerror}") from None
        try:
            _trusted(os.fstat(fd), str(lock))
            try:
                held = flock_within(fd, timeout)
            except OSError as exc:
                raise LedgerError(f"{lock}: {exc.strerror}") from None
            if not held:
                raise LedgerError(f"{lock}: held by another hook for {timeout:g}s")
            yield
        finally:
            os.close(fd)

    def read(self) -> list[Event]:
        """The events; none when the file does not exist; LedgerError when it is not trusted."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LedgerError(f"{self.path}: {exc.strerror}") from None
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise LedgerError(f"{self.path}: not a regular file")
            _trusted(st, str(self.path))
            try:
                text = f.read(8 * 1024 * 1024 + 1)
            except (OSError, UnicodeDecodeError) as exc:
                raise LedgerError(f"{self.path}: unreadable ({exc})") from None
        if len(text) > 8 * 1024 * 1024:
            raise LedgerError(f"{self.path}: larger than 8 MiB")
        return parse_ledger(text, str(self.path))

    def write(self, events: Sequence[Event], now: float) -> None:
        """Replace the file with `events` (0600, written whole, then renamed into place)."""
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".drain_requests")
            with os.fdopen(fd, "w") as f:
                f.write(ledger_text(events, now))
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            raise LedgerError(f"{self.path}: not written ({exc.strerror})") from None


def refusal_line(job: str, user: str | None, node: str, why: str) -> str:
    """The one log line for a request not acted on: job, user, node and why."""
    return f"drain request refused: job {job} user {user or '?'} node {node}: {printable(why, 300)}"


def job_user(env: dict[str, str]) -> str | None:
    """The job's owner as slurmd tells the Epilog (`SLURM_JOB_USER`, else `SLURM_JOB_UID`'s
    name), never anything the job wrote; None when neither is usable."""
    name = env.get("SLURM_JOB_USER", "")
    if name and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}", name):
        return name
    uid = env.get("SLURM_JOB_UID", "")
    if uid.isdigit():
        import pwd

        try:
            return pwd.getpwuid(int(uid)).pw_name
        except KeyError:
            return f"uid{uid}"
    return None


def as_record(verdict: Verdict, request: DrainRequest | None) -> dict[str, Any]:
    """What the Epilog's JSON line says about a request."""
    out: dict[str, Any] = {"action": verdict.action, "why": verdict.why}
    if request is not None:
        out.update(seq=request.seq, node=request.node, kind=request.kind)
    if verdict.reason:
        out["reason"] = verdict.reason
    return out
