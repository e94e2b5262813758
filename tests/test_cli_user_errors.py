"""What an ordinary user gets from a broken environment: one line, a documented exit code, and
nothing half-written. A `SLURM_CONF` the user cannot read, and a run folder they cannot write,
as the job user through the site install (root, who runs the tests, could read and write both)."""

from __future__ import annotations

from pathlib import Path

import pytest
from user_harness import SiteUser

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slurm  # the job users and the site install are made as root


@pytest.fixture
def user(job_users: tuple[str, str], site_install: Path, user_base: Path) -> SiteUser:
    from user_harness import user_folder

    return SiteUser(job_users[0], site_install, user_folder(user_base, job_users[0], "work"))


def _one_line(r: object) -> str:
    out = (r.stdout or "") + (r.stderr or "")  # type: ignore[attr-defined]
    assert "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return lines[0]


def test_a_slurm_conf_the_user_cannot_read_is_one_line_and_exit_3(
    user: SiteUser, user_base: Path
) -> None:
    closed = user_base / "closed"
    closed.mkdir(mode=0o700)  # root's
    (closed / "slurm.conf").write_text("ClusterName=x\n")
    run = user.home / "run"
    r = user.with_env(SLURM_CONF=str(closed / "slurm.conf")).fthsdp(
        "submit", str(ROOT / "examples" / "tiny.toml"), "--set", f"job.run_dir={run}"
    )
    assert r.returncode == 3, r.stdout + r.stderr
    line = _one_line(r)
    assert "SLURM_CONF" in line and "Permission denied" in line, line
    assert not run.exists()


def test_a_run_folder_the_user_cannot_write_is_one_line_and_nothing_written(
    user: SiteUser, user_base: Path
) -> None:
    theirs = user_base / "roots"
    theirs.mkdir(mode=0o755)  # root's, readable, not the user's to write
    run = theirs / "run"
    r = user.fthsdp("submit", str(ROOT / "examples" / "tiny.toml"), "--set", f"job.run_dir={run}")
    assert r.returncode in (2, 3), r.stdout + r.stderr
    line = _one_line(r)
    assert str(run) in line, line
    assert list(theirs.iterdir()) == []
