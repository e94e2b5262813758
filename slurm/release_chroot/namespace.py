"""Entering a chroot: the mounts of a run, made inside a private mount namespace and undone after
it, the chrooted command itself, and the host command line that gets there (`chroot_command`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm.errors import EnvironmentProblem
from slurm.release_chroot.matrix import CACHE_DIR
from slurm.release_chroot.plan import Mount, chroot_env, mount_plan, run_cwd, venv_base_prefix

#: Host files copied into each run's overlay so names resolve as on the host.
HOST_FILES = ("etc/hosts", "etc/resolv.conf", "etc/hostname")
REPO = Path(__file__).resolve().parent.parent.parent
EXIT_TIMEOUT = 124
#: Caches beside the chroots that runs may use, bound at the same path when present: the tests'
#: site install and the self-contained interpreter it is made from (tests/site_install.py).
SHARED_CACHES = ("python", "site")
SHARED_CACHE_ROOT = Path(os.environ.get("FTHSDP_SITE_CACHE", "/var/cache/fthsdp"))


def unshare() -> list[str]:
    """Prefix that runs a command in a new private mount namespace (pid and net stay shared)."""
    return [shutil.which("unshare") or "/usr/bin/unshare", "--mount", "--propagation", "private"]


def enter_argv() -> list[str]:
    return [*unshare(), "--", sys.executable, "-m", "slurm.release_chroot", "_enter"]


def _do_mount(m: Mount) -> None:
    m.target.mkdir(parents=True, exist_ok=True)
    if m.kind == "bind":
        argv = ["mount", "--rbind" if m.recursive else "--bind", str(m.source), str(m.target)]
    elif m.kind == "proc":
        argv = ["mount", "-t", "proc", "proc", str(m.target)]
    else:
        argv = ["mount", "-t", m.kind, "-o", m.options, f"fthsdp-{m.kind}", str(m.target)]
    checked(argv, f"mount {m.target}", timeout=60)
    if m.recursive:
        # Host mounts appear inside; nothing done inside (unmounts included) reaches the host.
        checked(["mount", "--make-rslave", str(m.target)], f"make-rslave {m.target}", timeout=60)


def _undo(mounted: list[Path]) -> None:
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=60, check=False)


def _prepare_root(root: Path) -> None:
    """Per-run files in the overlay: the host's name resolution, /run/munge for munge's user."""
    for rel in HOST_FILES:
        src = Path("/") / rel
        if src.is_file():
            dst = root / rel
            with contextlib.suppress(OSError):
                dst.unlink()
            shutil.copyfile(src, dst)
    uid = gid = 0
    with contextlib.suppress(OSError):
        for line in (root / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == "munge":
                uid, gid = int(fields[2]), int(fields[3])
    for sub in ("munge", "lock"):
        (root / "run" / sub).mkdir(mode=0o755, exist_ok=True)
    os.chown(root / "run" / "munge", uid, gid)


def enter(
    chroot: Path,
    argv: Sequence[str],
    *,
    build: bool,
    binds: Sequence[Path],
    cwd: Path,
    env: Mapping[str, str],
    timeout: float | None,
) -> int:
    """Mount, run `argv` chrooted, unmount (also on failure or timeout); the command's exit code.

    Must run in a private mount namespace (see `enter_argv`).
    """
    scratch = CACHE_DIR / ".mnt"  # each namespace mounts its own tmpfs here
    root, mounts = mount_plan(chroot, scratch, binds, overlay=not build)
    mounted: list[Path] = []
    proc: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        for m in mounts:
            if m.kind == "overlay":
                for sub in ("upper", "work"):
                    (scratch / sub).mkdir(exist_ok=True)
            _do_mount(m)
            mounted.append(m.target)
        if not build:
            _prepare_root(root)

        def into_root() -> None:
            os.chroot(root)
            os.chdir(cwd)

        proc = subprocess.Popen(
            list(argv), env=dict(env), preexec_fn=into_root, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"release_chroot: timed out after {timeout:.0f}s: {argv[0]}", file=sys.stderr)
            _kill_group(proc)
            return EXIT_TIMEOUT
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        _undo(mounted)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


def chroot_command(
    version: str,
    chroot: Path,
    argv: Sequence[str],
    timeout: float | None = None,
    extra_binds: Sequence[Path] = (),
    venv: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The host command line (and its environment) that runs `argv` inside `chroot`."""
    venv = (venv or default_venv()).absolute()
    caches = [SHARED_CACHE_ROOT / name for name in SHARED_CACHES]
    binds = [REPO, venv, venv_base_prefix(venv), Path("/tmp"), *extra_binds]
    binds += [c for c in caches if c.is_dir()]
    binds = [Path(os.path.realpath(b)) for b in binds]
    cwd = run_cwd(Path(os.path.realpath(os.getcwd())), binds, REPO)
    command = [*enter_argv(), "--root", str(chroot), "--version", version, "--cwd", str(cwd)]
    for b in binds:
        command += ["--bind", str(b)]
    if timeout is not None:
        command += ["--timeout", str(timeout)]
    env = chroot_env(os.environ, venv, version)
    env["PYTHONPATH"] = ":".join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return [*command, "--", *argv], env


def default_venv() -> Path:
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    return REPO / ".venv"


def checked(argv: list[str], what: str, timeout: float) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]) or "no output"
        raise EnvironmentProblem(f"{what} failed (exit {r.returncode}): {tail}")
