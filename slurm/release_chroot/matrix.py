"""The release matrix: which Debian suite ships each Slurm release, what its chroot holds, where
it is cached, and which release the host runs itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from slurm.errors import EnvironmentProblem, InputError

#: Slurm release -> the Debian suite whose archive ships it (Slurm facts 10-11,
#: docs/design-facts.md).
MATRIX: dict[str, str] = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
CACHE_DIR = Path(os.environ.get("FTHSDP_CHROOT_CACHE", "/var/cache/fthsdp/chroots"))
MARKER = "etc/fthsdp-chroot.json"
#: procps: slurmd's tools; the libraries: what the venv's interpreter links its stdlib's ctypes,
#: sqlite3 and ssl against (a minbase system lacks some). The list is part of the marker, so a
#: change rebuilds the cached chroots.
PACKAGES = ("slurm-wlm", "munge", "procps", "libffi8", "libsqlite3-0")
SUITE_PACKAGES = {"bookworm": ("libssl3",), "trixie": ("libssl3t64",), "sid": ("libssl3t64",)}


def release_of(version_text: str) -> str:
    """'slurm-wlm 24.11.5' / 'slurm 22.05.8' -> '24.11' (the matrix key)."""
    m = re.search(r"\b(\d{2})\.(\d{2})\.\d+", version_text)
    if not m:
        raise EnvironmentProblem(f"cannot read a Slurm version from {version_text.strip()!r}")
    return f"{m.group(1)}.{m.group(2)}"


def full_version(version_text: str) -> str:
    """'slurm-wlm 24.11.5' -> '24.11.5'."""
    m = re.search(r"\b\d{2}\.\d{2}\.\d+\S*", version_text)
    if not m:
        raise EnvironmentProblem(f"cannot read a Slurm version from {version_text.strip()!r}")
    return m.group(0)


def suite_for(version: str) -> str:
    if version not in MATRIX:
        raise InputError("--version", version, f"one of {', '.join(MATRIX)}")
    return MATRIX[version]


def packages_for(suite: str) -> list[str]:
    return [*PACKAGES, *SUITE_PACKAGES.get(suite, ())]


def chroot_dir(version: str) -> Path:
    return CACHE_DIR / suite_for(version)


def host_version() -> str | None:
    """The host's own Slurm release ('22.05'), or None when it has no slurmd."""
    slurmd = find_sbin("slurmd")
    if slurmd is None:
        return None
    r = subprocess.run([slurmd, "-V"], capture_output=True, text=True, timeout=30, check=False)
    return release_of(r.stdout + r.stderr)


def find_sbin(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if Path(p).exists()), None
    )
