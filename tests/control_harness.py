"""Test helpers for the control plane: stand-ins for Slurm's commands that keep state in a JSON
file and log every call, a `fthsdp control` process that can be killed with -9, and signed posts.

The dev-cluster end-to-end tests (`test_story_control_e2e.py`,
`test_story_straggler_devcluster.py`) share the run they submit (`SPEC`, `write_spec`: 3 one-node
replicas of `examples/train_tiny.py` + the control job), the health-gated cluster
(`health_gated`) and the helpers that drive the run through the CLI (`fthsdp`, `wait_until`,
`cancel`, `clean_up`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from user_harness import SiteUser, journal_actions_of, user_argv

from prolog_epilog import dev_health
from runtime.control.journal.store import Journal
from runtime.control.policy import PolicyConfig, Requeue
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import ReplicaReport, replica_key_id, sign
from slurm import devcluster
from slurm.backend import JobInfo, NodeInfo
from slurm.devcluster import DevClusterConfig

ROOT = Path(__file__).resolve().parents[1]
#: Who drives a dev-cluster run: root's environment (the checkout's CLI as root), or a job user
#: working through the site install (`user_harness.SiteUser`), as a site's users do.
Cli = dict[str, str] | SiteUser

FAKE_SLURM = r'''#!PYTHON
"""Stand-in for scontrol/squeue/sinfo: state in $FAKE_SLURM_STATE, calls in $FAKE_SLURM_LOG."""
import fcntl, json, os, sys, time
name = os.path.basename(sys.argv[0]); args = sys.argv[1:]
state_path = os.environ["FAKE_SLURM_STATE"]
with open(state_path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    state = json.load(open(state_path))
    with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
        log.write(" ".join([name, *args]) + "\n")
    if args == ["--version"]:
        print("slurm 22.05.8")
    elif name == "squeue":
        ids = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--jobs=")]
        want = set(ids[0]) if ids else set(state["jobs"])
        if "-o" in args:  # text form: one %T state per job
            print("\n".join(v["state"] for j, v in state["jobs"].items() if j in want))
            want = set()
        jobs = [dict(job_id=int(j), name="r", job_state=v["state"], nodes=v["nodes"],
                     restart_cnt=v["restarts"], state_reason="", het_job_id=0, het_job_offset=0)
                for j, v in state["jobs"].items() if j in want]
        if "-o" not in args:
            print(json.dumps({"jobs": jobs}))
    elif name == "sinfo":
        print(json.dumps({"nodes": [dict(name=n, state=v["state"], state_flags=v["flags"],
                                         reason=v["reason"]) for n, v in state["nodes"].items()]}))
    elif name == "scontrol" and args[0] == "requeue":
        time.sleep(float(os.environ.get("FAKE_REQUEUE_SLEEP", "0")))
        job = state["jobs"][args[1]]; job["restarts"] += 1; job["state"] = "PENDING"
    elif name == "scontrol" and args[0] == "update" and args[1].startswith("NodeName="):
        node = state["nodes"][args[1].split("=", 1)[1]]
        node["flags"] = ["DRAIN"]; node["reason"] = args[3].split("=", 1)[1]
    json.dump(state, open(state_path + ".tmp", "w")); os.replace(state_path + ".tmp", state_path)
'''


def control_info(run_dir: Path) -> dict[str, Any]:
    """The run's control.json as it stands, or {} while it is missing or being rewritten."""
    try:
        return dict(json.loads((run_dir / "control.json").read_text()))
    except (OSError, ValueError):
        return {}


def two_replica_config(run_dir: Path, **kw: Any) -> CoordinatorConfig:
    """An in-process coordinator's settings for replicas 0 and 1 (jobs 100 and 101), no polls."""
    return CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=2),
        job_ids={0: "100", 1: "101"},
        poll_jobs=False,
        **kw,
    )


def install_fake_slurm(root: Path, jobs: dict[str, str]) -> dict[str, str]:
    """Fake Slurm commands under root/bin; returns the environment that uses them."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "fake_slurm"
    script.write_text(FAKE_SLURM.replace("#!PYTHON", "#!" + sys.executable))
    script.chmod(0o755)
    for name in ("scontrol", "squeue", "sinfo", "scancel", "sbatch"):
        (bin_dir / name).symlink_to(script)
    state = {
        "jobs": {j: {"state": "RUNNING", "nodes": node, "restarts": 0} for j, node in jobs.items()},
        "nodes": {
            f"node{i}": {"state": "allocated", "flags": [], "reason": ""} for i in range(1, 5)
        },
    }
    (root / "slurm.json").write_text(json.dumps(state))
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        FAKE_SLURM_STATE=str(root / "slurm.json"),
        FAKE_SLURM_LOG=str(root / "calls.log"),
        PYTHONPATH=str(ROOT),
    )
    return env


def set_jobs(root: Path, states: dict[str, str | None]) -> None:
    """Change the fake Slurm's jobs under its lock: a new state, or None to purge the job."""
    path = root / "slurm.json"
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text())
        for job, state in states.items():
            if state is None:
                data["jobs"].pop(job, None)
            else:
                data["jobs"][job]["state"] = state
        path.write_text(json.dumps(data))


def calls(root: Path, prefix: str) -> list[str]:
    log = root / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith(prefix)]


def wait_for(pred: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class RecordingBackend:
    """A `SlurmBackend` that records what it is asked to do; jobs run on `allocations`
    (job id -> Slurm hostlist; default `node1`, the dev cluster's single-node replica)."""

    def __init__(self, allocations: dict[str, str] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.allocations = allocations or {}
        #: Nodes on which no step runs (their slurmd is gone); every other node answers.
        self.silent: set[str] = set()
        #: (node, het group) of every probe step asked for.
        self.probes: list[tuple[str, int | None]] = []

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        raise NotImplementedError

    def requeue(self, job_id: str) -> None:
        self.calls.append(("requeue", job_id))

    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None:
        self.calls.append(("release", job_id))

    def step_runs(
        self, job_id: str, node: str, timeout: float, het_group: int | None = None
    ) -> bool:
        self.probes.append((node, het_group))
        return node not in self.silent

    def cancel(self, job_ids: Iterable[str]) -> None:
        self.calls.append(("cancel", *job_ids))

    def drain(self, node: str, reason: str) -> bool:
        self.calls.append(("drain", node, reason))
        return True

    def resume(self, node: str) -> bool:
        return False

    def set_comment(self, job_id: str, text: str) -> None:
        self.calls.append(("comment", job_id, text))

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        requeued = {c[1] for c in self.calls if c[0] == "requeue"}
        return [
            JobInfo(
                j,
                "x",
                "PENDING" if j in requeued else "RUNNING",
                self.allocations.get(j, "node1"),
                int(j in requeued),
                "",
            )
            for j in job_ids
        ]

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        return [NodeInfo(n, "allocated") for n in names]  # every node answers


class ControlProcess:
    """`fthsdp control` for a run folder: as root from the checkout, or, given a `SiteUser`, as
    that user from the site install (its log then sits beside the run folder, in the user's)."""

    def __init__(self, run_dir: Path, env: Cli, extra: list[str] | None = None) -> None:
        self.run_dir, self.env, self.extra = run_dir, env, list(extra or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        control = self.run_dir / "control.json"
        control.unlink(missing_ok=True)
        args = ["control", "--run-dir", str(self.run_dir)]
        args += ["--bind", "127.0.0.1", "--no-lighthouse", *self.extra]
        if isinstance(self.env, SiteUser):
            argv = user_argv(self.env.user, [str(self.env.prefix / "bin" / "fthsdp"), *args])
            env, log_path = self.env.env, self.env.home / "control.log"
        else:
            argv = [sys.executable, "-m", "fthsdp_cli", *args]
            env, log_path = self.env, self.run_dir / "control.log"
        log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        log.close()
        wait_for(control.exists, what="control.json")
        return str(json.loads(control.read_text())["coordinator"])

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def post(url: str, secret: bytes, report: ReplicaReport) -> int:
    body = report.to_json()
    headers = sign(secret, replica_key_id(report.replica), "POST", "/v1/reports", body)
    req = urllib.request.Request(url + "/v1/reports", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def fatal(k: int, job: str, node: str, seq: int = 9) -> ReplicaReport:
    return ReplicaReport(
        replica=k,
        incarnation=f"w{k}",
        seq=seq,
        kind="fatal",
        job_id=job,
        nodes=[node],
        failure="node",
        failed_node=node,
        last_error="Xid 79",
    )


def action_status(run_dir: Path, kind: str, job: str) -> list[str]:
    db = sqlite3.connect(run_dir / "control.sqlite")
    try:
        rows = db.execute("SELECT payload, status FROM actions WHERE type = ?", (kind,)).fetchall()
    finally:
        db.close()
    return [status for payload, status in rows if json.loads(payload).get("job_id") == job]


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, Path, dict[str, str], ControlProcess]]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(
        json.dumps({"replicas": {"count": 2}, "train": {"min_replicas": 1}})
    )
    record = {
        "name": "t",
        "run_dir": str(run_dir),
        "submitted_at": 0.0,
        "control": {"role": "control", "job_id": "99", "job_name": "t-ctl", "script": "c"},
        "replicas": [
            {"role": "replica", "job_id": str(100 + k), "job_name": f"t-r{k}", "script": "r",
             "replica": k}
            for k in range(2)
        ],
    }  # fmt: skip
    (run_dir / "jobs.json").write_text(json.dumps(record))
    env = install_fake_slurm(tmp_path, {"99": "node4", "100": "node1", "101": "node2"})
    proc = ControlProcess(run_dir, env)
    try:
        yield run_dir, tmp_path, env, proc
    finally:
        proc.stop()


# -- the dev-cluster end-to-end run ------------------------------------------------------------

#: 3 one-node replicas of `examples/train_tiny.py` (one CPU rank each) + the control job; with the
#: 4-node dev cluster that leaves one spare node. The training command is the plain python line:
#: the health-gated dev cluster's TaskProlog points each rank at its node's simulated hardware.
SPEC = """
[job]
name = "{name}"
run_dir = "{run_dir}"
time = "00:20:00"
partition = "gpu"

[replicas]
count = 3
nodes = 1
gpus_per_node = 8
tasks_per_node = 1
cpus_per_task = 1
mem = "2G"

[control]
cpus = 1
mem = "1G"
python = "{python}"

[train]
command = "{python} {root}/examples/train_tiny.py"
steps = {steps}
# Every dev node shares this machine's 2 cores: scheduling noise can make one replica look 1.5x
# slower for a window. Runs about node faults only report stragglers; the straggler test evicts.
straggler_mode = "{straggler_mode}"
min_replicas = 2
heartbeat_timeout_s = 0.5
allreduce_timeout_s = 5
quorum_timeout_s = 10
join_timeout_s = 30

[health]
checks = ["xid", "ecc"]
"""


def write_spec(
    work: Path | SiteUser, steps: int, name: str = "e2e", straggler_mode: str = "report"
) -> tuple[Path, Path]:
    """The run's spec at work/spec.toml; returns (spec, run_dir). `--dependency=singleton` is
    per job name, so runs that may overlap in one session use different names. For a job user
    the spec lies in their folder and names the site install's python."""
    home = work.home if isinstance(work, SiteUser) else work
    run_dir = home / "run"
    spec = home / "spec.toml"
    text = SPEC.format(
        name=name,
        run_dir=run_dir,
        python=work.python if isinstance(work, SiteUser) else sys.executable,
        root=ROOT,
        steps=steps,
        straggler_mode=straggler_mode,
    )
    if isinstance(work, SiteUser):
        work.write(spec, text)
    else:
        spec.write_text(text)
    return spec, run_dir


@contextlib.contextmanager
def health_gated(cfg: DevClusterConfig) -> Iterator[DevClusterConfig]:
    """The session cluster switched to simulated hardware + the project's Prolog/Epilog/
    HealthCheckProgram/TaskProlog for the block, and back afterwards."""
    gated = devcluster.reconfigure(cfg, **dev_health.health_settings(cfg))
    try:
        yield gated
    finally:
        devcluster.reconfigure(cfg)


def _cli(env: Cli, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    if isinstance(env, SiteUser):
        return env.fthsdp(*args, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def fthsdp(env: Cli, *args: str) -> str:
    r = _cli(env, args, 120)
    assert r.returncode == 0, f"fthsdp {args}: {r.stderr[-2000:]}"
    return r.stdout


def cancel(env: Cli, run_dir: Path) -> None:
    """Cancel the run's jobs (best effort: used in clean-up)."""
    _cli(env, ["cancel", str(run_dir)], 60)


def clean_up(env: Cli, run_dir: Path, cfg: DevClusterConfig, node: str | None) -> None:
    """Cancel the run; make `node` (the one a fault was injected into) healthy again, and resume
    every node the run drained (an unexpected drain must not starve the session's later tests)."""
    from runtime.control.inject import heal
    from slurm.backend import CommandBackend, SlurmCommandError

    cancel(env, run_dir)
    if node:
        heal(dev_health.hardware_dir(cfg), node, cfg.gpus_per_node)
    backend = CommandBackend()
    try:
        for info in backend.nodes():
            if info.drained_by_us:
                backend.resume(info.name)
    except SlurmCommandError:
        pass


def control_node(run_dir: Path) -> str:
    """The node the run's control job runs on, as Slurm says (`control.json` names the job)."""
    from slurm.backend import CommandBackend
    from slurm.hostlist import expand

    (job,) = CommandBackend().jobs([str(control_info(run_dir)["job_id"])])
    (node,) = expand(job.nodes)
    return node


def heal_node(cfg: DevClusterConfig, node: str) -> None:
    """Boot a powered-off node (`inject --fault down`), as an operator would once the power is
    back, as root."""
    subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "cluster", "heal", node, "--dir", str(cfg.directory)],
        env=dict(os.environ), cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def node_state(node: str) -> str:
    """Slurm's state of `node` in lower case, "?" while Slurm cannot say."""
    from slurm.backend import CommandBackend, SlurmCommandError

    try:
        (info,) = CommandBackend().nodes([node])
    except (SlurmCommandError, ValueError):
        return "?"
    return info.state.lower()


def replicas(env: Cli, run_dir: Path) -> dict[int, dict[str, Any]]:
    data = json.loads(fthsdp(env, "status", str(run_dir), "--json"))
    return {r["replica"]: r for r in data["replicas"]}


def journal_actions(run_dir: Path, user: SiteUser | None = None) -> list[tuple[str, str, str]]:
    """(action type, job id, status) of every action in the run's journal, read as `user`
    (through the site install) when the run is theirs."""
    if user is not None:
        return journal_actions_of(user, run_dir)
    journal = Journal.in_run_dir(run_dir)
    try:
        return [
            (type(s.action).__name__, getattr(s.action, "job_id", None), s.status)
            for s in journal.actions()
        ]
    finally:
        journal.close()


#: Read as the run's user (root opening the journal would leave it files the user cannot write).
_SUMMARY = """
import json, sys
from pathlib import Path
from runtime.control.journal.store import Journal
from runtime.control.policy import Drain, Requeue, StragglerEviction
journal = Journal.in_run_dir(Path(sys.argv[1]))
print(json.dumps({
    "requeues": [(s.action.job_id, s.status) for s in journal.actions()
                 if isinstance(s.action, Requeue)],
    "drains": [(s.action.node, s.status, s.action.reason) for s in journal.actions()
               if isinstance(s.action, Drain)],
    "evictions": [(e.replica, e.node, e.at) for _, e in journal.events()
                  if isinstance(e, StragglerEviction)],
    "attempts": journal._db.execute(
        "SELECT b.type, a.outcome, a.detail FROM attempts a JOIN actions b"
        " ON a.action_id = b.id ORDER BY a.id").fetchall(),
}))
"""


def journal_summary(run_dir: Path, user: SiteUser) -> dict[str, list[list[Any]]]:
    """Every Requeue (job id, status), Drain (node, status, reason), straggler eviction
    (replica, node, at) and Slurm attempt (action type, outcome, detail) of the run's journal."""
    r = user.run([str(user.python), "-c", _SUMMARY, str(run_dir)])
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def requeues_in_journal(run_dir: Path, user: SiteUser | None = None) -> list[tuple[str, str]]:
    return [(job, status) for kind, job, status in journal_actions(run_dir, user)
            if kind == Requeue.__name__]  # fmt: skip


def requeued_and_caught_up(replica: int) -> Callable[[dict[int, dict[str, Any]]], bool]:
    """`wait_until` predicate: `replica` was requeued once, trains again and is within 3 steps
    of the slowest other replica."""

    def pred(reps: dict[int, dict[str, Any]]) -> bool:
        r = reps[replica]
        others = [x["step"] or 0 for k, x in reps.items() if k != replica]
        return (
            r["restarts"] == 1
            and r["state"] == "training"
            and (r["step"] or 0) >= min(others, default=0) - 3
        )

    return pred


def wait_until(
    env: Cli,
    run_dir: Path,
    pred: Callable[[dict[int, dict[str, Any]]], bool],
    timeout: float,
    what: str,
    trace: list[tuple[float, dict[int, dict[str, Any]]]],
) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reps = replicas(env, run_dir)
        trace.append((time.time(), reps))
        if pred(reps):
            return reps
        time.sleep(2)
    print(log_tails(run_dir))
    raise AssertionError(f"timed out waiting for {what}; last: {trace[-1][1] if trace else None}")


def log_tails(run_dir: Path, lines: int = 15) -> str:
    """The last lines of the run's logs (stderr of the control job and each replica) and its
    control.json: what a timed-out story prints, since its run folder is removed afterwards."""
    out = [f"== {run_dir / 'control.json'}"]
    try:
        out.append((run_dir / "control.json").read_text(errors="replace"))
    except OSError as exc:
        out.append(f"(unreadable: {exc})")
    for path in sorted((run_dir / "logs").glob("*.err")):
        try:
            # torchft's per-step INFO lines would hide what fthsdp said
            said = [
                line
                for line in path.read_text(errors="replace").splitlines()
                if "[INFO] [torchft::" not in line
            ]
            tail = said[-lines:]
        except OSError as exc:
            tail = [f"(unreadable: {exc})"]
        out += [f"== {path.name}", *(line[:400] for line in tail)]
    return "\n".join(out)


def submit_until_training(
    env: Cli,
    spec: Path,
    run_dir: Path,
    trace: list[tuple[float, dict[int, dict[str, Any]]]],
    min_step: int = 20,
    sets: Sequence[str] = (),
) -> dict[int, dict[str, Any]]:
    """`fthsdp submit` the spec (with `--set` for each of `sets`), then wait (up to 120 s)
    until every replica trains at `min_step` or later; returns that status."""
    fthsdp(env, "submit", str(spec), *[a for s in sets for a in ("--set", s)])
    return wait_until(
        env,
        run_dir,
        lambda r: all(
            x["state"] == "training" and (x["step"] or 0) >= min_step for x in r.values()
        ),
        120,
        "all replicas training",
        trace,
    )
