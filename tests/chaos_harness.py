"""The seeded chaos campaign's pure parts: the fault schedule, and the figures and invariants
read from what a run left behind (`tests/test_story_chaos.py` drives the dev cluster).

A schedule is a function of its seed alone (`random.Random(seed)`), so a failing seed is
rerun with `FTHSDP_CHAOS_SEED=N`. Faults come one after another: each strikes `after_steps`
steps after the previous one was recovered from (every replica training again), except the
kill of `second`, which strikes a second replica while the first is still recovering.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

#: What each kind does, and what the run must do about it.
KINDS: dict[str, str] = {
    "xid79": "an Xid 79 on the replica's node: drain and requeue that replica only",
    "ecc": "uncorrectable ECC errors on the replica's node: drain and requeue that replica only",
    "kill": "the replica's processes killed, no hardware sign: relaunched in place, no requeue",
    "slow": "the replica's node made 5x slower: the replica alone evicted as a straggler, "
    "requeued off the node",
    "down": "power loss of the replica's node: Slurm finds it down, the replica is requeued",
    "control": "the control job requeued (its coordinator and Lighthouse die): replicas ride on",
    "control-down": "power loss of the control job's node: the control plane comes back "
    "elsewhere, a replica beside it is requeued by Slurm, the others ride on",
    "coordinator": "the control plane's process killed (kill -9): its keeper restarts it in "
    "place, no replica restarts",
    "slurmctld": "slurmctld stopped and restarted on its saved state: no replica restarts",
    "second": "an Xid 79, then a kill on another replica while the first is still recovering",
}
#: The short campaign `make test` runs: one of each kind that needs no second free node.
SHORT_KINDS = ("xid79", "kill", "control")
#: Strikes the control job's node, and with it whichever replica Slurm placed beside it when
#: the fault comes (none, or one that is not the protected replica): its `replica` is
#: `ANY_REPLICA` in a schedule, and the one it struck once it has.
CONTROL_DOWN = "control-down"
ANY_REPLICA = -1
#: Kinds that count as a failure of the replica they strike (and, for `second`, of the other).
FAILS = frozenset({"xid79", "ecc", "kill", "slow", "down", "second"})
#: Kinds after which the replica runs on another node (the faulted one is healed afterwards).
REQUEUES = frozenset({"xid79", "ecc", "slow", "down", "second"})
#: Of those, the ones whose requeue the coordinator always makes (for a power loss Slurm may
#: have put the job back in the queue itself before the coordinator's call, found moot then).
COORDINATOR_REQUEUES = frozenset({"xid79", "ecc", "slow", "second"})


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: `kind` on `replica`, `after_steps` steps after the run was
    last whole (and, for `second`, a kill on `other` while `replica` recovers)."""

    index: int
    kind: str
    after_steps: int
    replica: int
    other: int | None = None


def plan(
    seed: int,
    faults: int,
    kinds: Sequence[str],
    replicas: int,
    protected: int | None = None,
    delay_steps: tuple[int, int] = (10, 40),
    strikes: int | None = None,
) -> list[Fault]:
    """`faults` faults drawn from `kinds` (each kind at least once when `faults` allows), each
    `delay_steps` (a range) after the last recovery; `protected` is never moved off its node
    (the replica under an administrator's drain). With `strikes`, no replica fails more often
    than that (the run's `max_restarts_per_replica`: one failure more and the policy leaves the
    replica out, which the policy's own tests check, not the campaign). Draws are the same as
    without a limit until a replica reaches it, so schedules within it do not change.
    `CONTROL_DOWN` strikes no replica the schedule names (`ANY_REPLICA`): see its comment.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown chaos kinds {unknown}; allowed: {', '.join(KINDS)}")
    if faults < 1 or not kinds or replicas < 2:
        raise ValueError("a campaign needs at least one fault, one kind and two replicas")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    while len(order) < faults:
        order.append(rng.choice(list(kinds)))
    order = order[:faults]
    movable = [k for k in range(replicas) if k != protected]
    failed = dict.fromkeys(range(replicas), 0)

    def can_fail(k: int) -> bool:
        return strikes is None or failed[k] < strikes

    out = []
    for i, kind in enumerate(order):
        after = rng.randint(*delay_steps)
        if kind == CONTROL_DOWN:
            # Which replica shares the control job's node is Slurm's choice at the time: it may
            # be any movable one, so the fault counts against each of them.
            if not all(can_fail(k) for k in movable):
                raise ValueError(f"fault {i} ({kind}): a replica it may strike failed {strikes}x")
            for k in movable:
                failed[k] += 1
            out.append(Fault(i, kind, after, ANY_REPLICA))
            continue
        pool = movable if kind in REQUEUES else list(range(replicas))
        if kind in FAILS:
            pool = [k for k in pool if can_fail(k)]
        others_of = {k: [j for j in range(replicas) if j != k and can_fail(j)] for k in pool}
        if kind == "second":
            pool = [k for k in pool if others_of[k]]
        if not pool:
            raise ValueError(f"fault {i} ({kind}): every replica it may strike failed {strikes}x")
        replica = rng.choice(pool)
        other = rng.choice(others_of[replica]) if kind == "second" else None
        for k in (replica, other):
            if k is not None and kind in FAILS:
                failed[k] += 1
        out.append(Fault(i, kind, after, replica, other))
    return out


def with_protected(faults: Sequence[Fault], protected: int, replicas: int) -> list[Fault]:
    """A schedule drawn with replica 0 protected, moved onto the run whose protected replica is
    `protected` (the one not beside the control job when the run starts, chosen then): 0 and
    `protected` trade places, every other replica keeps its number. With `protected` 0 it is
    the schedule itself."""
    if not 0 <= protected < replicas:
        raise ValueError(f"protected replica {protected} is not one of {replicas}")
    swap = {0: protected, protected: 0}

    def moved(k: int) -> int:
        return k if k == ANY_REPLICA else swap.get(k, k)

    return [
        replace(f, replica=moved(f.replica), other=None if f.other is None else moved(f.other))
        for f in faults
    ]


@dataclass
class Outcome:
    """What one fault did, as measured: seconds from the fault until the faulted replica (or,
    for the control plane and slurmctld, every replica) trains again, the healthy replicas'
    longest stall, and the run's committed step before and after (steps lost)."""

    fault: Fault
    injected_at: float
    recovered_s: float | None = None
    stall_s: float | None = None
    step_before: int = 0
    step_low_after: int = 0
    #: The struck replica's node and the control job's, as Slurm said just before the fault
    #: (None where there is no one replica's node, or Slurm could not say): a node fault
    #: beside the control job takes the control plane down with it.
    node: str | None = None
    control_node: str | None = None

    @property
    def beside_control(self) -> bool:
        return self.node is not None and self.node == self.control_node

    @property
    def steps_lost(self) -> int:
        return max(0, self.step_before - self.step_low_after)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "steps_lost": self.steps_lost,
            "beside_control": self.beside_control,
        }


Trace = Sequence[tuple[float, Mapping[int, Mapping[str, Any]]]]


def stall_s(trace: Trace, start: float, end: float, healthy: Sequence[int]) -> float:
    """The longest time within [start, end] in which no healthy replica committed a step: the
    gap between successive rises of their highest step, as the status polls (in time order)
    saw it, so within one poll interval of the truth."""
    rises = [start]
    best = None
    for t, reps in trace:
        if t > end:
            break
        top = max((reps[k].get("step") or 0) for k in healthy if k in reps)
        if best is not None and top > best and t >= start:
            rises.append(t)
        best = top if best is None else max(best, top)
    rises.append(end)
    return max(b - a for a, b in itertools.pairwise(rises))


def committed(reps: Mapping[int, Mapping[str, Any]]) -> int:
    """The run's step: the highest any replica committed (the others catch up to it)."""
    return max((r.get("step") or 0) for r in reps.values())


def lowest_after(trace: Trace, start: float, before: int) -> int:
    """The lowest run step the status polls saw from `start` on (`before` if none saw one). A
    poll in which no replica has a step says nothing about it: while the control plane is away
    `status` has Slurm's view alone, with no steps, and the steps were not lost."""
    seen = [
        committed(reps)
        for t, reps in trace
        if t >= start and any(r.get("step") is not None for r in reps.values())
    ]
    return min(seen, default=before)


def unattributed_requeues(
    requeued_jobs: Sequence[str], faults: Sequence[Fault], jobs: Mapping[int, str]
) -> list[str]:
    """Problems with the journal's requeues: every one is of a job that a fault which
    requeues struck (at most one per such fault), and a drain's requeue is always there.
    `faults` are the ones that struck: a `CONTROL_DOWN` names the replica it took with it."""
    least: dict[str, int] = {}
    most: dict[str, int] = {}
    for f in faults:
        if f.kind in REQUEUES or (f.kind == CONTROL_DOWN and f.replica != ANY_REPLICA):
            job = jobs[f.replica]
            most[job] = most.get(job, 0) + 1
            least[job] = least.get(job, 0) + (f.kind in COORDINATOR_REQUEUES)
    got: dict[str, int] = {}
    for job in requeued_jobs:
        got[job] = got.get(job, 0) + 1
    problems = []
    for job in sorted(set(got) | set(least)):
        n, low, high = got.get(job, 0), least.get(job, 0), most.get(job, 0)
        if not low <= n <= high:
            problems.append(
                f"job {job}: {n} requeue(s) in the journal, faults that requeue it: {low}-{high}"
            )
    return problems


def figures(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Per kind: faults injected and survived, median steps lost, stall and time back."""
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        mine = [o for o in outcomes if o.fault.kind == kind]
        if not mine:
            continue
        back = [o.recovered_s for o in mine if o.recovered_s is not None]
        stalls = [o.stall_s for o in mine if o.stall_s is not None]
        out[kind] = {
            "injected": len(mine),
            "survived": len(back),
            "steps_lost": statistics.median([o.steps_lost for o in mine]),
            "stall_s": statistics.median(stalls) if stalls else None,
            "recovered_s": statistics.median(back) if back else None,
        }
    return out
