"""The Slurm-release chroot harness: its pure parts by tables, then real runs in a real chroot.

The real runs use a release other than the host's (its chroot is built on first use and cached,
so `make test` builds it before the suite). They are not marked `slurm`: the matrix runs the
`slurm`-marked tests inside the chroots, and the harness is driven from the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm import release_chroot as rc
from slurm.errors import EnvironmentProblem, InputError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "release", "full"),
    [
        ("slurm-wlm 22.05.8\n", "22.05", "22.05.8"),
        ("slurm 24.11.5", "24.11", "24.11.5"),
        ("slurm-wlm 26.05.5-1\n", "26.05", "26.05.5-1"),
    ],
)
def test_release_of_reads_major_minor(text: str, release: str, full: str) -> None:
    assert rc.release_of(text) == release
    assert rc.full_version(text) == full


@pytest.mark.parametrize("text", ["", "slurmd: command not found", "slurm 24.11"])
def test_release_of_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(EnvironmentProblem, match="cannot read a Slurm version"):
        rc.release_of(text)


DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


@pytest.mark.parametrize(
    ("sources", "uri"),
    [
        ({"debian.sources": DEB822}, "http://deb.debian.org/debian"),
        (
            {
                "a.sources": "Types: deb\nEnabled: no\nURIs: http://off.example/debian\n",
                "b.sources": "Types: deb\nURIs: http://mirror.example/debian\n",
            },
            "http://mirror.example/debian",
        ),
        (
            {
                "sources.list": "# c\ndeb-src http://a/debian bookworm main\n"
                "deb [arch=amd64] http://m.example/debian/ bookworm main\n"
            },
            "http://m.example/debian",
        ),
        (
            {
                "sources.list": "deb http://security.debian.org/debian-security bookworm main\n"
                "deb http://ftp.de.debian.org/debian bookworm main\n"
            },
            "http://ftp.de.debian.org/debian",
        ),
    ],
)
def test_debian_mirror_from_deb822_and_one_line_sources(sources: dict[str, str], uri: str) -> None:
    assert rc.debian_mirror(sources) == uri


@pytest.mark.parametrize(
    "sources",
    [{}, {"x.sources": "Types: deb-src\nURIs: http://a/debian\n"}, {"s.list": "# nothing\n"}],
)
def test_debian_mirror_missing_is_an_error(sources: dict[str, str]) -> None:
    with pytest.raises(EnvironmentProblem, match="no Debian archive URI"):
        rc.debian_mirror(sources)


def test_suite_for_rejects_a_release_outside_the_matrix() -> None:
    assert rc.suite_for("24.11") == "trixie"
    with pytest.raises(InputError, match=r"--version.*22.05, 24.11, 26.05"):
        rc.suite_for("23.02")


def test_venv_base_prefix_follows_home_and_refuses_the_system_python(tmp_path: Path) -> None:
    base = tmp_path / "pyenv" / "versions" / "3.11.7"
    (base / "bin").mkdir(parents=True)
    (tmp_path / "link").symlink_to(base / "bin")
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = {tmp_path / 'link'}\nversion = 3.11.7\n")
    assert rc.venv_base_prefix(venv) == base
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with pytest.raises(EnvironmentProblem, match="system interpreter"):
        rc.venv_base_prefix(venv)
    (venv / "pyvenv.cfg").write_text("version = 3\n")
    with pytest.raises(EnvironmentProblem, match="no 'home ='"):
        rc.venv_base_prefix(venv)
    with pytest.raises(EnvironmentProblem, match=r"is .* a venv"):
        rc.venv_base_prefix(tmp_path / "nothing")


def test_mount_plan_for_a_run_overlays_then_binds_each_path_once() -> None:
    chroot, scratch = Path("/c/trixie"), Path("/c/.mnt")
    binds = [Path("/work/main"), Path("/work/main/.venv"), Path("/root/.pyenv/v"), Path("/tmp")]
    root, mounts = rc.mount_plan(chroot, scratch, binds)
    assert root == scratch / "root"
    assert [(m.kind, str(m.target)) for m in mounts] == [
        ("tmpfs", "/c/.mnt"),
        ("overlay", "/c/.mnt/root"),
        ("proc", "/c/.mnt/root/proc"),
        ("bind", "/c/.mnt/root/dev"),
        ("bind", "/c/.mnt/root/sys"),
        ("tmpfs", "/c/.mnt/root/run"),
        ("bind", "/c/.mnt/root/work/main"),  # .venv inside the checkout rides along
        ("bind", "/c/.mnt/root/root/.pyenv/v"),
        ("bind", "/c/.mnt/root/tmp"),
    ]
    assert mounts[1].options == "lowerdir=/c/trixie,upperdir=/c/.mnt/upper,workdir=/c/.mnt/work"
    # Every host tree bound in is recursive and so made a slave (see _do_mount).
    assert all(m.recursive for m in mounts if m.kind == "bind")


def test_mount_plan_for_a_build_mounts_only_kernel_trees_into_the_chroot() -> None:
    root, mounts = rc.mount_plan(Path("/c/.b"), Path("/c/.mnt"), [Path("/tmp")], overlay=False)
    assert root == Path("/c/.b")
    assert [str(m.target) for m in mounts] == ["/c/.b/proc", "/c/.b/dev", "/c/.b/sys"]


def test_chroot_env_passes_the_callers_env_with_a_sane_path() -> None:
    env = rc.chroot_env(
        {"CI": "1", "FTHSDP_X": "y", "PATH": "/root/.pyenv/shims:/usr/bin", "SLURM_CONF": "/h"},
        Path("/w/.venv"),
        "24.11",
    )
    assert env["CI"] == "1" and env["FTHSDP_X"] == "y"
    assert env["PATH"] == "/w/.venv/bin:" + rc.SANE_PATH
    assert "SLURM_CONF" not in env  # the host cluster's config means nothing inside
    assert env[rc.CHROOT_RELEASE_ENV] == "24.11"


@pytest.mark.parametrize(
    ("cwd", "expected"),
    [("/work/main/tests", "/work/main/tests"), ("/tmp/x", "/tmp/x"), ("/etc", "/work/main")],
)
def test_run_cwd_is_the_callers_when_bound(cwd: str, expected: str) -> None:
    binds = [Path("/work/main"), Path("/tmp")]
    assert rc.run_cwd(Path(cwd), binds, Path("/work/main")) == Path(expected)


def _fake_chroot(root: Path, marker: object) -> None:
    for binary in ("usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/sbin/munged", "usr/bin/sinfo"):
        (root / binary).parent.mkdir(parents=True, exist_ok=True)
        (root / binary).touch()
    (root / "etc").mkdir(exist_ok=True)
    (root / rc.MARKER).write_text(json.dumps(marker) if marker is not None else "{bad")


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ({"suite": "trixie", "slurm": "24.11.5", "packages": rc.packages_for("trixie")}, None),
        ({"suite": "trixie", "slurm": "24.11.5"}, "built with packages None"),
        (None, "no valid"),
        (["trixie"], "no valid"),
        ({"suite": "sid", "slurm": "24.11.5"}, "built for suite 'sid'"),
        ({"suite": "trixie", "slurm": "25.05.1"}, "holds Slurm 25.05.1, not 24.11"),
        ({"suite": "trixie", "slurm": "?"}, "holds Slurm ?, not 24.11"),
    ],
)
def test_chroot_problem_checks_marker_and_binaries(
    tmp_path: Path, marker: object, problem: str | None
) -> None:
    _fake_chroot(tmp_path, marker)
    found = rc.chroot_problem(tmp_path, "24.11")
    assert found is None if problem is None else problem in (found or "")
    if problem is None:
        (tmp_path / "usr/sbin/munged").unlink()
        assert "lacks /usr/sbin/munged" in (rc.chroot_problem(tmp_path, "24.11") or "")


def _harness(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm.release_chroot", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_cli_bad_version_is_one_line_exit_2() -> None:
    r = _harness("run", "--version", "23.02", "--", "true")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "release_chroot: --version: got '23.02'; one of 22.05, 24.11, 26.05"
    ]


def test_harness_imports_no_torch() -> None:
    code = "import sys, slurm.release_chroot; print('torch' in sys.modules)"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert r.stdout.strip() == "False", r.stderr


# ---------------------------------------------------------------------------------------------
# Real runs


def _other_release() -> str:
    if os.geteuid() != 0:
        msg = "the chroot harness needs root"
        if os.environ.get("CI") or os.environ.get("FTHSDP_REQUIRE_SLURM"):
            pytest.fail(msg)
        pytest.skip(msg)
    if Path("/", rc.MARKER).exists():
        pytest.skip("already inside a release chroot; the harness is driven from the host")
    host = rc.host_version()
    return next(v for v in rc.MATRIX if v != host)


def _mount_targets() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


@pytest.mark.timeout(1200)
def test_run_in_a_chroot_sees_its_release_the_checkout_and_the_callers_env(tmp_path: Path) -> None:
    version = _other_release()
    before = _mount_targets()
    probe = (
        "import json, os, subprocess, sys; "
        "v = subprocess.run(['slurmd', '-V'], capture_output=True, text=True).stdout; "
        "print(json.dumps({'v': v.strip(), 'cwd': os.getcwd(), 'x': os.environ.get('FTHSDP_X'),"
        " 'conf': os.environ.get('SLURM_CONF'), 'mk': os.path.exists('/etc/fthsdp-chroot.json'),"
        " 'munge': os.stat('/run/munge').st_uid}))"
    )
    (tmp_path / "out").mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm.release_chroot",
            "run",
            "--version",
            version,
            "--",
            str(REPO / ".venv/bin/python"),
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO / "tests",
        env={**os.environ, "PYTHONPATH": str(REPO), "FTHSDP_X": "passed", "SLURM_CONF": "/x"},
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert rc.release_of(seen["v"]) == version
    assert seen["cwd"] == str(REPO / "tests") and seen["x"] == "passed" and seen["mk"]
    assert seen["conf"] is None
    assert seen["munge"] != 0  # /run/munge belongs to the chroot's munge user
    # Writes inside go to the run's overlay, never into the cache.
    r = _harness("run", "--version", version, "--", "sh", "-c", "touch /etc/fthsdp-probe; exit 7")
    assert r.returncode == 7, r.stderr
    assert not (rc.chroot_dir(version) / "etc/fthsdp-probe").exists()
    assert _mount_targets() == before  # nothing of a run is ever mounted on the host


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_concurrent_runs_and_a_timeout_leave_no_mount_and_no_process(tmp_path: Path) -> None:
    version = _other_release()
    rc.ensure(version, log=False)
    before = _mount_targets()
    stamp = tmp_path / "long.pid"
    results: dict[str, subprocess.CompletedProcess[str]] = {}

    def long_run() -> None:  # outlives the short run below, then times out
        results["long"] = _harness(
            "run",
            "--version",
            version,
            "--timeout",
            "20",
            "--",
            "sh",
            "-c",
            f"echo $$ > {stamp}; sleep 600",
        )

    t = threading.Thread(target=long_run)
    t.start()
    deadline = time.monotonic() + 120
    while not stamp.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    short = _harness("run", "--version", version, "--", "sh", "-c", "ls /proc/self >/dev/null")
    assert short.returncode == 0, short.stderr
    assert stamp.exists()
    # The short run's unmounts did not touch the long run's root: it still sees its binds.
    pid = int(stamp.read_text())
    assert Path(f"/proc/{pid}/root/{REPO}/setup.cfg").exists()
    t.join(timeout=120)
    assert results["long"].returncode == rc.EXIT_TIMEOUT
    assert "timed out after 20s" in results["long"].stderr
    assert not Path(f"/proc/{pid}").exists()
    assert _mount_targets() == before
