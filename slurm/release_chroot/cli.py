"""The `python -m slurm.release_chroot` commands (others, matrix, ensure, run, host-version), and
`run`: a command against a release, on the host for the host's own.

Exit codes: the command's own; 124 when `--timeout` expired; 2 for bad usage; 3 when the chroot
cannot be built or entered (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm.errors import EnvironmentProblem, InputError
from slurm.release_chroot.cache import ensure, lock
from slurm.release_chroot.matrix import MATRIX, chroot_dir, host_version, suite_for
from slurm.release_chroot.namespace import EXIT_TIMEOUT, chroot_command, enter
from slurm.release_chroot.plan import SANE_PATH

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3


def run(
    version: str,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    force_chroot: bool = False,
    extra_binds: Sequence[Path] = (),
    venv: Path | None = None,
) -> int:
    """Run `argv` against Slurm `version`: on the host when it is the host's release, else in
    that release's chroot (built first when needed). Returns the exit code."""
    suite_for(version)
    if not argv:
        raise InputError("CMD", "", "a command to run after '--'")
    if not force_chroot and host_version() == version:
        try:
            return subprocess.run(list(argv), timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            return EXIT_TIMEOUT
    chroot = ensure(version)
    full, env = chroot_command(version, chroot, argv, timeout, extra_binds, venv)
    # Become the namespace's entry process: signals and the exit code pass straight through.
    os.execve(full[0], full, env)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slurm.release_chroot",
        description="Run commands against each Slurm release of the test matrix "
        f"({', '.join(f'{v}: Debian {s}' for v, s in MATRIX.items())}).",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("ensure", help="build (or validate) the chroot of a release; print its path")
    e.add_argument("--version", required=True, help=f"one of {', '.join(MATRIX)}")
    e.add_argument("--chroot", action="store_true", help="also for the host's own release")
    r = sub.add_parser("run", help="run CMD against a release (on the host for the host's own)")
    r.add_argument("--version", required=True, help=f"one of {', '.join(MATRIX)}")
    r.add_argument("--timeout", type=float, default=None, help="seconds; exit 124 when reached")
    r.add_argument("--chroot", action="store_true", help="use a chroot even for the host's release")
    r.add_argument("--bind", action="append", default=[], type=Path, help="extra path to bind")
    r.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    sub.add_parser("host-version", help="the host's Slurm release (empty when none)")
    sub.add_parser("others", help="the matrix releases other than the host's, one per line")
    sub.add_parser("matrix", help="each release, its Debian suite, and where it runs")
    n = sub.add_parser("_enter")  # internal: the part that runs inside the mount namespace
    n.add_argument("--root", required=True, type=Path)
    n.add_argument("--build", action="store_true")
    n.add_argument("--version", default="")
    n.add_argument("--cwd", type=Path, default=Path("/"))
    n.add_argument("--bind", action="append", default=[], type=Path)
    n.add_argument("--timeout", type=float, default=None)
    n.add_argument("argv", nargs=argparse.REMAINDER)
    return p


def _strip_dashes(argv: list[str]) -> list[str]:
    return argv[1:] if argv[:1] == ["--"] else argv


def main(args: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(args)
    try:
        if ns.cmd == "host-version":
            print(host_version() or "")
        elif ns.cmd == "others":
            host = host_version()
            print("\n".join(v for v in MATRIX if v != host))
        elif ns.cmd == "matrix":
            host = host_version()
            for v, s in MATRIX.items():
                print(f"{v} {s} {'host' if v == host else chroot_dir(v)}")
        elif ns.cmd == "ensure":
            suite_for(ns.version)
            if not ns.chroot and host_version() == ns.version:
                print("host")
            else:
                print(ensure(ns.version))
        elif ns.cmd == "run":
            return run(
                ns.version,
                _strip_dashes(ns.argv),
                timeout=ns.timeout,
                force_chroot=ns.chroot,
                extra_binds=ns.bind,
            )
        elif ns.cmd == "_enter":
            env = dict(os.environ)
            if ns.build:
                env = {"PATH": SANE_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
            else:
                with lock(suite_for(ns.version), exclusive=False):
                    return enter(
                        ns.root,
                        _strip_dashes(ns.argv),
                        build=False,
                        binds=ns.bind,
                        cwd=ns.cwd,
                        env=env,
                        timeout=ns.timeout,
                    )
            return enter(
                ns.root,
                _strip_dashes(ns.argv),
                build=True,
                binds=[],
                cwd=Path("/"),
                env=env,
                timeout=ns.timeout,
            )
    except InputError as exc:
        print(f"release_chroot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (EnvironmentProblem, OSError, subprocess.SubprocessError) as exc:
        print(f"release_chroot: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    return 0
