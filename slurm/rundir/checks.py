"""What a command that reads a run directory checks first: the directory, and every file it
will act on.

A corrupt file stops a command (or the control plane) here with one line, instead of in a crash
or requeue loop later. So does a run directory someone else controls (`check_run_dir`): whoever
can write it, or a folder above it, can replace the scripts Slurm runs and the control.json the
supervisors obey, so it is refused as the dev cluster refuses its folder (`slurm.devcluster.
directory`): the run directory must be the user's and writable by nobody else, and each folder
above it root's or the user's, writable by nobody else unless it has the sticky bit (like /tmp).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurm.errors import InputError
from slurm.rundir.control import read_control
from slurm.rundir.jobs import RunRecord, read_job_ids, read_run
from slurm.rundir.spec_file import read_spec_data


def folder_problem(st: os.stat_result, is_run_dir: bool) -> str | None:
    """Why a folder with this status cannot hold a run (`is_run_dir`) or sit above one; None
    when it can (module docstring)."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if is_run_dir and st.st_uid != me:
        return f"is owned by uid {st.st_uid}, not by this user (uid {me})"
    if not is_run_dir and st.st_uid not in (0, me):
        return f"is owned by uid {st.st_uid}, neither root nor this user (uid {me})"
    if mode & 0o022 and (is_run_dir or not mode & stat.S_ISVTX):
        return f"is writable by group or others (mode {mode:04o})"
    return None


def check_run_dir(run_dir: Path, field: str = "RUN_DIR") -> None:
    """Refuse (`InputError` naming `field`) a run directory that is not the user's alone, or
    that sits below a folder someone else could change; a run directory not made yet is
    judged by the folders above it. Symbolic links are followed: the folders of both the
    path as given and the path it resolves to are judged, never a link itself."""
    given = Path(run_dir).absolute()
    resolved = Path(run_dir).resolve()
    seen: set[Path] = set()
    for path in [given, *given.parents, resolved, *resolved.parents]:
        if path in seen:
            continue
        seen.add(path)
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise InputError(
                field, str(run_dir), f"{path} cannot be read ({exc.strerror})"
            ) from None
        if stat.S_ISLNK(st.st_mode):
            continue
        is_run_dir = path in (given, resolved)
        if is_run_dir and not stat.S_ISDIR(st.st_mode):
            raise InputError(field, str(run_dir), "a directory")
        problem = folder_problem(st, is_run_dir)
        if problem:
            fix = "chmod go-w it" if "writable" in problem else "use a folder of your own"
            raise InputError(
                field,
                str(run_dir),
                f"{path} {problem}; someone else could replace the run's files ({fix})",
            )


def check_control_inputs(run_dir: Path) -> None:
    """What the control plane reads at start (the run directory, then spec.json and jobs.json,
    either may be absent), checked, so a corrupt file stops it with one line instead of a crash
    loop."""
    check_run_dir(run_dir)
    read_spec_data(run_dir)
    read_job_ids(run_dir)


def check_run_files(run_dir: Path, control: bool = True, spec: bool = True) -> RunRecord:
    """The run directory, jobs.json (required), and control.json and spec.json when present, all
    checked: what a command that reads a run directory calls first. Returns the run's record."""
    check_run_dir(run_dir)
    record = read_run(run_dir)
    if control:
        read_control(run_dir)
    if spec:
        read_spec_data(run_dir)
    return record
