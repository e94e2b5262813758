"""The expedited requeue: asked for by every replica job where the running slurmctld grants it.

Tables on `scontrol show config` text; and on the dev cluster, which enables it on the releases
that have it (25.11+: 26.05 in the matrix), a job submitted with `--requeue=expedite` and then
requeued by its owner is eligible again at once, not held behind the requeue's begin time."""

from __future__ import annotations

import subprocess
import time

import pytest

from slurm import devcluster
from slurm.devcluster.daemons import slurm_release
from slurm.doctor import check_expedited_requeue
from slurm.expedite import ENABLE, SBATCH_OPTION, expedited_requeue
from slurm.slurm_config import SlurmConfig


def config(version: str, params: str | None) -> SlurmConfig:
    return SlurmConfig(version, {} if params is None else {"SlurmctldParameters": params})


@pytest.mark.parametrize(
    ("version", "params", "granted", "says"),
    [
        ("22.05.8", ENABLE, False, "has none (added in 25.11)"),
        ("24.11.5", None, False, "has none"),
        ("25.11.0", None, False, f"lacks {ENABLE}"),
        ("26.05.5", "enable_configless", False, f"lacks {ENABLE}"),
        ("26.05.5", f"enable_configless,{ENABLE}", True, f"SlurmctldParameters={ENABLE}"),
    ],
)
def test_granted_only_where_the_release_has_it_and_the_site_allows_it(
    version: str, params: str | None, granted: bool, says: str
) -> None:
    cfg = config(version, params)
    got, why = expedited_requeue(cfg)
    assert got is granted and says in why, why
    finding = check_expedited_requeue(cfg)
    assert finding.status == "pass"  # information: never a failure
    assert (SBATCH_OPTION in finding.detail) is granted
    if "lacks" in why:
        assert finding.fix == f"SlurmctldParameters={params + ',' if params else ''}{ENABLE}"


def _squeue(cfg: devcluster.DevClusterConfig, job: str, fmt: str) -> str:
    r = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", fmt],
        env=cfg.env(), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return r.stdout.strip()


def _sbatch(cfg: devcluster.DevClusterConfig, *args: str) -> str:
    r = subprocess.run(
        ["sbatch", "--parsable", *args, "-N1", "-o", "/dev/null", "--wrap", "sleep 300"],
        env=cfg.env(), capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return r.stdout.strip().split(";")[0]


def _wait(cfg: devcluster.DevClusterConfig, job: str, pred: object, what: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        got = _squeue(cfg, job, "%T %r")
        if pred(got):  # type: ignore[operator]
            return got
        assert time.monotonic() < deadline, f"{what}: {got}"
        time.sleep(0.3)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_an_expedited_job_requeued_by_its_owner_is_eligible_at_once(
    slurm_cluster: devcluster.DevClusterConfig,
) -> None:
    cfg = slurm_cluster
    if slurm_release() < (25, 11):
        pytest.skip(f"Slurm {'.'.join(map(str, slurm_release()))} has no expedited requeue")
    assert f"SlurmctldParameters={ENABLE}" in cfg.conf_path.read_text()
    plain, fast = _sbatch(cfg, "--requeue"), _sbatch(cfg, SBATCH_OPTION)
    try:
        for job in (plain, fast):
            _wait(cfg, job, lambda got: got.startswith("RUNNING"), f"job {job} to run")
            subprocess.run(["scontrol", "requeue", job], env=cfg.env(), timeout=30, check=True)
        # The plain job is held behind the requeue's begin time (~100 s); the expedited one
        # runs again at once, without anyone moving its begin time.
        _wait(cfg, plain, lambda got: got == "PENDING BeginTime", "the plain job held")
        _wait(cfg, fast, lambda got: got.startswith("RUNNING"), "the expedited job back")
        assert _squeue(cfg, plain, "%T %r") == "PENDING BeginTime"
    finally:
        subprocess.run(["scancel", plain, fast], env=cfg.env(), timeout=30, check=False)
