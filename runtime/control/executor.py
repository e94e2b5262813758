"""The Slurm executor: carries out the policy's Slurm actions through `slurm.backend`.

The policy decides a Drain, Requeue, Release or Cancel; the coordinator journals it; this module
does it. `SlurmExecutor.execute` is one blocking attempt that turns an action into backend calls
(skipping what Slurm already shows done, so a resumed action is never repeated) and returns the
outcome for the journal. `SlurmExecutor.carry_out` runs it in a worker thread with bounded
retries and exponential backoff on transient failures, recording every attempt through the
callback it is given (the coordinator's journal). The spare pool uses `execute` for its plain
requeue fallback, so there is one place that knows how an action becomes Slurm commands.

Drains have two modes (`slurm.privileges`). `direct`: `scontrol update NodeName=N State=DRAIN`,
for a coordinator whose user may change node state (root, SlurmUser, a Slurm operator). `request`:
the job's owner may not drain, so the drain is written as a request into the replica job's own
Comment (`slurm.drain_request`) for root's Epilog to carry out under the site's policy; it is
journaled `requested`, never `done`, because nothing has been drained yet. The policy puts the
Drain before the job's Requeue and the coordinator runs one decision's actions in order, so the
comment is on the job when its Epilog runs. A direct drain that Slurm refuses for lack of rights
is journaled `failed` with Slurm's message and then asked for as a request. Either way the
policy keeps the node off the requeued job (`ExcNodeList`, which the owner may set).

A Requeue waits while the job's node may be dead (`requeue_hold`). Requeued while its node does
not answer, the job stays COMPLETING on it until Slurm sets the node DOWN, so nothing is gained;
and on 22.05 the job then starts elsewhere with no GRES (`JOB_GRES=(null)`, every srun refused
"Invalid generic resource (gres) specification") while the new node's GPUs stay counted as
used; 24.11 and 26.05 requeue it again at DOWN, held back ~120 s (docs/design-facts.md, fact
24). Slurm requeues such a job itself when it sets the node DOWN; the Requeue then ends skipped,
and the Release that follows it makes the job eligible at once, kept off the node. Slurm's view
of a node lags by up to a ping cycle (more on a loaded controller), so for a replica that fell
silent the executor asks the node itself: a one-task step of the job (`step_runs`) that runs
there proves its slurmd answers, and the requeue goes ahead at once; one that cannot run holds
it until Slurm marks the node, or for twice Slurm's detection time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence

from runtime.control.journal.schema import StoredAction
from runtime.control.policy import Action, Cancel, Drain, Release, Requeue
from slurm import hostlist
from slurm.backend import DRAIN_PREFIX, SlurmBackend, SlurmCommandError
from slurm.drain_request import DrainRequest
from slurm.errors import EnvironmentProblem, InputError
from slurm.privileges import DrainMode, lacks_rights
from slurm.records import (
    JobInfo,
    JobNotSettled,
    NodeInfo,
    SlurmOutputError,
    lead_record,
    retryable,
    unreachable,
)
from slurm.slurm_config import SlurmConfig, read_config

log = logging.getLogger("fthsdp.coordinator")

#: Records one attempt at a journaled action: (action id, outcome, detail), once durable.
AttemptRecorder = Callable[[int, str, str], Awaitable[None]]


def drain_request(action: Drain, seq: int) -> DrainRequest:
    """The request a Drain becomes without drain rights; the detail is the policy's reason
    without the `fthsdp:` prefix (the Epilog writes its own reason, with job and user)."""
    detail = action.reason.removeprefix(DRAIN_PREFIX).strip()
    return DrainRequest.make(seq % 10**9, action.node, action.kind, detail)


#: Slurm's defaults (slurm.conf(5)), for a configuration that cannot be read.
SLURMD_TIMEOUT_S = 300
MESSAGE_TIMEOUT_S = 10
#: How often a held Requeue looks at Slurm again.
HOLD_POLL_S = 2.0


class NotYet(Exception):
    """An action that must wait for Slurm (a Requeue whose node may be dead): tried again, with
    no attempt used up, until it can be done or Slurm made it moot."""


def detection_s(cfg: SlurmConfig | None) -> float:
    """How long slurmctld may take to mark a dead node NOT_RESPONDING: every SlurmdTimeout/3 it
    pings the nodes it has not heard from for as long (up to 2/3 SlurmdTimeout after the last
    word; every 100 s with SlurmdTimeout=0), the ping fails after MessageTimeout, and its
    background loop adds a few seconds."""
    slurmd = cfg.seconds("SlurmdTimeout") if cfg else None
    message = cfg.seconds("MessageTimeout") if cfg else None
    slurmd = SLURMD_TIMEOUT_S if slurmd is None else slurmd
    message = MESSAGE_TIMEOUT_S if message is None else message
    ping = 2 * slurmd / 3 if slurmd else 100.0
    return ping + message + 5.0


def requeue_hold(
    job: JobInfo,
    names: Sequence[str],
    nodes: Sequence[NodeInfo],
    last_heard: float | None,
    now: float,
    detect_s: float,
    answered: Collection[str] = (),
) -> str | None:
    """Why a Requeue of the running `job` (on the nodes `names`, as Slurm read them into
    `nodes`) must wait (None: requeue now). Only nodes Slurm positively shows answering let it
    go. For a replica silent since `last_heard`, Slurm's view can be a ping cycle stale, so
    each node must also have run a step since (`answered`); one that has not holds the
    requeue until Slurm marks it, or for twice `detect_s`, after which Slurm has plainly seen
    it alive and what stopped is the trainer (or the probe itself cannot run)."""
    shown = {n.name: n for n in nodes}
    if not names:
        return f"job {job.job_id} runs on no node Slurm names: waiting to read them"
    for name in names:
        node = shown.get(name)
        if node is None:
            return f"{name} not in Slurm's node list: waiting to read it"
        if not node.responding:
            flags = "+".join((node.state.upper(), *node.flags))
            return f"{name} is {flags}: Slurm requeues job {job.job_id} when it sets it DOWN"
    if last_heard is None or now - last_heard >= 2 * detect_s:
        return None
    silent = [n for n in names if n not in answered]
    if silent:
        # Worded the same on every poll: the journal gets one line per reason, not per poll.
        return (
            f"no step runs on {','.join(silent)} and Slurm has had less than "
            f"{2 * detect_s:.0f}s to see a dead node: job {job.job_id} is requeued once one "
            "does or Slurm had them"
        )
    return None


class SlurmExecutor:
    """Carries out Slurm actions through one backend, with `retries` attempts per action and a
    backoff of `backoff_s` doubling up to `backoff_max_s` between them. A failure that means
    Slurm could not be asked at all (`unreachable`) uses up no attempt: the action is retried
    until Slurm answers."""

    def __init__(
        self,
        backend: SlurmBackend,
        retries: int = 5,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        drain_mode: DrainMode = "direct",
    ) -> None:
        self.backend = backend
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        #: How a Drain is carried out (`slurm.privileges`): drain, or request it of root's Epilog.
        self.drain_mode: DrainMode = drain_mode
        #: `detection_s` of the running Slurm, read at the first Requeue that needs it.
        self.detect_s: float | None = None
        #: How long a step that proves a node alive may take (`_probe_s`).
        self.probe_s: float | None = None
        self._slurm_config: SlurmConfig | None = None
        self._config_read = False

    async def carry_out(self, stored: StoredAction, resumed: bool, record: AttemptRecorder) -> None:
        """Run one journaled action with retries and backoff, each attempt recorded."""
        loop = asyncio.get_running_loop()
        action = stored.action
        await record(stored.id, "started", "resumed after restart" if resumed else "")
        request = False  # a Drain asked of root's Epilog (request mode, or direct refused)
        attempt = -1
        failures = 0  # failed tries so far: the backoff's exponent
        away_for = next_log = 0.0  # seconds Slurm has been unreachable; when to log it again
        held = ""  # why the action last had to wait (`NotYet`), journaled when it changes
        while attempt + 1 < self.retries:
            attempt += 1
            try:
                outcome, detail = await loop.run_in_executor(
                    None, self.execute, action, resumed, stored.id, request
                )
            except NotYet as exc:
                if str(exc) != held:
                    held = str(exc)
                    await record(stored.id, "retry", f"waiting: {held}")
                attempt -= 1
                await asyncio.sleep(HOLD_POLL_S)
                continue
            except DrainRefused as exc:
                await record(stored.id, "failed", f"{exc}; asking root's Epilog instead")
                log.warning("drain of %s refused (%s): requesting it", exc.node, exc.cause.stderr)
                request = True
                attempt -= 1  # the request is a first attempt of its own
                continue
            except (InputError, EnvironmentProblem) as exc:
                # Refused before Slurm was asked (a bad node name, Slurm not usable):
                # retrying cannot help.
                await record(stored.id, "failed", str(exc))
                log.error("giving up on %s: %s", action, exc)
                break
            except SlurmCommandError as exc:
                away = unreachable(exc)
                if not away and (attempt + 1 >= self.retries or not retryable(exc)):
                    await record(stored.id, "failed", str(exc))
                    log.error("giving up on %s: %s", action, exc)
                    break
                delay = min(self.backoff_s * 2 ** min(failures, 30), self.backoff_max_s)
                failures += 1
                if away:
                    # Slurm is away: the action stays pending and is tried again, with the
                    # backoff, for as long as the run lives. Each try re-reads what Slurm shows
                    # (`execute`), so one that became moot meanwhile ends as skipped.
                    attempt -= 1
                    if away_for >= next_log:
                        log.warning("Slurm unreachable for %s (%s): retrying", action, exc)
                        next_log = away_for + 60.0
                    away_for += delay
                await record(stored.id, "retry", str(exc))
                await asyncio.sleep(delay)
            else:
                await record(stored.id, outcome, detail)
                break

    def execute(
        self, action: Action, resumed: bool, seq: int = 0, request: bool = False
    ) -> tuple[str, str]:
        """Carry out one Slurm action (in a worker thread); returns (outcome, detail).

        `seq` numbers a drain request (the action's journal id); `request` asks for a Drain
        as a request whatever the mode (after a direct drain was refused)."""
        b = self.backend
        if isinstance(action, Drain):
            if request or self.drain_mode == "request":
                return self._request_drain(action, seq)
            try:
                ok = b.drain(action.node, action.reason)
            except SlurmCommandError as exc:
                if lacks_rights(exc):
                    raise DrainRefused(action.node, exc) from exc
                raise
            return ("done", "drained") if ok else ("skipped", "drained by someone else")
        if isinstance(action, Requeue):
            jobs = b.jobs([action.job_id])
            current = lead_record(jobs, action.job_id)
            if current and current.restarts > action.restarts:
                return ("skipped", f"already requeued (restart count {current.restarts})")
            if current and current.state.upper() == "PENDING":
                return ("skipped", "job is pending, nothing to requeue")
            if current and current.state.upper() == "RUNNING":
                self._hold(action, current, jobs)
            try:
                b.requeue(action.job_id)
            except SlurmCommandError as exc:
                # Slurm may have put the job back in the queue itself between the read and the
                # call (its end reached slurmctld): moot only once a fresh read shows it so.
                again = lead_record(b.jobs([action.job_id]), action.job_id)
                if again and (again.restarts > action.restarts or again.state.upper() == "PENDING"):
                    return ("skipped", f"requeued meanwhile by Slurm ({exc.stderr[:120]})")
                raise
            return ("done", "requeued" + (" (after restart)" if resumed else ""))
        if isinstance(action, Release):
            # The backend waits for the requeued job to settle back to PENDING first; one still
            # completing would have its begin time overwritten: not done, tried again.
            try:
                b.release(action.job_id, exclude=action.exclude, forget=action.forget)
            except JobNotSettled as exc:
                raise NotYet(f"{exc}: released again once it is back in the queue") from None
            excluded = f", off {','.join(action.exclude)}" if action.exclude else ""
            if action.forget:
                excluded += f"; {','.join(action.forget)} let back if Slurm shows them in service"
            return ("done", f"eligible now{excluded}")
        if isinstance(action, Cancel):
            b.cancel([action.job_id])
            return ("done", "cancelled")
        return ("skipped", f"not a Slurm action: {action}")

    def _hold(self, action: Requeue, current: JobInfo, jobs: Sequence[JobInfo]) -> None:
        """Raise `NotYet` while a Requeue of the running job must wait (`requeue_hold`): the
        nodes of every het component count, each probed with a step in its own component."""
        component: dict[str, int | None] = {}  # node -> the het offset of its component
        for part in jobs:
            if part.base_id == action.job_id and part.nodes:
                offset = part.het_offset if part.het_job_id else None
                for name in hostlist.expand(part.nodes, "job nodes"):
                    component.setdefault(name, offset)
        names = list(component)
        shown = self.backend.nodes(names) if names else []
        now = time.time()
        why = requeue_hold(current, names, shown, None, now, 0.0)
        if why is None and action.last_heard is not None:
            detect = self._detect_s()
            answered: list[str] = []
            if now - action.last_heard < 2 * detect:
                probe_s = self._probe_s()
                for name in names:
                    if not self.backend.step_runs(action.job_id, name, probe_s, component[name]):
                        break
                    answered.append(name)
            why = requeue_hold(current, names, shown, action.last_heard, now, detect, answered)
        if why:
            raise NotYet(why)

    def _config(self) -> SlurmConfig | None:
        if not self._config_read:
            try:
                self._slurm_config = read_config(timeout=20)
            except (EnvironmentProblem, SlurmOutputError) as exc:
                log.warning("scontrol show config: %s; Slurm's default timeouts assumed", exc)
            self._config_read = True
        return self._slurm_config

    def _detect_s(self) -> float:
        if self.detect_s is None:
            self.detect_s = detection_s(self._config())
        return self.detect_s

    def _probe_s(self) -> float:
        """How long a probe step may take: one message's timeout, and time to start."""
        if self.probe_s is None:
            cfg = self._config()
            message = cfg.seconds("MessageTimeout") if cfg else None
            self.probe_s = (MESSAGE_TIMEOUT_S if message is None else message) + 5.0
        return self.probe_s

    def _request_drain(self, action: Drain, seq: int) -> tuple[str, str]:
        """Write the drain request into the replica job's Comment, read back before counted."""
        if action.job_id is None:
            raise InputError("job id", None, "the replica's job, to carry the drain request")
        text = drain_request(action, seq).text()
        self.backend.set_comment(action.job_id, text)
        return ("requested", f"in job {action.job_id}'s comment for root's Epilog: {text}")


class DrainRefused(SlurmCommandError):
    """A direct drain that slurmctld refused because the user may not change node state."""

    def __init__(self, node: str, cause: SlurmCommandError) -> None:
        super().__init__(cause.argv, cause.returncode, cause.stderr)
        self.node = node
        self.cause = cause
