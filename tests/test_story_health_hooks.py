"""Health checks against a real Slurm: Prolog drains and requeues, HealthCheckProgram resumes.

The dev cluster's slurmds all run on this host, so each node gets its own simulated hardware
(`simulated_hardware.write_node_inputs`) and one config with `{node}` paths. The Prolog and
HealthCheckProgram are `prolog_epilog.dev_health.entrypoint_wrapper` scripts with absolute
paths, since slurmd runs them as root in its own environment. The cluster is shared by the test
session: the fixture restores the original slurm.conf and resumes every node it touched.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prolog_epilog import dev_health
from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs
from slurm import devcluster
from slurm.backend import CommandBackend

pytestmark = pytest.mark.slurm


@dataclass
class HealthCluster:
    cfg: devcluster.DevClusterConfig
    root: Path
    backend: CommandBackend
    healthcheck: str

    def enable_healthcheck(self, interval: int = 5) -> None:
        self.cfg = devcluster.reconfigure(
            self.cfg, health_check_program=self.healthcheck, health_check_interval=interval
        )


def _wrapper(path: Path, mode: str, config: Path, conf: Path) -> str:
    return dev_health.entrypoint_wrapper(path, mode, config, conf)


def _scontrol(*args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=20, check=False
    ).stdout


def _wait(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _queue() -> str:
    return subprocess.run(
        ["squeue", "-h", "-o", "%i %u %T %R"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    ).stdout.strip()


def _start_quiet() -> None:
    """These stories place jobs on named nodes: a job an earlier story left in the shared cluster
    (pending with a higher priority, or still completing) would hold a node back ("ReqNodeNotAvail,
    May be reserved for other job"). Cancel what is left and wait for an empty queue."""
    ids = [line.split()[0] for line in _queue().splitlines() if line.strip()]
    if ids:
        subprocess.run(["scancel", "--quiet", *ids], timeout=20, check=False)
    try:
        _wait(lambda: not _queue(), 90, "an empty queue")
    except AssertionError as exc:
        raise AssertionError(f"jobs left by an earlier test will not end:\n{_queue()}") from exc


@pytest.fixture
def health_cluster(
    slurm_cluster: devcluster.DevClusterConfig, tmp_path: Path
) -> Iterator[HealthCluster]:
    _start_quiet()
    root = tmp_path / "hw"
    for node in slurm_cluster.node_names:
        write_node_inputs(root, node, gpus=slurm_cluster.gpus_per_node)
    config = tmp_path / "health.toml"
    config.write_text(
        dev_config_toml(root, total_budget_s=10.0)
        + f"[checks.gpu-count]\nexpected = {slurm_cluster.gpus_per_node}\n"
    )
    conf = slurm_cluster.conf_path
    live = devcluster.reconfigure(
        slurm_cluster, prolog=_wrapper(tmp_path / "prolog.sh", "prolog", config, conf)
    )
    backend = CommandBackend(timeout=20)
    try:
        yield HealthCluster(
            live, root, backend, _wrapper(tmp_path / "hc.sh", "healthcheck", config, conf)
        )
    finally:
        subprocess.run(["scancel", "--user=root", "--quiet"], timeout=20, check=False)
        devcluster.reconfigure(
            slurm_cluster,
            prolog=slurm_cluster.prolog,
            health_check_program=slurm_cluster.health_check_program,
            health_check_interval=slurm_cluster.health_check_interval,
        )
        for n in backend.nodes(slurm_cluster.node_names):
            if n.drained:
                _scontrol("update", f"NodeName={n.name}", "State=RESUME")


def _sbatch(hc: HealthCluster, *args: str, command: str = "true") -> str:
    """A one-node job in partition gpu; returns its id."""
    argv = ["sbatch", "--parsable", "-p", "gpu", "-N1", "-o", "/dev/null", *args, "--wrap", command]
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=20, check=True, env=hc.cfg.env()
    )
    return r.stdout.strip()


def _node(hc: HealthCluster, name: str):  # type: ignore[no-untyped-def]
    return hc.backend.nodes([name])[0]


def _job_field(job: str, key: str) -> str:
    for token in _scontrol("show", "job", job).split():
        if token.startswith(f"{key}="):
            return token.split("=", 1)[1]
    return ""


@pytest.mark.timeout(240)
def test_prolog_drains_bad_node_job_runs_elsewhere_healthcheck_resumes(
    health_cluster: HealthCluster, tmp_path: Path
) -> None:
    hc = health_cluster
    write_node_inputs(hc.root, "node1", faults=["xid79"])
    out = tmp_path / "job.out"
    job = _sbatch(
        hc,
        "--requeue",
        "--exclude=node3,node4",
        f"--output={out}",
        command="echo ran-on=$SLURMD_NODENAME",
    )
    # The prolog fails on node1: the job is requeued (not held: nohold_on_prolog_fail), with
    # its begin time pushed ~120 s out (docs/design-facts.md, Slurm fact 2); release makes it
    # eligible now.
    _wait(lambda: int(_job_field(job, "Restarts") or 0) >= 1, 60, f"job {job} requeued")
    hc.backend.release(job)
    try:
        _wait(lambda: _job_field(job, "JobState") == "COMPLETED", 90, f"job {job} to complete")
    except AssertionError as exc:
        logs = [
            *sorted(hc.root.glob("health-*.log")),
            hc.cfg.directory / "log" / "slurmd-node1.log",
            hc.cfg.directory / "log" / "slurmctld.log",
        ]
        tails = "\n".join(
            f"== {p}\n" + "\n".join(p.read_text().splitlines()[-25:]) for p in logs if p.exists()
        )
        nodes = _scontrol("show", "node", "node1,node2")
        raise AssertionError(
            f"{_scontrol('show', 'job', job)}\n== queue\n{_queue()}\n{nodes}\n{tails}"
        ) from exc
    assert int(_job_field(job, "Restarts")) >= 1
    assert "ran-on=node2" in out.read_text()
    node1 = _node(hc, "node1")
    assert node1.drained and node1.reason.startswith("fthsdp: "), node1
    assert "xid" in node1.reason or "gpu-count" in node1.reason
    # Repair the input: HealthCheckProgram (every 5 s) resumes the node we drained.
    write_node_inputs(hc.root, "node1")
    hc.enable_healthcheck()
    _wait(lambda: not _node(hc, "node1").drained, 60, "node1 resumed by HealthCheckProgram")


@pytest.mark.timeout(120)
def test_healthcheck_leaves_admin_drain_alone(health_cluster: HealthCluster) -> None:
    hc = health_cluster
    _scontrol("update", "NodeName=node4", "State=DRAIN", "Reason=admin: fan swap")
    hc.enable_healthcheck()
    write_node_inputs(hc.root, "node4", faults=["ecc"])  # failing input must not rewrite the reason
    log = hc.root / "health-node4.jsonl"
    _wait(lambda: log.exists() and log.read_text().count("\n") >= 2, 60, "two healthcheck runs")
    node4 = _node(hc, "node4")
    assert node4.drained and node4.reason == "admin: fan swap"
    write_node_inputs(hc.root, "node4")  # healthy input: still not resumed (not our drain)
    start = log.read_text().count("\n")
    _wait(lambda: log.read_text().count("\n") >= start + 2, 60, "two more healthcheck runs")
    node4 = _node(hc, "node4")
    assert node4.drained and node4.reason == "admin: fan swap"
    assert os.path.exists(hc.root / "node4" / "state" / "state.json")


def _sbatch_as_nobody(hc: HealthCluster, *args: str) -> str:
    """Submit as root on behalf of the unprivileged user `nobody` (sbatch --uid): the job is
    nobody's, its comment is whatever nobody typed. The uid goes as a number: 26.05's sbatch
    refuses `--uid=nobody` ("Invalid --uid specification")."""
    uid = pwd.getpwnam("nobody").pw_uid
    return _sbatch(hc, f"--uid={uid}", "--chdir=/tmp", "--output=/dev/null", *args)


def _no_node_drained(hc: HealthCluster) -> None:
    nodes = hc.backend.nodes(hc.cfg.node_names)
    assert nodes and not [n for n in nodes if n.drained], [(n.name, n.reason) for n in nodes]


@pytest.mark.timeout(240)
def test_unprivileged_job_comment_drains_nothing(health_cluster: HealthCluster) -> None:
    """`sbatch --comment=fthsdp-health:dcgm` by `nobody` on nodes without DCGM: the check is not
    on the operator's allow-list (empty by default), so the prolog ignores it and the jobs run."""
    hc = health_cluster
    jobs = [
        _sbatch_as_nobody(hc, "--comment=fthsdp-health:dcgm", f"--nodelist={node}")
        for node in ("node1", "node2")
    ]
    # The job passed its prolog and started, once (no requeue). Its script itself may fail as
    # `nobody` (the dev cluster's spool is in a root-only folder): what it runs is not the point.
    ended = ("COMPLETED", "FAILED")
    for job in jobs:
        _wait(lambda job=job: _job_field(job, "JobState") in ended, 90, f"job {job} to end")
        assert _job_field(job, "UserId").startswith("nobody")
        assert _job_field(job, "Restarts") == "0"
    _no_node_drained(hc)
    for node in ("node1", "node2"):
        runs = [
            json.loads(line) for line in (hc.root / f"health-{node}.jsonl").read_text().splitlines()
        ]
        prolog = [r for r in runs if r["mode"] == "prolog" and r["job_id"] in jobs]
        assert prolog and all(r["exit"] == 0 and r["healthy"] for r in prolog), prolog
        assert all(r["requested"] == {"added": [], "refused": ["dcgm"]} for r in prolog)


@pytest.mark.timeout(240)
def test_allowed_job_check_that_errors_fails_the_job_not_the_node(
    health_cluster: HealthCluster, tmp_path: Path
) -> None:
    """With dcgm on the allow-list but no dcgmi on the node, the check errors: the job is
    cancelled (AdminComment says why) and the node stays in service."""
    hc = health_cluster
    config = tmp_path / "health.toml"
    config.write_text(config.read_text() + '[actions]\njob_checks_allowed = ["dcgm"]\n')
    job = _sbatch_as_nobody(hc, "--comment=fthsdp-health:dcgm", "--nodelist=node3")
    _wait(lambda: _job_field(job, "JobState") == "CANCELLED", 90, f"job {job} cancelled")
    assert "dcgm" in _scontrol("show", "job", job)  # AdminComment=fthsdp: ... dcgm ...
    _no_node_drained(hc)


@pytest.mark.timeout(180)
def test_prolog_error_after_our_prolog_failed_is_taken_over_and_resumed(
    health_cluster: HealthCluster,
) -> None:
    """Slurm's `Prolog error` drain that follows a recorded failure of fthsdp's prolog (its own
    drain could not be made) becomes an `fthsdp:` drain, which HealthCheckProgram resumes once
    the node passes; the same reason with no failure of ours recorded is left alone."""
    from prolog_epilog.state import StateStore

    hc = health_cluster
    for node in ("node2", "node3"):
        _scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=Prolog error")
    StateStore(hc.root / "node2" / "state").put(
        "prolog_failed",
        {"at": time.time() - 30, "job_id": "7", "reason": "fthsdp: xid: Xid 79 GPU3"},
    )
    hc.enable_healthcheck()
    _wait(lambda: not _node(hc, "node2").drained, 90, "node2 resumed by HealthCheckProgram")
    runs = [json.loads(x) for x in (hc.root / "health-node2.jsonl").read_text().splitlines()]
    assert any(r.get("claimed") == "Prolog error" for r in runs)
    assert StateStore(hc.root / "node2" / "state").get("prolog_failed") is None
    log = hc.root / "health-node3.jsonl"
    _wait(lambda: log.exists() and log.read_text().count("\n") >= 2, 60, "two node3 runs")
    node3 = _node(hc, "node3")
    assert node3.drained and node3.reason == "Prolog error"


def _resume_record(r: dict[str, Any]) -> bool:
    return bool(r["mode"] == "healthcheck" and r.get("action", {}).get("action") == "resume")


@pytest.mark.timeout(240)
def test_healthcheck_never_races_a_failing_prolog(
    health_cluster: HealthCluster, tmp_path: Path
) -> None:
    """A fault only the prolog sees (gone by the time HealthCheckProgram looks, every second):
    the prolog drains node1 and exits 1; HealthCheckProgram, which sees a healthy node, must not
    resume it before Slurm has acted on the prolog's exit (else Slurm drains it again as
    `Prolog error`, which nobody resumes). It resumes only after the hold, and node1 ends in
    service."""
    hc = health_cluster
    healthy_root = tmp_path / "hw-healthy"
    for node in hc.cfg.node_names:
        write_node_inputs(healthy_root, node, gpus=hc.cfg.gpus_per_node)
    hc_config = tmp_path / "health-hc.toml"
    hc_config.write_text(
        dev_config_toml(healthy_root, state_root=hc.root, log_dir=hc.root, total_budget_s=10.0)
        + f"[checks.gpu-count]\nexpected = {hc.cfg.gpus_per_node}\n"
    )
    wrapper = _wrapper(tmp_path / "hc-healthy.sh", "healthcheck", hc_config, hc.cfg.conf_path)
    hc.cfg = devcluster.reconfigure(hc.cfg, health_check_program=wrapper, health_check_interval=1)
    write_node_inputs(hc.root, "node1", faults=["xid79"])  # what the prolog sees
    job = _sbatch(hc, "--requeue", "--exclude=node3,node4", "--output=/dev/null")
    seen: set[str] = set()

    def resumed() -> bool:
        node1 = _node(hc, "node1")
        seen.add(node1.reason if node1.drained else "")
        return not node1.drained and int(_job_field(job, "Restarts") or 0) >= 1

    _wait(resumed, 120, "node1 drained by the prolog, then resumed")
    runs: list[dict[str, Any]] = []

    def logged() -> bool:
        # The hook writes its record after the resume it made: wait for the record itself.
        runs[:] = [json.loads(x) for x in (hc.root / "health-node1.jsonl").read_text().splitlines()]
        return any(_resume_record(r) for r in runs)

    _wait(logged, 30, "the healthcheck's record of the resume")
    # A record's `time` is when its hook started. The hold runs from the prolog's failure (after
    # its start) to the healthcheck's decision (before its end, which can be seconds after its
    # start on a loaded machine), so the end of the resuming run is at least the hold after the
    # start of the failed prolog.
    failed = [r["time"] for r in runs if r["mode"] == "prolog" and r["exit"] == 1]
    resumes = [r["time"] + r["elapsed_s"] for r in runs if _resume_record(r)]
    assert failed and resumes, runs[-5:]
    assert min(resumes) - max(f for f in failed if f <= min(resumes)) >= 19.5, (failed, resumes)
    assert "Prolog error" not in seen, seen
