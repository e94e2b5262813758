"""What each release's commands answer while slurmctld is stopped, and that fthsdp reads it as
"Slurm could not be asked" (`slurm.records.unreachable`): no verdict, retried, never acted on.

The captures under `tests/fixtures/slurm_outage/<release>/` are real (see PROVENANCE.md there):
22.05's `squeue --json` and `sinfo --json` exit 0 with an `errors` list and no records, where
24.11 and 26.05 exit 1 with "Unable to contact slurm controller".
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from slurm_captures import version_of

from slurm.records import JobInfo, SlurmAwayOutput, SlurmCommandError, SlurmOutputError, unreachable
from slurm.slurm_json import parse_sinfo_nodes, parse_squeue_jobs

OUTAGE = Path(__file__).parent / "fixtures" / "slurm_outage"


def answer(release: str, name: str) -> tuple[list[str], int, str, str]:
    """(argv, exit code, stdout, stderr) of one capture."""
    text = (OUTAGE / release / f"{name}.txt").read_text()
    head, _, rest = text.partition("\n--- stdout\n")
    stdout, _, stderr = rest.partition("--- stderr\n")
    argv_line, exit_line = head.splitlines()
    argv = ast.literal_eval(argv_line.removeprefix("argv: "))
    return argv, int(exit_line.removeprefix("exit: ")), stdout, stderr


@pytest.mark.parametrize(
    ("name", "parse"),
    [("squeue_json_ctld_down", parse_squeue_jobs), ("sinfo_json_ctld_down", parse_sinfo_nodes)],
)
def test_22_05_answers_0_with_errors_and_that_is_no_verdict(name: str, parse: object) -> None:
    argv, code, stdout, _ = answer("22.05", name)
    assert code == 0
    with pytest.raises(SlurmAwayOutput) as err:
        parse(stdout, version_of("22.05"), argv)  # type: ignore[operator]
    assert unreachable(err.value)
    assert "22.05" in str(err.value) and argv[0] in str(err.value)


@pytest.mark.parametrize("release", ["24.11", "26.05"])
@pytest.mark.parametrize(
    "name", ["squeue_json_ctld_down", "sinfo_json_ctld_down", "scontrol_show_job_ctld_down"]
)
def test_later_releases_exit_1_and_say_so(release: str, name: str) -> None:
    argv, code, stdout, stderr = answer(release, name)
    assert code == 1 and stdout == ""
    assert unreachable(SlurmCommandError(argv, code, stderr)), stderr


def test_an_error_slurm_means_is_still_its_verdict() -> None:
    """Not the outage's errno -1: an error that is Slurm's answer stays an unexpected output."""
    _, _, stdout, _ = answer("22.05", "squeue_json_ctld_down")
    data = json.loads(stdout)
    data["errors"] = [{"error": "Invalid job id specified", "error_number": 2017}]
    with pytest.raises(SlurmOutputError) as err:
        parse_squeue_jobs(json.dumps(data), version_of("22.05"), ["squeue", "--json"])
    assert not isinstance(err.value, SlurmAwayOutput) and not unreachable(err.value)
    data["errors"] = [{"error": "Unspecified error", "errno": -1}]
    data["jobs"] = [{"job_id": 1}]  # records as well: not the empty answer of an outage
    with pytest.raises(SlurmOutputError) as err:
        parse_squeue_jobs(json.dumps(data), version_of("22.05"), ["squeue", "--json"])
    assert not isinstance(err.value, SlurmAwayOutput)


def test_the_coordinators_job_poll_waits_out_an_outage_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """22.05's answer during an outage costs the coordinator's poll one warning, no traceback,
    and changes nothing it knows of the jobs."""
    import asyncio
    import logging

    from control_harness import RecordingBackend

    from runtime.control.coordinator import Coordinator
    from runtime.control.policy import PolicyConfig
    from runtime.control.settings import CoordinatorConfig

    argv, _, stdout, _ = answer("22.05", "squeue_json_ctld_down")

    class Away(RecordingBackend):
        def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
            return parse_squeue_jobs(stdout, version_of("22.05"), argv)

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    config = CoordinatorConfig(
        run_dir=run, policy=PolicyConfig(replicas=1), poll_jobs=False, job_ids={0: "7"}
    )
    coord = Coordinator(config, Away())  # type: ignore[arg-type]
    try:
        before = dict(coord.job_states)
        with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
            asyncio.run(coord._poll())
        assert coord.job_states == before
    finally:
        coord.journal.close()
    lines = [r for r in caplog.records if r.name == "fthsdp.coordinator"]
    assert len(lines) == 1 and "Slurm not answering" in lines[0].getMessage(), lines
    assert lines[0].exc_info is None
