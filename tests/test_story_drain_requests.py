"""A run's drain request, end to end on the dev cluster, made by ordinary users.

The run's coordinator has only its user's rights, so it asks for a drain by writing a request
into its own job's comment and requeueing (or ending) the job; root's Epilog judges it by the
site's policy (`prolog_epilog.drain_requests`). Here the users `fthsdp-user` and `fthsdp-other`
do what a coordinator does, with their own `scontrol`: the Epilog is the project's wrapper, each
node has simulated hardware, and the policy is the health config's, rewritten per test (every
hook run reads it afresh). A hostile user may not drain a node their job never held, may not
drain more than the limit, and may not touch a node an admin drained.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prolog_epilog import dev_health
from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs
from slurm import devcluster
from slurm.backend import CommandBackend
from slurm.drain_request import DrainRequest

pytestmark = pytest.mark.slurm

USER = "fthsdp-user"
OTHER = "fthsdp-other"


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            timeout=30,
            capture_output=True,
        )


def _open_to_users(cfg: devcluster.DevClusterConfig) -> list[tuple[Path, int]]:
    """Let other users traverse the folders down to the cluster and read its config (a site's
    slurm.conf is world-readable; the dev cluster's may still be root's). Returns what changed."""
    changed = []
    etc = cfg.conf_path.parent
    wanted = [(p, 0o001) for p in [cfg.directory, *cfg.directory.parents]]
    wanted += [(etc, 0o005), *((p, 0o004) for p in etc.iterdir() if p.is_file())]
    for path, bits in wanted:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & bits != bits:
            changed.append((path, mode))
            path.chmod(mode | bits)
    return changed


@dataclass
class DrainCluster:
    cfg: devcluster.DevClusterConfig
    root: Path
    config: Path
    backend: CommandBackend
    #: Modes changed to let users in, restored at the end.
    opened: list[tuple[Path, int]]
    #: The HealthCheckProgram wrapper, for a test that turns it on.
    healthcheck: str = ""

    def policy(self, policy: str, limit: int = 3, hold_s: float = 3600.0) -> None:
        """The health config with this drain-request policy (read by the next hook run)."""
        self.config.write_text(
            dev_config_toml(self.root, total_budget_s=10.0)
            + f"[checks.gpu-count]\nexpected = {self.cfg.gpus_per_node}\n"
            + f'[actions]\ndrain_requests = "{policy}"\ndrain_requests_per_user_day = {limit}\n'
            + f"drain_request_hold_s = {hold_s}\n"
        )

    def records(self, node: str, mode: str) -> list[dict[str, Any]]:
        log = self.root / f"health-{node}.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        return [r for r in map(json.loads, lines) if r.get("mode") == mode]

    def as_user(self, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """A Slurm command run by `user` with nothing but that user's rights. The folders are
        opened again first: pytest closes its temp root (0700) whenever another session starts."""
        self.opened += _open_to_users(self.cfg)
        return subprocess.run(
            ["runuser", "-u", user, "--", *argv],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=self.cfg.env(),
            cwd="/tmp",
        )

    def submit(self, user: str, node: str, *args: str, command: str = "sleep 300") -> str:
        r = self.as_user(
            user,
            "sbatch",
            "--parsable",
            "-p",
            "gpu",
            "-N1",
            f"--nodelist={node}",
            "--chdir=/tmp",
            "--output=/dev/null",
            *args,
            "--wrap",
            command,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().split(";")[0]

    def node(self, name: str) -> Any:
        return self.backend.node(name)

    def epilog(self, node: str, job: str, timeout: float = 90.0) -> dict[str, Any]:
        """The Epilog's JSON record for `job` on `node`, once it has run."""

        def found() -> dict[str, Any] | None:
            return next((r for r in self.records(node, "epilog") if r.get("job_id") == job), None)

        _wait(lambda: found() is not None, timeout, f"the Epilog of job {job} on {node}")
        rec = found()
        assert rec is not None
        return rec


def _wait(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=30, check=False
    )


def _state(job: str) -> str:
    for token in _scontrol("show", "job", job).stdout.split():
        if token.startswith("JobState="):
            return token.split("=", 1)[1]
    return ""


@pytest.fixture
def drain_cluster(
    slurm_cluster: devcluster.DevClusterConfig, tmp_path: Path
) -> Iterator[DrainCluster]:
    for user in (USER, OTHER):
        _ensure_user(user)
    root = tmp_path / "hw"
    for node in slurm_cluster.node_names:
        write_node_inputs(root, node, gpus=slurm_cluster.gpus_per_node)
    config = tmp_path / "health.toml"
    backend = CommandBackend(timeout=20)
    dc = DrainCluster(slurm_cluster, root, config, backend, [])
    dc.policy("recheck")
    wrapper = dev_health.entrypoint_wrapper(
        tmp_path / "epilog.sh", "epilog", config, slurm_cluster.conf_path
    )
    dc.cfg = devcluster.reconfigure(slurm_cluster, epilog=wrapper)
    dc.healthcheck = dev_health.entrypoint_wrapper(
        tmp_path / "hc.sh", "healthcheck", config, slurm_cluster.conf_path
    )
    try:
        yield dc
    finally:
        for user in (USER, OTHER):
            subprocess.run(["scancel", f"--user={user}", "--quiet"], timeout=30, check=False)
        devcluster.reconfigure(
            slurm_cluster,
            epilog=slurm_cluster.epilog,
            health_check_program=slurm_cluster.health_check_program,
            health_check_interval=slurm_cluster.health_check_interval,
        )
        for n in backend.nodes(slurm_cluster.node_names):
            if n.drained:
                _scontrol("update", f"NodeName={n.name}", "State=RESUME")
        for path, mode in reversed(dc.opened):
            with contextlib.suppress(OSError):
                path.chmod(mode)


def _request(node: str, seq: int = 1, kind: str = "straggler") -> str:
    return DrainRequest.make(seq, node, kind, f"{node} 3.1x slower than the median").text()


def _running(dc: DrainCluster, user: str, node: str) -> str:
    """A job of `user`'s holding `node`, running."""
    job = dc.submit(user, node)
    _wait(lambda: _state(job) == "RUNNING", 90, f"job {job} of {user} to run on {node}")
    return job


@pytest.mark.timeout(300)
def test_trusted_request_from_a_requeued_job_drains_its_node_naming_job_and_user(
    drain_cluster: DrainCluster,
) -> None:
    dc = drain_cluster
    dc.policy("trust")
    job = _running(dc, USER, "node1")
    update = dc.as_user(USER, "scontrol", "update", f"JobId={job}", f"Comment={_request('node1')}")
    assert update.returncode == 0, update.stderr  # the owner may set its own job's comment
    refused = dc.as_user(USER, "scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=x")
    assert refused.returncode != 0  # but not drain a node itself
    requeue = dc.as_user(USER, "scontrol", "requeue", job)
    assert requeue.returncode == 0, requeue.stderr
    rec = dc.epilog("node1", job)
    assert rec["drain_request"]["action"] == "drain", rec
    assert rec["drain_request"]["user"] == USER  # SLURM_JOB_USER, as slurmd set it
    assert rec["exit"] == 0
    node1 = dc.node("node1")
    assert node1.drained, node1
    assert node1.reason.startswith(f"fthsdp: requested: job {job} user {USER}: straggler: node1")


@pytest.mark.timeout(300)
def test_recheck_drains_only_on_a_finding_of_the_full_suite(drain_cluster: DrainCluster) -> None:
    dc = drain_cluster
    healthy = dc.submit(USER, "node2", f"--comment={_request('node2')}", command="true")
    rec = dc.epilog("node2", healthy)
    assert rec["drain_request"]["action"] == "recheck" and rec["healthy"], rec
    assert "nvlink" in [c["name"] for c in rec["checks"]]
    assert not dc.node("node2").drained
    # An NVLink fault is no Epilog check of its own: only the requested recheck finds it.
    write_node_inputs(dc.root, "node3", gpus=dc.cfg.gpus_per_node, faults=["nvlink"])
    plain = dc.submit(USER, "node3", "--comment=team=x", command="true")
    assert dc.epilog("node3", plain)["healthy"] and not dc.node("node3").drained
    faulty = dc.submit(USER, "node3", f"--comment={_request('node3')}", command="true")
    rec = dc.epilog("node3", faulty)
    assert rec["drain_request"]["action"] == "recheck" and not rec["healthy"], rec
    node3 = dc.node("node3")
    assert node3.drained, node3
    assert node3.reason.startswith(f"fthsdp: nvlink: requested by job {faulty} user {USER}: ")


@pytest.mark.timeout(420)
def test_hostile_user_cannot_drain_a_node_never_held_more_than_the_limit_or_an_admin_drain(
    drain_cluster: DrainCluster,
) -> None:
    dc = drain_cluster
    dc.policy("trust", limit=1)
    # A request naming a node the job never held: node1 is left in service.
    elsewhere = dc.submit(OTHER, "node4", f"--comment={_request('node1')}", command="true")
    rec = dc.epilog("node4", elsewhere)
    assert rec["drain_request"]["action"] == "refuse", rec
    assert "names node node1, not node4" in rec["drain_request"]["why"]
    assert not dc.node("node1").drained and not dc.node("node4").drained
    # One request is within the limit ...
    first = dc.submit(OTHER, "node4", f"--comment={_request('node4')}", command="true")
    assert dc.epilog("node4", first)["drain_request"]["action"] == "drain"
    assert dc.node("node4").reason.startswith(f"fthsdp: requested: job {first} user {OTHER}:")
    # ... a second, while that node is drained, is not (on any node) ...
    second = dc.submit(OTHER, "node2", f"--comment={_request('node2')}", command="true")
    rec = dc.epilog("node2", second)
    assert "keep 1 nodes drained (limit 1)" in rec["drain_request"]["why"], rec
    assert not dc.node("node2").drained
    # ... nor, once the node is back, a second on the same node within the day.
    assert _scontrol("update", "NodeName=node4", "State=RESUME").returncode == 0
    third = dc.submit(OTHER, "node4", f"--comment={_request('node4')}", command="true")
    rec = dc.epilog("node4", third)
    assert "made 1 requests here in 24 h (limit 1)" in rec["drain_request"]["why"], rec
    assert not dc.node("node4").drained
    # An admin drains the node under a running job; the job's request leaves it exactly as is.
    job = _running(dc, OTHER, "node2")
    admin = _scontrol("update", "NodeName=node2", "State=DRAIN", "Reason=admin: maintenance")
    assert admin.returncode == 0, admin.stderr
    before = dc.node("node2")
    comment = dc.as_user(
        OTHER, "scontrol", "update", f"JobId={job}", f"Comment={_request('node2')}"
    )
    assert comment.returncode == 0, comment.stderr
    assert dc.as_user(OTHER, "scancel", job).returncode == 0
    rec = dc.epilog("node2", job)
    assert "another drain (admin: maintenance)" in rec["drain_request"]["why"], rec
    after = dc.node("node2")
    assert after.drained and after.reason == "admin: maintenance" == before.reason
    # The other user's own Epilog runs all exited 0: no refusal failed a job's Epilog.
    runs = [
        json.loads(line)
        for node in ("node2", "node4")
        for line in (dc.root / f"health-{node}.jsonl").read_text().splitlines()
    ]
    assert all(r["exit"] == 0 for r in runs if r.get("mode") == "epilog"), runs
    # Another user may not write a request into someone else's job.
    victim = _running(dc, USER, "node3")
    foreign = dc.as_user(OTHER, "scontrol", "update", f"JobId={victim}", "Comment=x")
    assert foreign.returncode != 0
    assert os.path.exists(dc.root / "node4" / "state" / "drain_requests.json")


@pytest.mark.timeout(300)
def test_healthcheck_resumes_a_requested_drain_only_after_the_hold(
    drain_cluster: DrainCluster,
) -> None:
    """A user's trusted request cannot keep a healthy node out: HealthCheckProgram holds the
    drain for `drain_request_hold_s`, then resumes it, since the node passes its checks."""
    dc = drain_cluster
    hold = 20.0
    dc.policy("trust", hold_s=hold)
    job = dc.submit(USER, "node2", f"--comment={_request('node2', kind='hung')}", command="true")
    epilog = dc.epilog("node2", job)
    assert epilog["drain_request"]["action"] == "drain"
    assert dc.node("node2").reason.startswith(f"fthsdp: requested: job {job} user {USER}: hung:")
    dc.cfg = devcluster.reconfigure(
        dc.cfg, health_check_program=dc.healthcheck, health_check_interval=5
    )

    def held() -> bool:
        return any(
            "requested drain is held" in r["action"]["why"]
            for r in dc.records("node2", "healthcheck")
        )

    _wait(held, 60, "HealthCheckProgram to hold node2's requested drain")
    assert dc.node("node2").drained

    def resumed() -> list[dict[str, Any]]:
        runs = dc.records("node2", "healthcheck")
        return [r for r in runs if r["action"]["action"] == "resume" and r["action"].get("done")]

    # The hook writes its record after it has resumed the node: wait for the record.
    _wait(resumed, 90, "HealthCheckProgram to resume node2 after the hold")
    assert not dc.node("node2").drained
    # The Epilog drained after it started; the resume was decided before its run ended.
    first = resumed()[0]
    assert first["time"] + first["elapsed_s"] - epilog["time"] >= hold
