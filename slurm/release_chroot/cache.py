"""The cached chroots: one per release, built once by debootstrap and apt-get, checked on use.

A build goes to a temporary directory renamed into place only once it passed its checks, so a
half-built chroot is never used; a build lock serialises builders, runs hold it shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from slurm.errors import EnvironmentProblem
from slurm.release_chroot.matrix import (
    CACHE_DIR,
    MARKER,
    chroot_dir,
    find_sbin,
    full_version,
    packages_for,
    release_of,
    suite_for,
)
from slurm.release_chroot.namespace import (
    checked,
    chroot_command,
    default_venv,
    enter_argv,
    unshare,
)
from slurm.release_chroot.plan import debian_mirror

#: Imported by the venv's Python in a freshly built chroot: a missing library fails the build.
PYTHON_CHECK = "import ctypes, hashlib, sqlite3, ssl, bz2, lzma, zlib"
#: sid's Release file is past Valid-Until on the mirror reachable from CI; harmless elsewhere.
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false", "-o", "APT::Install-Recommends=false")


def _require_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem("must run as root (chroot, mount and debootstrap need it)")


def host_mirror() -> str:
    sources = {}
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in {".list", ".sources"} and path.is_file():
            sources[path.name] = path.read_text()
    return debian_mirror(sources)


def read_marker(chroot: Path) -> dict[str, str] | None:
    try:
        data = json.loads((chroot / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def chroot_problem(chroot: Path, version: str) -> str | None:
    """Why the cached chroot cannot be used for `version` (None = it can)."""
    marker = read_marker(chroot)
    if marker is None:
        return f"{chroot} has no valid {MARKER}"
    if marker.get("suite") != suite_for(version):
        return f"{chroot} was built for suite {marker.get('suite')!r}"
    try:
        release = release_of(str(marker.get("slurm", "")))
    except EnvironmentProblem:
        release = None
    if release != version:
        return f"{chroot} holds Slurm {marker.get('slurm')}, not {version}"
    if marker.get("packages") != packages_for(suite_for(version)):
        return f"{chroot} was built with packages {marker.get('packages')}"
    for binary in ("usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/sbin/munged", "usr/bin/sinfo"):
        if not (chroot / binary).exists():
            return f"{chroot} lacks /{binary}"
    return None


@contextlib.contextmanager
def lock(suite: str, exclusive: bool) -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{suite}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            out.append(target)
    return out


def _remove_tree(path: Path) -> None:
    """rm -rf that never follows a mount: refuses if anything is mounted there."""
    if not path.exists():
        return
    mounted = _mounts_under(path)
    if mounted:
        raise EnvironmentProblem(f"refusing to delete {path}: {mounted[0]} is mounted there")
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True, timeout=600)


def ensure(version: str, log: bool = True) -> Path:
    """The cached chroot for `version`, built (or rebuilt) when missing or failing its checks."""
    _require_root()
    suite = suite_for(version)
    target = chroot_dir(version)
    with lock(suite, exclusive=False):
        if chroot_problem(target, version) is None:
            return target
    with lock(suite, exclusive=True):
        problem = chroot_problem(target, version)
        if problem is None:  # another builder finished first
            return target
        if log:
            print(
                f"release_chroot: building {suite} for Slurm {version} ({problem})", file=sys.stderr
            )
        started = time.monotonic()
        build = CACHE_DIR / f".{suite}.build-{os.getpid()}"
        _remove_tree(build)
        try:
            _build(build, suite, version)
            if target.exists():
                old = CACHE_DIR / f".{suite}.old-{os.getpid()}"
                target.rename(old)
                _remove_tree(old)
            build.rename(target)
        except BaseException:
            with contextlib.suppress(Exception):
                _remove_tree(build)
            raise
        if log:
            marker = read_marker(target) or {}
            print(
                f"release_chroot: built {target} (Slurm {marker.get('slurm')}) in "
                f"{time.monotonic() - started:.0f}s",
                file=sys.stderr,
            )
    _check_python(version, target)
    return target


def _check_python(version: str, chroot: Path) -> None:
    """Fail the build, loudly, when the venv's Python cannot load its stdlib inside the chroot
    (a library the suite's minbase lacks); the marker goes so the next use rebuilds."""
    venv = default_venv().absolute()
    argv, env = chroot_command(version, chroot, [str(venv / "bin/python"), "-c", PYTHON_CHECK])
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        (chroot / MARKER).unlink(missing_ok=True)
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EnvironmentProblem(
            f"{venv}/bin/python fails inside the {suite_for(version)} chroot: {tail[0]} "
            "(add the library's package to SUITE_PACKAGES in slurm/release_chroot/matrix.py)"
        )


def _debootstrap() -> str:
    """debootstrap's path, installed from the host's apt when missing (CI starts without it)."""
    found = find_sbin("debootstrap")
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # A fresh machine may have no package lists yet.
    steps = [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "debootstrap"]]
    for argv in steps:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EnvironmentProblem(f"{' '.join(argv)} failed: {tail[0]}")
    found = find_sbin("debootstrap")
    if not found:
        raise EnvironmentProblem("apt-get installed debootstrap but it is not on PATH")
    return found


def _build(build: Path, suite: str, version: str) -> None:
    build.mkdir(parents=True)
    started = time.monotonic()
    checked(
        # In its own mount namespace too: the /proc debootstrap mounts dies with it.
        [*unshare(), _debootstrap(), "--variant=minbase", suite, str(build), host_mirror()],
        f"debootstrap {suite}",
        timeout=1800,
    )
    # Packages must not start their daemons on the host's pid/net namespace while installing.
    bootstrapped = time.monotonic()
    policy = build / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    apt = " ".join(["apt-get", *APT_OPTIONS])
    script = (
        f"set -e; export DEBIAN_FRONTEND=noninteractive; {apt} update -qq; "
        f"{apt} install -y -qq {' '.join(packages_for(suite))}; apt-get clean; "
        "/usr/sbin/slurmd -V"
    )
    r = subprocess.run(
        [*enter_argv(), "--root", str(build), "--build", "--", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]) or "no output"
        raise EnvironmentProblem(f"apt-get install in the {suite} chroot failed: {tail}")
    print(
        f"release_chroot: {suite}: debootstrap {bootstrapped - started:.0f}s, "
        f"apt-get install {time.monotonic() - bootstrapped:.0f}s",
        file=sys.stderr,
    )
    got = full_version(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
    if release_of(got) != version:
        raise EnvironmentProblem(
            f"Debian {suite} now ships Slurm {got}, not {version}: update MATRIX in "
            "slurm/release_chroot/matrix.py"
        )
    (build / MARKER).write_text(
        json.dumps(
            {
                "suite": suite,
                "slurm": got,
                "packages": packages_for(suite),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        + "\n"
    )
