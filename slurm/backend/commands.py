"""`CommandBackend`: the `SlurmBackend` over Slurm's own commands, which work on every Slurm.

Their JSON differs by release, so the backend reads the version once (`scontrol --version`) and
picks the command and parser for it (`slurm.slurm_json`): `sinfo --json` on 22.05, `scontrol
--json show node` from 23.02 on. An answer it does not recognise raises `SlurmOutputError`, never
an empty list. Each command runs with a timeout and a bounded number of retries with backoff,
because slurmctld restarts and slow answers are normal on a busy cluster.

Drain reasons are owned by prefix. `drain` and `resume` take exactly one node name (a hostlist
would be expanded by Slurm), re-read that node right before acting, and act only on what they
read: a reason someone else set is never changed, and a node that cannot be read is left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from slurm import hostlist, slurm_json
from slurm.errors import InputError
from slurm.records import (
    DRAIN_PREFIX,
    JobInfo,
    JobNotSettled,
    NodeInfo,
    NodeNotFound,
    SlurmCommandError,
    SlurmOutputError,
    SlurmVersion,
    check_node_name,
    retryable,
)

#: Seconds after `release` at which a requeued job may start (see `CommandBackend.release`).
RELEASE_DELAY_S = 2
#: Longest job comment `set_comment` writes (Slurm keeps far more; a drain request is shorter).
COMMENT_MAX = 1000
#: Environment prefixes that tie srun to the step it was started from.
_STEP_ENV = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")
#: Seconds a Slurm command may take before a `notice` says what fthsdp is waiting for.
WAIT_NOTICE_AFTER_S = 3.0


class CommandBackend:
    """`SlurmBackend` over Slurm's command-line tools (the default; works on any Slurm)."""

    def __init__(
        self,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        env: dict[str, str] | None = None,
        version: SlurmVersion | None = None,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.env = env
        self._version = version
        #: Told what a slow command is waiting for; a person at a terminal wants to know, a
        #: daemon's log has the final error anyway, so only the CLI sets it.
        self.notice = notice

    # -- plumbing -------------------------------------------------------------------------

    def _run(self, argv: Sequence[str], retry: bool = True) -> str:
        """Run a Slurm command; retry transient failures (timeouts, slurmctld unreachable)."""
        attempts = self.retries if retry else 1
        last: SlurmCommandError | None = None
        for attempt in range(attempts):
            try:
                r = self._attempt(argv)
            except subprocess.TimeoutExpired:
                last = SlurmCommandError(argv, -1, f"timed out after {self.timeout:.0f}s")
            except FileNotFoundError:
                raise SlurmCommandError(argv, 127, f"{argv[0]}: command not found") from None
            else:
                if r.returncode == 0:
                    return r.stdout
                last = SlurmCommandError(argv, r.returncode, r.stderr or r.stdout)
                if not retryable(last):
                    raise last
            if attempt + 1 < attempts:
                delay = self.backoff * (2**attempt)
                if self.notice is not None:
                    why = last.stderr.splitlines()[-1] if last.stderr else "no answer"
                    self.notice(
                        f"fthsdp: waiting: `{argv[0]}` failed ({why}); "
                        f"trying again in {delay:.1f} s ({attempt + 2}/{attempts})"
                    )
                time.sleep(delay)
        assert last is not None
        raise last

    def _attempt(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """One run of a command under the backend's timeout (or `timeout`), with its
        environment (or `env`); says so once when it is slow to answer."""
        env = self.env if env is None else env
        timeout = self.timeout if timeout is None else timeout
        quiet = self.notice is None or timeout <= WAIT_NOTICE_AFTER_S
        with subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # a timeout stops the command's children too
        ) as proc:
            try:
                try:
                    out, err = proc.communicate(timeout=timeout if quiet else WAIT_NOTICE_AFTER_S)
                except subprocess.TimeoutExpired:
                    if quiet or self.notice is None:
                        raise
                    self.notice(
                        f"fthsdp: waiting for `{argv[0]}` to answer (slurmctld slow or "
                        f"unreachable); giving up after {timeout:.0f} s"
                    )
                    out, err = proc.communicate(timeout=timeout - WAIT_NOTICE_AFTER_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    # -- jobs -----------------------------------------------------------------------------

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        """sbatch a script; returns the job id (the het leader's id for a het job)."""
        out = self._run(["sbatch", "--parsable", *args, str(script)], retry=False)
        return out.strip().split(";")[0].split("+")[0]

    def requeue(self, job_id: str) -> None:
        self._run(["scontrol", "requeue", job_id])

    def step_runs(
        self, job_id: str, node: str, timeout: float, het_group: int | None = None
    ) -> bool:
        """Whether a one-task step of job `job_id` (of its component `het_group` for a het job:
        Slurm takes the leader's id and the offset, not the component's own id) starts and
        ends on `node` within `timeout`: proof that the node's slurmd answers, which
        slurmctld's view only shows up to a ping cycle late. The step shares the job's CPUs and
        takes no GRES and a token of memory, so it never waits behind the job's own steps. Any
        failure (refused, node dead, too slow) is False: the caller waits for Slurm instead."""
        check_node_name(node, "probe")
        group = [] if het_group is None else [f"--het-group={int(het_group)}"]
        argv = ["srun", f"--jobid={job_id}", *group, f"--nodelist={node}", "--nodes=1",
                "--ntasks=1", "--overlap", "--gres=none", "--mem=1", "--quiet",
                "--job-name=fthsdp-probe", "true"]  # fmt: skip
        # The caller may itself run inside a job step: its SLURM_* would pick that step's
        # sizes and id. Only the configuration's location is kept.
        base = self.env if self.env is not None else dict(os.environ)
        env = {k: v for k, v in base.items() if not k.startswith(_STEP_ENV) or k == "SLURM_CONF"}
        try:
            return self._attempt(argv, env=env, timeout=timeout).returncode == 0
        except (subprocess.TimeoutExpired, FileNotFoundError):
            return False

    def release(
        self,
        job_id: str,
        exclude: Sequence[str] = (),
        settle: float = 30.0,
        *,
        forget: Sequence[str] = (),
    ) -> None:
        """Make a requeued job eligible now (docs/design-facts.md, Slurm fact 2: otherwise held back
        ~120 s), keeping it off the nodes in `exclude` for the rest of its life (`ExcNodeList`,
        added to what it already excludes): the way to move a replica off a node without draining
        it. Of the nodes in `forget`, those Slurm now shows in service (an operator healed and
        resumed them) leave the job's ExcNodeList; one that cannot be read stays in it.

        Right after `scontrol requeue` the job is still COMPLETING, and Slurm sets the
        held-back begin time only when it has completed: an update sent earlier is overwritten
        (seen on 22.05 with het jobs). So this waits (up to `settle` s) until every component is
        back to PENDING, then sets the begin time, and repeats while a later one is in place. A
        job still completing after `settle` s (its steps' ends held up, as after slurmctld was
        away) gets the update all the same and raises `JobNotSettled`: the caller tries again.

        The begin time is now + `RELEASE_DELAY_S`, not now: slurmd revoked the old run's job
        credential when it was killed, and a restart in that same second is refused ("Killing
        non-startable batch JobId=N: Job credential revoked", seen on 22.05), which ends the
        job instead of restarting it. The held-back ~120 s exists for this; 2 s suffice.
        """
        deadline = time.monotonic() + settle
        settled = self._wait_settled(job_id, deadline)
        if exclude or forget:
            self._exclude(job_id, exclude, forget)
        while True:
            self._run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{RELEASE_DELAY_S}"])
            ahead = [
                j
                for j in self.jobs([job_id])
                if j.state.upper() == "PENDING"
                and j.eligible_time > time.time() + RELEASE_DELAY_S + 1
            ]
            if not ahead or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        # A job requeued after a prolog failure may also be held; release is a no-op otherwise.
        with contextlib.suppress(SlurmCommandError):
            self._run(["scontrol", "release", job_id], retry=False)
        if not settled:
            raise JobNotSettled(job_id, settle)

    def _exclude(self, job_id: str, nodes: Sequence[str], forget: Sequence[str] = ()) -> None:
        """Add `nodes` to a pending job's ExcNodeList (Slurm accepts it only while pending) and
        take out the nodes of `forget` that Slurm shows in service."""
        current: set[str] = set()
        for job in self.jobs([job_id]):
            if job.job_id == job_id and job.excluded:
                current.update(hostlist.expand(job.excluded, "ExcNodeList"))
        asked = sorted(current.intersection(forget) - set(nodes))
        back: set[str] = set()
        if asked:
            with contextlib.suppress(SlurmCommandError):  # unread: they stay excluded
                back = {n.name for n in self.nodes(asked) if n.in_service}
        # What it had, less the nodes back in service, plus those to keep off now (which win).
        wanted = sorted((current - back) | set(nodes))
        if wanted == sorted(current):
            return
        self._run(
            [
                "scontrol",
                "update",
                f"JobId={job_id}",
                f"ExcNodeList={hostlist.compress(wanted)}",
            ]
        )

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = list(job_ids)
        if ids:
            self._run(["scancel", *ids])

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        """Jobs known to slurmctld; with `job_ids`, those jobs (all components of het jobs),
        finished ones included for as long as slurmctld keeps them (`MinJobAge`).

        22.05's `squeue --json` ignores `--jobs`/`--name` and returns every job, finished ones
        too; later releases honour the filters and need `--states=all` for finished jobs. The
        filters are applied here as well.
        """
        ids = list(job_ids)
        version = self.version()
        argv = slurm_json.jobs_argv(version, ids, name)
        try:
            out = self._run(argv)
        except SlurmCommandError as exc:
            # squeue errors on ids that have aged out of slurmctld; they are simply gone.
            if ids and "Invalid job id" in exc.stderr:
                return []
            raise
        return filter_jobs(slurm_json.parse_squeue_jobs(out, version, argv), ids, name)

    def _wait_settled(self, job_id: str, deadline: float) -> bool:
        """`_settled`, polled until it holds or the monotonic `deadline` passes; its last answer."""
        settled = self._settled(job_id)
        while not settled and time.monotonic() < deadline:
            time.sleep(0.2)
            settled = self._settled(job_id)
        return settled

    def _settled(self, job_id: str) -> bool:
        """True once every component of `job_id` is back in the queue (PENDING or held).

        Uses text squeue, whose `--jobs` filter works on every version, and whose %T shows
        COMPLETING (the JSON form reports a completing requeued job as PENDING already).
        """
        try:
            out = self._run(["squeue", "-h", f"--jobs={job_id}", "-o", "%T"])
        except SlurmCommandError:
            return True
        states = {line.strip() for line in out.splitlines() if line.strip()}
        return states <= {"PENDING", "REQUEUE_HOLD", "SPECIAL_EXIT"}

    # -- version ------------------------------------------------------------------------

    def version(self) -> SlurmVersion:
        """The Slurm release of the commands this backend runs, read once per backend."""
        if self._version is None:
            argv = list(slurm_json.VERSION_COMMAND)
            version = slurm_json.parse_version(self._run(argv), argv)
            slurm_json.check_supported(version, argv)
            self._version = version
        return self._version

    # -- nodes ----------------------------------------------------------------------------

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        """Per-node records (all nodes, or those named); an unreadable answer raises."""
        wanted = set(names)
        version = self.version()
        argv = slurm_json.nodes_argv(version)
        found = slurm_json.parse_nodes(self._run(argv), version, argv)
        return [n for n in found if not wanted or n.name in wanted]

    def node(self, name: str) -> NodeInfo:
        """One node's current record, asked for by name; raises when Slurm does not show it."""
        check_node_name(name, "node query")
        version = self.version()
        argv = slurm_json.nodes_argv(version, name)
        found = [
            n for n in slurm_json.parse_nodes(self._run(argv), version, argv) if n.name == name
        ]
        if not found:
            raise NodeNotFound(argv, version, name)
        if len(found) > 1:
            raise SlurmOutputError(argv, version, f"{len(found)} records for node {name}, not 1")
        return found[0]

    def drain(self, node: str, reason: str) -> bool:
        """Drain one node with our `reason` unless someone else's reason is on it.

        Returns True when the drain was sent, False when the node carries another's reason
        (an admin's drain, Slurm's own) and was left alone. Raises, having done nothing, when
        `node` is not one node name or its current state cannot be read.
        """
        check_node_name(node, "drain")
        _check_our_reason(reason)
        current = self.node(node)  # read right before acting: the window is one command
        if current.foreign_reason:
            return False
        self._update_node(node, "DRAIN", reason)
        return True

    def resume(self, node: str) -> bool:
        """Resume one node only when it is drained with our reason; True when resumed.

        Raises, having done nothing, when `node` is not one node name or cannot be read.
        """
        check_node_name(node, "resume")
        current = self.node(node)  # read right before acting: the window is one command
        if not current.drained_by_us:
            return False
        self._update_node(node, "RESUME", None)
        return True

    def take_over_drain(self, node: str, their_reason: str, reason: str) -> bool:
        """Replace the drain reason `their_reason` on one node with our `reason`, re-reading the
        node right before; any other reason is left alone. True when replaced.

        The one case is Slurm's own `Prolog error` after fthsdp's prolog failed on the node:
        the caller has recorded that failure, so the drain is ours to resume once it passes.
        """
        check_node_name(node, "take over drain")
        _check_our_reason(reason)
        current = self.node(node)
        if not (current.drained and current.reason == their_reason):
            return False
        self._update_node(node, "DRAIN", reason)
        return True

    def annotate_job(self, job_id: str, note: str) -> None:
        """Set one job's AdminComment (what the owner reads in `scontrol show job`)."""
        if not job_id.isdigit():
            raise InputError("job id", job_id, "digits only")
        text = note.replace("\n", " ").replace('"', "'")[:200]
        self._run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={text}"])

    def set_comment(self, job_id: str, text: str) -> None:
        """Set one job's `Comment` to `text` and read it back; raises unless Slurm shows it.

        The job's owner may set its Comment (AdminComment needs an operator): it is how a run
        without drain rights asks root's Epilog for a drain (`slurm.drain_request`). A comment
        is counted as set only once `squeue` shows exactly `text` on the job.
        """
        if not job_id.isdigit():
            raise InputError("job id", job_id, "digits only")
        if not text or len(text) > COMMENT_MAX or not text.isprintable():
            raise InputError("comment", text[:80], f"one printable line of 1-{COMMENT_MAX} chars")
        argv = ["scontrol", "update", f"JobId={job_id}", f"Comment={text}"]
        self._run(argv)
        shown = [j.comment.strip() for j in self.jobs([job_id]) if j.job_id == job_id]
        if shown != [text]:
            what = f"comment {shown[0][:60]!r}" if shown else "no such job"
            raise SlurmCommandError(argv, 0, f"exit 0 but squeue shows {what}, not the one set")

    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        self._run(argv + ([f"Reason={reason}"] if reason else []))


def _check_our_reason(reason: object) -> None:
    if not isinstance(reason, str) or not reason.startswith(DRAIN_PREFIX) or "\n" in reason:
        raise InputError("reason", reason, f"one line starting with {DRAIN_PREFIX!r}")


def filter_jobs(jobs: list[JobInfo], ids: Iterable[str], name: str | None) -> list[JobInfo]:
    """Keep jobs whose id or het leader id is in `ids` (if any) and whose name is `name`."""
    wanted = set(ids)
    return [
        j
        for j in jobs
        if (not wanted or j.job_id in wanted or j.base_id in wanted)
        and (name is None or j.name == name)
    ]
