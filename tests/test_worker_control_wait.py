"""After a failed quorum, a worker retries it while the control plane restarts or settles
after its start, and exits with a process fault otherwise (`ControlRestartWait.wait_out`).

Seen on the dev cluster: after a control-job requeue, the new Lighthouse's first quorums failed
for ~20 s (a peer still on its own retry was missing from the process group), and a worker that
exited on the second failure was counted as a replica failure and relaunched, which changed
the quorum for its peers once more.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pytest

from runtime.env import ControlEndpoints, Timeouts, WorkerEnv
from runtime.protocol import ExitCode
from runtime.worker.control_wait import ControlRestartWait
from runtime.worker.errors import FatalWorkerError

NOW = 10_000.0


@dataclass
class FakeEnv:
    """What `ControlRestartWait` reads of a worker's environment."""

    found: ControlEndpoints | None
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(join_s=30.0))
    lighthouse_forwarder: str | None = None

    def endpoints(self) -> ControlEndpoints | None:
        return self.found


@pytest.fixture
def lighthouse() -> Iterator[str]:
    """An address that accepts connections, as an up Lighthouse does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def rewritten_after(env: FakeEnv, delay: float, found: ControlEndpoints) -> Iterator[None]:
    """control.json rewritten to `found` `delay` seconds into the block, as a control plane
    coming back does."""
    timer = threading.Timer(delay, lambda: setattr(env, "found", found))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def waiter(env: FakeEnv, lighthouse: str) -> ControlRestartWait:
    return ControlRestartWait(cast(WorkerEnv, env), lighthouse, clock=lambda: NOW)


@pytest.mark.parametrize(
    ("started_before", "started_now", "retried"),
    [
        (NOW - 500, NOW - 500, False),  # up for long, unchanged: a real failure
        (NOW - 500, NOW - 5, True),  # restarted meanwhile, same address: retry
        (NOW - 5, NOW - 5, True),  # started 5 s ago: its first quorums may fail; retry
        (NOW - 29, NOW - 29, True),  # inside the 30 s join timeout
        (NOW - 31, NOW - 31, False),  # settled
        (None, None, False),  # no start time known: nothing says it is settling
    ],
)
def test_what_a_failed_quorum_is_taken_for(
    lighthouse: str, started_before: float | None, started_now: float | None, retried: bool
) -> None:
    env = FakeEnv(ControlEndpoints(lighthouse, None, started_before))
    wait = waiter(env, lighthouse)
    env.found = ControlEndpoints(lighthouse, None, started_now)
    give_up = time.monotonic() + 5
    if retried:
        wait.wait_out(RuntimeError("Timeout expired"), give_up)
        assert wait.control_started_at == started_now
    else:
        with pytest.raises(FatalWorkerError, match="quorum failed: Timeout expired") as err:
            wait.wait_out(RuntimeError("Timeout expired"), give_up)
        assert err.value.exit_code == ExitCode.PROCESS_FAULT


def test_a_lighthouse_that_moved_is_a_process_fault_without_a_forwarder(lighthouse: str) -> None:
    old = "http://127.0.0.1:1"
    env = FakeEnv(ControlEndpoints(old, None, NOW - 500))
    wait = waiter(env, old)
    env.found = ControlEndpoints(lighthouse, None, NOW - 5)
    with pytest.raises(FatalWorkerError, match=r"moved from http://127\.0\.0\.1:1 ") as err:
        wait.wait_out(RuntimeError("transport error"), time.monotonic() + 5)
    assert err.value.exit_code == ExitCode.PROCESS_FAULT


@pytest.mark.parametrize("started_now", [NOW - 5, NOW - 400])
def test_a_lighthouse_that_moved_is_followed_through_the_forwarder(
    lighthouse: str, started_now: float
) -> None:
    """The Manager dials the supervisor's forwarder, which dials whatever control.json names:
    the worker retries in process and keeps its state, and later failures compare against the
    new address and incarnation (a settled, unchanged plane's failure is real again)."""
    old = "http://127.0.0.1:1"
    env = FakeEnv(ControlEndpoints(old, None, NOW - 500), lighthouse_forwarder="http://127.0.0.1:2")
    wait = waiter(env, old)
    env.found = ControlEndpoints(lighthouse, None, started_now)
    wait.wait_out(RuntimeError("transport error"), time.monotonic() + 5)
    assert (wait.lighthouse, wait.control_started_at) == (lighthouse, started_now)
    assert wait.epoch() == int(started_now)
    if started_now < NOW - 30:
        with pytest.raises(FatalWorkerError, match="quorum failed"):
            wait.wait_out(RuntimeError("Timeout expired"), time.monotonic() + 5)


def _free_address() -> str:
    """An address nothing listens on (a control plane that is down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_an_outage_longer_than_the_join_timeout_is_waited_out(lighthouse: str) -> None:
    """The control job's node was lost and its job is pending: the worker keeps waiting, past
    the join timeout and up to `control_s`, and retries in process once the new control plane
    writes control.json (the state stays in memory). Giving up at the join timeout made every
    worker of a loaded run exit at once after a 136 s outage, and the run start over."""
    down = _free_address()
    env = FakeEnv(
        ControlEndpoints(down, None, NOW - 500),
        timeouts=Timeouts(join_s=0.2, control_s=30.0),
        lighthouse_forwarder="http://127.0.0.1:2",
    )
    wait = waiter(env, down)
    started = time.monotonic()
    with rewritten_after(env, 1.0, ControlEndpoints(lighthouse, None, NOW - 1)):
        wait.wait_out(RuntimeError("Timeout expired"), wait.deadline())
    assert time.monotonic() - started >= 1.0 > env.timeouts.join_s
    assert (wait.lighthouse, wait.control_started_at) == (lighthouse, NOW - 1)


def test_an_outage_past_the_control_wait_is_a_process_fault() -> None:
    down = _free_address()
    env = FakeEnv(
        ControlEndpoints(down, None, NOW - 500), timeouts=Timeouts(join_s=0.2, control_s=0.5)
    )
    wait = waiter(env, down)
    started = time.monotonic()
    with pytest.raises(FatalWorkerError, match="quorum failed") as err:
        wait.wait_out(RuntimeError("Timeout expired"), wait.deadline())
    assert err.value.exit_code == ExitCode.PROCESS_FAULT
    assert 0.5 <= time.monotonic() - started < 10


def test_a_restart_in_place_is_waited_on_until_control_json_names_the_new_plane(
    lighthouse: str,
) -> None:
    """Restarted in place by its keeper, the control plane brings its gate back at the old
    address before its coordinator listens and rewrites control.json. A quorum that fails then
    is retried only once control.json names the new incarnation: the retry's store keys are
    namespaced by its start, and a retry under the old one hung the run."""
    env = FakeEnv(ControlEndpoints(lighthouse, _free_address(), NOW - 500))
    wait = waiter(env, lighthouse)
    started = time.monotonic()
    with rewritten_after(env, 0.5, ControlEndpoints(lighthouse, lighthouse, NOW - 1)):
        wait.wait_out(RuntimeError("transport error"), time.monotonic() + 10)
    assert time.monotonic() - started >= 0.5
    assert (wait.control_started_at, wait.epoch()) == (NOW - 1, int(NOW - 1))


def test_a_coordinator_that_answers_again_unchanged_leaves_the_failure_real(
    lighthouse: str,
) -> None:
    """A coordinator that was only slow to answer, with control.json unchanged and the plane
    settled: nothing restarted, so the quorum's failure is the replica's own."""
    down = _free_address()
    env = FakeEnv(ControlEndpoints(lighthouse, down, NOW - 500))
    wait = waiter(env, lighthouse)
    back = ControlEndpoints(lighthouse, lighthouse, NOW - 500)
    with (
        rewritten_after(env, 0.3, back),
        pytest.raises(FatalWorkerError, match="quorum failed"),
    ):
        wait.wait_out(RuntimeError("Timeout expired"), time.monotonic() + 10)
    assert wait.control_started_at == NOW - 500


def test_a_restart_in_place_that_never_completes_is_a_process_fault(lighthouse: str) -> None:
    env = FakeEnv(ControlEndpoints(lighthouse, _free_address(), NOW - 500))
    wait = waiter(env, lighthouse)
    started = time.monotonic()
    with pytest.raises(FatalWorkerError, match="quorum failed") as err:
        wait.wait_out(RuntimeError("Timeout expired"), time.monotonic() + 0.6)
    assert err.value.exit_code == ExitCode.PROCESS_FAULT
    assert 0.6 <= time.monotonic() - started < 10
