"""Shared fixtures: the real local Slurm cluster.

Tests marked `slurm` run against a real slurmctld and several slurmd (see `slurm.devcluster`).
They skip with a reason only when the machine cannot run Slurm (not root, or slurm-wlm/munge
missing); under CI (`CI` set) that is a failure instead, so a broken install can never turn
into a silently green run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import machine_slots
import pytest
import site_install as site_install_module
import user_harness

from slurm import devcluster


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A heavy test (`slow` or `one_release`) waits for a machine-wide slot before it starts
    (tests/machine_slots.py); outermost, so the wait is not on the test's timeout clock."""
    heavy = item.get_closest_marker("slow") or item.get_closest_marker("one_release")
    with machine_slots.slot(machine_slots.heavy_slots() if heavy else 0):
        return (yield)


def _require_slurm() -> None:
    problems = devcluster.missing_prerequisites()
    if problems:
        msg = "dev cluster unavailable: " + "; ".join(problems)
        if os.environ.get("CI") or os.environ.get("FTHSDP_REQUIRE_SLURM"):
            pytest.fail(msg)
        pytest.skip(msg)  # not root, or Slurm is not installed


@contextlib.contextmanager
def open_folder(prefix: str) -> Iterator[Path]:
    """A new root-owned folder every user can traverse (0755) under /tmp, removed afterwards.

    pytest's temp base is 0700, so slurmctld (which runs as `slurm`) and the tests' job users
    could not reach a cluster or a run folder there; a site's Slurm folders are readable too.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def site_dir() -> Iterator[Path]:
    """A fresh folder for one test's own dev cluster, traversable by slurmctld's user."""
    with open_folder("fthsdp-cluster-") as path:
        yield path


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[devcluster.DevClusterConfig]:
    """A 4-node dev cluster (8 GPUs per node, 2 nodes per leaf switch) for the whole session.

    `SLURM_CONF` is exported for the session so Slurm's commands, the `slurm` backend and jobs
    submitted with `--export=ALL` all find this cluster. Its folder is world-traversable, as a
    site's Slurm configuration is world-readable.
    """
    _require_slurm()
    # Before any node's simulated hardware is written (a root-only story may come first).
    _share_simulated_tools(site_install_module.site_prefix())
    with open_folder("fthsdp-devcluster-") as directory:
        yield from _session_cluster(directory)


def _session_cluster(directory: Path) -> Iterator[devcluster.DevClusterConfig]:
    base = devcluster.free_port_block(6, start=21000 + (os.getpid() % 200) * 10)
    cfg = devcluster.DevClusterConfig(
        directory=directory, ctld_port=base, slurmd_base_port=base + 1
    )
    previous = os.environ.get("SLURM_CONF")
    with devcluster.running_cluster(cfg) as running:
        os.environ["SLURM_CONF"] = str(running.conf_path)
        try:
            yield running
        finally:
            if previous is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="session")
def job_users() -> tuple[str, str]:
    """Two ordinary accounts for jobs: (the stories' job user, another user), made if missing.

    They stay after the session (other test sessions on the machine may be using them); an
    account that existed before is used as it is. Inside a release chroot the overlay is the
    run's own, so they are made there on every run.
    """
    if os.geteuid() != 0:
        pytest.skip("making and becoming other users needs root")
    for name in user_harness.USERS:
        user_harness.ensure_user(name)
    return user_harness.JOB_USER, user_harness.OTHER_USER


@pytest.fixture
def user_base() -> Iterator[Path]:
    """A root-owned, world-traversable folder (removed afterwards) for the job users' folders
    (`user_harness.user_folder`)."""
    with open_folder("fthsdp-users-") as path:
        yield path


def _share_simulated_tools(prefix: Path) -> None:
    """Have the simulated `nvidia-smi` run on the site install's interpreter, which every job
    user can run on every release (inside a chroot there is no system Python)."""
    python = prefix / "bin" / "python"
    if python.exists():
        os.environ.setdefault("FTHSDP_SIM_PYTHON", str(python))


@pytest.fixture(scope="session")
def site_install(job_users: tuple[str, str]) -> Path:
    """The cached site install (`tests/site_install.py`), checked to start as the job user."""
    try:
        prefix = site_install_module.ensure()
        site_install_module.check_usable(prefix)
    except site_install_module.SiteInstallError as exc:
        pytest.fail(str(exc))
    _share_simulated_tools(prefix)
    r = user_harness.as_user(
        job_users[0],
        [str(prefix / "bin" / "python"), "-c", "import fthsdp_cli, runtime, torch"],
        user_harness.user_env(job_users[0], Path("/")),
        Path("/"),
        timeout=120,
    )
    if r.returncode != 0:
        pytest.fail(f"the site install {prefix} does not start as {job_users[0]}: {r.stderr}")
    return prefix


@pytest.fixture
def site_user(
    slurm_cluster: devcluster.DevClusterConfig,
    job_users: tuple[str, str],
    site_install: Path,
    user_base: Path,
) -> user_harness.SiteUser:
    """The job user, in a folder of their own, with the session cluster's `SLURM_CONF`."""
    home = user_harness.user_folder(user_base, job_users[0], "work")
    return user_harness.SiteUser(
        job_users[0], site_install, home, {"SLURM_CONF": str(slurm_cluster.conf_path)}
    )


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    """Puts the process umask back after each test: `fthsdp control` run in process sets 077,
    and files created later in the session (the dev cluster's TaskProlog folder) would then be
    closed to other users' jobs."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)
