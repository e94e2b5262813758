"""Shared by the tests of the health checks, the runner and the hook actions: the fixture
directory, the default config and one section of it with overrides, a suite of results, and the
config of a simulated node."""

from __future__ import annotations

from pathlib import Path

from prolog_epilog import load_config
from prolog_epilog.checks.base import CheckResult
from prolog_epilog.config import HealthConfig
from prolog_epilog.runner import SuiteResult, verdict
from prolog_epilog.simulated_hardware import dev_config_toml

FIX = Path(__file__).parent / "fixtures" / "health"
CFG = load_config()


def sec(name: str, **over: object) -> dict:
    return {**CFG.section(name), **over}


def _suite(*results: CheckResult) -> SuiteResult:
    healthy, reason = verdict(list(results), "fail")
    return SuiteResult(list(results), healthy, reason)


def sim_config(tmp_path: Path, **general: object) -> HealthConfig:
    (tmp_path / "c.toml").write_text(
        dev_config_toml(tmp_path, **general) + "[checks.gpu-count]\nexpected = 8\n"
    )
    return load_config(tmp_path / "c.toml", node="node1")
