"""Run a command against another Slurm release: a cached Debian chroot per release of the matrix.

fthsdp must work on every Slurm a site runs, but a machine has one Slurm from its own apt. Debian's
archive carries one release per suite (22.05 in bookworm, 24.11 in trixie, 26.05 in sid), so each
release of the matrix is a `debootstrap --variant=minbase` chroot of the suite that ships it, with
`slurm-wlm` and `munge` installed, built once and cached under `CACHE_DIR/<suite>`. The project's
own venv runs unchanged inside: the checkout, the venv's base interpreter and /tmp are
bind-mounted at the same paths, and the chroot shares the host's pid and network namespaces (so
the dev cluster's pid-based ports keep parallel runs apart).

Isolation, and why it is done this way:
- Every build and every run happens in its own private mount namespace (`unshare --mount
  --propagation private`). Its mounts are invisible to the host and to concurrent runs, so two runs
  of the same chroot can never unmount each other's binds, and a killed run leaves no mount
  behind: the namespace dies with its last process. Mounts are still undone in reverse order
  (lazily) when the command ends, fails or times out.
- A run sees the cached chroot through an overlay whose writable layer is a per-run tmpfs, so the
  cache stays exactly as built (its marker check stays meaningful) and runs do not see each
  other's writes.
- A build goes to a temporary directory renamed into place only once it passed its checks, so a
  half-built chroot is never used; a build lock serialises builders, runs hold it shared.

The release of the host itself runs on the host (no chroot) unless `--chroot` asks otherwise.
Nothing here imports torch: this package is run as `python -m slurm.release_chroot`.

- `matrix`: the releases, the suites that ship them, what each chroot holds and where it lives;
- `plan`: the pure parts of a run (the mount plan, its environment, the venv it binds);
- `namespace`: entering a chroot inside a private mount namespace, and the command that does it;
- `cache`: building and checking the cached chroots;
- `cli`: the `python -m slurm.release_chroot` commands and `run`.

Exit codes: the command's own; 124 when `--timeout` expired; 2 for bad usage; 3 when the chroot
cannot be built or entered (one line on stderr saying why).
"""

from __future__ import annotations

from slurm.release_chroot.cache import chroot_problem, ensure, read_marker
from slurm.release_chroot.cli import main, run
from slurm.release_chroot.matrix import (
    CACHE_DIR,
    MARKER,
    MATRIX,
    chroot_dir,
    full_version,
    host_version,
    packages_for,
    release_of,
    suite_for,
)
from slurm.release_chroot.namespace import EXIT_TIMEOUT, enter
from slurm.release_chroot.plan import (
    CHROOT_RELEASE_ENV,
    SANE_PATH,
    Mount,
    chroot_env,
    debian_mirror,
    mount_plan,
    run_cwd,
    venv_base_prefix,
)

__all__ = [
    "CACHE_DIR",
    "CHROOT_RELEASE_ENV",
    "EXIT_TIMEOUT",
    "MARKER",
    "MATRIX",
    "SANE_PATH",
    "Mount",
    "chroot_dir",
    "chroot_env",
    "chroot_problem",
    "debian_mirror",
    "ensure",
    "enter",
    "full_version",
    "host_version",
    "main",
    "mount_plan",
    "packages_for",
    "read_marker",
    "release_of",
    "run",
    "run_cwd",
    "suite_for",
    "venv_base_prefix",
]
