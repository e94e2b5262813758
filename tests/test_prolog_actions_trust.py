"""What a job user can make the root hooks do, and how prolog and HealthCheckProgram take turns.

A job may add checks only from the operator's allow-list (`actions.job_checks_allowed`, empty by
default); a check only the job asked for drains the node when it finds a fault, never when it
errors. The hooks of one node hold an fcntl lock in the root-owned state_dir, and a state_dir
someone else could write is not trusted. After fthsdp's prolog failed on a node, the
HealthCheckProgram holds off resuming it and takes over the `Prolog error` drain that follows.
The dev-cluster attack (an unprivileged user's `--comment=fthsdp-health:dcgm`) is in
test_story_health_hooks.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prolog_epilog.actions import (
    claimable,
    decide,
    prolog_failure,
    requested_checks,
    split_verdict,
)
from prolog_epilog.checks.base import CheckResult
from prolog_epilog.config import load_config
from prolog_epilog.entrypoints import run_mode
from prolog_epilog.runner import SuiteResult
from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs
from prolog_epilog.state import StateStore, node_lock
from slurm.backend import NodeInfo
from slurm.errors import InputError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("asked", "allowed", "suite", "added", "refused"),
    [
        (["dcgm"], [], ["ecc"], [], ["dcgm"]),  # the default: a job adds nothing
        (["dcgm", "pcie"], ["pcie"], ["ecc"], ["pcie"], ["dcgm"]),
        (["ecc"], [], ["ecc"], [], []),  # already the operator's check: not the job's
        ([" pcie ", "pcie", ""], ["pcie"], [], ["pcie"], []),
        (["nosuch", "../../bin/sh"], ["pcie"], [], [], ["../../bin/sh", "nosuch"]),
    ],
)
def test_requested_checks_come_only_from_the_allow_list(
    asked: list[str], allowed: list[str], suite: list[str], added: list[str], refused: list[str]
) -> None:
    assert requested_checks(asked, allowed, suite) == (added, refused)


def _suite(*results: tuple[str, str]) -> SuiteResult:
    checks = [
        CheckResult(name, status, f"{name} {status}", f"{name} {status}")
        for name, status in results
    ]
    return SuiteResult(checks, True, None)


@pytest.mark.parametrize(
    ("results", "requested", "on_error", "healthy", "reason", "job_errors"),
    [
        # The job's check errors (tool missing, timeout): the node stays in service.
        ([("ecc", "pass"), ("dcgm", "error")], ["dcgm"], "fail", True, None, ["dcgm"]),
        # The job's check finds a fault: that drains like any check.
        ([("ecc", "pass"), ("dcgm", "fail")], ["dcgm"], "fail", False, "dcgm", []),
        # The operator's own check erroring still follows general.on_error.
        ([("ecc", "error"), ("dcgm", "pass")], ["dcgm"], "fail", False, "ecc", []),
        ([("ecc", "error"), ("dcgm", "error")], ["dcgm"], "warn", True, None, ["dcgm"]),
        ([("ecc", "pass")], [], "fail", True, None, []),
    ],
)
def test_a_job_check_that_errors_never_drains(
    results: list[tuple[str, str]],
    requested: list[str],
    on_error: str,
    healthy: bool,
    reason: str | None,
    job_errors: list[str],
) -> None:
    node, errors = split_verdict(_suite(*results), requested, on_error)
    assert node.healthy is healthy
    if reason is None:
        assert node.drain_reason is None
    else:
        assert node.drain_reason is not None and node.drain_reason.startswith(f"fthsdp: {reason}:")
    assert [c.name for c in errors] == job_errors
    assert [c.name for c in node.checks] == [name for name, _ in results]  # all reported


def _node(reason: str, drained: bool = True) -> NodeInfo:
    return NodeInfo("node1", "idle", ("DRAIN",) if drained else (), reason)


@pytest.mark.parametrize(
    ("node", "since", "window", "ours"),
    [
        (_node("Prolog error"), 5.0, 3600.0, True),
        (_node("Prolog error"), None, 3600.0, False),  # no failure of ours recorded
        (_node("Prolog error"), 4000.0, 3600.0, False),  # too long ago: the operator's now
        (_node("admin: RMA ticket"), 5.0, 3600.0, False),
        (_node("Prolog error", drained=False), 5.0, 3600.0, False),
        (None, 5.0, 3600.0, False),
    ],
)
def test_prolog_error_is_ours_only_after_our_prolog_failed(
    node: NodeInfo | None, since: float | None, window: float, ours: bool
) -> None:
    assert claimable(node, since, window) is ours


@pytest.mark.parametrize(
    ("state", "seconds"),
    [
        ({"at": 100.0}, 50.0),
        ({"at": 100}, 50.0),
        (None, None),
        ({"at": "x"}, None),
        ({"at": True}, None),
        ({"at": 200.0}, None),  # from the future: not trusted
        ("junk", None),
    ],
)
def test_prolog_failure_record(state: object, seconds: float | None) -> None:
    assert prolog_failure(state, 150.0) == seconds  # type: ignore[arg-type]


def test_healthcheck_holds_off_resume_after_a_prolog_failure() -> None:
    suite = SuiteResult([], True, None)
    node = _node("fthsdp: xid: Xid 79")
    assert decide("healthcheck", suite, node, 3, 1).action == "resume"
    held = decide("healthcheck", suite, node, 3, 1, hold="prolog failed 5s ago")
    assert held.action == "none" and "prolog failed" in held.why


def test_allow_list_config_is_validated(tmp_path: Path) -> None:
    assert load_config().actions["job_checks_allowed"] == []
    for text, field in [
        ('[actions]\njob_checks_allowed = ["nosuch"]\n', "actions.job_checks_allowed"),
        ('[actions]\njob_check_error = "drain"\n', "actions.job_check_error"),
        ("[actions]\nlock_timeout_s = 0\n", "actions.lock_timeout_s"),
    ]:
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(InputError) as info:
            load_config(path)
        assert info.value.field == field


_HOLDER = """
import sys, time
from prolog_epilog.state import node_lock
with node_lock(sys.argv[1], 5) as problem:
    assert problem is None, problem
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.mark.timeout(60)
def test_node_lock_serializes_hooks_across_processes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(state), "3"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with node_lock(state, 0.3) as problem:
            assert problem is not None and "held" in problem
        start = time.monotonic()
        with node_lock(state, 30) as problem:
            assert problem is None
        # Only once the holder let go (it held the lock for 3 s).
        assert time.monotonic() - start > 1.5
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert (os.stat(state).st_mode & 0o777) == 0o700


@pytest.mark.parametrize("how", ["group-writable", "other-owner"])
def test_state_dir_that_others_can_write_is_not_trusted(tmp_path: Path, how: str) -> None:
    state = tmp_path / "state"
    store = StateStore(state)
    store.put("passes", 7)
    assert (state / "state.json").exists()
    if how == "group-writable":
        state.chmod(0o770)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory away")
        os.chown(state, 65534, 65534)
    fresh = tmp_path / "fresh-key"  # another store path: nothing cached in memory for it
    os.symlink(state, fresh)
    assert StateStore(fresh).get("passes") is None
    with node_lock(state, 1) as problem:
        assert problem is not None


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(dev_config_toml(tmp_path) + "[checks.gpu-count]\nexpected = 8\n" + extra)
    return path


@pytest.mark.timeout(60)
def test_prolog_ignores_a_job_check_not_allowed(tmp_path: Path) -> None:
    write_node_inputs(tmp_path, "node1")
    env = {"SLURMD_NODENAME": "node1", "FTHSDP_HEALTH_CHECKS": "dcgm"}
    code, record = run_mode("prolog", str(_config(tmp_path)), node="node1", env=env)
    assert code == 0, record
    assert record["requested"] == {"added": [], "refused": ["dcgm"]}
    assert "dcgm" not in [c["name"] for c in record["checks"]]


@pytest.mark.timeout(60)
def test_prolog_job_check_error_keeps_node_healthy(tmp_path: Path) -> None:
    write_node_inputs(tmp_path, "node1")
    cfg = _config(tmp_path, '[actions]\njob_checks_allowed = ["dcgm"]\n')
    text = cfg.read_text().replace("[general]", f'[general]\ndcgmi = "{tmp_path}/no-dcgmi"', 1)
    cfg.write_text(text)
    env = {"SLURMD_NODENAME": "node1", "FTHSDP_HEALTH_CHECKS": "dcgm"}
    code, record = run_mode("prolog", str(cfg), node="node1", env=env, drain=False)
    assert code == 0, record
    assert record["healthy"] is True and record["drain_reason"] is None
    dcgm = [c for c in record["checks"] if c["name"] == "dcgm"]
    assert dcgm and dcgm[0]["status"] == "error"
    assert "dcgm" in record["job_errors"]


@pytest.mark.timeout(60)
def test_prolog_job_check_fault_fails_and_is_recorded(tmp_path: Path) -> None:
    write_node_inputs(tmp_path, "node1", faults=["xid79"])
    cfg = _config(tmp_path, '[actions]\njob_checks_allowed = ["xid"]\n')
    env = {"SLURMD_NODENAME": "node1", "FTHSDP_HEALTH_CHECKS": "xid", "SLURM_JOB_ID": "42"}
    code, record = run_mode("prolog", str(cfg), node="node1", only=["disk"], env=env, drain=False)
    assert code == 1, record
    assert record["drain_reason"].startswith("fthsdp: xid:")
    failed = StateStore(tmp_path / "node1" / "state").get("prolog_failed")
    assert failed["job_id"] == "42" and failed["reason"].startswith("fthsdp: xid:")
    assert 0 <= time.time() - failed["at"] < 60
