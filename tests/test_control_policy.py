"""Table tests for the recovery policy: (state, events) -> actions, including duplicates,
reordering, Slurm's own requeue and coordinator restarts."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, replace

import pytest

from prolog_epilog.actions import drain_kind
from runtime.control.policy import (
    Cancel,
    CoordinatorStarted,
    Directive,
    Drain,
    Event,
    JobObserved,
    Note,
    OperatorRequeue,
    PolicyConfig,
    Release,
    ReportReceived,
    Requeue,
    RunState,
    StragglerEviction,
    Tick,
    action_from_dict,
    action_to_dict,
    decide,
    directive_for,
    event_from_dict,
    event_to_dict,
    step,
)
from runtime.protocol import ExitCode, ReplicaReport
from slurm.backend import REASON_MAX

JOBS = {0: "100", 1: "101", 2: "102", 3: "103"}
CFG = PolicyConfig(replicas=3, min_replicas=2, max_restarts_per_replica=2, report_timeout_s=30.0)


def status(k: int, seq: int, at: float, inc: str = "a", step_: int = 0) -> ReportReceived:
    rep = ReplicaReport(
        replica=k, incarnation=f"{k}{inc}", seq=seq, job_id=JOBS[k], nodes=[f"node{k + 1}"],
        step=step_,
    )  # fmt: skip
    return ReportReceived(rep, at)


def fatal(
    k: int,
    seq: int,
    at: float,
    failure: str | None = "process",
    node: str | None = None,
    inc: str = "a",
    exit_code: int | None = None,
    launch: int | None = None,
) -> ReportReceived:
    rep = ReplicaReport(
        replica=k,
        incarnation=f"{k}{inc}",
        seq=seq,
        kind="fatal",
        job_id=JOBS[k],
        failure=failure,  # type: ignore[arg-type]
        failed_node=node,
        exit_code=exit_code,
        launch=launch,
        last_error="boom",
    )
    return ReportReceived(rep, at)


def job(k: int, restarts: int, state: str, at: float, job_id: str | None = None) -> JobObserved:
    return JobObserved(k, job_id or JOBS[k], restarts, state, at, (f"node{k + 1}",))


def run(events: list[Event], cfg: PolicyConfig = CFG) -> tuple[RunState, list[list[object]]]:
    state = RunState.new(cfg, JOBS)
    out: list[list[object]] = []
    for ev in events:
        state, actions = step(state, ev)
        out.append(list(actions))
    return state, out


def slurm_actions(per_event: list[list[object]]) -> list[object]:
    return [
        a for acts in per_event for a in acts if isinstance(a, Drain | Requeue | Release | Cancel)
    ]


WARM = [status(0, 1, 1.0), status(1, 1, 1.0), status(2, 1, 1.0)]


def requeued_off(
    k: int, node: str, reason: str, kind: str = "fault", heard: float | None = None
) -> list[object]:
    """A node fault's actions: drain `node` (or ask for it: the Drain carries the job and the
    request's kind), requeue the job (for a silent replica: naming when it was last heard from),
    release it kept off `node`."""
    return [
        Drain(node, reason, k, JOBS[k], kind),
        Requeue(k, JOBS[k], 0, heard),
        Release(k, JOBS[k], 0.0, (node,)),
    ]


CASES: list[tuple[str, list[Event], list[object]]] = [
    ("healthy reports do nothing", [*WARM, status(1, 2, 5.0)], []),
    (
        "process fault -> relaunch in place, no Slurm action",
        [*WARM, fatal(1, 2, 5.0)],
        [],
    ),
    (
        "node fault -> drain, requeue, release",
        [*WARM, fatal(1, 2, 5.0, "node", "node2")],
        requeued_off(1, "node2", "fthsdp: fault: boom"),
    ),
    (
        "exit code NODE_FAULT without class -> tier 2",
        [*WARM, fatal(1, 2, 5.0, None, "node2", exit_code=ExitCode.NODE_FAULT)],
        requeued_off(1, "node2", "fthsdp: fault: boom"),
    ),
    (
        "duplicate node-fault report -> one requeue",
        [*WARM, fatal(1, 2, 5.0, "node", "node2"), fatal(1, 2, 5.1, "node", "node2")],
        requeued_off(1, "node2", "fthsdp: fault: boom"),
    ),
    (
        "worker and supervisor both report the death -> one requeue",
        [
            *WARM,
            fatal(1, 2, 5.0, "node", "node2"),
            fatal(1, 0, 5.5, None, None, inc="sup", exit_code=ExitCode.NODE_FAULT, launch=0),
        ],
        requeued_off(1, "node2", "fthsdp: fault: boom"),
    ),
    (
        "our requeue then Slurm shows restart 1 -> nothing more",
        [*WARM, fatal(1, 2, 5.0, "node", "node2"), job(1, 1, "PENDING", 6.0)],
        requeued_off(1, "node2", "fthsdp: fault: boom"),
    ),
    (
        "Slurm's own requeue -> release only, never requeue",
        [*WARM, job(1, 1, "PENDING", 6.0)],
        [Release(1, "101", 0.0)],
    ),
    (
        "Slurm requeued first, the old run's fatal report arrives late -> ignored",
        [*WARM, job(1, 1, "PENDING", 6.0), fatal(1, 2, 7.0, "node", "node2")],
        [Release(1, "101", 0.0)],
    ),
    (
        "stale squeue observation (restart count went back) -> ignored",
        [*WARM, job(1, 1, "PENDING", 6.0), job(1, 0, "RUNNING", 5.0)],
        [Release(1, "101", 0.0)],
    ),
    (
        "silent replica -> drain its leader node and requeue",
        [*WARM, status(0, 2, 40.0), status(2, 2, 40.0), Tick(45.0)],
        requeued_off(1, "node2", "fthsdp: silent: no report for 44s", "silent", 1.0),
    ),
    (
        "coordinator restart gives grace: no silence requeue",
        [*WARM, CoordinatorStarted(100.0), Tick(110.0)],
        [],
    ),
    (
        "silence tick twice -> one requeue",
        [*WARM, status(0, 2, 40.0), status(2, 2, 40.0), Tick(45.0), Tick(60.0)],
        requeued_off(1, "node2", "fthsdp: silent: no report for 44s", "silent", 1.0),
    ),
    (
        "every replica silent at once -> the coordinator's outage: nothing drained or requeued",
        [*WARM, Tick(45.0), Tick(100.0), Tick(1000.0)],
        [],
    ),
    (
        "two of three silent at once -> an outage too",
        [*WARM, status(0, 2, 40.0), Tick(45.0)],
        [],
    ),
    (
        "last reports spread over 10 s are one window -> an outage",
        [*WARM, status(1, 2, 10.0), Tick(35.0)],
        [],
    ),
    (
        "reports come back -> the outage ends; one still silent is requeued a timeout later",
        [
            *WARM,
            Tick(45.0),
            status(0, 2, 50.0),
            status(1, 2, 50.0),
            Tick(51.0),
            Tick(60.0),
            status(0, 3, 75.0),
            status(1, 3, 75.0),
            Tick(80.0),
            Tick(82.0),
        ],
        [
            Drain("node3", "fthsdp: silent: no report for 31s", 2, "102", "silent"),
            Requeue(2, "102", 0, 51.0),
            Release(2, "102", 0.0, ("node3",)),
        ],
    ),
    (
        "operator requeue with drain",
        [*WARM, OperatorRequeue(2, 9.0, "node3", "bad fan")],
        requeued_off(2, "node3", "fthsdp: manual: bad fan", "operator"),
    ),
    (
        "worker names its host, not the Slurm node: a one-node replica's node is drained",
        [*WARM, fatal(1, 2, 5.0, "node", "vm-hostname")],
        requeued_off(1, "node2", "fthsdp: fault: boom"),
    ),
    (
        "user error -> exit for good, nothing on Slurm",
        [*WARM, fatal(1, 2, 5.0, None, exit_code=ExitCode.USER_ERROR)],
        [],
    ),
]


@pytest.mark.parametrize(("name", "events", "expected"), CASES, ids=[c[0] for c in CASES])
def test_policy_slurm_actions(name: str, events: list[Event], expected: list[object]) -> None:
    _, per_event = run(events)
    assert slurm_actions(per_event) == expected


def test_process_fault_relaunch_then_new_incarnation_trains() -> None:
    state, per = run([*WARM, fatal(1, 2, 5.0), status(1, 1, 8.0, inc="b", step_=7)])
    assert [a for a in per[3] if isinstance(a, Directive)] == [
        Directive(1, "relaunch", ("101", 0, 0), 0.0)
    ]
    r = state.replicas[1]
    assert (r.phase, r.launch, r.relaunches, r.requeues) == ("training", 1, 1, 0)
    assert r.step == 7


def test_supervisor_directive_lookup() -> None:
    state, _ = run([*WARM, fatal(1, 2, 5.0)])
    assert directive_for(state, 1, "101", 0, 0) == ("relaunch", 0.0)
    assert directive_for(state, 0, "100", 0, 0) == ("continue", 0.0)
    state, _ = run([*WARM, fatal(1, 2, 5.0, "node", "node2")])
    assert directive_for(state, 1, "101", 0, 0) == ("requeue", 0.0)
    assert directive_for(state, 9, "x", 0, 0) == ("exit", 0.0)


def test_second_failure_after_relaunch_is_a_new_decision() -> None:
    events: list[Event] = [
        *WARM,
        fatal(1, 2, 5.0),
        fatal(1, 0, 6.0, inc="sup0", exit_code=ExitCode.PROCESS_FAULT, launch=0),
        fatal(1, 0, 9.0, inc="sup1", exit_code=ExitCode.PROCESS_FAULT, launch=1),
    ]
    state, per = run(events)
    assert state.replicas[1].relaunches == 2
    assert state.replicas[1].launch == 1
    assert [len([a for a in acts if isinstance(a, Directive)]) for acts in per[3:]] == [1, 0, 1]


def test_escalation_from_process_to_node_requeues_once() -> None:
    events: list[Event] = [
        *WARM,
        fatal(1, 2, 5.0, "process"),
        fatal(1, 3, 5.2, "node", "node2"),
        fatal(1, 4, 5.3, "node", "node2"),
    ]
    _, per = run(events)
    assert [a for a in slurm_actions(per) if isinstance(a, Requeue)] == [Requeue(1, "101", 0)]


def test_too_many_failures_leaves_replica_out_while_min_replicas_hold() -> None:
    events: list[Event] = [*WARM]
    for launch in range(3):
        events.append(fatal(1, 0, 10.0 + launch, inc=f"s{launch}", launch=launch))
    state, _ = run(events)
    assert state.replicas[1].phase == "out"
    assert directive_for(state, 1, "101", 0, 2) == ("exit", 0.0)
    # A second replica over the limit would break min_replicas=2: it backs off instead.
    for launch in range(3):
        events.append(fatal(2, 0, 20.0 + launch, inc=f"s{launch}", launch=launch))
    state, _ = run(events)
    assert state.replicas[2].phase == "restarting"
    assert directive_for(state, 2, "102", 0, 2) == ("relaunch", 5.0)


def test_failures_outside_window_do_not_count() -> None:
    cfg = replace(CFG, restart_window_s=10.0)
    events: list[Event] = [*WARM]
    for launch in range(6):
        events.append(fatal(1, 0, 100.0 + 20 * launch, inc=f"s{launch}", launch=launch))
    state, _ = run(events, cfg)
    assert state.replicas[1].phase == "restarting"
    assert state.replicas[1].relaunches == 6


def test_out_replica_pending_job_is_cancelled_once() -> None:
    events: list[Event] = [*WARM]
    for launch in range(3):
        events.append(fatal(1, 0, 10.0 + launch, inc=f"s{launch}", launch=launch))
    events += [job(1, 0, "RUNNING", 20.0), job(1, 0, "RUNNING", 21.0)]
    _, per = run(events)
    assert [a for a in slurm_actions(per) if isinstance(a, Cancel)] == [Cancel(1, "101")]


def test_requeued_replica_comes_back_and_trains() -> None:
    events: list[Event] = [
        *WARM,
        fatal(1, 2, 5.0, "node", "node2"),
        job(1, 1, "PENDING", 6.0),
        job(1, 1, "RUNNING", 9.0),
        status(1, 1, 12.0, inc="new", step_=40),
    ]
    state, _ = run(events)
    r = state.replicas[1]
    assert (r.phase, r.restarts, r.requeues, r.slurm_requeues, r.step) == ("training", 1, 1, 0, 40)
    assert state.drained == {"node2": "fthsdp: fault: boom"}


def test_restored_incarnation_shows_its_own_step_not_the_lost_one() -> None:
    """After a whole-run loss the requeued replica restores an older checkpoint: status shows the
    restored step; a report reordered within one incarnation never moves the step back."""
    events: list[Event] = [
        status(1, 1, 1.0, step_=1579),
        fatal(1, 2, 5.0, "node", "node2"),
        job(1, 1, "PENDING", 6.0),
        job(1, 1, "RUNNING", 9.0),
        status(1, 2, 12.0, inc="new", step_=1200),
        status(1, 1, 12.5, inc="new", step_=1199),
    ]
    state, _ = run(events)
    assert state.replicas[1].step == 1200


def test_reordered_status_after_fatal_is_ignored() -> None:
    events: list[Event] = [*WARM, fatal(1, 5, 5.0, "node", "node2"), status(1, 4, 5.1)]
    state, _ = run(events)
    assert state.replicas[1].phase == "requeued"


def test_decide_is_pure() -> None:
    state = RunState.new(CFG, JOBS)
    before = state.to_dict()
    assert decide(state, fatal(1, 2, 5.0, "node", "node2"))
    assert state.to_dict() == before


def test_events_and_actions_round_trip() -> None:
    evs: list[Event] = [
        *WARM,
        fatal(1, 2, 5.0, "node", "node2"),
        job(1, 1, "PENDING", 6.0),
        Tick(7.0),
        CoordinatorStarted(8.0),
        OperatorRequeue(0, 9.0, "node1", "x"),
    ]
    assert [event_from_dict(event_to_dict(e)) for e in evs] == evs
    _, per = run(evs)
    acts = [a for acts in per for a in acts]
    assert [action_from_dict(action_to_dict(a)) for a in acts] == acts  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("last_error", "reason"),
    [
        # A health check's drain reason from the watchdog: its text is the detail.
        ("fthsdp: xid: Xid 79 0000:db:00", "fthsdp: fault: xid: Xid 79 0000:db:00"),
        # A leader may not choose the kind: `manual` would never be resumed by itself.
        ("fthsdp: manual: keep this node", "fthsdp: fault: manual: keep this node"),
        ("fthsdp:straggler: 9x", "fthsdp: fault: straggler: 9x"),
        ("fthsdp: silent: ", "fthsdp: fault: silent:"),
        # Terminal escapes, control characters, quotes and other lines are reduced away.
        ("\x1b[2J\x1b]0;pwned\x07gpu\r\nfell off", "fthsdp: fault: [2J ]0;pwned gpu fell off"),
        ('say "drain" \\ \'now\'', "fthsdp: fault: say drain now"),
        ("GPU\u00a0lost \u202e\u00e9", "fthsdp: fault: GPU lost"),
        ("\x00\x1b", "fthsdp: fault: "),
        ("x" * 5000, "fthsdp: fault: " + "x" * (REASON_MAX - len("fthsdp: fault: "))),
    ],
    ids=["health-check", "manual", "straggler", "silent", "escapes", "quotes", "unicode",
         "nothing-left", "long"],
)  # fmt: skip
def test_a_leader_gives_only_the_drain_reasons_detail(last_error: str, reason: str) -> None:
    ev = fatal(1, 2, 5.0, "node", "node2")
    ev.report.last_error = last_error
    state, per = run([*WARM, ev])
    drains = [a for a in per[-1] if isinstance(a, Drain)]
    assert drains == [Drain("node2", reason, 1, "101")]
    assert drain_kind(drains[0].reason) == "fault"
    assert state.drained == {"node2": reason}
    assert all(" " <= c <= "~" for c in reason) and len(reason) <= REASON_MAX


def test_the_policy_kinds_stay_its_own() -> None:
    # The operator's (signed) requeue and a straggler keep their kinds, the detail printable.
    _, per = run([*WARM, OperatorRequeue(2, 9.0, "node3", "fan \x1b[5m")])
    assert [a for a in per[-1] if isinstance(a, Drain)] == [
        Drain("node3", "fthsdp: manual: fan [5m", 2, "102", "operator")
    ]
    _, per = run([*WARM, StragglerEviction(1, 5.0, "node2", "node2 2.0x")])
    assert drain_kind(next(a for a in per[-1] if isinstance(a, Drain)).reason) == "straggler"


@pytest.mark.parametrize(
    ("eviction", "expected"),
    [
        # mode "drain": the node is drained with the straggler reason, the job requeued
        (
            StragglerEviction(1, 5.0, "node2", "node2 2.0x"),
            requeued_off(1, "node2", "fthsdp: straggler: node2 2.0x", "straggler"),
        ),
        # mode "exclude": no drain; the requeued job is kept off the node for this run only
        (
            StragglerEviction(1, 5.0, None, "node2 2.0x", exclude="node2"),
            [Requeue(1, "101", 0), Release(1, "101", 0.0, ("node2",))],
        ),
    ],
)
def test_straggler_eviction_drains_or_only_excludes(
    eviction: StragglerEviction, expected: list[object]
) -> None:
    state, per = run([*WARM, eviction])
    assert slurm_actions(per) == expected
    assert state.replicas[1].phase == "requeued"
    # the journal round-trips the exclusion
    acts = [a for acts in per for a in acts]
    assert [action_from_dict(action_to_dict(a)) for a in acts] == acts  # type: ignore[arg-type]
    assert event_from_dict(event_to_dict(eviction)) == eviction


# -- mass silence: the coordinator's outage ---------------------------------------------------

OUTAGE_CASES: list[tuple[str, list[Event], PolicyConfig, list[int] | None]] = [
    ("all three quiet", [*WARM, Tick(45.0)], CFG, [0, 1, 2]),
    ("two of three", [*WARM, status(0, 2, 40.0), Tick(45.0)], CFG, [1, 2]),
    ("one of three: its own fault", [*WARM, status(0, 2, 40.0), status(2, 2, 40.0), Tick(45.0)],
     CFG, None),
    ("quiet but nobody past the limit yet", [*WARM, Tick(20.0)], CFG, None),
    ("one replica run: never an outage", [status(0, 1, 1.0), Tick(45.0)],
     replace(CFG, replicas=1, min_replicas=1), None),
    ("two of four is not more than half",
     [*WARM, status(3, 1, 1.0), status(2, 2, 40.0), status(3, 2, 40.0), Tick(45.0)],
     replace(CFG, replicas=4, min_replicas=1), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "events", "cfg", "silent"), OUTAGE_CASES, ids=[c[0] for c in OUTAGE_CASES]
)
def test_mass_silence_is_an_outage(
    name: str, events: list[Event], cfg: PolicyConfig, silent: list[int] | None
) -> None:
    state, per_event = run(events, cfg)
    if silent is None:
        assert state.outage is None
        return
    assert state.outage == {"since": 45.0, "silent": silent, "watched": 3}
    assert slurm_actions(per_event) == []
    notes = [a for a in per_event[-1] if isinstance(a, Note)]
    assert len(notes) == 1 and "the coordinator's outage" in notes[0].text
    # No replica was decided on: every one still trains, with no directive.
    assert all(r.handled is None and r.phase == "training" for r in state.replicas.values())


def test_an_outage_is_noted_once_and_its_end_once() -> None:
    events: list[Event] = [*WARM, Tick(45.0), Tick(46.0), Tick(47.0)]
    events += [status(k, 2, 50.0) for k in range(3)] + [Tick(51.0), Tick(52.0)]
    state, per_event = run(events)
    notes = [a.text for acts in per_event for a in acts if isinstance(a, Note)]
    assert len(notes) == 2
    assert notes[1].startswith("control plane: reports are back after 6s of mass silence")
    assert state.outage is None


def test_an_outage_survives_a_snapshot() -> None:
    state, _ = run([*WARM, Tick(45.0)])
    again = RunState.from_dict(CFG, state.to_dict())
    assert again.outage == state.outage is not None
    assert RunState.from_dict(CFG, {**state.to_dict(), "outage": None}).outage is None


def test_hand_built_dicts_and_copies_match_the_generic_ones() -> None:
    """`ReplicaState.to_dict`, its deep copy and a report's `event_to_dict` are written by
    hand for speed: they must give what `asdict` and `copy.deepcopy` give, and share no list
    with the original (a snapshot is serialised in another thread)."""
    state, _ = run([*WARM, fatal(1, 2, 5.0, "node", "node2"), job(1, 1, "PENDING", 6.0)])
    r = replace(state.replicas[1], failures=[4.0], old_jobs=["7"], handled="requeue")
    assert r.incarnations and r.nodes
    assert r.to_dict() == asdict(r) and list(r.to_dict()) == list(asdict(r))
    copied = copy.deepcopy(r)
    assert copied == r and copied.to_dict() == asdict(r)
    for name in ("old_jobs", "nodes", "incarnations", "failures"):
        assert getattr(copied, name) is not getattr(r, name)
        assert r.to_dict()[name] is not getattr(r, name)
    assert next(iter(copied.incarnations.values())) is not next(iter(r.incarnations.values()))
    assert state.to_dict()["replicas"] == [asdict(x) for _, x in sorted(state.replicas.items())]
    ev = fatal(1, 2, 5.0, "node", "node2")
    assert isinstance(ev, ReportReceived)
    generic = {**asdict(ev), "type": "ReportReceived"}
    assert json.dumps(event_to_dict(ev)) == json.dumps(generic)
    assert event_to_dict(ev)["report"]["evidence"] is not ev.report.evidence


def test_the_drained_map_is_shared_until_a_drain_replaces_it() -> None:
    """A report shares the earlier state's drained map (a run with thousands of drained nodes
    copies none of them per report); a drain makes a new map and leaves the earlier states'
    maps as they were."""
    state, _ = run(WARM)
    before = state
    after_status, _ = step(state, status(0, 2, 2.0))
    assert after_status.drained is before.drained
    after_fault, actions = step(after_status, fatal(1, 2, 3.0, failure="node", node="node2"))
    assert any(isinstance(a, Drain) for a in actions)
    assert after_fault.drained == {"node2": after_fault.drained["node2"]}
    assert before.drained == {} and after_status.drained == {}
