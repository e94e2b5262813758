"""A run of an unprivileged user asks root for a drain instead of draining, and keeps the node off.

On the real dev cluster, everything of the run as `nobody` (uid 65534: no Slurm admin rights,
not SlurmUser, no accounting): two one-node jobs stand in for the run's replicas, submitted by
`nobody`'s own sbatch; the coordinator runs as `nobody` with `drain = auto`; the operator's
`fthsdp requeue RUN --replica 0 --drain NODE` comes from `nobody` too. Then:

- the coordinator started in mode `request` and journaled it;
- the drain is journaled `requested`, never `done`, and the node is not drained by the run;
- replica 0's job Comment holds the request (`slurm.drain_request`: its node, kind `operator`);
- the requeued job's `ExcNodeList` holds the node, and it runs again elsewhere;
- `fthsdp doctor` as `nobody` says `request` and why, as root `direct`.

Interpreter: `nobody` cannot run the developer's venv (its Python lives under root's 0700
home), so the user's commands run on a Python every user can: the relocated copy of the same
CPython that the site install is made from (/var/cache/fthsdp/python) when it is there, else the
host's /usr/bin/python3 of the same minor version, with this checkout and the venv's
site-packages on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm import devcluster
from slurm.backend import CommandBackend
from slurm.drain_request import parse
from slurm.hostlist import expand

ROOT = Path(__file__).resolve().parent.parent
USER = "nobody"
PYTHONS = (
    *sorted(
        Path("/var/cache/fthsdp/python").glob(f"cpython-3.{sys.version_info[1]}.*/bin/python3")
    ),
    Path("/usr/bin/python3"),
)


def user_python() -> Path:
    """An interpreter of this Python's minor version that `nobody` may run."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for python in PYTHONS:
        r = run_as([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], {}, 30)
        if r.returncode == 0 and r.stdout.strip() == want:
            return python
    msg = f"no Python {want} that {USER} may run (tried {', '.join(map(str, PYTHONS))})"
    if os.environ.get("CI") or os.environ.get("FTHSDP_REQUIRE_SLURM"):
        pytest.fail(msg)
    pytest.skip(msg)


def run_as(
    argv: list[str], env: dict[str, str], timeout: float, cwd: str = "/tmp"
) -> subprocess.CompletedProcess[str]:
    """`argv` as `nobody` (its uid and gid, no groups) with exactly `env`."""
    entry = pwd.getpwnam(USER)
    full = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
    return subprocess.run(
        [*full, "--", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def open_to_users(path: Path, read: bool = False) -> list[tuple[Path, int]]:
    """Let other users traverse the folders down to `path` (and read it, with `read`): a
    site's slurm.conf is world-readable, the dev cluster's folder is root's. Returns what it
    changed, to put back."""
    changed = []
    for p in [path, *path.parents]:
        mode = p.stat().st_mode & 0o777
        add = 0o004 if read and p == path else 0o001
        if mode & add != add:
            changed.append((p, mode))
            p.chmod(mode | add)
    return changed


@contextlib.contextmanager
def kept_open(conf: Path, run_parent: Path) -> Iterator[None]:
    """`open_to_users` for the cluster's slurm.conf (read) and the run's folder (traverse),
    kept so while the block runs: every pytest session that starts on this machine sets
    /tmp/pytest-of-root back to 0700, which would lock `nobody` out of the cluster's config and
    its jobs out of slurmd's spool in the middle of the story. Modes are put back at the end."""
    changed: list[tuple[Path, int]] = []
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(0.1):
            with contextlib.suppress(OSError):
                changed.extend(open_to_users(conf, read=True) + open_to_users(run_parent))

    changed += open_to_users(conf, read=True) + open_to_users(run_parent)
    keeper = threading.Thread(target=keep, daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join(5)
        first: dict[Path, int] = {}
        for p, mode in changed:
            first.setdefault(p, mode)
        for p, mode in first.items():
            with contextlib.suppress(OSError):
                p.chmod(mode)


class UserRun:
    """The run's folder and commands, all as `nobody`."""

    def __init__(self, run: Path, env: dict[str, str], python: Path) -> None:
        self.run, self.env, self.python = run, env, python
        self.control: subprocess.Popen[bytes] | None = None

    def fthsdp(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        r = run_as([str(self.python), "-m", "fthsdp_cli", *args], self.env, timeout)
        assert "Traceback" not in r.stdout + r.stderr, r.stderr
        return r

    def start_control(self) -> None:
        entry = pwd.getpwnam(USER)
        argv = [
            *("setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"),
            *("--", str(self.python), "-m", "fthsdp_cli", "control", str(self.run)),
            *("--bind", "127.0.0.1", "--no-lighthouse"),
        ]
        log = open(self.run / "control.log", "ab")  # noqa: SIM115
        self.control = subprocess.Popen(argv, env=self.env, cwd="/tmp", stdout=log, stderr=log)
        log.close()
        wait(lambda: (self.run / "control.json").exists(), 60, "control.json", self.log)

    def log(self) -> str:
        path = self.run / "control.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.control is not None and self.control.poll() is None:
            self.control.terminate()
            try:
                self.control.wait(20)
            except subprocess.TimeoutExpired:
                self.control.kill()
                self.control.wait()

    def actions(self) -> list[tuple[str, str, str | None, str]]:
        """(type, status, result, payload) of every journaled action, read-only."""
        db = sqlite3.connect(f"file:{self.run / 'control.sqlite'}?mode=ro", uri=True, timeout=10)
        try:
            rows = db.execute("SELECT type, status, result, payload FROM actions ORDER BY id")
            return list(rows)
        finally:
            db.close()


def wait(pred: object, timeout: float, what: str, why: object = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {why() if callable(why) else ''}")


def sbatch_as_user(env: dict[str, str]) -> str:
    r = run_as(
        [
            *("sbatch", "--parsable", "-N1", "--exclusive", "--requeue", "--chdir=/tmp"),
            *("-o", "/dev/null", "--wrap", "sleep 600"),
        ],
        env,
        60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def running_on(backend: CommandBackend, job: str, timeout: float = 120) -> str:
    found = ""

    def ran() -> bool:
        nonlocal found
        for j in backend.jobs([job]):
            if j.base_id == job and j.state == "RUNNING" and j.nodes:
                found = j.nodes
                return True
        return False

    wait(ran, timeout, f"job {job} to run")
    return found


@pytest.fixture
def user_run(
    slurm_cluster: devcluster.DevClusterConfig, tmp_path: Path
) -> Iterator[tuple[UserRun, list[str], list[str]]]:
    """Two RUNNING one-node jobs of `nobody` and a run folder of theirs (0700) naming them."""
    conf = slurm_cluster.conf_path
    entry = pwd.getpwnam(USER)
    venv_site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": "/tmp",
        "USER": USER,
        "LANG": "C.UTF-8",
        "SLURM_CONF": str(conf),
        "PYTHONPATH": f"{ROOT}:{venv_site}",
        "FTHSDP_CONTROL_FINISH_GRACE_S": "never",
    }
    backend = CommandBackend(env={**os.environ, "SLURM_CONF": str(conf)})
    jobs: list[str] = []
    run = tmp_path / "run"
    users: list[UserRun] = []

    def cleanup() -> None:
        for user in users:
            user.stop()
        if jobs:
            subprocess.run(["scancel", *jobs], env=backend.env, timeout=60, check=False)

    with kept_open(conf, tmp_path), contextlib.ExitStack() as stack:
        stack.callback(cleanup)
        python = user_python()
        jobs += [sbatch_as_user(env), sbatch_as_user(env)]
        nodes = [running_on(backend, job) for job in jobs]
        run.mkdir(mode=0o700)
        spec = {"replicas": {"count": 2}, "train": {"min_replicas": 1}}
        (run / "spec.json").write_text(json.dumps(spec))
        replicas = [
            {"role": "replica", "job_id": job, "job_name": f"t-r{k}", "script": "r", "replica": k}
            for k, job in enumerate(jobs)
        ]
        record = {"name": "t", "run_dir": str(run), "submitted_at": 0.0, "control": None}
        (run / "jobs.json").write_text(json.dumps({**record, "replicas": replicas}))
        for p in (run, *run.iterdir()):
            os.chown(p, entry.pw_uid, entry.pw_gid)
        users.append(UserRun(run, env, python))
        yield users[0], jobs, nodes


@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_a_user_run_requests_the_drain_and_keeps_the_node_off(
    user_run: tuple[UserRun, list[str], list[str]],
) -> None:
    user, jobs, nodes = user_run
    backend = CommandBackend(env={**os.environ, "SLURM_CONF": user.env["SLURM_CONF"]})
    assert nodes[0] != nodes[1], nodes

    # What doctor says, as the user and as root (it changes nothing).
    r = user.fthsdp("doctor", "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: this cluster runs without hooks
    drain = json.loads(r.stdout)["drain"]
    assert (drain["mode"], drain["user"]) == ("request", USER), drain
    assert "keeps no accounting" in drain["reason"] and "ExcNodeList" in drain["effect"]
    root = subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "doctor", "--json"],
        env={**os.environ, "SLURM_CONF": user.env["SLURM_CONF"]},
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert json.loads(root.stdout)["drain"]["mode"] == "direct", root.stdout + root.stderr

    user.start_control()
    # The operator's requeue --drain, as the user, through the coordinator.
    r = user.fthsdp("requeue", str(user.run), "--replica", "0", "--drain", nodes[0], "--json")
    assert r.returncode == 0, r.stdout + r.stderr + user.log()
    assert json.loads(r.stdout)["via"] == "coordinator"

    def settled() -> bool:
        status = {t: s for t, s, _, _ in user.actions()}
        return {"Drain", "Requeue", "Release"} <= set(status) and not {
            status["Drain"],
            status["Requeue"],
            status["Release"],
        } & {"decided", "started"}

    wait(settled, 120, "the requeue's actions to finish", lambda: (user.actions(), user.log()))
    actions = user.actions()
    status = {t: (s, result) for t, s, result, _ in actions}
    assert status["Drain"][0] == "requested", actions
    assert status["Requeue"][0] == "done" and status["Release"][0] == "done", actions
    assert any(t == "Note" and "drain mode request" in p for t, _, _, p in actions), actions
    # The job's comment holds the request, for root's Epilog.
    (job,) = [j for j in backend.jobs([jobs[0]]) if j.job_id == jobs[0]]
    request = parse(job.comment.strip())
    assert request is not None, job.comment
    assert (request.node, request.kind) == (nodes[0], "operator"), request
    assert request.text() in (status["Drain"][1] or "")
    # The requeued job is kept off the node, and runs again elsewhere.
    assert nodes[0] in expand(job.excluded, "ExcNodeList"), job
    again = running_on(backend, jobs[0], timeout=180)
    assert nodes[0] not in expand(again, "nodes"), again
    # The run drained nothing itself.
    (node,) = backend.nodes([nodes[0]])
    assert not node.drained_by_us, node
    # The coordinator ran as the user.
    assert user.control is not None
    assert Path(f"/proc/{user.control.pid}").stat().st_uid == pwd.getpwnam(USER).pw_uid
