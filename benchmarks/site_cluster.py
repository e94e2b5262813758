"""A health-gated dev cluster and the job user who runs the benchmark's jobs through the site
install, as the stories have them (`tests/conftest.py`'s `slurm_cluster` and `site_user`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import site_install as site_install_module  # noqa: E402
import user_harness  # noqa: E402
from conftest import _share_simulated_tools, open_folder  # noqa: E402

from prolog_epilog import dev_health  # noqa: E402
from slurm import devcluster  # noqa: E402


@contextlib.contextmanager
def site_cluster(
    prefix: str,
) -> Iterator[tuple[devcluster.DevClusterConfig, user_harness.SiteUser]]:
    """(the running cluster, the job user in a folder of their own); root's `SLURM_CONF` names
    the cluster for the block (the operator's side: injecting faults). A SIGTERM ends the block
    like an error, so the cluster and its jobs are stopped, not left running."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with _site_cluster(prefix) as found:
            yield found
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _site_cluster(
    prefix: str,
) -> Iterator[tuple[devcluster.DevClusterConfig, user_harness.SiteUser]]:
    user_harness.ensure_user(user_harness.JOB_USER)
    install = site_install_module.ensure()
    _share_simulated_tools(install)
    with open_folder(prefix) as tmp:
        base = devcluster.free_port_block(6, start=25000 + (os.getpid() % 100) * 10)
        cfg = dev_health.with_health(
            devcluster.DevClusterConfig(
                directory=tmp / "cluster", ctld_port=base, slurmd_base_port=base + 1
            )
        )
        users = tmp / "users"
        users.mkdir(mode=0o755)
        with devcluster.running_cluster(cfg) as running:
            os.environ["SLURM_CONF"] = str(running.conf_path)
            yield (
                running,
                user_harness.SiteUser(
                    user_harness.JOB_USER,
                    install,
                    user_harness.user_folder(users, user_harness.JOB_USER, "work"),
                    {"SLURM_CONF": str(running.conf_path)},
                ),
            )
