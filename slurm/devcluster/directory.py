"""The cluster folder's safety: a folder root's daemons run files from must be root's alone.

Slurmd runs the cluster's Prolog and HealthCheckProgram as root, so the folder (and every folder
above it) must be one nobody else can write, rename or replace: owned by root, not writable by
group or others (a folder above may be, with the sticky bit, like /tmp).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from slurm.errors import InputError


def directory_problem(uid: int, mode: int, holds_cluster: bool) -> str | None:
    """Why a folder with this owner and mode cannot hold (or sit above) a root-run cluster.

    None means it can. A folder above the cluster's may be writable by others only with the
    sticky bit (like /tmp): then nobody but root can rename or replace what root made in it.
    """
    if uid != 0:
        return f"is owned by uid {uid}, not root"
    if mode & 0o022 and (holds_cluster or not mode & stat.S_ISVTX):
        return f"is writable by group or others (mode {stat.S_IMODE(mode):04o})"
    return None


def check_directory(directory: Path) -> None:
    """Refuse a cluster folder that someone other than root controls, or could swap."""
    directory = directory.absolute()
    for path in [directory, *directory.parents]:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        problem = directory_problem(st.st_uid, st.st_mode, holds_cluster=path == directory)
        if problem:
            raise InputError(
                "--dir",
                str(directory),
                f"{path} {problem}; the dev cluster runs its files as root, so use a folder "
                "owned by root and writable by root alone (0755)",
            )


def make_directory(directory: Path) -> None:
    """Create the cluster folder (0755: root writes it, every user reads the config, as on a
    site) if missing, then check it and its parents."""
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
            os.chmod(directory, 0o755)
    check_directory(directory)
