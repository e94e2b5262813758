"""`slurm.records`: which squeue record speaks for a job, and the one-node-name check, by tables."""

from __future__ import annotations

import pytest

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
