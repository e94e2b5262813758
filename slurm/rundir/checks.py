"""What a command that reads a run directory checks first: every file it will act on.

A corrupt file stops a command (or the control plane) here with one line, instead of in a crash
or requeue loop later.
"""

from __future__ import annotations

from pathlib import Path

from slurm.rundir.control import read_control
from slurm.rundir.jobs import RunRecord, read_job_ids, read_run
from slurm.rundir.spec_file import read_spec_data


def check_control_inputs(run_dir: Path) -> None:
    """What the control plane reads at start (spec.json, jobs.json, either may be absent),
    checked, so a corrupt file stops it with one line instead of a crash loop."""
    read_spec_data(run_dir)
    read_job_ids(run_dir)


def check_run_files(run_dir: Path, control: bool = True, spec: bool = True) -> RunRecord:
    """jobs.json (required), and control.json and spec.json when present, all checked: what
    a command that reads a run directory calls first. Returns the run's record."""
    record = read_run(run_dir)
    if control:
        read_control(run_dir)
    if spec:
        read_spec_data(run_dir)
    return record
