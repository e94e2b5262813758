"""The Epilog's policy for a run's drain request, by tables, and its root-owned ledger."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prolog_epilog import drain_requests as dr
from prolog_epilog.config import load_config
from slurm.backend import REASON_MAX
from slurm.drain_request import DrainRequest
from slurm.errors import InputError
from slurm.records import JobInfo, NodeInfo

NOW = 1_800_000_000.0
REQ = DrainRequest(1, "node1", "straggler", "3.1x slower than the median")
IDLE = NodeInfo("node1", "idle")
ADMIN = NodeInfo("node1", "idle", ("DRAIN",), "admin: maintenance")
OURS = NodeInfo("node1", "idle", ("DRAIN",), "fthsdp: xid: Xid 79")


def ev(job: str, seq: int = 1, user: str = "alice", ago: float = 60.0, counted: bool = True):
    return dr.Event(job, seq, user, NOW - ago, counted)


def judge(**over: object) -> dr.Verdict:
    args: dict[str, object] = {
        "policy": "trust",
        "job": "42",
        "user": "alice",
        "node": "node1",
        "events": [],
        "limit": 3,
        "node_info": IDLE,
        "user_drained": 0,
        "now": NOW,
        **over,
    }
    request = args.pop("request", REQ)
    return dr.judge(request, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("over", "action", "why", "recorded"),
    [
        ({}, "drain", "trusted", True),
        ({"policy": "recheck"}, "recheck", "full checks", True),
        ({"policy": "off"}, "refuse", "'off'", False),
        ({"policy": "maybe"}, "refuse", "'maybe'", False),
        ({"user": None}, "refuse", "owner is unknown", False),
        ({"node": "node2"}, "refuse", "names node node1, not node2", False),
        ({"events": None}, "refuse", "ledger is unusable", False),
        ({"events": [ev("42")]}, "skip", "handled before", False),
        ({"events": [ev("42", counted=False)]}, "skip", "handled before", False),
        ({"events": [ev("42", seq=2)]}, "drain", "trusted", True),
        ({"events": [ev("1"), ev("2"), ev("3")]}, "refuse", "3 requests here in 24 h", True),
        ({"events": [ev("1"), ev("2"), ev("3")], "policy": "recheck"}, "refuse", "limit 3", True),
        ({"events": [ev("1"), ev("2"), ev("3", ago=86400.0)]}, "drain", "trusted", True),
        ({"events": [ev("1"), ev("2"), ev("3", user="bob")]}, "drain", "trusted", True),
        ({"events": [ev("1"), ev("2"), ev("3", counted=False)]}, "drain", "trusted", True),
        ({"limit": 0}, "refuse", "limit 0", True),
        ({"node_info": None}, "refuse", "unreadable", False),
        ({"node_info": ADMIN}, "refuse", "another drain (admin: maintenance)", True),
        ({"node_info": ADMIN, "policy": "recheck"}, "refuse", "another drain", True),
        ({"node_info": OURS}, "refuse", "already drained by fthsdp", True),
        ({"node_info": OURS, "policy": "recheck"}, "recheck", "full checks", True),
        ({"user_drained": None}, "refuse", "drained nodes are unreadable", False),
        ({"user_drained": 3}, "refuse", "keep 3 nodes drained (limit 3)", True),
        ({"user_drained": 3, "policy": "recheck"}, "recheck", "full checks", True),
    ],
)
def test_judge(over: dict[str, object], action: str, why: str, recorded: bool) -> None:
    verdict = judge(**over)
    assert verdict.action == action, verdict
    assert why in verdict.why, verdict
    assert (verdict.record is not None) == recorded
    if verdict.record is not None:
        assert (verdict.record.job, verdict.record.seq, verdict.record.user) == ("42", 1, "alice")
        assert verdict.record.counted == (action in ("drain", "recheck"))
    assert (verdict.reason is not None) == (action == "drain")


def test_trusted_reason_names_job_user_kind_and_fits_slurm() -> None:
    verdict = judge()
    assert verdict.reason == (
        "fthsdp: requested: job 42 user alice: straggler: 3.1x slower than the median"
    )
    long = DrainRequest.make(7, "node1", "operator", "x" * 400)
    reason = dr.requested_reason("123456789", "a-long-user-name", long)
    assert len(reason) <= REASON_MAX
    assert reason.startswith("fthsdp: requested: job 123456789 user a-long-user-name: operator: x")
    assert dr.requested_user(reason) == "a-long-user-name"
    assert dr.requested_user("fthsdp: xid: Xid 79") is None
    assert dr.requested_user("admin: fthsdp: requested: job 1 user bob: x") is None


@pytest.mark.parametrize(
    ("reason", "want"),
    [
        (
            "fthsdp: xid: Xid 79 GPU3",
            "fthsdp: xid: requested by job 42 user alice: Xid 79 GPU3",
        ),
        (
            "fthsdp: ecc: error: timed out [+xid]",
            "fthsdp: ecc: requested by job 42 user alice: error: timed out [+xid]",
        ),
    ],
)
def test_annotate_keeps_the_findings_kind(reason: str, want: str) -> None:
    assert dr.annotate(reason, "42", "alice") == want
    assert len(dr.annotate(reason + "y" * 200, "42", "alice")) <= REASON_MAX


def test_nodes_drained_for_counts_only_that_users_requested_drains() -> None:
    def drained(reason: str) -> NodeInfo:
        return NodeInfo("n", "idle", ("DRAIN",), reason)

    nodes = [
        drained("fthsdp: requested: job 1 user alice: hung: x"),
        drained("fthsdp: requested: job 2 user alice: silent: y"),
        drained("fthsdp: requested: job 3 user bob: hung: x"),
        drained("fthsdp: xid: requested by job 4 user alice: Xid 79"),
        NodeInfo("n", "idle", (), "fthsdp: requested: job 5 user alice: hung: resumed"),
    ]
    assert dr.nodes_drained_for("alice", nodes) == 2
    assert dr.nodes_drained_for("carol", nodes) == 0


@pytest.mark.parametrize(
    ("reason", "at", "now", "hold", "since"),
    [
        ("fthsdp: requested: job 1 user a: hung: x", NOW - 10, NOW, "3590s left", NOW - 10),
        ("fthsdp: requested: job 1 user a: hung: x", NOW - 3600, NOW, None, NOW - 3600),
        ("fthsdp: requested: job 1 user a: hung: x", None, NOW, "3600s left", NOW),
        ("fthsdp: requested: job 1 user a: hung: x", NOW + 99, NOW, "3600s left", NOW),
        ("fthsdp: xid: requested by job 1 user a: Xid 79", NOW - 10, NOW, None, None),
        ("fthsdp: straggler: node1 2.7x", None, NOW, None, None),
    ],
)
def test_resume_hold(
    reason: str, at: float | None, now: float, hold: str | None, since: float | None
) -> None:
    got_hold, got_since = dr.resume_hold(reason, at, now, 3600.0)
    assert (got_hold is None) == (hold is None)
    if hold is not None:
        assert got_hold is not None and hold in got_hold
    assert got_since == since


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "0"}, "alice"),
        ({"SLURM_JOB_USER": "jdoe@example.org"}, "jdoe@example.org"),
        ({"SLURM_JOB_UID": "0"}, "root"),
        ({"SLURM_JOB_UID": "4000000000"}, "uid4000000000"),
        ({"SLURM_JOB_USER": "a b:c", "SLURM_JOB_UID": "x"}, None),
        ({}, None),
    ],
)
def test_job_user_comes_from_slurmd_environment(env: dict[str, str], want: str | None) -> None:
    assert dr.job_user(env) == want


def test_refusal_line_is_one_printable_line() -> None:
    line = dr.refusal_line("42", None, "node1", "names node\x1b[31mnode9\n, not node1")
    assert line.startswith("drain request refused: job 42 user ? node node1: names node")
    assert "\n" not in line and "\x1b" not in line


# -- the ledger --------------------------------------------------------------------------


def test_ledger_round_trip_keeps_recent_events_0600(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    ledger = dr.Ledger(tmp_path)
    assert ledger.read() == []
    events = [ev("1", ago=dr.KEEP_S + 1), ev("2"), ev("3", counted=False)]
    with ledger.locked(1.0):
        ledger.write(events, NOW)
    assert ledger.read() == events[1:]
    assert (ledger.path.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_ledger_lock_waits_then_refuses(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    ledger = dr.Ledger(tmp_path)
    second = dr.Ledger(tmp_path)
    with (
        ledger.locked(1.0),
        pytest.raises(dr.LedgerError, match="held by another hook"),
        second.locked(0.2),
    ):
        pass


GOOD_EVENT = {"job": "1", "seq": 1, "user": "a", "at": NOW, "counted": True}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not JSON"),
        ("[]", "not a ledger"),
        ('{"version": 1}', "not a ledger"),
        ('{"version": 2, "events": []}', "version 2"),
        ('{"version": 1, "events": {}}', "not a list"),
        (json.dumps({"version": 1, "events": [{**GOOD_EVENT, "x": 1}]}), "events\\[0\\]"),
        (json.dumps({"version": 1, "events": [{**GOOD_EVENT, "seq": True}]}), "seq"),
        (json.dumps({"version": 1, "events": [{**GOOD_EVENT, "seq": "1"}]}), "seq"),
        (json.dumps({"version": 1, "events": [{**GOOD_EVENT, "at": "now"}]}), "at"),
        (json.dumps({"version": 1, "events": [{**GOOD_EVENT, "counted": 1}]}), "counted"),
        (json.dumps({"version": 1, "events": [{**GOOD_EVENT, "user": None}]}), "user"),
    ],
)
def test_ledger_reader_is_strict(text: str, match: str) -> None:
    with pytest.raises(dr.LedgerError, match=match):
        dr.parse_ledger(text, "L")


def test_ledger_refuses_a_file_of_the_wrong_mode_or_kind(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    ledger = dr.Ledger(tmp_path)
    ledger.path.write_text(dr.ledger_text([ev("1")], NOW))
    ledger.path.chmod(0o644)
    with pytest.raises(dr.LedgerError, match="mode 644"):
        ledger.read()
    ledger.path.unlink()
    (tmp_path / "elsewhere").write_text(dr.ledger_text([], NOW))
    os.symlink(tmp_path / "elsewhere", ledger.path)
    with pytest.raises(dr.LedgerError):
        ledger.read()


def test_config_keys_and_their_checks(tmp_path: Path) -> None:
    cfg = load_config()
    assert cfg.actions["drain_requests"] == "recheck"
    assert cfg.actions["drain_requests_per_user_day"] == 3
    assert cfg.actions["drain_request_hold_s"] == 3600.0
    for text, field in [
        ('[actions]\ndrain_requests = "always"\n', "actions.drain_requests"),
        ("[actions]\ndrain_requests_per_user_day = -1\n", "actions.drain_requests_per_user_day"),
        ("[actions]\ndrain_request_hold_s = -5\n", "actions.drain_request_hold_s"),
    ]:
        (tmp_path / "c.toml").write_text(text)
        with pytest.raises(InputError, match=field):
            load_config(tmp_path / "c.toml")


# -- the Epilog's wiring, on a simulated node with a stand-in for slurmctld --------------------


class FakeSlurm:
    """What the hooks ask slurmctld, answered from memory: one job's comment, one node."""

    def __init__(self, comment: str, node: NodeInfo) -> None:
        self.comment = comment
        self.node_info = node
        self.actions: list[tuple[str, str]] = []
        self.reads: list[str] = []

    def jobs(self, ids: list[str] = (), name: str | None = None) -> list[JobInfo]:  # type: ignore[assignment]
        self.reads.append("jobs")
        return [JobInfo(ids[0], "j", "COMPLETING", "node1", 0, "", comment=self.comment)]

    def node(self, name: str) -> NodeInfo:
        self.reads.append("node")
        return self.node_info

    def nodes(self, names: object = ()) -> list[NodeInfo]:
        self.reads.append("nodes")
        return [self.node_info]

    def drain(self, node: str, reason: str) -> bool:
        if self.node_info.foreign_reason:
            return False
        self.actions.append(("drain", reason))
        self.node_info = NodeInfo(node, "idle", ("DRAIN",), reason)
        return True

    def resume(self, node: str) -> bool:
        if not self.node_info.drained_by_us:
            return False
        self.actions.append(("resume", node))
        self.node_info = NodeInfo(node, "idle")
        return True


def _hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm: FakeSlurm, extra: str = ""):
    import slurm.backend as backend
    from prolog_epilog.entrypoints import run_mode
    from prolog_epilog.simulated_hardware import dev_config_toml

    tmp_path.chmod(0o700)
    config = tmp_path / "c.toml"
    config.write_text(
        dev_config_toml(tmp_path) + "[checks.gpu-count]\nexpected = 8\n" + "[actions]\n" + extra
    )
    monkeypatch.setattr(backend, "make_backend", lambda **_: slurm)

    def run(mode: str, job: str = "42", user: str = "alice", **more: str) -> dict:
        env = {"SLURMD_NODENAME": "node1", "SLURM_JOB_ID": job, "SLURM_JOB_USER": user, **more}
        return run_mode(mode, str(config), node="node1", env=env)[1]

    return run


REQUEST_TEXT = REQ.text()


@pytest.mark.timeout(60)
def test_epilog_trusts_a_request_once_and_healthcheck_holds_then_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prolog_epilog.simulated_hardware import write_node_inputs

    write_node_inputs(tmp_path, "node1")
    slurm = FakeSlurm(REQUEST_TEXT, IDLE)
    run = _hooks(tmp_path, monkeypatch, slurm, 'drain_requests = "trust"\n')
    record = run("epilog")
    want = "fthsdp: requested: job 42 user alice: straggler: 3.1x slower than the median"
    assert record["drain_request"]["action"] == "drain" and record["exit"] == 0
    assert slurm.actions == [("drain", want)]
    slurm.node_info = IDLE  # resumed by hand; the requeued job's next Epilog sees the comment
    again = run("epilog")
    assert again["drain_request"]["action"] == "skip" and slurm.actions == [("drain", want)]
    slurm.node_info = NodeInfo("node1", "idle", ("DRAIN",), want)
    held = run("healthcheck")
    assert held["healthy"] and "requested drain is held" in held["action"]["why"]
    assert slurm.actions == [("drain", want)]


@pytest.mark.timeout(60)
def test_requested_drain_is_resumed_once_the_hold_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prolog_epilog.simulated_hardware import write_node_inputs

    write_node_inputs(tmp_path, "node1")
    reason = "fthsdp: requested: job 9 user bob: hung: no step for 600s"
    slurm = FakeSlurm("", NodeInfo("node1", "idle", ("DRAIN",), reason))
    run = _hooks(tmp_path, monkeypatch, slurm, "drain_request_hold_s = 0.0\n")
    assert run("healthcheck")["action"]["action"] == "resume"
    assert slurm.actions == [("resume", "node1")]


@pytest.mark.timeout(60)
def test_epilog_recheck_runs_the_full_suite_and_drains_only_on_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prolog_epilog.simulated_hardware import write_node_inputs

    write_node_inputs(tmp_path, "node1")
    slurm = FakeSlurm(REQUEST_TEXT, IDLE)
    run = _hooks(tmp_path, monkeypatch, slurm)
    healthy = run("epilog", job="41")
    assert healthy["drain_request"]["action"] == "recheck" and healthy["healthy"]
    assert "nvlink" in [c["name"] for c in healthy["checks"]]  # not among the Epilog's own
    assert slurm.actions == []
    # nvlink is not an Epilog check: without a request the fault goes unseen here.
    write_node_inputs(tmp_path, "node1", faults=["nvlink"])
    slurm.comment = "team=x"
    assert run("epilog", job="43")["healthy"] and slurm.actions == []
    slurm.comment = REQUEST_TEXT
    found = run("epilog", job="44")
    assert found["exit"] == 1 and len(slurm.actions) == 1
    assert slurm.actions[0][1].startswith("fthsdp: nvlink: requested by job 44 user alice: GPU")


@pytest.mark.timeout(60)
def test_epilog_refuses_other_nodes_limits_admin_drains_and_corrupt_ledgers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prolog_epilog.simulated_hardware import write_node_inputs

    write_node_inputs(tmp_path, "node1")
    other = DrainRequest(1, "node2", "silent", "x").text()
    slurm = FakeSlurm(other, IDLE)
    run = _hooks(tmp_path, monkeypatch, slurm, 'drain_requests = "trust"\n')
    assert "not node1" in run("epilog")["drain_request"]["why"]
    slurm.comment = REQUEST_TEXT
    for job in ("50", "51", "52"):
        assert run("epilog", job=job)["drain_request"]["action"] == "drain"
        slurm.node_info = IDLE
    limited = run("epilog", job="53")
    assert "limit 3" in limited["drain_request"]["why"] and len(slurm.actions) == 3
    slurm.node_info = ADMIN
    kept = run("epilog", job="60", user="carol")
    assert "another drain" in kept["drain_request"]["why"] and slurm.node_info == ADMIN
    slurm.comment = "fthsdp-drain-request/1 seq=x node=node1"
    bad = run("epilog", job="61", user="carol")
    assert "malformed" in bad["drain_request"]["why"] and bad["exit"] == 0
    slurm.node_info, slurm.comment = IDLE, REQUEST_TEXT
    ledger = tmp_path / "node1" / "state" / dr.LEDGER_FILE
    ledger.write_text("{not json")
    ledger.chmod(0o600)
    corrupt = run("epilog", job="62", user="carol")
    assert "ledger is unusable" in corrupt["drain_request"]["why"] and corrupt["exit"] == 0
    assert len(slurm.actions) == 3
    log = (tmp_path / "health-node1.log").read_text()
    assert "drain request refused: job 62 user carol node node1: the drain-request ledger" in log
    assert "drain request refused: job 1 user alice node node1: names node node2" not in log
    assert "drain request refused: job 42 user alice node node1: names node node2" in log


@pytest.mark.timeout(60)
def test_epilog_takes_the_comment_slurmd_passes_and_asks_slurm_only_when_it_may_act(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prolog_epilog.simulated_hardware import write_node_inputs

    write_node_inputs(tmp_path, "node1")
    slurm = FakeSlurm("not read", IDLE)
    run = _hooks(tmp_path, monkeypatch, slurm, 'drain_requests = "trust"\n')
    context = {"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
    assert "drain_request" not in run("epilog", job="70", **context)
    assert slurm.reads == []  # no comment: slurmd leaves SLURM_JOB_COMMENT out
    other = DrainRequest(1, "node2", "hung", "x").text()
    refused = run("epilog", job="71", SLURM_JOB_COMMENT=other, **context)
    assert "not node1" in refused["drain_request"]["why"] and slurm.reads == []
    taken = run("epilog", job="72", SLURM_JOB_COMMENT=REQUEST_TEXT, **context)
    assert taken["drain_request"]["action"] == "drain"
    assert "jobs" not in slurm.reads and slurm.reads[:2] == ["node", "nodes"]
