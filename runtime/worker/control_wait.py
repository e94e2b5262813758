"""Waiting for the quorum service: at the start, and out a control-plane restart.

A worker may start before the control job's Lighthouse listens, and the control job may be
restarted while the run trains. `wait_for_lighthouse` waits (re-reading the control file) until
the Lighthouse accepts connections. `ControlRestartWait` decides, after a failed quorum, whether
the control job was restarted and its Lighthouse is back (retry the quorum) or the failure is
real (a process fault). A Lighthouse that moved (the control job restarted on another node or
port) is followed in process when the Manager goes through the supervisor's forwarder
(`runtime.control.lighthouse_forwarder` dials the address in `control.json` for every
connection), as every Slurm run's does: the replica keeps its model, optimizer and ledger in
memory. Without a forwarder (a bare address in the environment) torchft's Manager cannot follow
it, and the worker exits to be relaunched with the new address.

An outage of the control plane (its node lost, its job requeued and pending until the
supervisor releases it) is waited out for up to `control_s` (`train.control_wait_s`, 300 s by
default): long enough for a requeue on a busy cluster, so that no replica on a healthy node loses
its in-memory state to it. Past that the worker exits with a process fault and its supervisor
takes over (it waits for the control plane again before relaunching).

A restarted Lighthouse knows no quorum: the replicas come back to it one by one, and its first
quorums may fail (a peer still out on its own retry is missing from the process group). A
failure while the control plane is younger than the join timeout is retried as part of the
restart: exiting then would count as the replica's failure and restart it, which changes the
quorum once more for the peers.

A control plane restarted in place by its keeper brings its Lighthouse and gate back at the old
addresses before it rewrites `control.json`, and its coordinator answers only after that write
(its port is bound, refusing connections, until then). A quorum that fails while the
coordinator named there does not answer is therefore waited on until `control.json` names the
new incarnation; a coordinator that answers while the file is unchanged was not restarted. The
retry must use the new start time, since the quorum's store keys are namespaced by it.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Callable
from urllib.parse import urlparse

from runtime.env import ControlEndpoints, WorkerEnv
from runtime.protocol import ExitCode
from runtime.worker.errors import FatalWorkerError

log = logging.getLogger("fthsdp.runtime")


def lighthouse_reachable(address: str) -> bool:
    """Whether `address` (a Lighthouse's or coordinator's URL) accepts a TCP connection."""
    parsed = urlparse(address)
    if not parsed.hostname or not parsed.port:
        return False
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=1.0):
            return True
    except OSError:
        return False


def wait_for_lighthouse(env: WorkerEnv, deadline_s: float) -> str:
    """Return the lighthouse URL once it accepts TCP connections; re-reads the control file.

    Retries with backoff (0.1 s doubling to 2 s) and prints one message while waiting; raises
    `FatalWorkerError(NO_QUORUM_SERVICE)` after `deadline_s`.
    """
    start = time.monotonic()
    delay = 0.1
    told = False
    last = "no control file yet"
    while True:
        found = env.endpoints()
        if found is not None:
            parsed = urlparse(found.lighthouse)
            host, port = parsed.hostname, parsed.port
            if host and port:
                try:
                    with socket.create_connection((host, port), timeout=1.0):
                        return found.lighthouse
                except OSError as exc:
                    last = f"{found.lighthouse}: {exc}"
            else:
                last = f"bad lighthouse address {found.lighthouse!r}"
        if time.monotonic() - start > deadline_s:
            raise FatalWorkerError(
                f"quorum service unreachable after {deadline_s:.0f}s ({last})",
                ExitCode.NO_QUORUM_SERVICE,
            )
        if not told:
            print(f"fthsdp: waiting for the quorum service ({last})", file=sys.stderr, flush=True)
            told = True
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


class ControlRestartWait:
    """The Lighthouse this worker's Manager was built with, and the control job's start time
    it saw then (`control.json`'s `started_at`), to tell a restart from a real failure."""

    def __init__(
        self, env: WorkerEnv, lighthouse: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.env = env
        self.lighthouse = lighthouse
        self.clock = clock
        found = env.endpoints()
        self.control_started_at = found.started_at if found else None

    def epoch(self) -> int:
        """The incarnation of the control plane this worker last saw start (its start second;
        0 when unknown): what its quorums' store keys are kept apart by."""
        return int(self.control_started_at or 0)

    def deadline(self) -> float:
        """When (monotonic) a wait that starts now gives up on the control plane: after
        `control_s`, so that a requeue of the control job on a busy cluster costs no replica its
        in-memory state."""
        return time.monotonic() + self.env.timeouts.control_s

    def settling(self, found: ControlEndpoints | None) -> bool:
        """Whether the control plane in `found` started less than the join timeout ago."""
        if found is None or found.started_at is None:
            return False
        return 0 <= self.clock() - found.started_at < self.env.timeouts.join_s

    def _past_restart_in_place(
        self,
        found: ControlEndpoints | None,
        give_up: float,
        failed: FatalWorkerError,
        exc: Exception,
    ) -> ControlEndpoints | None:
        """The control file once it shows no restart in place under way: either it names a new
        incarnation, or the coordinator it names answers (or none is named). A coordinator that
        does not answer while the file is unchanged is a restart whose new child has not yet
        rewritten the file; past `give_up` that is the process fault `failed`."""
        delay = 0.1
        told = False
        while (
            found is not None
            and found.started_at == self.control_started_at
            and found.coordinator is not None
            and not lighthouse_reachable(found.coordinator)
        ):
            if time.monotonic() >= give_up:
                raise failed from exc
            if not told:
                log.warning(
                    "quorum failed while the coordinator at %s does not answer; waiting for "
                    "the control plane to restart",
                    found.coordinator,
                )
                told = True
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            found = self.env.endpoints()
        return found

    def wait_out(self, exc: Exception, give_up: float) -> None:
        """After a failed quorum: return (to retry it) if the control job was restarted, or
        started less than the join timeout ago, and its Lighthouse is back, at the same address
        or behind the forwarder; raise the process fault otherwise.

        torchft's Manager keeps the Lighthouse address it was built with and reconnects to it.
        That address is the forwarder's, which stays put while the gate behind it moves; a
        Manager built on the gate's own address cannot follow a move, so then this rank exits
        with a process fault and its supervisor relaunches the step with the new address.
        """
        failed = FatalWorkerError(f"quorum failed: {exc}", ExitCode.PROCESS_FAULT, [repr(exc)])
        found = self._past_restart_in_place(self.env.endpoints(), give_up, failed, exc)
        restarted = found is not None and found.started_at != self.control_started_at
        steady = not (restarted or self.settling(found))
        if steady and found is not None and lighthouse_reachable(found.lighthouse):
            raise failed from exc  # the quorum service is up, unchanged and settled: real
        remaining = give_up - time.monotonic()
        try:
            lighthouse = wait_for_lighthouse(self.env, max(0.0, remaining))
        except FatalWorkerError:
            raise failed from exc
        if lighthouse != self.lighthouse:
            if self.env.lighthouse_forwarder is None:
                raise FatalWorkerError(
                    f"the quorum service moved from {self.lighthouse} to {lighthouse} (control "
                    "job restarted elsewhere); exiting to be relaunched with the new address",
                    ExitCode.PROCESS_FAULT,
                ) from exc
            # The Manager talks to the supervisor's forwarder, which dials the address in
            # control.json for every connection: it follows the move, and the state stays.
            log.warning(
                "the quorum service moved from %s to %s; following it through %s",
                self.lighthouse,
                lighthouse,
                self.env.lighthouse_forwarder,
            )
            self.lighthouse = lighthouse
        found = self.env.endpoints()
        self.control_started_at = found.started_at if found else None
        when = "restarted" if restarted else "settles after its start"
        log.warning("quorum failed while the control plane %s; retrying: %s", when, exc)
