"""Process fault or node fault: how a replica worker's fatal failure is classified.

The pure part of a fatal report: from the exception (an exit code it carries wins, and what the
node watchdog saw as evidence) or from an error text alone, decide process fault vs node fault
and the exit code. The coordinator's policy and the replica's supervisor act on that (relaunch
in place vs drain the node and requeue). Table-tested; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.protocol import ExitCode, FailureClass

#: Text in an error that points at the node's hardware, not at a process.
NODE_FAULT_MARKERS = (
    "xid",
    "uncorrectable ecc",
    "ecc error",
    "gpu is lost",
    "fallen off the bus",
    "gpu-count",
    "cuda error: unknown error",
    "nvml",
    "health check",
)
#: Text that points at a peer or a collective (the node itself is fine).
PROCESS_FAULT_MARKERS = (
    "connection reset",
    "connection closed",
    "broken pipe",
    "timed out",
    "timeout",
    "gloo",
    "nccl",
    "peer",
    "quorum",
    "commit vote",
    "transport error",
    "checkpoint",
)


@dataclass(frozen=True)
class FailureVerdict:
    failure: FailureClass | None
    exit_code: ExitCode
    node: str | None
    evidence: list[str] = field(default_factory=list)


def classify_text(text: str, node: str | None) -> FailureVerdict:
    """Classify an error message alone (table-tested)."""
    low = text.lower()
    evidence = [line.strip() for line in text.splitlines() if line.strip()][:3]
    if any(m in low for m in NODE_FAULT_MARKERS):
        return FailureVerdict("node", ExitCode.NODE_FAULT, node, evidence)
    if any(m in low for m in PROCESS_FAULT_MARKERS):
        return FailureVerdict("process", ExitCode.PROCESS_FAULT, node, evidence)
    return FailureVerdict(None, ExitCode.USER_ERROR, node, evidence)


def classify_failure(exc: BaseException, node: str | None) -> FailureVerdict:
    """Classify a fatal exception; an exit code carried by the exception wins."""
    code = getattr(exc, "exit_code", None)
    evidence = list(getattr(exc, "evidence", []) or [])
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(code, ExitCode):
        classes: dict[ExitCode, FailureClass] = {
            ExitCode.NODE_FAULT: "node",
            ExitCode.PROCESS_FAULT: "process",
            ExitCode.NO_QUORUM_SERVICE: "process",
        }
        failure = classes.get(code)
        return FailureVerdict(failure, code, node, evidence or [text[:300]])
    verdict = classify_text(text, node)
    return FailureVerdict(verdict.failure, verdict.exit_code, node, evidence or verdict.evidence)
