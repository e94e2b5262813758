"""A node fault on a full cluster: with a hot spare the replica is back in seconds; without one
it waits in the queue behind another user's jobs.

2 one-node replicas of `examples/train_tiny.py` + the control job on the 4-node session cluster
(health gated: the Prolog gates every job, the replicas' watchdog reads simulated hardware).
Every node the run does not hold is filled with `nobody`'s sleep jobs (one per node, all 8 GPUs,
10-minute limit, submitted by uid: 26.05's sbatch refuses a user name). An Xid 79 goes into
replica 1's node, and the test measures fault -> the replacement's step advancing.

- `[spares] nodes = 1`: the run holds one idle slot job; replica 1 moves into it (its job id
  becomes the slot's) and participates again sooner than the run without a spare even gets a
  node, and nobody's jobs keep their ids and stay RUNNING; a refill slot is queued and waits
  like anyone's job. How soon (target 20 s) is `benchmarks/spares.py`'s figure, measured with
  the load recorded, not a wall-clock bound here.
- no spares: replica 1's requeued job, released by the coordinator, stays PENDING with Slurm's
  reason that no node is free (`Resources`), still so 10 s after the time the spare's replica
  took to train again; nobody's jobs untouched; the test does not wait out their 10 minutes.

The runs are the job user's (`fthsdp-user`, through the site install), who may not drain: the
drain of the faulty node is asked of root's Epilog in the job's comment, and root injects the
faults, as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from control_harness import ROOT, SPEC, clean_up, fthsdp, health_gated
from user_harness import SiteUser

from prolog_epilog import dev_health
from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig

STEPS = 3000
#: How long past its watch the run without a spare may take to be seen pending for want of a
#: node (the watch itself follows the run with a spare, however slow that was).
WATCH_PENDING_S = 90.0
#: Slurm's reasons for a pending job that could start but for the nodes others hold.
NO_NODE_FREE = ("Resources", "Priority", "ReqNodeNotAvail")


def spec_text(user: SiteUser, name: str, spares: int) -> tuple[SiteUser, Path, Path]:
    """The run's spec in a new folder of the job user's; returns (the user working in that
    folder, spec, run_dir)."""
    work = SiteUser(
        user.user,
        user.prefix,
        user.folder(name),
        {"SLURM_CONF": user.env["SLURM_CONF"], "TINY_STEP_SLEEP_S": "0.1"},
    )
    run_dir = work.home / "run"
    text = SPEC.format(
        name=name,
        run_dir=run_dir,
        python=work.python,
        root=ROOT,
        steps=STEPS,
        straggler_mode="report",
    )
    text = text.replace("count = 3", "count = 2").replace("min_replicas = 2", "min_replicas = 1")
    if spares:
        text += f"\n[spares]\nnodes = {spares}\n"
    spec = work.home / "spec.toml"
    work.write(spec, text)
    return work, spec, run_dir


def status(env: SiteUser, run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fthsdp(env, "status", str(run_dir), "--json"))
    return data


def wait_status(env: SiteUser, run_dir: Path, pred: Any, timeout: float, what: str,
                every: float = 1.0) -> dict[str, Any]:  # fmt: skip
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = status(env, run_dir)
        if pred(last):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}; last: {json.dumps(last)[-3000:]}")


def steady(env: SiteUser, run_dir: Path, ready: Any, timeout: float = 300) -> dict[str, Any]:
    """The status once `ready` holds twice 5 s apart with every replica's step risen and no
    relaunch in between: a replica that was just relaunched (a step killed at start, seen on
    24.11) must not overlap the fault this test measures."""
    deadline = time.monotonic() + timeout
    while True:
        a = wait_status(env, run_dir, ready, max(deadline - time.monotonic(), 1), "training")
        time.sleep(5)
        b = status(env, run_dir)
        ra, rb = reps(a), reps(b)
        if ready(b) and all(
            rb[k]["relaunches"] == ra[k]["relaunches"]
            and (rb[k]["step"] or 0) > (ra[k]["step"] or 0)
            for k in ra
        ):
            return b
        assert time.monotonic() < deadline, f"never steady: {json.dumps(b)[-2000:]}"


def advancing_in(slot: str, replica: int = 1) -> Callable[[dict[str, Any]], bool]:
    """A status predicate: `replica` runs in the slot job `slot` and its step has risen since
    it was first seen there (it participates)."""
    first: list[int] = []

    def advancing(d: dict[str, Any]) -> bool:
        r = reps(d)[replica]
        if r["job_id"] != slot or r["state"] not in ("training", "healing"):
            return False
        first.append(r["step"] or 0)
        return (r["step"] or 0) > first[0]

    return advancing


def reps(data: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["replica"]: r for r in data["replicas"]}


def squeue_of(job: str, fmt: str) -> str:
    """What `squeue -o FMT` lists for `job` (a line per component; empty once it is gone)."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", fmt], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip()


def squeue_state(job: str) -> str:
    return squeue_of(job, "%T")


def waits_for_a_node(job: str) -> tuple[bool, str]:
    """Whether every component of `job` is PENDING for a reason in `NO_NODE_FREE` (the
    scheduler looked at it, eligible, and found no node), and what squeue said."""
    said = squeue_of(job, "%T|%r")
    lines = [line.split("|", 1) for line in said.splitlines() if "|" in line]
    ok = bool(lines) and all(
        state == "PENDING" and reason.startswith(NO_NODE_FREE) for state, reason in lines
    )
    return ok, said


def let_traverse(path: Path) -> list[tuple[Path, int]]:
    """Let other users traverse (x, not read) the folders down to the cluster: slurmd starts
    nobody's batch script from its spool under the pytest temp folder (0700, and pytest sets
    it back to 0700 whenever another session starts). Returns what it changed."""
    changed = []
    for p in [path, *path.parents]:
        mode = p.stat().st_mode & 0o777
        if not mode & 0o001:
            changed.append((p, mode))
            p.chmod(mode | 0o001)
    return changed


def _sbatch_nobody(node: str, gpus: int) -> str:
    uid = pwd.getpwnam("nobody").pw_uid
    out = subprocess.run(
        ["sbatch", "--parsable", f"--uid={uid}", f"--gid={uid}", "--chdir=/tmp",
         "--output=/dev/null", "--job-name=other-user", "--time=10", "-p", "gpu",
         f"--nodelist={node}", "--nodes=1", "--ntasks=1", f"--gres=gpu:{gpus}",
         "--wrap", "sleep 600"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def _running_for(job: str, timeout: float, settle: float = 3.0) -> bool:
    """True once `job` has been RUNNING for `settle` seconds (its script started)."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        state = squeue_state(job)
        if state == "RUNNING":
            since = since or time.monotonic()
            if time.monotonic() - since >= settle:
                return True
        elif state not in ("PENDING", "CONFIGURING"):
            return False
        time.sleep(0.5)
    return False


@contextlib.contextmanager
def filled(cluster_dir: Path, nodes: list[str], gpus: int) -> Iterator[list[str]]:
    """One sleep job of `nobody` on each node in `nodes`, holding all its GPUs, RUNNING when the
    block starts; always cancelled, and the folder modes put back."""
    jobs: list[str] = []
    changed: list[tuple[Path, int]] = []
    try:
        for node in nodes:
            for _ in range(4):  # a script that could not start (spool not traversable): again
                changed += let_traverse(cluster_dir)
                jobs.append(_sbatch_nobody(node, gpus))
                if _running_for(jobs[-1], 90):
                    break
            else:
                raise AssertionError(f"nobody's job never ran on {node}:\n{_squeue()}")
        yield [j for j in jobs if squeue_state(j) == "RUNNING"]
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True, timeout=60, check=False)
        for p, mode in reversed(changed):
            with contextlib.suppress(OSError):
                p.chmod(mode)


def _run(
    cfg: DevClusterConfig, user: SiteUser, name: str, spares: int, watch_s: float = 0.0
) -> dict[str, Any]:
    """One run with `spares` slots; an Xid on replica 1's node. Without a spare, replica 1 is
    watched until Slurm says it waits for a node and `watch_s` has passed since the fault."""
    env, spec, run_dir = spec_text(user, name, spares)
    root_env = dict(os.environ)  # the operator's side: injecting the faults
    drained: str | None = None
    also_drained: str | None = None
    out: dict[str, Any] = {}
    try:
        fthsdp(env, "submit", str(spec))

        def ready(d: dict[str, Any]) -> bool:
            r = reps(d)
            ok = all(x["state"] == "training" and (x["step"] or 0) >= 10 for x in r.values())
            pool = d.get("spares")
            return ok and (not spares or bool(pool and pool.get("idle") == spares))

        before = steady(env, run_dir, ready)
        held = {n for r in before["replicas"] for n in r["nodes"]}
        if spares:
            held |= {n for s in before["spares"]["slots"] for n in s["nodes"]}
        others = [n for n in cfg.node_names if n not in held]
        assert others, f"the run holds every node {held}: nothing to fill"
        with filled(cfg.directory, others, cfg.gpus_per_node) as fillers:
            victim = reps(before)[1]["nodes"][0]
            old_job = reps(before)[1]["job_id"]
            fthsdp(
                root_env,
                "cluster",
                "inject",
                victim,
                "--fault",
                "xid79",
                "--dir",
                str(cfg.directory),
            )
            drained = victim
            t_fault = time.monotonic()
            out["fault_at"] = time.time()
            if spares:
                slot = out["slot"] = before["spares"]["slots"][0]["job_id"]
                after = wait_status(
                    env, run_dir, advancing_in(slot), 90, "replica 1 on the spare", 0.3
                )
                out["fault_to_participating_s"] = time.monotonic() - t_fault
                r1 = reps(after)[1]
                assert r1["nodes"] == before["spares"]["slots"][0]["nodes"], r1
                assert victim not in r1["nodes"]
                # Its output goes to its own logs, named for the slot's job, not to the slot's.
                logs = [run_dir / "logs" / f"replica-01-{slot}.{x}" for x in ("out", "err")]
                listing = sorted(p.name for p in (run_dir / "logs").iterdir())
                assert all(p.exists() for p in logs), listing
                assert sum(p.stat().st_size for p in logs) > 0, listing
                assert squeue_state(old_job) in ("", "CANCELLED", "COMPLETING", "COMPLETED")
                assert reps(after)[0]["job_id"] == reps(before)[0]["job_id"]
                # A refill slot waits in the queue like anyone's job.
                refill = wait_status(
                    env,
                    run_dir,
                    lambda d: any(
                        s["replica"] is None and s["state"] == "PENDING"
                        for s in d["spares"]["slots"]
                    ),
                    30,
                    "a queued refill slot",
                )
                out["pool_after"] = refill["spares"]
                requeue = _journal_requeue(run_dir, env)
                assert requeue and f"moved to spare slot {slot}" in requeue, requeue
                # A second fault while the refill waits: the pool is empty, so replica 0 falls
                # back to the plain requeue, and the journal and status say so.
                second = reps(before)[0]["nodes"][0]
                fthsdp(
                    root_env,
                    "cluster",
                    "inject",
                    second,
                    "--fault",
                    "xid79",
                    "--dir",
                    str(cfg.directory),
                )
                also_drained = second
                fell = wait_status(
                    env,
                    run_dir,
                    lambda d: (
                        (d["spares"].get("last_fallback") or {}).get("replica") == 0
                        and reps(d)[0]["slurm_state"] == "PENDING"
                    ),
                    90,
                    "replica 0 requeued with the pool empty",
                )
                assert "no spare free" in fell["spares"]["last_fallback"]["why"]
                assert "plain requeue" in _journal_requeue(run_dir, env)
                assert reps(fell)[0]["job_id"] == reps(before)[0]["job_id"]
                out["fallback"] = fell["spares"]["last_fallback"]
            else:
                # Requeued and released (no held-back begin time), the job waits: Slurm's own
                # reason says no node is free, and it still says so past `watch_s`.
                seen: list[tuple[float, str, str]] = []
                while True:
                    d = status(env, run_dir)
                    r1 = reps(d)[1]
                    waiting, said = waits_for_a_node(old_job)
                    since = time.monotonic() - t_fault
                    seen.append((round(since, 1), r1["slurm_state"], said))
                    assert r1["job_id"] == old_job
                    if r1["slurm_state"] == "RUNNING" and since > 5:
                        raise AssertionError(f"replica 1 ran again: {seen}\n{_squeue()}")
                    if waiting and since >= watch_s:
                        break
                    assert since < watch_s + WATCH_PENDING_S, (
                        f"never pending for a node: {seen[-5:]}"
                    )
                    time.sleep(2)
                out["pending_watched_s"] = time.monotonic() - t_fault
                out["pending_trace"] = seen[-3:]
            # The other user's jobs were never touched.
            assert [squeue_state(j) for j in fillers] == ["RUNNING"] * len(fillers)
            out["fillers"] = fillers
    finally:
        if also_drained:  # healed before clean_up resumes it, or a health check drains it again
            from runtime.control.inject import heal

            heal(dev_health.hardware_dir(cfg), also_drained, cfg.gpus_per_node)
        clean_up(env, run_dir, cfg, drained)
    return out


def _squeue() -> str:
    out = subprocess.run(
        ["squeue", "-o", "%i %j %T %N %r %u"], capture_output=True, text=True, timeout=30
    )
    return out.stdout


#: Read as the run's user: root opening the journal (SQLite in WAL mode) could leave root-owned
#: -wal/-shm files in the run folder that the user's coordinator then cannot open.
_REQUEUE_DETAILS = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute(
    "SELECT a.detail FROM attempts a JOIN actions b ON a.action_id = b.id "
    "WHERE b.type = 'Requeue' ORDER BY a.id"
).fetchall()
print(" | ".join(str(r[0]) for r in rows))
"""


def _journal_requeue(run_dir: Path, user: SiteUser) -> str:
    """Every requeue attempt's detail in the run's journal, oldest first."""
    r = user.run([str(user.python), "-c", _REQUEUE_DETAILS, str(run_dir / "control.sqlite")])
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_spare_takes_the_failed_replica_on_a_full_cluster(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    backend = CommandBackend()
    with health_gated(slurm_cluster) as gated:
        with_spare = _run(gated, site_user, "spares1", spares=1)
        print(json.dumps({"with_spare": with_spare}, indent=1))
        # Without a spare, replica 1 still waits for a node well after the spare's was back.
        watch_s = with_spare["fault_to_participating_s"] + 10
        without = _run(gated, site_user, "spares0", spares=0, watch_s=watch_s)
    print(json.dumps({"with_spare": with_spare, "without": without}, indent=1))
    assert without["pending_watched_s"] >= watch_s
    assert not [n.name for n in backend.nodes() if n.drained_by_us]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_spare_that_fails_its_check_is_drained_and_replaced(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    """An Xid 79 on the idle spare's node: the HealthCheckProgram drains it like any node, the
    coordinator retires the slot and queues a new one, which starts on a healthy node."""
    backend = CommandBackend()
    with health_gated(slurm_cluster) as cfg:
        env, spec, run_dir = spec_text(site_user, "sparehc", 1)
        root_env = dict(os.environ)  # the operator's side: injecting the fault
        victim: str | None = None
        try:
            fthsdp(env, "submit", str(spec))
            before = wait_status(
                env,
                run_dir,
                lambda d: bool(d.get("spares") and d["spares"].get("idle") == 1),
                240,
                "an idle spare",
            )
            (slot,) = before["spares"]["slots"]
            victim = slot["nodes"][0]
            fthsdp(
                root_env,
                "cluster",
                "inject",
                victim,
                "--fault",
                "xid79",
                "--dir",
                str(cfg.directory),
            )

            def replaced(d: dict[str, Any]) -> bool:
                pool = d["spares"]
                return slot["job_id"] in pool["retired"] and any(
                    s["job_id"] != slot["job_id"]
                    and s["state"] == "RUNNING"
                    and s["health"] == "ok"
                    for s in pool["slots"]
                )

            after = wait_status(env, run_dir, replaced, 180, "the spare retired and replaced")
            (new,) = [s for s in after["spares"]["slots"] if s["job_id"] != slot["job_id"]]
            assert victim not in new["nodes"]
            (info,) = backend.nodes([victim])
            assert info.drained_by_us, info
            assert squeue_state(slot["job_id"]) in ("", "CANCELLED", "COMPLETING")
            # The replicas never noticed.
            assert all(r["restarts"] == 0 for r in after["replicas"])
        finally:
            clean_up(env, run_dir, cfg, victim)
