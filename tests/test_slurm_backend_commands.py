"""A slow or failing Slurm command says what fthsdp waits for, and still ends by its deadline.

Real executables stand in for a slurmctld that answers late or not at all: a script that sleeps,
and one that prints Slurm's own "Unable to contact slurm controller" and fails. `set_comment`
(the drain-request channel) sends the comment as one argument and counts it set only once squeue
shows it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from slurm.backend import CommandBackend, SlurmCommandError
from slurm.backend.commands import WAIT_NOTICE_AFTER_S
from slurm.errors import InputError
from slurm.records import JobInfo, JobNotSettled, NodeInfo


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_slow_answer_is_announced_once_and_still_read(tmp_path: Path) -> None:
    slow = _script(tmp_path, "squeue", f"sleep {WAIT_NOTICE_AFTER_S + 1}; echo ok")
    seen: list[str] = []
    backend = CommandBackend(timeout=30, notice=seen.append)
    assert backend._run([slow]) == "ok\n"
    assert len(seen) == 1 and "waiting for" in seen[0] and "giving up after 30 s" in seen[0]


def test_a_fast_answer_says_nothing(tmp_path: Path) -> None:
    fast = _script(tmp_path, "squeue", "echo ok")
    seen: list[str] = []
    assert CommandBackend(notice=seen.append)._run([fast]) == "ok\n"
    assert seen == []


def test_an_unreachable_controller_is_retried_aloud_then_fails(tmp_path: Path) -> None:
    down = _script(
        tmp_path, "sbatch", "echo 'sbatch: error: Unable to contact slurm controller' >&2; exit 1"
    )
    seen: list[str] = []
    backend = CommandBackend(retries=3, backoff=0.01, notice=seen.append)
    with pytest.raises(SlurmCommandError, match="Unable to contact slurm controller"):
        backend._run([down])
    assert [m.split("(")[-1] for m in seen] == ["2/3)", "3/3)"]
    assert all("Unable to contact slurm controller" in m for m in seen)


def _gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_the_deadline_holds_and_the_command_is_stopped(tmp_path: Path) -> None:
    # The command's child has let go of the pipes, so only a kill of the whole process group
    # stops it: killing the command alone would leave it running its 30 s.
    pid_file = tmp_path / "child.pid"
    hung = _script(
        tmp_path, "scontrol", f"sleep 30 >/dev/null 2>&1 </dev/null & echo $! > {pid_file}; wait"
    )
    seen: list[str] = []
    backend = CommandBackend(timeout=WAIT_NOTICE_AFTER_S + 1, retries=1, notice=seen.append)
    start = time.monotonic()
    with pytest.raises(SlurmCommandError, match="timed out"):
        backend._run([hung])
    assert time.monotonic() - start < WAIT_NOTICE_AFTER_S + 10
    assert len(seen) == 1
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # a third of the child's 30 s: it was stopped, not done
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), f"the command's child {child} outlived the deadline"


def test_without_a_notice_nothing_changes(tmp_path: Path) -> None:
    hung = _script(tmp_path, "scontrol", "sleep 30")
    with pytest.raises(SlurmCommandError, match="timed out after 1s"):
        CommandBackend(timeout=1, retries=1)._run([hung])


class _CommentBackend(CommandBackend):
    """The command backend with Slurm's answers replaced: `scontrol update` is recorded and
    `squeue` shows the job with `shown` as its comment."""

    def __init__(self, shown: str | None) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []
        self.shown = shown

    def _run(self, argv: Sequence[str], retry: bool = True) -> str:
        self.argvs.append(list(argv))
        return ""

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        if self.shown is None:
            return []
        return [JobInfo(j, "x", "RUNNING", "node1", 0, "", comment=self.shown) for j in job_ids]


REQUEST = "fthsdp-drain-request/1 seq=3 node=node1 kind=operator detail=bad fan"


def test_set_comment_is_one_argument_and_read_back() -> None:
    backend = _CommentBackend(REQUEST)
    backend.set_comment("12", REQUEST)
    assert backend.argvs == [["scontrol", "update", "JobId=12", f"Comment={REQUEST}"]]


@pytest.mark.parametrize(
    ("shown", "what"), [("someone else's", 'comment "someone else\'s"'), (None, "no such job")]
)
def test_set_comment_not_shown_is_an_error(shown: str | None, what: str) -> None:
    with pytest.raises(SlurmCommandError, match=re.escape(what)):
        _CommentBackend(shown).set_comment("12", REQUEST)


@pytest.mark.parametrize(
    ("job", "text"), [("12;x", REQUEST), ("12", "two\nlines"), ("12", ""), ("12", "x" * 1001)]
)
def test_set_comment_refuses_bad_input_before_slurm(job: str, text: str) -> None:
    backend = _CommentBackend(text)
    with pytest.raises(InputError):
        backend.set_comment(job, text)
    assert backend.argvs == []


class _ExcludeBackend(CommandBackend):
    """The command backend with a pending job that excludes `excluded`, and nodes in the states
    given (`None`: the node read fails)."""

    def __init__(self, excluded: str, nodes: dict[str, NodeInfo] | None) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []
        self.excluded = excluded
        self.node_states = nodes

    def _run(self, argv: Sequence[str], retry: bool = True) -> str:
        self.argvs.append(list(argv))
        return ""

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        return [JobInfo(j, "x", "PENDING", "", 1, "", excluded=self.excluded) for j in job_ids]

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        if self.node_states is None:
            raise SlurmCommandError(["scontrol", "show", "node"], 1, "Unable to contact")
        return [self.node_states[n] for n in names]


HEALED = NodeInfo("node2", "idle")
DRAINED = NodeInfo("node2", "idle", ("DRAIN",), "fthsdp: fault: xid")
DOWN = NodeInfo("node2", "down", ("NOT_RESPONDING",))


@pytest.mark.parametrize(
    ("excluded", "exclude", "forget", "nodes", "expected"),
    [
        # healed and resumed by an operator: it may take the job again
        ("node2", ["node4"], ["node2"], {"node2": HEALED}, "ExcNodeList=node4"),
        ("node2", [], ["node2"], {"node2": HEALED}, "ExcNodeList="),
        # still drained or down, or not read: it stays off
        ("node2", ["node4"], ["node2"], {"node2": DRAINED}, "ExcNodeList=node[2,4]"),
        ("node2", ["node4"], ["node2"], {"node2": DOWN}, "ExcNodeList=node[2,4]"),
        ("node2", ["node4"], ["node2"], None, "ExcNodeList=node[2,4]"),
        # what the job excluded by itself (the spec's) is never in `forget`: it stays
        ("node[1-2]", ["node4"], ["node2"], {"node2": HEALED}, "ExcNodeList=node[1,4]"),
        # to keep off now wins over back in service
        ("node2", ["node2"], ["node2"], {"node2": HEALED}, "ExcNodeList=node2"),
    ],
)
def test_release_forgets_only_nodes_back_in_service(
    excluded: str,
    exclude: list[str],
    forget: list[str],
    nodes: dict[str, NodeInfo] | None,
    expected: str,
) -> None:
    backend = _ExcludeBackend(excluded, nodes)
    backend._exclude("12", exclude, forget)
    updates = [a for a in backend.argvs if any(x.startswith("ExcNodeList=") for x in a)]
    if expected == f"ExcNodeList={excluded}":
        assert updates == []  # nothing changes: nothing is sent
    else:
        assert updates == [["scontrol", "update", "JobId=12", expected]]


@pytest.mark.parametrize(
    ("node", "in_service"),
    [
        (NodeInfo("n", "idle"), True),
        (NodeInfo("n", "mixed"), True),
        (NodeInfo("n", "allocated"), True),
        (NodeInfo("n", "idle", ("DRAIN",)), False),
        (NodeInfo("n", "allocated", ("DRAIN",)), False),
        (NodeInfo("n", "idle", ("NOT_RESPONDING",)), False),
        (NodeInfo("n", "down"), False),
        (NodeInfo("n", "drained"), False),
        (NodeInfo("n", "unknown"), False),
        (NodeInfo("n", "future"), False),
        (NodeInfo("n", "idle", ("MAINTENANCE",)), False),
    ],
)
def test_a_node_is_in_service_only_when_slurm_would_start_a_job_there(
    node: NodeInfo, in_service: bool
) -> None:
    assert node.in_service is in_service


@pytest.mark.parametrize(
    ("node", "responding"),
    [
        (NodeInfo("n", "allocated"), True),
        (NodeInfo("n", "mixed", ("DRAIN",)), True),  # drained, but its slurmd answers
        (NodeInfo("n", "idle", ("MAINTENANCE",)), True),
        (NodeInfo("n", "allocated", ("NOT_RESPONDING",)), False),
        (NodeInfo("n", "allocated", ("not_responding",)), False),
        (NodeInfo("n", "down"), False),
        (NodeInfo("n", "down", ("NOT_RESPONDING",)), False),
        (NodeInfo("n", "unknown"), False),
        (NodeInfo("n", "future"), False),
    ],
)
def test_a_node_responds_unless_slurm_has_stopped_hearing_from_it(
    node: NodeInfo, responding: bool
) -> None:
    assert node.responding is responding


class _CompletingBackend(CommandBackend):
    """A requeued job that stays COMPLETING on its old node (its steps' ends held up)."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    def _run(self, argv: Sequence[str], retry: bool = True) -> str:
        self.argvs.append(list(argv))
        return "COMPLETING\n" if argv[0] == "squeue" else ""

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        return [JobInfo(j, "x", "PENDING", "", 1, "") for j in job_ids]


def test_release_of_a_job_still_completing_is_sent_but_not_done() -> None:
    backend = _CompletingBackend()
    with pytest.raises(JobNotSettled, match="job 12 still completing"):
        backend.release("12", settle=0.3)
    # The begin time is asked for all the same; the caller tries again once the job settles.
    assert ["scontrol", "update", "JobId=12", "StartTime=now+2"] in backend.argvs
