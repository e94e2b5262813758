"""The replica supervisor: a process fault relaunches the step in place, a node fault exits for
the coordinator's requeue, and with no coordinator the job requeues itself. It launches only
once the control plane is up: it waits for a late one, stops (exit 3, nothing counted, nothing
requeued) when the control job ended first, and launches a step that could not reach the quorum
service again without counting a failure. An answer the coordinator did not sign for the
supervisor's own request (an impostor at its address) is treated as no answer at all."""

from __future__ import annotations

import http.server
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_harness import (  # noqa: F401
    ControlProcess,
    action_status,
    calls,
    live_run,
    set_jobs,
    wait_for,
)

from slurm.rundir import create_secret, write_control_file

# Fails the first launch with the given code, succeeds on the next one.
STEP = 'echo "$FTHSDP_LAUNCH $FTHSDP_INCARNATION" >> "$1"; [ "$FTHSDP_LAUNCH" != 0 ] || exit "$2"'


def _argv(env: dict[str, str], run_dir: Path, code: int, step: str = STEP) -> list[str]:
    env.update(SLURM_JOB_ID="101", SLURM_RESTART_COUNT="0", SLURM_JOB_NODELIST="node2")
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--decision-wait", "3", "--requeue-wait", "0.5", "--"]
    return [*argv, "bash", "-c", step, "step", str(run_dir / "launches"), str(code)]


def supervise(env: dict[str, str], run_dir: Path, code: int) -> subprocess.CompletedProcess[str]:
    env = dict(env)
    argv = _argv(env, run_dir, code)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, check=False)


def launches(run_dir: Path) -> list[str]:
    path = run_dir / "launches"
    return path.read_text().splitlines() if path.exists() else []


def fatal_reports(run_dir: Path) -> int:
    db = sqlite3.connect(run_dir / "control.sqlite")
    try:
        rows = db.execute("SELECT payload FROM events WHERE type = 'ReportReceived'").fetchall()
    finally:
        db.close()
    return sum(1 for (payload,) in rows if json.loads(payload)["report"]["kind"] == "fatal")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("code", "fatal"),
    [(10, 1), (3, 0)],
    ids=["process-fault", "quorum-service-unreachable-uncounted"],
)
def test_process_fault_relaunches_in_place(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
    code: int,
    fatal: int,
) -> None:
    # Exit 3 is the worker's "quorum service unreachable": launched again, no failure reported.
    run_dir, root, env, proc = live_run
    proc.start()
    r = supervise(env, run_dir, code)
    assert r.returncode == 0, r.stderr
    assert launches(run_dir) == ["0 101.0.0", "1 101.0.1"]
    assert fatal_reports(run_dir) == fatal
    assert calls(root, "scontrol requeue") == []


@pytest.mark.timeout(120)
def test_node_fault_exits_for_the_coordinators_requeue(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, _, env, proc = live_run
    proc.start()
    r = supervise(env, run_dir, 11)
    assert r.returncode == 75, r.stderr
    assert (run_dir / "launches").read_text().splitlines() == ["0 101.0.0"]
    assert action_status(run_dir, "Requeue", "101") in (["decided"], ["started"], ["done"])


@pytest.mark.timeout(120)
def test_unreachable_coordinator_falls_back_to_self_requeue(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, proc = live_run
    proc.start()
    env = dict(env)
    # The step fails once the control plane is gone: killed -9 while the step runs.
    step = 'echo "$FTHSDP_LAUNCH" >> "$1"; sleep 2; exit "$2"'
    sup = subprocess.Popen(_argv(env, run_dir, 10, step), env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not launches(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.kill9()
        _, err = sup.communicate(timeout=60)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert sup.returncode == 75, err
    assert calls(root, "scontrol requeue") == ["scontrol requeue 101"]
    assert calls(root, "scontrol update JobId=101 StartTime=now")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_late_control_plane_is_waited_for(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, proc = live_run
    env = dict(env, FTHSDP_CONTROL_WAIT_S="90")
    sup = subprocess.Popen(_argv(env, run_dir, 0), env=env, stderr=subprocess.PIPE, text=True)
    try:
        # Its first Slurm check of the control job (after 5 s, past a Lighthouse's idle start).
        # The wait loop looks for control.json before it asks Slurm, so that pass goes on to
        # judge this answer even if the control plane comes up now: a supervisor that took the
        # running control job for an ended one exits 3 below instead of launching.
        check = "squeue --json --jobs=99"
        wait_for(lambda: calls(root, check) or sup.poll() is not None, 60, "a Slurm check")
        assert sup.poll() is None
        assert launches(run_dir) == []
        proc.start()
        _, err = sup.communicate(timeout=60)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert sup.returncode == 0, err
    assert launches(run_dir) == ["0 101.0.0"]
    assert "waits for the control plane" in err
    assert calls(root, "scontrol requeue") == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("control_state", ["FAILED", None], ids=["failed", "gone"])
def test_control_job_that_ended_stops_the_replica_without_a_restart(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
    control_state: str | None,
) -> None:
    run_dir, root, env, _ = live_run  # the control job failed before it wrote control.json
    set_jobs(root, {"99": control_state})
    t0 = time.monotonic()
    r = supervise(env, run_dir, 0)
    assert r.returncode == 3, r.stderr
    assert time.monotonic() - t0 < 60  # not the whole control-plane wait
    assert launches(run_dir) == []
    assert calls(root, "scontrol requeue") == []
    ended = "failed" if control_state else "gone"
    lines = [line for line in r.stderr.splitlines() if "control job 99 ended" in line]
    assert len(lines) == 1, r.stderr
    assert f"({ended})" in lines[0] and str(run_dir / "logs" / "control-99.err") in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(120)
def test_control_plane_wait_runs_out_without_a_restart(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, _ = live_run  # the control job runs but never writes control.json
    r = supervise(dict(env, FTHSDP_CONTROL_WAIT_S="3"), run_dir, 0)
    assert r.returncode == 3, r.stderr
    assert "did not come up within 3s" in r.stderr
    assert launches(run_dir) == []
    assert calls(root, "scontrol requeue") == []


@pytest.mark.timeout(60)
def test_sigterm_from_slurm_never_requeues(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, _ = live_run  # no coordinator: a failure would requeue itself
    env = dict(env, SLURM_JOB_ID="101")
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--", "sleep", "30"]
    proc = subprocess.Popen(argv, env=env)
    try:
        # It waits for the control plane with its handler in place, and asks Slurm about the
        # control job from there.
        wait_for(lambda: calls(root, "squeue"), 60, "the supervisor's wait")
        proc.send_signal(signal.SIGTERM)  # what scancel does to the batch script
        assert proc.wait(20) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert calls(root, "scontrol requeue") == []


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Whoever answers at control.json's address: accepts every report, then sends the
    directive the test chose, without the coordinator's signature."""

    answer = b""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(b'{"ok": true, "directive": "exit", "phase": "out"}')

    def do_GET(self) -> None:
        self._send(self.answer)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def impostor(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> Iterator[tuple[Path, Path, dict[str, str], type[_Impostor]]]:
    """The run with an impostor at control.json's coordinator address (its port is free while
    the control job is requeued, and the traffic is plain HTTP)."""
    run_dir, root, env, _ = live_run
    create_secret(run_dir / "secret")
    handler = type("Impostor", (_Impostor,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        write_control_file(run_dir, {"coordinator": url, "lighthouse": None})
        yield run_dir, root, env, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "answer",
    [
        b'{"directive": "exit"}',
        b'{"directive": "relaunch", "delay_s": NaN}',
        b'{"directive": "exit", "delay_s": 0.0, "restarts": 0, "launch": 0}',
    ],
    ids=["exit", "nan-delay", "exit-for-this-epoch"],
)
def test_an_unsigned_directive_is_no_answer(
    impostor: tuple[Path, Path, dict[str, str], type[_Impostor]], answer: bytes
) -> None:
    # The supervisor neither leaves for good nor crashes: no answer it can verify came, so it
    # does what it does when the coordinator is unreachable (requeue its own job, exit 75).
    run_dir, root, env, handler = impostor
    handler.answer = answer
    r = supervise(env, run_dir, 10)
    assert r.returncode == 75, r.stderr
    assert launches(run_dir) == ["0 101.0.0"]
    assert calls(root, "scontrol requeue") == ["scontrol requeue 101"]
    assert "answer not signed" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(120)
def test_each_step_is_pointed_at_the_supervisors_lighthouse_forwarder(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    """The step's Manager reaches the gated Lighthouse through the supervisor's loopback
    forwarder, the same one for every launch of the job."""
    run_dir, _, env, proc = live_run
    proc.start()
    step = 'echo "$FTHSDP_LIGHTHOUSE_FORWARDER" >> "$1"; [ "$FTHSDP_LAUNCH" != 0 ] || exit "$2"'
    env = dict(env)
    argv = _argv(env, run_dir, 10, step)
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, check=False)
    assert r.returncode == 0, r.stderr
    first, second = launches(run_dir)
    assert first == second and first.startswith("http://127.0.0.1:"), (first, second)
