"""End to end on the dev cluster: the control job itself is requeued and the replicas ride through.

3 replicas (one node each, `examples/train_tiny.py`) + the control job on the health-gated
session cluster. Once every replica trains, the control job is requeued the way Slurm or an
operator would (`scontrol requeue` + release, through `slurm.backend`). Its Lighthouse and
coordinator die with it; the new incarnation replays the journal and rewrites `control.json`.
Root holds the requeued job (`scontrol hold`, which its owner cannot release) until the outage
has outlasted the spec's join timeout (30 s), as a control job pending on a busy cluster would:
the workers wait it out for `train.control_wait_s` with their state in memory.
Before it starts, the test takes the old Lighthouse gate's port, so the new gate listens
elsewhere, as after a requeue onto another node: the replicas' Managers reach the gate through
their supervisors' forwarders, which follow the move.

What is asserted:

- the control job restarts (Slurm restart count 1) and `control.json` is rewritten by the new
  incarnation (new pid / start time, same job id), with the Lighthouse at a new address;
- no replica job is requeued: same job ids, Slurm restart count 0, and the journal holds no Slurm
  action (drain, requeue, release, cancel) at all: the coordinator treated the time it was away
  as grace, not as the replicas' silence;
- no replica is relaunched: every worker retried its failed quorums in process and kept its
  model, optimizer and ledger; the replicas' committed steps keep rising after the control plane
  is back and never go back;
- the ledger so far replays cleanly: every issued unit trained once or pending;
- the coordinator rebuilt its state from the journal: `fthsdp status --json` shows every replica
  with its step from the new coordinator, and `fthsdp events` shows two coordinator starts with
  the replicas' reports continuing after the second.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from control_harness import (
    clean_up,
    control_info,
    fthsdp,
    health_gated,
    journal_actions,
    submit_until_training,
    wait_until,
    write_spec,
)
from user_harness import SiteUser

from runtime import ledger
from runtime.control.policy import Cancel, Drain, Release, Requeue
from runtime.control.service import previous_ports
from runtime.env import read_control
from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig
from slurm.spec import load_spec

STEPS = 2000
#: How far the control plane's outage goes past the join timeout, where workers used to give up.
OUTAGE_PAST_JOIN_S = 15.0


def _hold(job: str, within_s: float) -> None:
    """`scontrol hold JOB` as root once the requeued job is pending again (a completing job
    cannot be held)."""
    deadline = time.monotonic() + within_s
    while True:
        done = subprocess.run(
            ["scontrol", "hold", job], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"scontrol hold {job}: {done.stderr.strip()}")
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("previous", "taken", "expected"),
    [
        ({}, set(), (0, 0)),
        ({"lighthouse": "http://10.0.0.5:29510", "coordinator": "http://10.0.0.5:29511"}, set(),
         (29510, 29511)),
        ({"lighthouse": "http://10.0.0.5:29510", "coordinator": "http://10.0.0.5:29511"}, {29511},
         (29510, 0)),
        ({"lighthouse": "http://10.0.0.9:29510", "coordinator": "http://10.0.0.5:29511"}, set(),
         (0, 29511)),
        ({"lighthouse": None, "coordinator": "http://10.0.0.5:99999"}, set(), (0, 0)),
        ({"lighthouse": "not a url", "coordinator": 7}, set(), (0, 0)),
    ],
)  # fmt: skip
def test_previous_ports_are_reused_on_the_same_address_when_free(
    previous: dict[str, object], taken: set[int], expected: tuple[int, int]
) -> None:
    assert previous_ports(previous, "10.0.0.5", lambda _h, port: port not in taken) == expected


def test_control_file_names_the_incarnation(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    path.write_text(json.dumps({"lighthouse": "http://h:1", "started_at": 12.5}))
    found = read_control(path)
    assert found is not None and found.started_at == 12.5 and found.coordinator is None


def slurm_actions(run_dir: Path, user: SiteUser) -> list[tuple[str, str]]:
    kinds = {kind.__name__ for kind in (Drain, Requeue, Release, Cancel)}
    return [(kind, status) for kind, _, status in journal_actions(run_dir, user) if kind in kinds]


@contextlib.contextmanager
def port_taken(port: int, within_s: float = 60.0) -> Iterator[None]:
    """Listen on every IPv4 address at `port` as soon as its old owner has let it go (the
    control job's processes end a little after the requeue), so nothing else can bind it."""
    deadline = time.monotonic() + within_s
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        while True:
            try:
                sock.bind(("0.0.0.0", port))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"port {port} still taken after {within_s}s") from exc
                time.sleep(0.2)
        sock.listen(1)
        yield


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_replicas_ride_through_a_control_job_requeue(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _ride_through(gated, site_user)


def _ride_through(gated: DevClusterConfig, site_user: SiteUser) -> None:
    env = site_user.with_env(TINY_STEP_SLEEP_S="0.1")
    spec, run_dir = write_spec(env, STEPS, name="ctlrq")
    backend = CommandBackend()
    trace: list[tuple[float, dict[int, dict[str, Any]]]] = []
    stack = contextlib.ExitStack()
    try:
        before = submit_until_training(env, spec, run_dir, trace)
        jobs = {k: r["job_id"] for k, r in before.items()}
        # Read as the test's root, which the run's own readers refuse (not this user's file).
        record = json.loads((run_dir / "jobs.json").read_text())
        assert record["control"] is not None
        control_job = str(record["control"]["job_id"])
        first = control_info(run_dir)
        assert first.get("job_id") == control_job, first

        backend.requeue(control_job)
        t_requeue = time.time()
        # Slurm holds a requeued job back (~120 s) until it is released: the old gate's port is
        # taken before the new incarnation can start.
        old_port = urlparse(first["lighthouse"]).port
        assert old_port, first
        stack.enter_context(port_taken(old_port))
        # Pending past the join timeout: held by root, which the supervisors' release of a job
        # held behind its requeue's begin time does not undo.
        _hold(control_job, within_s=60)
        join_s = load_spec(spec).train.join_timeout_s
        time.sleep(max(0.0, t_requeue + join_s + OUTAGE_PAST_JOIN_S - time.time()))
        backend.release(control_job)

        # The control job comes back and rewrites control.json with its new addresses.
        deadline = time.monotonic() + 120
        second: dict[str, Any] = {}
        while time.monotonic() < deadline:
            second = control_info(run_dir)
            if (
                second.get("pid") not in (None, first["pid"])
                and second.get("started_at", 0) > (first["started_at"])
            ):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"control.json was not rewritten: {second}")
        t_back = time.time()
        assert t_back - t_requeue > join_s + OUTAGE_PAST_JOIN_S, (t_requeue, t_back)
        (ctl,) = backend.jobs([control_job])
        assert ctl.restarts == 1 and ctl.state == "RUNNING", ctl
        assert second["job_id"] == control_job
        assert second["lighthouse"] != first["lighthouse"], (first, second)
        print(
            f"control plane back after {t_back - t_requeue:.1f}s: "
            f"{first['lighthouse']} -> {second['lighthouse']}, "
            f"{first['coordinator']} -> {second['coordinator']}"
        )

        # Training goes on: every replica commits 30 more steps than when the plane came back.
        at_back = {k: r["step"] or 0 for k, r in trace[-1][1].items()}
        after = wait_until(
            env,
            run_dir,
            lambda r: all(
                x["state"] == "training" and (x["step"] or 0) >= at_back[k] + 30
                for k, x in r.items()
            ),
            120,
            "replicas training past the control-plane restart",
            trace,
        )
        print("relaunches:", {k: r["relaunches"] for k, r in after.items()})
        for k in range(3):
            assert after[k]["job_id"] == jobs[k]
            assert after[k]["restarts"] == 0
            assert after[k]["relaunches"] == 0, after[k]
        # Steps never went back, as the (old, then new) coordinator saw them.
        for k in range(3):
            steps = [reps[k]["step"] or 0 for t, reps in trace if t >= t_requeue]
            seen = [s for s in steps if s]
            assert seen == sorted(seen), steps

        # Every unit issued so far was trained once or is pending (read as root: the run's
        # reader refuses another user's files).
        verdict = ledger.verify(ledger.read_log(sorted((run_dir / "ledger").glob("r*.jsonl"))))
        assert verdict.ok and verdict.steps > 30, verdict.problems[:3]

        # The new coordinator replayed the journal and carried on; no Slurm action on a replica.
        assert slurm_actions(run_dir, env) == []
        for job in backend.jobs(jobs.values()):
            assert job.restarts == 0, job
        events = [
            json.loads(line) for line in fthsdp(env, "events", str(run_dir), "--json").splitlines()
        ]
        starts = [e["at"] for e in events if e["kind"] == "CoordinatorStarted"]
        assert len(starts) == 2, starts
        later = [e for e in events if e["kind"] == "ReportReceived" and e["at"] > starts[1]]
        assert {e["replica"] for e in later} == {0, 1, 2}, later[-5:]
    finally:
        stack.close()
        clean_up(env, run_dir, gated, None)
