"""`prolog_epilog.runner`: the suite's verdict and drain reason, its timeouts and a crashing
check."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from health_harness import FIX

from prolog_epilog import load_config, run_checks
from prolog_epilog.checks.base import CheckResult
from prolog_epilog.config import HealthConfig
from prolog_epilog.runner import verdict


def test_verdict_and_drain_reason():
    ok = CheckResult("ecc", "pass", "")
    bad = CheckResult("gpu-count", "fail", "7 of 8", "7/8 GPUs")
    xidbad = CheckResult("xid", "fail", "...", "Xid 79 GPU7")
    err = CheckResult("nvlink", "error", "timed out after 8s", "timed out")
    assert verdict([ok], "fail") == (True, None)
    assert verdict([ok, bad, xidbad], "fail")[1] == "fthsdp: xid: Xid 79 GPU7 [+gpu-count]"
    assert verdict([err], "fail") == (False, "fthsdp: nvlink: error: timed out")
    assert verdict([err], "warn") == (True, None)


def with_general(cfg: HealthConfig, **general: object) -> HealthConfig:
    """`cfg` with some of its `[general]` settings replaced."""
    table = dict(cfg.table)
    table["general"] = {**table["general"], **general}
    return HealthConfig(table, cfg.node, cfg.source)


def hung_nvidia_smi(tmp_path: Path, hang: str, budget_s: float) -> HealthConfig:
    """A config whose nvidia-smi starts `sleep HANG` and waits for it: it never answers."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nsleep {hang} &\nwait\n")
    fake.chmod(0o755)
    return with_general(
        load_config(),
        nvidia_smi=str(fake),
        gpu_source="nvidia-smi",
        total_budget_s=budget_s,
        state_dir=str(tmp_path / "st"),
    )


@pytest.mark.timeout(30)
def test_hung_nvidia_smi_times_out_and_leaves_no_process(tmp_path):
    # A sleep no other test (or another checkout's run of this one) starts: its own length.
    hang = f"1000.{os.getpid()}"
    cfg = hung_nvidia_smi(tmp_path, hang, 1.0)
    t0 = time.monotonic()
    res = run_checks(["gpu-count", "ecc", "infiniband"], cfg, sysfs_root=FIX / "sysfs" / "healthy")
    elapsed = time.monotonic() - t0
    # The tool would hang for 1000 s: any bound far below that shows the budget ended the
    # suite. How close to the budget it ends (overrun < 0.5 s) is measured by
    # benchmarks/healthcheck.py ("hung: overrun of the budget"), where load is recorded.
    assert elapsed < 10 * 1.0
    assert res.by_name()["ecc"].status == "error" and "timed out" in res.by_name()["ecc"].detail
    assert res.by_name()["infiniband"].status == "pass"
    assert not res.healthy and res.drain_reason.startswith("fthsdp: gpu-count: error:")
    warn = run_checks(["ecc"], with_general(cfg, on_error="warn"))
    assert warn.healthy
    argv = b"sleep\x00" + hang.encode() + b"\x00"

    def leftovers() -> list[str]:  # a killed one that is not reaped yet has no command line
        return [p for p in os.listdir("/proc") if p.isdigit() and _cmd(p) == argv]

    deadline = time.monotonic() + 10  # the kill is sent; its delivery is waited for, not guessed
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers() == []


def _cmd(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_crashing_check_becomes_one_line_error(tmp_path, monkeypatch):
    import prolog_epilog.checks.disk as disk

    def boom(ctx):
        raise RuntimeError("deep\ninside")

    monkeypatch.setattr(disk, "run", boom)
    res = run_checks(["disk"], with_general(load_config(), state_dir=str(tmp_path)))
    assert res.checks[0].status == "error" and res.checks[0].detail == "RuntimeError: deep"


@pytest.mark.timeout(30)
def test_a_killed_check_that_finishes_late_stays_timed_out(tmp_path, monkeypatch):
    # The race a loaded machine hits: the killed tool's check thread writes its own result
    # ("exited -9") after the runner recorded the timeout. Here the runner's log line, written
    # just after that record, waits until the check thread has finished.
    import logging
    import threading

    from prolog_epilog import runner

    class WaitForChecks(logging.LoggerAdapter):
        def error(self, *args: object, **kw: object) -> None:
            for t in threading.enumerate():
                if t.name.startswith("check-"):
                    t.join(10)

    monkeypatch.setattr(runner, "log", WaitForChecks(runner.log, {}))
    cfg = hung_nvidia_smi(tmp_path, "1000", 0.5)
    ecc = run_checks(["ecc"], cfg).by_name()["ecc"]
    assert (ecc.status, ecc.detail) == ("error", "timed out after 0.5s")
