"""`slurm.records.lead_record`: which squeue record speaks for a job, by a table."""

from __future__ import annotations

import pytest

from slurm.records import JobInfo, lead_record


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
