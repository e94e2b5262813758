"""What a job's owner may do in Slurm without admin rights, recorded on the real dev cluster.

The coordinator runs as the job's user, so its whole design rests on these facts: the owner
may requeue its own job, move its start, change its excluded nodes, release it and set its
Comment (the channel a run uses to ask root's Epilog for a drain); it may not drain a node nor
set an AdminComment; and another ordinary user may do none of this to the owner's job.
Each is checked on every release of the matrix, with the exit status and Slurm's own words.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from user_harness import as_user, user_env, user_folder

from slurm.devcluster import DevClusterConfig, slurm_release

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


class Scontrol:
    """`scontrol`/`squeue`/`sbatch` as one user, with the cluster's config and nothing else."""

    def __init__(self, cluster: DevClusterConfig, user: str, home: Path) -> None:
        self.user = user
        self.home = home
        self.env = user_env(user, home, {"SLURM_CONF": str(cluster.conf_path)})

    def __call__(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return as_user(self.user, argv, self.env, self.home, timeout=30)


def _field(ctl: Scontrol, job: str, name: str, missing: str | None = None) -> str:
    """One field of `scontrol show job`; `missing` where Slurm leaves it out (AdminComment is
    shown only once set), else a field it lacks fails the test."""
    r = ctl("scontrol", "show", "job", "-o", job)
    assert r.returncode == 0, r.stderr
    for item in r.stdout.split():
        key, _, value = item.partition("=")
        if key == name:
            return value
    if missing is not None:
        return missing
    raise AssertionError(f"scontrol show job {job}: no {name}= in {r.stdout!r}")


def _wait_state(ctl: Scontrol, job: str, want: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = _field(ctl, job, "JobState")
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.25)


@pytest.fixture
def owner_job(
    slurm_cluster: DevClusterConfig, job_users: tuple[str, str], user_base: Path
) -> Iterator[tuple[Scontrol, Scontrol, str]]:
    """A held one-node job of the job user; (owner's scontrol, other user's, job id)."""
    owner, other = job_users
    mine = Scontrol(slurm_cluster, owner, user_folder(user_base, owner, "owner"))
    theirs = Scontrol(slurm_cluster, other, user_folder(user_base, other, "other"))
    r = mine(
        "sbatch", "--parsable", "--hold", "-N1", "--job-name=privileges",
        f"--output={mine.home}/slurm-%j.out", "--wrap", "sleep 300",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    try:
        yield mine, theirs, job
    finally:
        subprocess.run(["scancel", "--full", job], env=slurm_cluster.env(), timeout=30, check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            q = subprocess.run(
                ["squeue", "-h", "-j", job], capture_output=True, text=True,
                env=slurm_cluster.env(), timeout=30, check=False,
            )  # fmt: skip
            if not q.stdout.strip():
                break
            time.sleep(0.25)


def _refused(r: subprocess.CompletedProcess[str]) -> str:
    """Slurm's words for a refusal (the call must have failed)."""
    assert r.returncode != 0, f"{r.args} was allowed: {r.stdout!r}"
    return " ".join(r.stderr.split())


def test_job_owner_rights_and_limits(
    owner_job: tuple[Scontrol, Scontrol, str], slurm_cluster: DevClusterConfig
) -> None:
    mine, theirs, job = owner_job
    major, minor = slurm_release()
    release = f"{major}.{minor:02d}"
    said: dict[str, str] = {}

    # The owner's own job, while it is held (pending).
    for setting in ("ExcNodeList=node1", "ExcNodeList=", "Comment=fthsdp-test-comment"):
        r = mine("scontrol", "update", f"JobId={job}", setting)
        assert r.returncode == 0, (release, setting, r.stderr)
    assert _field(mine, job, "Comment") == "fthsdp-test-comment"
    assert _field(mine, job, "ExcNodeList") == "(null)"
    r = mine("scontrol", "update", f"JobId={job}", "StartTime=now+5")
    assert r.returncode == 0, (release, r.stderr)
    r = mine("scontrol", "release", job)
    assert r.returncode == 0, (release, r.stderr)
    assert _wait_state(mine, job, "RUNNING", 60) == "RUNNING"
    node = _field(mine, job, "NodeList")

    # What the owner may not do: node state and the admin's comment.
    said["owner drain"] = _refused(
        mine("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=fthsdp-test")
    )
    said["owner AdminComment"] = _refused(
        mine("scontrol", "update", f"JobId={job}", "AdminComment=fthsdp-test")
    )
    states = subprocess.run(
        ["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True,
        env=slurm_cluster.env(), timeout=30, check=True,
    ).stdout.strip()  # fmt: skip
    assert "drain" not in states and "drng" not in states, states
    assert _field(mine, job, "AdminComment", missing="") in ("(null)", "")

    # Another ordinary user may not touch the owner's job.
    said["other requeue"] = _refused(theirs("scontrol", "requeue", job))
    said["other Comment"] = _refused(
        theirs("scontrol", "update", f"JobId={job}", "Comment=not-yours")
    )
    assert _field(mine, job, "Comment") == "fthsdp-test-comment"
    assert _wait_state(mine, job, "RUNNING", 0) == "RUNNING"

    # The owner requeues its running job.
    r = mine("scontrol", "requeue", job)
    assert r.returncode == 0, (release, r.stderr)
    assert _wait_state(mine, job, "PENDING", 60) == "PENDING"
    r = mine("scontrol", "update", f"JobId={job}", "ExcNodeList=" + node)
    assert r.returncode == 0, (release, r.stderr)
    assert _field(mine, job, "ExcNodeList") == node
    print(f"\nSlurm {release}: job owner refusals: {said}")
