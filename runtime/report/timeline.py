"""What a run did, as plain data: each replica's states over wall time, its faults, the recovery
actions, the step rate, the recorded metrics and the effective training time.

Pure functions over records already read (`runtime.report.read` does the reading): the
replicas' progress records (`progress/rK.jsonl`, one dict per line) and the control journal's
typed events and actions. A replica's state at a time comes from *marks*, each saying "from
`t` on, this replica was in `state`"; the progress records give training and healing, the
journal gives pending (its job queued) and down (a fatal report, an ended job). Both sources
are merged by time, and `segments` turns the marks into the intervals the report draws.

Why derive rather than store a timeline: the progress files and the journal are what a run
already writes, durably and on its own shared file system, so a report of a live run and one of
a finished run read the same things, and nothing in the run pays for the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

State = Literal["pending", "healing", "training", "down", "done"]
STATES: tuple[State, ...] = ("pending", "healing", "training", "down", "done")

#: Slurm job states after which a replica's job is not running (COMPLETED is the normal end).
_JOB_DOWN = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")
_JOB_PENDING = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING")
#: A progress fault and a journal fault of one replica this close in time are the same fault.
SAME_FAULT_S = 15.0
#: Why a replica's processes are counted as lost when their records stop without an end.
LOST = "processes ended without a final record (killed, or crashed before reporting)"


@dataclass(frozen=True)
class Mark:
    """From `t` on, the replica was in `state`."""

    t: float
    state: State


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    state: State

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Fault:
    """A replica left training: when, at which step, and why (`source`: progress or journal)."""

    t: float
    replica: int
    step: int | None
    cause: str
    source: str


@dataclass(frozen=True)
class Action:
    """A recovery action on a replica's lane: a drain, a requeue, a relaunch, a cancel."""

    t: float
    replica: int | None
    kind: str
    text: str
    status: str


@dataclass
class ProgressFacts:
    """What one replica's progress records say."""

    marks: list[Mark] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    #: (commit time, step) of every committed training step.
    commits: list[tuple[float, int]] = field(default_factory=list)
    #: metric name -> step -> value (the last record for a step wins: a redone step).
    metrics: dict[str, dict[int, float]] = field(default_factory=dict)
    incarnations: list[str] = field(default_factory=list)
    last_step: int | None = None
    first_t: float | None = None
    last_t: float | None = None
    finished: bool = False


def progress_facts(
    replica: int, records: Iterable[dict[str, Any]], run_over: bool
) -> ProgressFacts:
    """Marks, faults, commits and metrics from one replica's progress records (file order).

    An incarnation whose records stop without `done` or `fatal` and is followed by another (or
    by the end of the run, `run_over`) lost its processes: that is a fault at its last record.
    """
    out = ProgressFacts()
    current: str | None = None
    ended = True
    last_t = 0.0

    def lost() -> None:
        out.faults.append(Fault(last_t, replica, out.last_step, LOST, "progress"))
        out.marks.append(Mark(last_t, "down"))

    for rec in records:
        t, event = float(rec["t"]), str(rec["event"])
        inc = rec.get("incarnation")
        if inc != current:
            if current is not None and not ended:
                lost()
            current, ended = inc, False
            if isinstance(inc, str):
                out.incarnations.append(inc)
        out.first_t = t if out.first_t is None else min(out.first_t, t)
        last_t = t
        step = rec.get("step")
        if event == "start":
            out.marks.append(Mark(t, "pending"))
        elif event in ("joined", "healed"):
            out.marks.append(Mark(t, "healing"))
        elif event == "commit":
            out.marks.append(Mark(t, "healing" if rec.get("healing") else "training"))
            if isinstance(step, int):
                out.commits.append((t, step))
                out.last_step = step
        elif event == "metrics" and isinstance(step, int):
            for name, value in (rec.get("metrics") or {}).items():
                out.metrics.setdefault(str(name), {})[step] = float(value)
        elif event == "fatal":
            cause = str(rec.get("error") or "fatal error")
            code = rec.get("exit_code")
            if code is not None:
                cause += f" (exit {code})"
            out.faults.append(Fault(t, replica, out.last_step, cause, "progress"))
            out.marks.append(Mark(t, "down"))
            ended = True
        elif event == "done":
            out.marks.append(Mark(t, "done"))
            out.finished = ended = True
    if current is not None and not ended and run_over:
        lost()
    out.last_t = last_t if out.first_t is not None else None
    return out


def fatal_cause(report: Any) -> str:
    """A fatal report in words: its class, node, exit code and error."""
    words = f"{report.failure or 'user'} fault"
    if report.failed_node:
        words += f" on {report.failed_node}"
    if report.exit_code is not None:
        words += f", exit {report.exit_code}"
    if report.last_error:
        words += f": {report.last_error.splitlines()[0][:300]}"
    return words


@dataclass
class JournalFacts:
    """What the control journal says, per replica."""

    marks: dict[int, list[Mark]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    #: replica -> job ids in the order the journal saw them
    jobs: dict[int, list[str]] = field(default_factory=dict)
    #: replica -> nodes in the order the journal saw them
    nodes: dict[int, list[str]] = field(default_factory=dict)
    #: replica -> marks and (time, step) commits from its leader's status reports: the lanes of
    #: a replica without a progress file (a foreign torchft trainer's); a snapshot drops the
    #: status reports it covers, so these can be partial.
    reported: dict[int, list[Mark]] = field(default_factory=dict)
    reported_commits: dict[int, list[tuple[float, int]]] = field(default_factory=dict)


def journal_facts(
    events: Sequence[tuple[int, Any]], actions: Sequence[tuple[int, Any, str]]
) -> JournalFacts:
    """Marks, faults, jobs and nodes from the journal's events (seq, event), and the recovery
    actions from its decided actions (event seq, action, status), timed by their event."""
    from runtime.control import policy

    out = JournalFacts()
    at: dict[int, float] = {}

    def saw(replica: int, job: str | None, nodes: Iterable[str]) -> None:
        if job and job not in out.jobs.get(replica, []):
            out.jobs.setdefault(replica, []).append(job)
        for node in nodes:
            if node and node not in out.nodes.get(replica, []):
                out.nodes.setdefault(replica, []).append(node)

    for seq, ev in events:
        at[seq] = ev.at
        if isinstance(ev, policy.JobObserved):
            saw(ev.replica, ev.job_id, ev.nodes)
            state = ev.state.upper()
            if state in _JOB_PENDING:
                out.marks.setdefault(ev.replica, []).append(Mark(ev.at, "pending"))
            elif state in _JOB_DOWN:
                out.marks.setdefault(ev.replica, []).append(Mark(ev.at, "down"))
        elif isinstance(ev, policy.ReportReceived):
            r = ev.report
            saw(r.replica, r.job_id, r.nodes)
            if r.kind == "fatal":
                out.faults.append(Fault(ev.at, r.replica, r.step, fatal_cause(r), "journal"))
                out.marks.setdefault(r.replica, []).append(Mark(ev.at, "down"))
            else:
                phase: State = "healing" if r.healing else "training"
                out.reported.setdefault(r.replica, []).append(Mark(ev.at, phase))
                out.reported_commits.setdefault(r.replica, []).append((ev.at, r.step))
        elif isinstance(ev, policy.StragglerEviction):
            cause = f"straggler eviction: {ev.detail}"
            out.faults.append(Fault(ev.at, ev.replica, None, cause, "journal"))
        elif isinstance(ev, policy.OperatorRequeue):
            cause = f"operator requeue: {ev.reason}"
            out.faults.append(Fault(ev.at, ev.replica, None, cause, "journal"))
    for seq, action, status in actions:
        t = at.get(seq)
        if t is None:
            continue
        described = describe_action(action)
        if described is not None:
            out.actions.append(Action(t, described[0], described[1], described[2], status))
    return out


def describe_action(action: Any) -> tuple[int | None, str, str] | None:
    """(replica, kind, text) of a recovery action; None for one the lanes do not show."""
    from runtime.control import policy

    if isinstance(action, policy.Drain):
        return action.replica, "drain", f"drain {action.node}: {action.reason}"
    if isinstance(action, policy.Requeue):
        return action.replica, "requeue", f"requeue job {action.job_id}"
    if isinstance(action, policy.Cancel):
        return action.replica, "cancel", f"cancel job {action.job_id}"
    if isinstance(action, policy.Directive) and action.directive in ("relaunch", "exit"):
        return action.replica, action.directive, f"{action.directive} (told to its supervisor)"
    return None


def merge_faults(progress: Iterable[Fault], journal: Iterable[Fault]) -> list[Fault]:
    """Every fault once, by time: a progress fault is dropped when the journal has one of the
    same replica within `SAME_FAULT_S` (the journal's names the node and the failure class),
    and a journal fault that repeats the cause of one just before it (a resent report) too."""
    from_journal: list[Fault] = []
    for j in sorted(journal, key=lambda f: f.t):  # a fatal report sent twice is one fault
        if not any(
            o.replica == j.replica and o.cause == j.cause and j.t - o.t <= SAME_FAULT_S
            for o in from_journal
        ):
            from_journal.append(j)
    kept = [
        f
        for f in progress
        if not any(j.replica == f.replica and abs(j.t - f.t) <= SAME_FAULT_S for j in from_journal)
    ]
    return sorted([*kept, *from_journal], key=lambda f: (f.t, f.replica))


#: Actions this long after a fault (and before the replica's next one) are taken as its recovery.
FOLLOW_UP_S = 600.0


def followed_by(fault: Fault, faults: Sequence[Fault], actions: Sequence[Action]) -> list[Action]:
    """The recovery actions on `fault`'s replica that answer it: from a second before it
    (a decision is journaled with its report) up to the replica's next fault, at most
    `FOLLOW_UP_S` later."""
    later = [f.t for f in faults if f.replica == fault.replica and f.t > fault.t]
    until = min([fault.t + FOLLOW_UP_S, *(t - 1 for t in later)])
    return [a for a in actions if a.replica == fault.replica and fault.t - 1 <= a.t < until]


def segments(marks: Iterable[Mark], until: float) -> list[Segment]:
    """The intervals between marks, by time, equal neighbours merged, up to `until`.

    `done` ends the lane (its segment has no length). A mark after `until` is ignored.
    """
    ordered = sorted((m for m in marks if m.t <= until), key=lambda m: m.t)
    out: list[Segment] = []
    for i, m in enumerate(ordered):
        if m.state == "done":
            break
        end = ordered[i + 1].t if i + 1 < len(ordered) else until
        if out and out[-1].state == m.state:
            out[-1] = Segment(out[-1].start, end, m.state)
        elif end > m.t:
            out.append(Segment(m.t, end, m.state))
    return out


def seconds_in(segs: Iterable[Segment], state: State) -> float:
    return sum(s.seconds for s in segs if s.state == state)


def step_rate(commits: Iterable[tuple[float, int]], bins: int = 40) -> list[tuple[float, float]]:
    """(bin middle, committed steps per second) over the run: each step counted once, at the
    first commit of it by any replica. Empty with fewer than two steps."""
    first: dict[int, float] = {}
    for t, step in commits:
        first[step] = min(t, first.get(step, t))
    times = sorted(first.values())
    if len(times) < 2 or times[-1] <= times[0]:
        return []
    n = max(1, min(bins, len(times) // 3))
    t0, width = times[0], (times[-1] - times[0]) / n
    counts = [0] * n
    for t in times:
        counts[min(n - 1, int((t - t0) / width))] += 1
    return [(t0 + (i + 0.5) * width, c / width) for i, c in enumerate(counts)]


@dataclass(frozen=True)
class EffectiveTime:
    """How much of the replicas' wall time trained: training seconds over replicas x span."""

    span_s: float
    replicas: int
    training_s: dict[int, float]
    healing_s: dict[int, float]
    down_s: dict[int, float]
    pending_s: dict[int, float]

    @property
    def fraction(self) -> float:
        total = self.span_s * self.replicas
        return sum(self.training_s.values()) / total if total > 0 else 0.0


def effective_time(lanes: dict[int, list[Segment]], start: float, end: float) -> EffectiveTime:
    def per(state: State) -> dict[int, float]:
        return {k: seconds_in(segs, state) for k, segs in sorted(lanes.items())}

    return EffectiveTime(
        span_s=max(0.0, end - start),
        replicas=len(lanes),
        training_s=per("training"),
        healing_s=per("healing"),
        down_s=per("down"),
        pending_s=per("pending"),
    )


#: The most points a metric's line keeps: a long run's page stays small enough to open.
MAX_POINTS = 2000


def thin(points: Sequence[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """At most about `limit` of `points`, evenly strided, the first and the last always kept."""
    if len(points) <= limit:
        return list(points)
    stride = -(-len(points) // limit)
    kept = list(points[::stride])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept
