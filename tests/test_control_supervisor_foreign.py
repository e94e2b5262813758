"""The supervisor's side of a foreign torchft trainer: reading its progress, reporting for it,
watching its node and leaving no ghost behind. Real processes throughout; the node's hardware is
the dev cluster's simulated one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import ControlProcess, live_run, wait_for

from runtime.control.client import fetch_state
from runtime.control.foreign_step import ForeignLaunch, ForeignStep
from runtime.foreign import FileProgress, LineProgress, marked_processes, progress_path
from runtime.protocol import ExitCode
from runtime.watchdog import NodeWatchdog, check_options

__all__ = ["live_run"]  # the fixture, used by name

REGEX = r"step:\s*(?P<step>\d+)\s.*loss"


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("step: 7  loss: 0.3", 7),
        ("0: step: 12  loss: 1.0", 12),
        ("1: step: 99  loss: 1.0", None),  # another task's line
        ("[rank0]: \x1b[31mstep:  5  \x1b[32mloss:  7.1", 5),  # torchtitan's colours
        ("[replica_0/0 - step 5] should_commit", None),
        ("step: x loss: 1", None),
        ("0: nothing here", None),
    ],
)
def test_line_progress_reads_task_zero(line: str, step: int | None) -> None:
    assert LineProgress(REGEX).feed(line) == step


def test_line_progress_keeps_the_highest_step() -> None:
    p = LineProgress(REGEX)
    for line in ["step: 3 loss: 1", "step: 9 loss: 1", "step: 4 loss: 1"]:
        p.feed(line)
    assert p.step == 9


def test_file_progress_reads_whole_lines_skips_junk_and_restarts_on_rewrite(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "p.jsonl"
    p = FileProgress(f)
    assert p.poll() is None  # no file yet
    f.write_text('{"step": 1}\n{"step": 2}\n{"step": 3')
    assert p.poll() == 2  # the half-written line waits
    with f.open("a") as out:
        out.write('}\nnot json\n{"step": "4"}\n[1]\n{"step": true}\n')
    assert p.poll() == 3
    assert "without an integer 'step'" in caplog.text
    f.write_text('{"step": 40}\n')  # a new launch rewrote it (shorter)
    assert p.poll() == 40


def test_progress_path_fills_placeholders(tmp_path: Path) -> None:
    assert progress_path("{dump_dir}/p-{replica}.jsonl", tmp_path, 3) == (
        tmp_path / "dump" / "replica-03" / "p-3.jsonl"
    )
    assert progress_path("logs/p.jsonl", tmp_path, 0) == tmp_path / "logs" / "p.jsonl"
    assert progress_path("/abs/p.jsonl", tmp_path, 0) == Path("/abs/p.jsonl")


def _launch(tmp_path: Path, script: str, incarnation: str, **kw: Any) -> ForeignLaunch:
    env = dict(os.environ, FTHSDP_INCARNATION=incarnation)
    out = (tmp_path / "out").open("wb")
    err = (tmp_path / "err").open("wb")
    return ForeignLaunch(["bash", "-c", script], env, report_interval_s=0.1, out=out, err=err, **kw)


@pytest.mark.timeout(60)
def test_step_reports_progress_tees_output_and_keeps_the_exit_code(tmp_path: Path) -> None:
    script = 'for i in 1 2 3 4 5; do echo "0: step: $i  loss: 0.$i"; sleep 0.3; done; exit 7'
    reports: list[dict[str, Any]] = []
    step = ForeignStep(
        _launch(tmp_path, script, f"t-{os.getpid()}-a", progress_regex=REGEX),
        lambda **f: reports.append(f),
    )
    step.start()
    assert step.wait() == 7
    assert step.step == 5
    assert (tmp_path / "out").read_text().count("step:") == 5  # every line reached the log
    steps = [r["step"] for r in reports]
    assert steps == sorted(steps) and steps[-1] >= 4 and len(reports) >= 5
    times = [r["step_time_s"] for r in reports if r["step_time_s"] is not None]
    assert times and all(0.1 < t < 3 for t in times), times


@pytest.mark.timeout(60)
def test_step_reads_a_progress_file(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    script = f'for i in 1 2 3; do echo "{{\\"step\\": $i}}" >> {f}; sleep 0.3; done'
    reports: list[dict[str, Any]] = []
    step = ForeignStep(
        _launch(tmp_path, script, f"t-{os.getpid()}-f", progress_file=f),
        lambda **kw: reports.append(kw),
    )
    step.start()
    assert step.wait() == 0
    assert step.step == 3 and reports and reports[-1]["step"] >= 2


@pytest.mark.timeout(60)
def test_a_step_without_progress_is_stopped_as_hung(tmp_path: Path) -> None:
    """Alive but stuck (a deadlocked data loader, a hung write): no new step for the progress
    timeout stops the step, and it ends as a process fault naming the last step."""
    script = 'echo "step: 1  loss: 1"; echo "step: 2  loss: 1"; sleep 120'
    launch = _launch(
        tmp_path, script, f"t-{os.getpid()}-hung", progress_regex=REGEX, progress_timeout_s=1.5
    )
    step = ForeignStep(launch)
    t0 = time.monotonic()
    step.start()
    assert step.wait() == ExitCode.PROCESS_FAULT
    assert 1.5 <= time.monotonic() - t0 < 15
    assert step.hung is not None and "no progress for" in step.hung, step.hung
    assert "(last step 2)" in step.hung


@pytest.mark.timeout(60)
def test_a_step_that_keeps_stepping_is_never_hung(tmp_path: Path) -> None:
    script = 'for i in $(seq 1 12); do echo "step: $i  loss: 1"; sleep 0.25; done'
    launch = _launch(
        tmp_path, script, f"t-{os.getpid()}-steps", progress_regex=REGEX, progress_timeout_s=1.5
    )
    step = ForeignStep(launch)
    step.start()
    assert step.wait() == 0  # 3 s in all, never 1.5 s without a step
    assert step.hung is None and step.step == 12


@pytest.mark.timeout(60)
def test_a_dead_step_leaves_no_ghost(tmp_path: Path) -> None:
    """A worker in its own session (as torchrun's workers are) outlives its parent's death;
    the step's end kills it by the launch's incarnation, and nobody else's process."""
    incarnation = f"t-{os.getpid()}-ghost"
    pidfile = tmp_path / "ghost.pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; sleep 0.5; kill -9 $$"
    bystander = ForeignStep(_launch(tmp_path, "sleep 30", f"t-{os.getpid()}-other"))
    bystander.start()
    step = ForeignStep(_launch(tmp_path, script, incarnation))
    step.start()
    assert step.wait() == -signal.SIGKILL
    ghost = int(pidfile.read_text())
    wait_for(lambda: not Path(f"/proc/{ghost}").exists() or _zombie(ghost), 10, "ghost gone")
    assert marked_processes("FTHSDP_INCARNATION", incarnation) == []
    assert bystander.child is not None and bystander.child.poll() is None  # untouched
    bystander.stop(signal.SIGKILL)
    bystander.wait()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.timeout(90)
def test_watchdog_xid_stops_the_step_as_a_node_fault(tmp_path: Path) -> None:
    """The node watchdog runs the real checks on the simulated node: an Xid 79 stops a step
    that would have run on, and the launch ends as a node fault with the evidence."""
    from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs

    write_node_inputs(tmp_path, "node1", gpus=8)
    config = tmp_path / "health.toml"
    config.write_text(dev_config_toml(tmp_path))
    options = check_options({"FTHSDP_HEALTH_CONFIG": str(config), "SLURMD_NODENAME": "node1"})

    def factory(checks: list[str], on_fault: Any) -> NodeWatchdog:
        return NodeWatchdog(checks, on_fault, interval_s=0.2, options=options)

    launch = _launch(tmp_path, "sleep 120", f"t-{os.getpid()}-xid", health_checks=("xid", "ecc"))
    step = ForeignStep(launch, watchdog_factory=factory)
    step.start()
    time.sleep(3.0)  # the simulated Xid line is stamped a second before it is written
    assert step.child is not None and step.child.poll() is None  # healthy: runs on
    write_node_inputs(tmp_path, "node1", gpus=8, faults=["xid79"])
    t0 = time.monotonic()
    assert step.wait() == ExitCode.NODE_FAULT
    assert time.monotonic() - t0 < 30
    assert step.fault is not None and step.fault.reason.startswith("fthsdp:")


def _on_this_host(root: Path, job: str) -> None:
    """Place the fake Slurm's `job` on `localhost`, a name this host resolves (a rendezvous
    address), so the coordinator finds the supervisor's node in the job's allocation."""
    path = root / "slurm.json"
    data = json.loads(path.read_text())
    data["jobs"][job]["nodes"] = "localhost"
    path.write_text(json.dumps(data))


def _group_one(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess], **extra: str
) -> tuple[Path, dict[str, str], str]:
    """Start the run's coordinator; (run dir, the environment of replica 1's torchft-mode
    supervisor in fake job 101 on this host, the address given as the Lighthouse)."""
    run_dir, root, env, proc = live_run
    _on_this_host(root, "101")
    url = proc.start()
    control = json.loads((run_dir / "control.json").read_text())
    control["lighthouse"] = url  # any listening address: the steps here only print it
    (run_dir / "control.json").write_text(json.dumps(control))
    env = dict(
        env,
        SLURM_JOB_ID="101",
        SLURM_RESTART_COUNT="0",
        SLURM_JOB_NODELIST="localhost",
        FTHSDP_TRAIN_MODE="torchft",
        FTHSDP_PROGRESS_REGEX=REGEX,
        **extra,
    )
    return run_dir, env, url


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_supervisor_reports_a_foreign_groups_step_to_the_coordinator(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],
) -> None:
    """The real coordinator accepts the supervisor's signed status reports for a trainer that
    sends nothing: its state shows the group's step from the trainer's output."""
    run_dir, env, url = _group_one(live_run, REPLICA_GROUP_ID="1")
    script = (
        'echo "lh=$TORCHFT_LIGHTHOUSE rdzv=$FTHSDP_RDZV_ENDPOINT g=$REPLICA_GROUP_ID"; '
        'for i in $(seq 1 40); do echo "step: $i  loss: 1"; sleep 0.25; done'
    )
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--", "bash", "-c", script]
    sup = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def step_of(k: int) -> int:
        state = fetch_state(run_dir) or {"replicas": []}
        return max([r["step"] or 0 for r in state["replicas"] if r["replica"] == k], default=0)

    try:
        wait_for(lambda: step_of(1) >= 10, 60, "the coordinator to see step 10")
        out, err = sup.communicate(timeout=60)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert sup.returncode == 0, err
    lines = out.decode().splitlines()
    # The trainer reaches the gated Lighthouse through its supervisor's loopback forwarder,
    # never at the control job's own address.
    found = re.fullmatch(r"lh=(http://127\.0\.0\.1:[0-9]+) rdzv=localhost:[0-9]+ g=1", lines[0])
    assert found and found.group(1) != url, (lines[0], url)
    assert lines[-1] == "step: 40  loss: 1"  # the job log got every line
    assert step_of(1) == 40  # the final report carries the last step
    assert step_of(0) == 0  # the other group said nothing


@pytest.mark.timeout(120)
def test_a_failed_foreign_step_is_relaunched_with_a_new_rendezvous(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],
) -> None:
    """A trainer exiting 10 (a process fault) is reported by the supervisor and relaunched in
    place by the coordinator's directive; the relaunch gets a new incarnation and port."""
    run_dir, env, _ = _group_one(live_run)
    record = run_dir / "launches"
    script = (
        f'echo "$FTHSDP_LAUNCH $FTHSDP_INCARNATION $MASTER_PORT" >> {record}; '
        'echo "step: 5  loss: 1"; [ "$FTHSDP_LAUNCH" != 0 ] || exit 10'
    )
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--decision-wait", "10", "--", "bash", "-c", script]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, check=False)
    assert r.returncode == 0, r.stderr
    first, second = (line.split() for line in record.read_text().splitlines())
    assert (first[0], first[1], second[0], second[1]) == ("0", "101.0.0", "1", "101.0.1")
    assert first[2] != second[2]  # a fresh rendezvous port per launch
    assert "directive relaunch" in r.stderr


@pytest.mark.timeout(120)
def test_a_hung_foreign_step_is_reported_as_hung_and_relaunched(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],
) -> None:
    """The supervisor stops a step that stopped stepping, reports it to the coordinator as a
    process fault saying why, and the relaunch trains on."""
    run_dir, env, _ = _group_one(live_run, FTHSDP_PROGRESS_TIMEOUT_S="2")
    script = 'echo "step: 5  loss: 1"; [ "$FTHSDP_LAUNCH" != 0 ] || sleep 120'
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--decision-wait", "10", "--", "bash", "-c", script]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, check=False)
    assert r.returncode == 0, r.stderr
    assert "hung: no progress for" in r.stderr and "directive relaunch" in r.stderr
    state = fetch_state(run_dir) or {"replicas": []}
    (row,) = [x for x in state["replicas"] if x["replica"] == 1]
    assert "hung: no progress for" in str(row["last_failure"]), row


def test_a_nonsense_progress_timeout_is_refused(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess], tmp_path: Path
) -> None:
    run_dir, _, env, _ = live_run
    env = dict(env, FTHSDP_TRAIN_MODE="torchft", FTHSDP_PROGRESS_TIMEOUT_S="soon")
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--", "true"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert "FTHSDP_PROGRESS_TIMEOUT_S" in r.stderr and "soon" in r.stderr
    assert "Traceback" not in r.stderr
