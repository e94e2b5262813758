"""The control job's lifecycle: it starts on a busy machine and ends by itself.

- `run_over` (table): a run is over once every replica's job finished, was cancelled, failed,
  was left out or is gone from Slurm, and no Slurm action is open;
- a real `fthsdp control` process over the fake Slurm of `control_harness` exits 0 on its own,
  after its grace, once the replica jobs completed, and also once they were cancelled or purged;
  while they run it stays up;
- the real `torchft_lighthouse` is given a deadline, not a one-shot wait: one that dies before it
  listens (its port taken) is started again on a free port; one that never listens is stopped
  and named, with its log, after the deadline.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_harness import ControlProcess, calls, set_jobs, wait_for
from control_harness import live_run as live_run  # the fixture

from runtime.control.coordinator import run_over
from runtime.control.policy import ReplicaState
from runtime.control.service import Lighthouse, LighthouseConfig
from slurm.errors import EnvironmentProblem


def _rep(k: int, phase: str, job: str | None = None) -> ReplicaState:
    r = ReplicaState(replica=k, job_id=job if job is not None else str(100 + k))
    r.phase = phase  # type: ignore[assignment]
    return r


RUN_OVER_TABLE: list[tuple[str, list[ReplicaState], dict[str, str | None], int, str | None]] = [
    ("training", [_rep(0, "training"), _rep(1, "training")], {"100": "RUNNING"}, 0, None),
    (
        "both completed",
        [_rep(0, "done"), _rep(1, "done")],
        {"100": "COMPLETED", "101": "COMPLETED"},
        0,
        "2 completed",
    ),
    ("one still trains", [_rep(0, "done"), _rep(1, "training")], {"101": "RUNNING"}, 0, None),
    (
        "cancelled by hand (phase not caught up yet)",
        [_rep(0, "training"), _rep(1, "training")],
        {"100": "CANCELLED", "101": "CANCELLED"},
        0,
        "2 cancelled",
    ),
    (
        "purged from Slurm",
        [_rep(0, "training"), _rep(1, "pending")],
        {"100": None, "101": None},
        0,
        "2 gone",
    ),
    (
        "a requeue still open",
        [_rep(0, "done"), _rep(1, "requeued")],
        {"100": "COMPLETED", "101": "FAILED"},
        1,
        None,
    ),
    (
        "left out, failed and completed",
        [_rep(0, "out"), _rep(1, "ended"), _rep(2, "done")],
        {"101": "FAILED"},
        0,
        "1 completed, 1 failed, 1 left out",
    ),
    ("a requeued job pending again", [_rep(0, "requeued")], {"100": "PENDING"}, 0, None),
    ("not asked Slurm yet", [_rep(0, "starting")], {}, 0, None),
    ("job id unknown", [_rep(0, "pending", job="")], {}, 0, None),
]


@pytest.mark.parametrize(
    ("name", "replicas", "jobs", "open_actions", "expected"),
    RUN_OVER_TABLE,
    ids=[row[0] for row in RUN_OVER_TABLE],
)
def test_run_over_table(
    name: str,
    replicas: list[ReplicaState],
    jobs: dict[str, str | None],
    open_actions: int,
    expected: str | None,
) -> None:
    got = run_over(replicas, jobs, open_actions)
    if expected is None:
        assert got is None, name
    else:
        assert got == f"every replica has finished ({expected})", name


@contextlib.contextmanager
def _control(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess], grace_s: float
) -> Iterator[subprocess.Popen[bytes]]:
    """A real `fthsdp control` (no Lighthouse) over the fake Slurm, stopped in any case."""
    run_dir, _, env, _ = live_run
    proc = ControlProcess(run_dir, dict(env, FTHSDP_CONTROL_FINISH_GRACE_S=str(grace_s)))
    try:
        proc.start()
        assert proc.proc is not None
        yield proc.proc
    finally:
        proc.stop()


def _polls(root: Path) -> list[str]:
    """The control job's polls of the replica jobs, as the fake Slurm logged them."""
    return calls(root, "squeue --json --jobs=")


def _polls_seen(root: Path, proc: subprocess.Popen[bytes], before: int, more: int) -> None:
    """Until `more` polls past the first `before` have started, or the control job exited.

    The control job judges whether the run is over every second (`watch_finish`) and polls
    every 3 s, in one event loop: a poll that started proves the previous poll's answer has been
    judged, so "it stays up" is checked on an event, not after a guess at the time it takes.
    """
    wait_for(
        lambda: len(_polls(root)) >= before + more or proc.poll() is not None,
        timeout=60,
        what=f"{more} more polls",
    )


def _stays_up(run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    log = (run_dir / "control.log").read_text()
    assert proc.poll() is None, log[-2000:]
    assert "the control job ends" not in log, log[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "end",
    [
        {"100": "COMPLETED", "101": "COMPLETED"},
        {"100": "CANCELLED", "101": "CANCELLED"},
        {"100": None, "101": None},
    ],
    ids=["completed", "cancelled", "purged"],
)
def test_control_job_ends_by_itself(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess], end: dict[str, str | None]
) -> None:
    run_dir, root, _, _ = live_run
    with _control(live_run, 3) as proc:
        _polls_seen(root, proc, 0, 2)  # the first poll of running replicas judged: it stays
        _stays_up(run_dir, proc)
        set_jobs(root, end)
        t0 = time.monotonic()
        code = proc.wait(60)
        waited = time.monotonic() - t0
    log = (run_dir / "control.log").read_text()
    assert code == 0, log[-2000:]
    assert waited >= 3.0  # the grace
    what = {"COMPLETED": "2 completed", "CANCELLED": "2 cancelled", None: "2 gone"}[end["100"]]
    assert f"every replica has finished ({what}): the control job ends" in log
    assert "Traceback" not in log


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_control_job_stays_while_one_replica_runs(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],
) -> None:
    run_dir, root, _, _ = live_run
    with _control(live_run, 1) as proc:
        set_jobs(root, {"100": "COMPLETED"})
        # A poll that saw the change, judged, and the next one 3 s later (3 x the grace).
        _polls_seen(root, proc, len(_polls(root)), 2)
        _stays_up(run_dir, proc)


@pytest.fixture
def taken_port() -> Iterator[int]:
    # Bound, not listening: nothing answers there, and nobody else can bind it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lighthouse_that_dies_is_started_again_on_a_free_port(
    tmp_path: Path, taken_port: int
) -> None:
    # The port is taken: the first Lighthouse cannot bind it and exits.
    config = LighthouseConfig(host="127.0.0.1", port=taken_port, start_timeout_s=240.0)
    house = Lighthouse(config, tmp_path / "lighthouse.log")
    try:
        house.start_and_wait()
        assert house.port != taken_port
        assert _listening(house.port)
        assert house.proc is not None and house.proc.poll() is None
    finally:
        house.stop()
    assert house.proc is not None and house.proc.poll() is not None


@pytest.mark.timeout(120)
def test_lighthouse_deadline_names_the_log_and_stops_it(tmp_path: Path) -> None:
    # Python alone takes longer than this to start: the deadline passes before it listens.
    config = LighthouseConfig(host="127.0.0.1", start_timeout_s=0.01)
    house = Lighthouse(config, tmp_path / "lighthouse.log")
    with pytest.raises(EnvironmentProblem) as err:
        house.start_and_wait()
    assert "did not listen" in str(err.value) and "within 0s" in str(err.value)
    assert str(tmp_path / "lighthouse.log") in str(err.value)
    assert house.proc is not None
    assert house.proc.poll() is not None  # stopped, not left behind
    # ... with its whole process group.
    r = subprocess.run(
        ["pgrep", "-g", str(house.proc.pid)], capture_output=True, text=True, check=False
    )
    assert r.stdout.strip() == ""
