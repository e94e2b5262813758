"""`prolog_epilog.actions`: what a hook does with a verdict (drain, resume, keep), the job's
requested checks and the epilog's cleanup."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from health_harness import _suite

from prolog_epilog.actions import decide, drain_kind, job_requested_checks
from prolog_epilog.checks.base import CheckResult
from prolog_epilog.records import (
    GpuInfo,
)
from slurm.backend import NodeInfo

NODE = "node1"


@pytest.mark.parametrize(
    ("mode", "healthy", "node", "passes", "action"),
    [
        ("prolog", False, NodeInfo(NODE, "idle"), 0, "drain"),
        ("prolog", False, NodeInfo(NODE, "drained", ("DRAIN",), "disk swap"), 0, "none"),
        (
            "healthcheck",
            True,
            NodeInfo(NODE, "drained", ("DRAIN",), "fthsdp: xid: Xid 79"),
            1,
            "resume",
        ),
        (
            "healthcheck",
            True,
            NodeInfo(NODE, "drained", ("DRAIN",), "fthsdp: prolog: xid: Xid 79 GPU3"),
            1,
            "resume",
        ),
        # A slow node passes every check, and an operator's drain had reasons of its own.
        (
            "healthcheck",
            True,
            NodeInfo(NODE, "drained", ("DRAIN",), "fthsdp: straggler: node1 2.7x"),
            5,
            "none",
        ),
        (
            "healthcheck",
            True,
            NodeInfo(NODE, "draining", ("DRAIN",), "fthsdp: manual: bad fan"),
            5,
            "none",
        ),
        # A real fault on a straggler's node still gets the check's own reason.
        (
            "healthcheck",
            False,
            NodeInfo(NODE, "drained", ("DRAIN",), "fthsdp: straggler: node1 2.7x"),
            0,
            "drain",
        ),
        ("healthcheck", True, NodeInfo(NODE, "drained", ("DRAIN",), "admin: bad fan"), 5, "none"),
        ("healthcheck", True, NodeInfo(NODE, "idle"), 3, "none"),
        ("prolog", True, NodeInfo(NODE, "drained", ("DRAIN",), "fthsdp: ecc: x"), 3, "none"),
    ],
)
def test_decide_table(mode, healthy, node, passes, action):
    suite = _suite(CheckResult("ecc", "pass" if healthy else "fail", "x", "GPU0 uncorr ECC 1"))
    assert decide(mode, suite, node, passes, 1).action == action


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("fthsdp: straggler: node2 2.7x", "straggler"),
        ("fthsdp: manual: bad fan", "manual"),
        ("fthsdp: xid: Xid 79 GPU7", "xid"),
        ("fthsdp:gpu-count: 7/8 GPUs", "gpu-count"),
        ("admin: straggler: node2", ""),
        ("Prolog error", ""),
    ],
)
def test_drain_kind(reason, kind):
    assert drain_kind(reason) == kind


def test_decide_requires_consecutive_passes():
    suite = _suite(CheckResult("ecc", "pass", ""))
    node = NodeInfo(NODE, "drained", ("DRAIN",), "fthsdp: ecc: x")
    assert decide("healthcheck", suite, node, 1, 3).action == "none"
    assert decide("healthcheck", suite, node, 3, 3).action == "resume"


def test_job_comment_checks():
    assert job_requested_checks("fthsdp-health:dcgm,pcie") == ["dcgm", "pcie"]
    assert job_requested_checks("team=x fthsdp-health:disk;other") == ["disk"]
    assert job_requested_checks("") == []


@pytest.mark.timeout(30)
def test_epilog_cleanup_kills_only_the_jobs_strays_on_its_gpus() -> None:
    import subprocess

    from prolog_epilog.actions import epilog_cleanup
    from prolog_epilog.records import GpuProcess

    mine = subprocess.Popen(["sleep", "100"])
    other_gpu = subprocess.Popen(["sleep", "100"])
    try:

        class Source:
            kind = "fake"

            def gpus(self, timeout: float) -> list[GpuInfo]:
                return [GpuInfo(0, "00000000:18:00.0"), GpuInfo(1, "00000000:2A:00.0")]

            def processes(self, timeout: float) -> list[GpuProcess]:
                return [
                    GpuProcess(mine.pid, "00000000:18:00.0"),
                    GpuProcess(other_gpu.pid, "00000000:2A:00.0"),
                ]

        env = {"SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": "0"}
        report = epilog_cleanup(Source(), env, grace=2.0, kill=True, shm=False, timeout=5.0)  # type: ignore[arg-type]
        assert report["signalled"] == [mine.pid]
        assert mine.wait(timeout=5) != 0
        assert other_gpu.poll() is None  # another job's GPU: left alone
    finally:
        for p in (mine, other_gpu):
            p.kill()
            p.wait()


@pytest.mark.timeout(30)
def test_epilog_signals_only_the_process_it_chose_not_one_reusing_its_pid() -> None:
    """The pid the epilog chose now names a process with another start time (or owner): it is
    not signalled; the one that still is itself is."""
    import dataclasses
    import subprocess

    from prolog_epilog.actions import kill_pids, process_id, signal_process

    proc = subprocess.Popen(["sleep", "100"])
    try:
        ident = process_id(proc.pid)
        assert ident is not None and ident.uid == os.getuid()
        reused = dataclasses.replace(ident, start=ident.start - 1)
        assert not signal_process(reused, signal.SIGTERM)
        assert kill_pids([reused], grace=0.2) == []
        assert proc.poll() is None
        other_owner = dataclasses.replace(ident, uid=ident.uid + 1)
        assert not signal_process(other_owner, signal.SIGKILL)
        assert proc.poll() is None
        assert kill_pids([ident], grace=2.0) == []  # SIGTERM was enough
        assert proc.wait(timeout=5) == -signal.SIGTERM
        assert not signal_process(ident, signal.SIGKILL)  # gone: nothing to signal
    finally:
        proc.kill()
        proc.wait()


def test_process_id_reads_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    from prolog_epilog.actions import ProcessId, process_id

    (tmp_path / "42").mkdir()
    fields = " ".join(["S", *[str(i) for i in range(4, 22)], "777", "0"])
    (tmp_path / "42" / "stat").write_text(f"42 (a b) c) {fields}\n")
    assert process_id(42, tmp_path) == ProcessId(42, os.getuid(), 777)
    (tmp_path / "42" / "stat").write_text("42 (x) S 1\n")
    assert process_id(42, tmp_path) is None
    assert process_id(43, tmp_path) is None
