"""`runtime.failure_class`: a failure's text or carried exit code becomes a node or process
verdict."""

from __future__ import annotations

import pytest

from runtime.failure_class import classify_failure, classify_text
from runtime.protocol import ExitCode


@pytest.mark.parametrize(
    ("text", "failure", "code"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", "node", 11),
        ("CUDA error: uncorrectable ECC error encountered", "node", 11),
        ("gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer", "process", 10),
        ("NCCL watchdog: collective operation timed out", "process", 10),
        ("ZeroDivisionError: division by zero", None, 1),
    ],
)
def test_classify_text(text: str, failure: str | None, code: int) -> None:
    verdict = classify_text(text, "node1")
    assert (verdict.failure, int(verdict.exit_code)) == (failure, code)
    assert verdict.evidence


def test_classify_carried_exit_code_wins() -> None:
    from runtime.worker.errors import FatalWorkerError

    exc = FatalWorkerError("quorum failed", ExitCode.PROCESS_FAULT, ["timeout"])
    assert classify_failure(exc, "n").exit_code is ExitCode.PROCESS_FAULT
    node = FatalWorkerError("xid 79", ExitCode.NODE_FAULT, ["xid: 79"])
    verdict = classify_failure(node, "n")
    assert (verdict.failure, verdict.evidence) == ("node", ["xid: 79"])
