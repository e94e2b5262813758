"""The health-check configuration: packaged TOML defaults merged with an operator's file.

One file configures prolog, epilog, HealthCheckProgram and `fthsdp check`, in the spirit of
LBNL NHC's `nhc.conf`, but typed: unknown sections or keys and values of the wrong type are
`InputError`s naming the key, so a typo fails loudly when an operator runs `fthsdp check`, not
silently on every node. Path values may contain `{node}` (the Slurm node name), which is how one
config gives each simulated dev-cluster node its own hardware inputs.
"""

from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from slurm.errors import InputError
from slurm.health_names import CHECK_NAMES

GPU_SOURCES = ("auto", "nvml", "nvidia-smi")
#: What the Epilog does with a run's drain request (`prolog_epilog.drain_requests`).
POLICIES = ("off", "recheck", "trust")
#: What a job-requested check that errored does to that job (never to the node).
JOB_CHECK_ERRORS = ("cancel", "ignore")
_PATH_KEYS = (
    "nvidia_smi",
    "dcgmi",
    "sysfs_root",
    "kernel_log",
    "log_file",
    "json_log",
    "state_dir",
)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def default_table() -> dict[str, Any]:
    text = resources.files("prolog_epilog").joinpath("defaults.toml").read_text()
    return tomllib.loads(text)


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        name = f"{where}.{key}" if where else key
        if key not in base:
            allowed = ", ".join(sorted(base)) or "(none)"
            raise InputError(name, value, f"unknown key; allowed: {allowed}")
        default = base[key]
        if isinstance(default, dict) and key != "counter_warn":
            if not isinstance(value, dict):
                raise InputError(name, value, "must be a table")
            out[key] = _merge(default, value, name)
        elif key == "counter_warn":
            if not isinstance(value, dict) or not all(isinstance(v, int) for v in value.values()):
                raise InputError(name, value, "must be a table of counter name = integer")
            out[key] = value
        else:
            _check_type(name, default, value)
            out[key] = float(value) if isinstance(default, float) else value
    return out


def _check_type(name: str, default: Any, value: Any) -> None:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        want = "true or false"
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        want = "a number"
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        want = "an integer"
    elif isinstance(default, str):
        ok = isinstance(value, str)
        want = "a string"
    elif isinstance(default, list):
        ok = isinstance(value, list)
        want = "a list"
    else:
        ok, want = True, ""
    if not ok:
        raise InputError(name, value, f"must be {want}")


@dataclass(frozen=True)
class HealthConfig:
    """The merged configuration. `section(name)` gives a check's own table."""

    table: dict[str, Any] = field(default_factory=default_table)
    node: str = field(default_factory=node_name)
    source: str = "defaults"

    @property
    def general(self) -> dict[str, Any]:
        return dict(self.table["general"])

    @property
    def actions(self) -> dict[str, Any]:
        return dict(self.table["actions"])

    @property
    def epilog(self) -> dict[str, Any]:
        return dict(self.table["epilog"])

    def section(self, check: str) -> dict[str, Any]:
        return dict(self.table["checks"].get(check, {}))

    def path(self, key: str) -> str:
        """A path setting with `{node}` expanded."""
        return str(self.table["general"][key]).replace("{node}", self.node)

    def timeout(self, check: str) -> float:
        return float(self.section(check).get("timeout_s", self.general["timeout_s"]))

    @property
    def default_checks(self) -> list[str]:
        return list(self.general["checks"])


def validate(table: dict[str, Any]) -> None:
    g = table["general"]
    for name in g["checks"]:
        if name not in CHECK_NAMES:
            raise InputError("general.checks", name, f"allowed: {', '.join(CHECK_NAMES)}")
    for name in table["epilog"]["checks"]:
        if name not in CHECK_NAMES:
            raise InputError("epilog.checks", name, f"allowed: {', '.join(CHECK_NAMES)}")
    if g["gpu_source"] not in GPU_SOURCES:
        raise InputError(
            "general.gpu_source", g["gpu_source"], f"allowed: {', '.join(GPU_SOURCES)}"
        )
    if g["on_error"] not in ("fail", "warn"):
        raise InputError("general.on_error", g["on_error"], "allowed: fail, warn")
    a = table["actions"]
    for name in a["job_checks_allowed"]:
        if name not in CHECK_NAMES:
            raise InputError(
                "actions.job_checks_allowed", name, f"allowed: {', '.join(CHECK_NAMES)}"
            )
    if a["job_check_error"] not in JOB_CHECK_ERRORS:
        raise InputError(
            "actions.job_check_error",
            a["job_check_error"],
            f"allowed: {', '.join(JOB_CHECK_ERRORS)}",
        )
    if a["drain_requests"] not in POLICIES:
        raise InputError(
            "actions.drain_requests", a["drain_requests"], f"allowed: {', '.join(POLICIES)}"
        )
    if a["drain_requests_per_user_day"] < 0:
        raise InputError(
            "actions.drain_requests_per_user_day", a["drain_requests_per_user_day"], "must be >= 0"
        )
    for key in (
        "lock_timeout_s",
        "prolog_failure_hold_s",
        "prolog_error_claim_s",
        "drain_request_hold_s",
    ):
        if not 0 <= a[key] < float("inf") or (key == "lock_timeout_s" and a[key] <= 0):
            raise InputError(f"actions.{key}", a[key], "a number of seconds (> 0 for the lock)")
    if g["total_budget_s"] <= 0 or g["timeout_s"] <= 0:
        raise InputError("general.total_budget_s", g["total_budget_s"], "must be > 0")
    if table["checks"]["ecc"]["ecc_disabled"] not in ("fail", "warn"):
        raise InputError(
            "checks.ecc.ecc_disabled", table["checks"]["ecc"]["ecc_disabled"], "allowed: fail, warn"
        )


def load_config(path: Path | str | None = None, node: str | None = None) -> HealthConfig:
    """Defaults, overridden by the TOML file at `path` (if given)."""
    table = default_table()
    source = "defaults"
    if path is not None:
        p = Path(path)
        try:
            user = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise InputError("--config", str(p), "file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise InputError("--config", str(p), f"is not valid TOML ({exc})") from None
        table = _merge(table, user, "")
        source = str(p)
    validate(table)
    return HealthConfig(table, node or node_name(), source)
