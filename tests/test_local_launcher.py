"""The local launcher's restart gate: a replica killed by the configured kills stays out until
another replica committed `restart_after_steps` steps past the kill; a crash restarts at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime.local.config import LaunchConfig
from runtime.local.faults import Failure
from runtime.local.launcher import LocalLauncher


@pytest.mark.parametrize(
    ("after", "kind", "held_until"), [(0, "injected", 10), (15, "injected", 25), (15, "crash", 10)]
)
def test_restart_after_steps(tmp_path: Path, after: int, kind: str, held_until: int) -> None:
    cfg = LaunchConfig(run_dir=tmp_path, command=["true"], replicas=3, restart_after_steps=after)
    launcher = LocalLauncher(cfg)
    launched: list[int] = []
    launcher._launch = lambda rs: launched.append(rs.step)  # type: ignore[method-assign]
    victim = launcher.replicas[1]
    victim.state, victim.step = "dead", 10
    launcher.failures.append(Failure(1, kind, 10, time.time()))
    for step in range(10, 30):
        for rs in launcher.replicas:
            if rs is not victim:
                rs.state, rs.step = "training", step
        launcher._supervise(victim)
        if launched:
            break
    assert launched == [10]
    assert max(r.step for r in launcher.replicas) == held_until
    assert victim.incarnation == 1 and launcher.failures[0].t_restart is not None
