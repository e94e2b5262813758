"""A run's directory: every file name, mode and format in it, and one strict reader per file.

`run_dir` (on a shared filesystem) is the run's single source of truth outside Slurm:

- `control.sbatch`, `replica-NN.sbatch`, `spare.sbatch`: the scripts that were submitted;
- `spec.json`: the resolved spec (`spec_file`);
- `jobs.json`: which Slurm job id belongs to which replica (`jobs`);
- `secret`: the run's HMAC key for the leaders' reports, mode 0600 (`secret`);
- `control.json`: where the control plane listens, written by the control job (`control`);
- `spares.json`: the hot-spare pool (`spares`);
- `logs/`: every job's stdout/stderr; `archive/`: earlier runs' state (`archive`).

Names and modes are in `paths`; the error every reader raises is in `shape`. The package lives
under `slurm/` because `fthsdp submit` writes the directory, and the runtime (control plane,
replicas, slot agents) reads it from here too, so both sides agree on one format.
"""

from slurm.rundir.archive import (
    RUN_STATE,
    archive_state,
    check_resubmit,
    previous_state,
    restore_archive,
)
from slurm.rundir.checks import check_control_inputs, check_run_dir, check_run_files
from slurm.rundir.control import (
    ControlFile,
    check_control_data,
    read_control,
    read_control_file,
    write_control_file,
)
from slurm.rundir.jobs import (
    JOB_ID,
    TERMINAL_STATES,
    JobRecord,
    RunRecord,
    check_job_record,
    check_jobs_data,
    is_live,
    job_ids_from_data,
    job_rows,
    live_jobs,
    new_record,
    read_job_ids,
    read_run,
    write_run,
)
from slurm.rundir.paths import (
    ARCHIVE_DIR,
    CONTROL_FILE,
    JOBS_FILE,
    LOG_DIR,
    PRIVATE_FILE_MODE,
    RUN_DIR_MODE,
    SECRET_FILE,
    SPARE_SCRIPT,
    SPARES_FILE,
    SPEC_FILE,
    WARM_DIR,
    write_private,
)
from slurm.rundir.secret import create_secret, read_secret
from slurm.rundir.shape import RunFileError, parse_json_file, read_json, read_trusted
from slurm.rundir.spares import (
    REPLICA_SCRIPT,
    SLOT_JOB_ID,
    Fallback,
    Move,
    Pool,
    PoolFileError,
    Slot,
    read_pool,
    write_pool,
)
from slurm.rundir.spec_file import check_spec_data, read_spec_data

__all__ = [
    "ARCHIVE_DIR",
    "CONTROL_FILE",
    "JOBS_FILE",
    "JOB_ID",
    "LOG_DIR",
    "PRIVATE_FILE_MODE",
    "REPLICA_SCRIPT",
    "RUN_DIR_MODE",
    "RUN_STATE",
    "SECRET_FILE",
    "SLOT_JOB_ID",
    "SPARES_FILE",
    "SPARE_SCRIPT",
    "SPEC_FILE",
    "TERMINAL_STATES",
    "WARM_DIR",
    "ControlFile",
    "Fallback",
    "JobRecord",
    "Move",
    "Pool",
    "PoolFileError",
    "RunFileError",
    "RunRecord",
    "Slot",
    "archive_state",
    "check_control_data",
    "check_control_inputs",
    "check_job_record",
    "check_jobs_data",
    "check_resubmit",
    "check_run_dir",
    "check_run_files",
    "check_spec_data",
    "create_secret",
    "is_live",
    "job_ids_from_data",
    "job_rows",
    "live_jobs",
    "new_record",
    "parse_json_file",
    "previous_state",
    "read_control",
    "read_control_file",
    "read_job_ids",
    "read_json",
    "read_pool",
    "read_run",
    "read_secret",
    "read_spec_data",
    "read_trusted",
    "restore_archive",
    "write_control_file",
    "write_pool",
    "write_private",
    "write_run",
]
