"""Shared fixtures: the real local Slurm cluster.

Tests marked `slurm` run against a real slurmctld and several slurmd (see `slurm.devcluster`).
They skip with a reason only when the machine cannot run Slurm (not root, or slurm-wlm/munge
missing); under CI (`CI` set) that is a failure instead, so a broken install can never turn
into a silently green run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm import devcluster


def _require_slurm() -> None:
    problems = devcluster.missing_prerequisites()
    if problems:
        msg = "dev cluster unavailable: " + "; ".join(problems)
        if os.environ.get("CI") or os.environ.get("FTHSDP_REQUIRE_SLURM"):
            pytest.fail(msg)
        pytest.skip(msg)  # not root, or Slurm is not installed


@pytest.fixture(scope="session")
def slurm_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[devcluster.DevClusterConfig]:
    """A 4-node dev cluster (8 GPUs per node, 2 nodes per leaf switch) for the whole session.

    `SLURM_CONF` is exported for the session so Slurm's commands, the `slurm` backend and jobs
    submitted with `--export=ALL` all find this cluster.
    """
    _require_slurm()
    directory: Path = tmp_path_factory.mktemp("devcluster")
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


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    """Puts the process umask back after each test: `fthsdp control` run in process sets 077,
    and files created later in the session (the dev cluster's TaskProlog folder) would then be
    closed to other users' jobs."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)
