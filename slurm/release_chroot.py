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
Nothing here imports torch: this module is run as `python -m slurm.release_chroot`.

Exit codes: the command's own; 124 when `--timeout` expired; 2 for bad usage; 3 when the chroot
cannot be built or entered (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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
#: Imported by the venv's Python in a freshly built chroot: a missing library fails the build.
PYTHON_CHECK = "import ctypes, hashlib, sqlite3, ssl, bz2, lzma, zlib"
#: sid's Release file is past Valid-Until on the mirror reachable from CI; harmless elsewhere.
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false", "-o", "APT::Install-Recommends=false")
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Host files copied into each run's overlay so names resolve as on the host.
HOST_FILES = ("etc/hosts", "etc/resolv.conf", "etc/hostname")
REPO = Path(__file__).resolve().parent.parent
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_TIMEOUT = 124


# ---------------------------------------------------------------------------------------------
# Pure parts: versions, mirrors, the mount plan, the environment


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


def debian_mirror(sources: Mapping[str, str]) -> str:
    """The Debian archive URI the host's apt uses (not the security archive).

    `sources` maps a file name to its text: deb822 `.sources` files (`URIs:`) and one-line
    `.list` files (`deb URI SUITE ...`) are both read.
    """
    candidates: list[str] = []
    for name, text in sorted(sources.items()):
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (k.strip().lower(), v.strip())
                    for k, _, v in (
                        line.partition(":")
                        for line in stanza.splitlines()
                        if line.strip() and not line.lstrip().startswith("#")
                    )
                )
                enabled = fields.get("enabled", "yes").lower() != "no"
                if enabled and "deb" in fields.get("types", "").split():
                    candidates += fields.get("uris", "").split()
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if parts[:1] == ["deb"]:
                    uri = next((p for p in parts[1:] if not p.startswith("[")), "")
                    candidates.append(uri)
    for uri in candidates:
        if uri.startswith(("http://", "https://", "file:/")) and "security" not in uri:
            return uri.rstrip("/")
    raise EnvironmentProblem(
        "no Debian archive URI in /etc/apt/sources.list{,.d/*} (needed to build a chroot)"
    )


def venv_base_prefix(venv: Path) -> Path:
    """The installation the venv's interpreter comes from (pyvenv.cfg `home`, resolved).

    It is bind-mounted into the chroot at the same path; an interpreter from the host's own /usr
    cannot be (it would shadow the chroot's system), which is refused with a reason.
    """
    cfg = venv / "pyvenv.cfg"
    try:
        text = cfg.read_text()
    except OSError as exc:
        raise EnvironmentProblem(f"{cfg}: cannot read ({exc.strerror}); is {venv} a venv?") from exc
    home = next(
        (
            v.strip()
            for k, _, v in (ln.partition("=") for ln in text.splitlines())
            if k.strip() == "home"
        ),
        None,
    )
    if not home:
        raise EnvironmentProblem(f"{cfg}: no 'home =' line")
    prefix = Path(home).resolve().parent
    if prefix in {Path("/"), Path("/usr"), Path("/usr/local"), Path("/bin")}:
        raise EnvironmentProblem(
            f"the venv {venv} is built on the system interpreter ({home}), which cannot be "
            "bind-mounted into a chroot; build it on a self-contained Python (pyenv, uv) instead"
        )
    return prefix


@dataclass(frozen=True)
class Mount:
    """One mount of a run, in the order made; `recursive` binds are then made slaves of the host."""

    kind: str  # "tmpfs" | "overlay" | "proc" | "bind"
    target: Path
    source: Path | None = None
    options: str = ""
    recursive: bool = False


def mount_plan(
    chroot: Path, scratch: Path, binds: Sequence[Path], overlay: bool = True
) -> tuple[Path, list[Mount]]:
    """The root the command will see and the mounts that build it, in order.

    `scratch` is an empty directory (private to the run's mount namespace) holding the overlay's
    writable layer. Without `overlay` (a build) the chroot itself is the root and nothing of the
    host but /proc, /dev and /sys is mounted into it.
    """
    mounts: list[Mount] = []
    if overlay:
        root = scratch / "root"
        mounts += [
            Mount("tmpfs", scratch, options="mode=0755"),
            Mount(
                "overlay",
                root,
                options=f"lowerdir={chroot},upperdir={scratch}/upper,workdir={scratch}/work",
            ),
        ]
    else:
        root = chroot
    mounts += [
        Mount("proc", root / "proc"),
        Mount("bind", root / "dev", Path("/dev"), recursive=True),
        Mount("bind", root / "sys", Path("/sys"), recursive=True),
    ]
    if overlay:
        mounts.append(Mount("tmpfs", root / "run", options="mode=0755"))
        seen: set[Path] = set()
        for path in binds:
            if path in seen or any(p in path.parents for p in seen):
                continue
            seen.add(path)
            mounts.append(Mount("bind", root / path.relative_to("/"), path, recursive=True))
    return root, mounts


def chroot_env(environ: Mapping[str, str], venv: Path) -> dict[str, str]:
    """The command's environment: the caller's, with a PATH that exists inside the chroot and
    without pointers at the host's own Slurm cluster."""
    env = {k: v for k, v in environ.items() if k not in {"SLURM_CONF", "PYTHONHOME"}}
    env["PATH"] = f"{venv / 'bin'}:{SANE_PATH}"
    return env


def run_cwd(cwd: Path, binds: Sequence[Path], default: Path) -> Path:
    """The caller's directory when the chroot sees it (it is under a bind), else `default`."""
    if any(cwd == b or b in cwd.parents for b in binds):
        return cwd
    return default


# ---------------------------------------------------------------------------------------------
# Host facts


def host_version() -> str | None:
    """The host's own Slurm release ('22.05'), or None when it has no slurmd."""
    slurmd = _find_sbin("slurmd")
    if slurmd is None:
        return None
    r = subprocess.run([slurmd, "-V"], capture_output=True, text=True, timeout=30, check=False)
    return release_of(r.stdout + r.stderr)


def host_mirror() -> str:
    sources = {}
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in {".list", ".sources"} and path.is_file():
            sources[path.name] = path.read_text()
    return debian_mirror(sources)


def default_venv() -> Path:
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    return REPO / ".venv"


def _require_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem("must run as root (chroot, mount and debootstrap need it)")


# ---------------------------------------------------------------------------------------------
# The cache


def packages_for(suite: str) -> list[str]:
    return [*PACKAGES, *SUITE_PACKAGES.get(suite, ())]


def chroot_dir(version: str) -> Path:
    return CACHE_DIR / suite_for(version)


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
def _lock(suite: str, exclusive: bool) -> Iterator[None]:
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
    with _lock(suite, exclusive=False):
        if chroot_problem(target, version) is None:
            return target
    with _lock(suite, exclusive=True):
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
    argv, env = _chroot_command(version, chroot, [str(venv / "bin/python"), "-c", PYTHON_CHECK])
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        (chroot / MARKER).unlink(missing_ok=True)
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EnvironmentProblem(
            f"{venv}/bin/python fails inside the {suite_for(version)} chroot: {tail[0]} "
            f"(add the library's package to SUITE_PACKAGES in {__name__})"
        )


def _find_sbin(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if Path(p).exists()), None
    )


def _debootstrap() -> str:
    """debootstrap's path, installed from the host's apt when missing (CI starts without it)."""
    found = _find_sbin("debootstrap")
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
    found = _find_sbin("debootstrap")
    if not found:
        raise EnvironmentProblem("apt-get installed debootstrap but it is not on PATH")
    return found


def _checked(argv: list[str], what: str, timeout: float) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]) or "no output"
        raise EnvironmentProblem(f"{what} failed (exit {r.returncode}): {tail}")


def _build(build: Path, suite: str, version: str) -> None:
    build.mkdir(parents=True)
    started = time.monotonic()
    _checked(
        # In its own mount namespace too: the /proc debootstrap mounts dies with it.
        [*_unshare(), _debootstrap(), "--variant=minbase", suite, str(build), host_mirror()],
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
        [*_enter_argv(), "--root", str(build), "--build", "--", "/bin/sh", "-c", script],
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
            f"Debian {suite} now ships Slurm {got}, not {version}: update MATRIX in {__name__}"
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


# ---------------------------------------------------------------------------------------------
# Entering: runs inside a private mount namespace


def _unshare() -> list[str]:
    """Prefix that runs a command in a new private mount namespace (pid and net stay shared)."""
    return [shutil.which("unshare") or "/usr/bin/unshare", "--mount", "--propagation", "private"]


def _enter_argv() -> list[str]:
    return [*_unshare(), "--", sys.executable, "-m", "slurm.release_chroot", "_enter"]


def _do_mount(m: Mount) -> None:
    m.target.mkdir(parents=True, exist_ok=True)
    if m.kind == "bind":
        argv = ["mount", "--rbind" if m.recursive else "--bind", str(m.source), str(m.target)]
    elif m.kind == "proc":
        argv = ["mount", "-t", "proc", "proc", str(m.target)]
    else:
        argv = ["mount", "-t", m.kind, "-o", m.options, f"fthsdp-{m.kind}", str(m.target)]
    _checked(argv, f"mount {m.target}", timeout=60)
    if m.recursive:
        # Host mounts appear inside; nothing done inside (unmounts included) reaches the host.
        _checked(["mount", "--make-rslave", str(m.target)], f"make-rslave {m.target}", timeout=60)


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

    Must run in a private mount namespace (see `_enter_argv`).
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
    full, env = _chroot_command(version, chroot, argv, timeout, extra_binds, venv)
    # Become the namespace's entry process: signals and the exit code pass straight through.
    os.execve(full[0], full, env)


def _chroot_command(
    version: str,
    chroot: Path,
    argv: Sequence[str],
    timeout: float | None = None,
    extra_binds: Sequence[Path] = (),
    venv: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The host command line (and its environment) that runs `argv` inside `chroot`."""
    venv = (venv or default_venv()).absolute()
    binds = [REPO, venv, venv_base_prefix(venv), Path("/tmp"), *extra_binds]
    binds = [Path(os.path.realpath(b)) for b in binds]
    cwd = run_cwd(Path(os.path.realpath(os.getcwd())), binds, REPO)
    enter_argv = [*_enter_argv(), "--root", str(chroot), "--version", version, "--cwd", str(cwd)]
    for b in binds:
        enter_argv += ["--bind", str(b)]
    if timeout is not None:
        enter_argv += ["--timeout", str(timeout)]
    env = chroot_env(os.environ, venv)
    env["PYTHONPATH"] = ":".join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return [*enter_argv, "--", *argv], env


# ---------------------------------------------------------------------------------------------
# CLI


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
                with _lock(suite_for(ns.version), exclusive=False):
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


if __name__ == "__main__":
    sys.exit(main())
