"""What a verdict does to the node: drain, resume, or nothing; and the epilog's clean-up.

`decide` is the pure policy (tested by tables): drain a node that fails unless an administrator
drained it for another reason; in HealthCheckProgram mode resume a node only when it is drained
with our `fthsdp:` prefix, has passed `resume_after_passes` runs in a row and fthsdp's prolog did
not fail on it moments ago. `apply` carries the decision out through
`slurm.backend.CommandBackend`, whose own `drain`/`resume` re-read the node and re-check
ownership of the reason, so a race with an administrator cannot overwrite their reason.

What a job may ask for is narrow: `requested_checks` keeps only the names on the operator's
allow-list, and `split_verdict` lets such a check drain the node only when it finds a fault; its
errors (a tool missing, a timeout) are the job's problem (`fail_job`), never the node's.

Slurm drains a node whose prolog exited non-zero with the reason `Prolog error`, unless the
node is already drained (docs/design-facts.md, Slurm fact 3). The prolog drains with an `fthsdp:`
reason before it exits, and records its failure in the root-owned state_dir; when that drain could
not be made (slurmctld unreachable, the hook's hard deadline), `claim_prolog_error` renames the
following `Prolog error` to an `fthsdp:` reason, so fthsdp resumes the node once it passes again.

The epilog clean-up kills what the finished job's user left running on that job's GPUs (each
process re-checked, owner and start time, right before it is signalled, so a reused pid is never
hit) and, when the user has nothing else running on the node, removes their files from /dev/shm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prolog_epilog.checks.base import CheckResult
from prolog_epilog.gpu_source import GpuSource
from prolog_epilog.records import GpuProcess, normalize_bus
from prolog_epilog.runner import SuiteResult, verdict
from slurm.backend import DRAIN_PREFIX, CommandBackend, NodeInfo, SlurmCommandError, drain_reason

log = logging.getLogger("fthsdp.health")


@dataclass(frozen=True)
class Decision:
    action: str  # drain | resume | none
    why: str
    reason: str | None = None


#: fthsdp drains that no health check can judge: a slow node passes every check, and an
#: operator's `requeue --drain` had reasons of their own. Passing checks does not undo them.
LEFT_TO_OPERATOR = frozenset({"straggler", "manual"})


def drain_kind(reason: str) -> str:
    """`straggler` for `fthsdp: straggler: node2 2.7x`; empty for a reason not ours."""
    if not reason.startswith(DRAIN_PREFIX):
        return ""
    return reason[len(DRAIN_PREFIX) :].strip().split(":", 1)[0].strip()


def decide(
    mode: str,
    suite: SuiteResult,
    node: NodeInfo | None,
    passes: int,
    resume_after: int,
    drain_enabled: bool = True,
    hold: str | None = None,
) -> Decision:
    """The node action for one run. `passes` counts consecutive healthy runs including this one;
    `hold` (why not now) keeps a node drained that would otherwise be resumed."""
    drained = node is not None and node.drained
    ours = node is not None and node.drained_by_us
    if not suite.healthy:
        if not drain_enabled:
            return Decision("none", "unhealthy; draining disabled")
        if drained and not ours:
            return Decision("none", f"unhealthy; admin drain kept ({node.reason if node else ''})")
        if ours and node is not None and node.reason == suite.drain_reason:
            return Decision("none", "unhealthy; already drained with this reason")
        return Decision("drain", "unhealthy", suite.drain_reason)
    if mode != "healthcheck":
        return Decision("none", "healthy")
    if not drained:
        return Decision("none", "healthy")
    if not ours:
        return Decision("none", "healthy; admin drain left alone")
    kind = drain_kind(node.reason if node is not None else "")
    if kind in LEFT_TO_OPERATOR:
        return Decision("none", f"healthy; a {kind} drain is the operator's to resume")
    if passes < resume_after:
        return Decision("none", f"healthy {passes}/{resume_after} before resume")
    if hold:
        return Decision("none", f"healthy; not resumed yet: {hold}")
    return Decision("resume", f"healthy {passes} time(s) in a row")


def apply(decision: Decision, node: str, backend: CommandBackend) -> bool:
    """Carry out a decision; returns True if Slurm was changed. Never raises for Slurm errors."""
    try:
        if decision.action == "drain" and decision.reason:
            done = backend.drain(node, decision.reason)
            log.warning(
                "drain %s: %s (%s)", node, decision.reason, "done" if done else "kept admin drain"
            )
            return done
        if decision.action == "resume":
            done = backend.resume(node)
            log.warning("resume %s: %s (%s)", node, decision.why, "done" if done else "not ours")
            return done
    except SlurmCommandError as exc:
        log.error("slurm action %s on %s failed: %s", decision.action, node, exc)
    return False


def job_requested_checks(comment: str) -> list[str]:
    """Checks named in a job comment `fthsdp-health:a,b` (other comment text is ignored)."""
    m = re.search(r"fthsdp-health:([\w,\-]+)", comment or "")
    return [c for c in m.group(1).split(",") if c] if m else []


def requested_checks(
    asked: Sequence[str], allowed: Sequence[str], suite: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(checks to add to the suite, names refused) for what a job asked for: only names on the
    operator's allow-list are added; what the suite already runs stays the operator's check."""
    added: list[str] = []
    refused: list[str] = []
    for raw in asked:
        name = raw.strip()
        if not name or name in suite or name in added:
            continue
        (added if name in allowed else refused).append(name)
    return added, sorted(set(refused))


def split_verdict(
    suite: SuiteResult, requested: Sequence[str], on_error: str
) -> tuple[SuiteResult, list[CheckResult]]:
    """(the node's verdict, the job's errored checks). A check only the job asked for counts
    against the node when it fails (a fault found), never when it errors: a tool missing or a
    timeout is not a fault of the node, and a job user must not be able to drain it that way."""
    asked = set(requested)
    node_checks = [c for c in suite.checks if c.name not in asked or c.status == "fail"]
    healthy, reason = verdict(node_checks, on_error)
    job_errors = [c for c in suite.checks if c.name in asked and c.status == "error"]
    return dataclasses.replace(suite, healthy=healthy, drain_reason=reason), job_errors


#: The reason Slurm gives a node whose prolog exited non-zero (when it was not drained yet).
PROLOG_ERROR = "Prolog error"


def prolog_failure(state: dict[str, Any] | None, now: float) -> float | None:
    """Seconds since fthsdp's prolog last failed on this node (None if never, or unreadable)."""
    if not isinstance(state, dict):
        return None
    at = state.get("at")
    if not isinstance(at, int | float) or isinstance(at, bool) or at > now:
        return None
    return now - float(at)


def claimable(node: NodeInfo | None, since_failure: float | None, window: float) -> bool:
    """A `Prolog error` drain that follows a recorded failure of fthsdp's prolog is ours."""
    return (
        node is not None
        and node.drained
        and node.reason == PROLOG_ERROR
        and since_failure is not None
        and since_failure <= window
    )


def claim_prolog_error(node: str, detail: str, backend: CommandBackend) -> bool:
    """Rename a `Prolog error` drain of `node` to an `fthsdp:` reason, re-reading the node right
    before (any other reason is left as is); True when renamed. Never raises for Slurm."""
    reason = drain_reason("prolog", detail)
    try:
        if not backend.take_over_drain(node, PROLOG_ERROR, reason):
            return False
    except SlurmCommandError as exc:
        log.error("could not take over the Prolog error drain of %s: %s", node, exc)
        return False
    log.warning("drain %s: %r follows fthsdp's prolog failure; now %r", node, PROLOG_ERROR, reason)
    return True


def fail_job(job_id: str, why: str, backend: CommandBackend) -> bool:
    """Cancel one job (its own check could not run), saying why in its AdminComment; the node is
    left in service. True when cancelled. Never raises for Slurm."""
    if not job_id.isdigit():
        log.error("not cancelling job %r: not a job id", job_id)
        return False
    with contextlib.suppress(SlurmCommandError):
        backend.annotate_job(job_id, f"fthsdp: {why}")
    try:
        backend.cancel([job_id])
    except SlurmCommandError as exc:
        log.error("could not cancel job %s: %s", job_id, exc)
        return False
    log.warning("cancelled job %s: %s (node stays in service)", job_id, why)
    return True


def ending_job_comment(env: dict[str, str], job_id: str, backend: CommandBackend) -> str:
    """The ending job's comment in the Epilog. slurmd passes it as `SLURM_JOB_COMMENT`, as it is
    in slurmctld when the job ends (an update by the owner while it ran included), and leaves
    the variable out when there is none, in an environment it builds itself (a job cannot add
    to it); seen on 22.05, 24.11 and 26.05. So the Epilog of each node need not ask slurmctld,
    which matters when a large job ends on all its nodes at once. Run any other way (no
    `SLURM_SCRIPT_CONTEXT=epilog_slurmd`), the comment is read from slurmctld."""
    if "SLURM_JOB_COMMENT" in env:
        return env["SLURM_JOB_COMMENT"]
    if env.get("SLURM_SCRIPT_CONTEXT") == "epilog_slurmd":
        return ""
    return job_comment(job_id, backend)


def job_comment(job_id: str, backend: CommandBackend) -> str:
    try:
        jobs = backend.jobs([job_id])
    except (SlurmCommandError, ValueError) as exc:
        log.warning("could not read job %s comment: %s", job_id, exc)
        return ""
    return jobs[0].comment if jobs else ""


# -- epilog clean-up ----------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessId:
    """A process as it was when chosen: a pid alone may name another process by the time it is
    signalled (the stray exits, the pid is reused), so its owner and start time come along."""

    pid: int
    uid: int
    start: int  # /proc/PID/stat field 22: clock ticks after boot


def process_id(pid: int, proc: Path = Path("/proc")) -> ProcessId | None:
    """The process `pid` is now (owner and start time), None when it is gone (or a zombie) or
    unreadable."""
    try:
        uid = os.stat(proc / str(pid)).st_uid
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and ')'.
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 20 or not fields[19].isdigit() or fields[0] in ("Z", "X"):
        return None  # a zombie has exited already: there is nothing left to signal
    return ProcessId(pid, uid, int(fields[19]))


def stray_processes(
    procs: list[GpuProcess],
    bus_to_index: dict[tuple[int, int, int] | None, int],
    uid: int,
    job_gpus: set[int] | None,
) -> list[ProcessId]:
    """The processes on the job's GPUs (all GPUs if unknown) owned by the job's user."""
    out = []
    for p in procs:
        ident = process_id(p.pid)
        if ident is None or ident.uid != uid:
            continue
        idx = bus_to_index.get(normalize_bus(p.bus_id))
        if job_gpus is not None and idx is not None and idx not in job_gpus:
            continue
        out.append(ident)
    return out


def signal_process(target: ProcessId, sig: int) -> bool:
    """Send `sig` to `target` only if the process with its pid is still the one chosen (same
    owner, same start time); True when sent.

    With a pidfd (Linux 5.3+), the descriptor is opened first and the identity checked after:
    the descriptor names one process, so a pid reused after the check cannot receive the signal.
    Without one, the check is made right before `kill`, which leaves only that instant.
    """
    try:
        fd = os.pidfd_open(target.pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):
        if process_id(target.pid) != target:
            return False
        try:
            os.kill(target.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    try:
        if process_id(target.pid) != target:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)


def kill_pids(targets: list[ProcessId], grace: float) -> list[int]:
    """SIGTERM each target, then SIGKILL those still alive (and still themselves) after
    `grace`; returns the pids killed."""
    for target in targets:
        signal_process(target, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(process_id(t.pid) == t for t in targets):
        time.sleep(0.1)
    return [t.pid for t in targets if signal_process(t, signal.SIGKILL)]


def user_has_processes(uid: int, proc: Path = Path("/proc")) -> bool:
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    return True
    return False


def clean_shm(uid: int, shm: Path = Path("/dev/shm")) -> list[str]:
    """Remove the user's entries from /dev/shm; returns their names. Never for root."""
    if uid == 0:
        return []
    removed = []
    for entry in shm.iterdir():
        with contextlib.suppress(OSError):
            if entry.lstat().st_uid != uid:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed


def job_gpu_indices(env: dict[str, str]) -> set[int] | None:
    text = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    idx = {int(x) for x in text.split(",") if x.strip().isdigit()}
    return idx or None


def epilog_cleanup(
    source: GpuSource, env: dict[str, str], grace: float, kill: bool, shm: bool, timeout: float
) -> dict[str, object]:
    """Kill the finished job's strays on its GPUs; clear its user's /dev/shm if nothing is left."""
    report: dict[str, object] = {}
    uid_text = env.get("SLURM_JOB_UID", "")
    if not uid_text.isdigit():
        return {"skipped": "SLURM_JOB_UID not set"}
    uid = int(uid_text)
    if kill:
        try:
            gpus = source.gpus(timeout)
            procs = source.processes(timeout)
            targets = stray_processes(
                procs, {normalize_bus(g.bus_id): g.index for g in gpus}, uid, job_gpu_indices(env)
            )
            report["signalled"] = [t.pid for t in targets]
            report["killed"] = kill_pids(targets, grace) if targets else []
        except Exception as exc:  # clean-up is best effort; the checks still run
            report["kill_error"] = str(exc)[:200]
    if shm and uid != 0:
        if user_has_processes(uid):
            report["shm"] = "kept: user still has processes on the node"
        else:
            with contextlib.suppress(OSError):
                report["shm_removed"] = clean_shm(uid)
    return report


__all__ = [
    "DRAIN_PREFIX",
    "PROLOG_ERROR",
    "Decision",
    "apply",
    "claim_prolog_error",
    "claimable",
    "decide",
    "epilog_cleanup",
    "fail_job",
    "job_requested_checks",
    "prolog_failure",
    "requested_checks",
    "split_verdict",
]
