"""`slurm.records`: which squeue record speaks for a job, the one-node-name check, and which
failures mean Slurm is away or busy, by tables."""

from __future__ import annotations

import pytest

from slurm import records
from slurm.records import JobInfo, NodeNameError, SlurmCommandError, check_node_name, lead_record


def _job(job_id: str, het_job_id: str | None = None, offset: int = 0) -> JobInfo:
    return JobInfo(job_id, "r", "RUNNING", "", 0, "", het_job_id=het_job_id, het_offset=offset)


PLAIN = _job("7")
LEADER = _job("10", "10", 0)
HELPER = _job("11", "10", 1)


@pytest.mark.parametrize(
    ("jobs", "job_id", "lead"),
    [
        ([PLAIN], "7", PLAIN),
        ([HELPER, LEADER], "10", LEADER),  # component 0, whatever the order
        ([HELPER], "10", None),  # only the helper component listed
        ([HELPER, LEADER], "11", None),  # a component's own id is not the job's
        ([], "7", None),
    ],
)
def test_lead_record(jobs: list[JobInfo], job_id: str, lead: JobInfo | None) -> None:
    assert lead_record(jobs, job_id) == lead


@pytest.mark.parametrize("name", ["node1", "gpu-a01", "n_1.rack2", "A100x8"])
def test_single_node_names_pass(name: str) -> None:
    assert check_node_name(name, "drain") == name


@pytest.mark.parametrize(
    "value",
    [
        "node[1-2]",
        "node[1-4]",
        "node1,node2",
        "node1 node2",
        "",
        "node1\n",
        "-n",
        "node1;reboot",
        "NodeName=node1",
        ["node1"],
        ("node1",),
        None,
        3,
        b"node1",
    ],
)
def test_anything_but_one_node_name_is_refused(value: object) -> None:
    with pytest.raises(NodeNameError) as info:
        check_node_name(value, "drain")
    assert "one Slurm node name" in str(info.value) and "nothing was done" in str(info.value)
    assert isinstance(info.value, SlurmCommandError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("rc", "stderr", "away", "again"),
    [
        (1, "scontrol: error: Unable to contact slurm controller (connect failure)", True, True),
        (1, "slurm_load_jobs error: Socket timed out on send/recv operation", True, True),
        (1, "squeue: error: Failed while looking for jobs", True, True),
        (1, "slurm_update error: Zero Bytes were transmitted or received", True, True),
        (-1, "timed out after 30s", True, True),
        (1, "sbatch: error: Slurm temporarily unable to accept job, sleeping", False, True),
        (1, "slurm_update error: Unexpected message received for job 12", False, True),
        (1, "slurm_update error: Invalid user id", False, False),
        (1, "Requested operation is presently disabled for job 7", False, False),
        (1, "slurm_requeue error: Job is pending execution", False, False),
        (1, "", False, False),
    ],
)
def test_unreachable_and_retryable_are_read_from_one_table(
    rc: int, stderr: str, away: bool, again: bool
) -> None:
    exc = SlurmCommandError(["scontrol"], rc, stderr)
    assert (records.unreachable(exc), records.retryable(exc)) == (away, again)
