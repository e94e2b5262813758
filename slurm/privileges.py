"""Whether the calling user may change node state in Slurm, decided without changing anything.

A job's owner may requeue its own job, move its begin time, set its `ExcNodeList` and its
`Comment`, but may not drain a node: slurmctld answers `slurm_update error: Invalid user id`.
Only root, the cluster's `SlurmUser`, and a user whose Slurm `AdminLevel` is Operator or
Administrator (kept in slurmdbd, so only where accounting is on) may. The coordinator runs as the
job's owner, so it must know which it is before its first drain: in mode `direct` it drains with
`scontrol update NodeName=N State=DRAIN`; in mode `request` it writes a drain request into the
replica job's own Comment (`slurm.drain_request`) for root's Epilog to act on, and still keeps
the node off the requeued job. `fthsdp doctor` reports the same decision.

Nothing here tries a drain to find out: the decision reads `scontrol show config` (`SlurmUser`,
`AccountingStorageType`) and, where accounting exists, `sacctmgr -nP show user NAME
format=adminlevel`. The parsing is pure (`decide`, `parse_slurm_user`, `parse_admin_level`),
tested by tables over real outputs; `probe` does the reading. Anything that cannot be read makes
the mode `request`, with the reason: a request is never counted as a drain, while a drain that
turns out to be refused would have been a failed action.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from dataclasses import asdict, dataclass
from typing import Literal, cast

from slurm.errors import EnvironmentProblem, InputError
from slurm.records import SlurmCommandError, SlurmOutputError
from slurm.slurm_config import SlurmConfig, read_config

DrainMode = Literal["direct", "request"]
#: The `drain` setting: decide (`auto`) or force one mode.
DRAIN_SETTINGS = ("auto", "direct", "request")
#: The accounting plugin under which Slurm keeps admin levels.
SLURMDBD = "accounting_storage/slurmdbd"
#: Admin levels that may change node state (`sacctmgr` prints `None` for a plain user).
NODE_ADMIN_LEVELS = ("Operator", "Administrator")
_ADMIN_LEVELS = ("None", *NODE_ADMIN_LEVELS)
_SLURM_USER = re.compile(r"(?P<name>[^\s()]+)\((?P<uid>\d+)\)")


#: How slurmctld refuses a node update to a user without the rights (22.05 to 26.05 say the
#: first; pyslurm carries Slurm's errno text, the second).
_NO_RIGHTS = ("Invalid user id", "Access/permission denied")


def lacks_rights(exc: SlurmCommandError) -> bool:
    """True when Slurm refused a node update because the user may not change node state."""
    return exc.returncode > 0 and any(t in exc.stderr for t in _NO_RIGHTS)


def admin_level_argv(user: str) -> list[str]:
    return ["sacctmgr", "-nP", "show", "user", user, "format=adminlevel"]


@dataclass(frozen=True)
class Privileges:
    """The drain mode in effect for `user`, and why."""

    mode: DrainMode
    reason: str
    user: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def parse_slurm_user(value: str | None) -> tuple[str, int]:
    """`SlurmUser` as `scontrol show config` prints it (`root(0)`, `slurm(64030)`) -> (name,
    uid); anything else raises `SlurmOutputError` naming the command."""
    m = _SLURM_USER.fullmatch((value or "").strip())
    if m is None:
        raise SlurmOutputError(["scontrol", "show", "config"], None, f"SlurmUser = {value!r}")
    return m["name"], int(m["uid"])


def parse_admin_level(text: str, user: str) -> str | None:
    """`sacctmgr -nP show user NAME format=adminlevel` -> `None` / `Operator` / `Administrator`,
    or None when accounting has no such user (nothing printed)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if len(lines) != 1 or lines[0] not in _ADMIN_LEVELS:
        raise SlurmOutputError(admin_level_argv(user), None, f"admin level {text[:60]!r}")
    return lines[0]


def accounting(cfg: SlurmConfig) -> bool:
    """True when slurmctld keeps accounting in slurmdbd, where admin levels live."""
    return cfg.get("AccountingStorageType") == SLURMDBD


def decide(
    uid: int,
    user: str,
    cfg: SlurmConfig | None,
    admin_level: str | None = None,
    problem: str | None = None,
) -> Privileges:
    """The mode for `user` (`uid`) from what was read: Slurm's configuration (None: unread,
    `problem` says why), and the user's admin level where accounting exists."""
    if uid == 0:
        return Privileges("direct", "running as root", user)
    if cfg is None:
        return Privileges("request", f"cannot tell whether {user} may drain: {problem}", user)
    name, slurm_uid = parse_slurm_user(cfg.get("SlurmUser"))
    if uid == slurm_uid or user == name:
        return Privileges("direct", f"{user} is the cluster's SlurmUser", user)
    if not accounting(cfg):
        return Privileges(
            "request",
            f"{user} is neither root nor SlurmUser ({name}), and this cluster keeps no "
            f"accounting (AccountingStorageType={cfg.get('AccountingStorageType') or 'none'}), "
            "so no Slurm admin level can grant drains",
            user,
        )
    if problem is not None:
        return Privileges("request", f"cannot read {user}'s Slurm admin level: {problem}", user)
    if admin_level in NODE_ADMIN_LEVELS:
        return Privileges("direct", f"{user} has Slurm AdminLevel {admin_level}", user)
    level = admin_level or "none (no accounting record)"
    return Privileges(
        "request",
        f"{user} is neither root nor SlurmUser ({name}) and has Slurm AdminLevel {level}",
        user,
    )


def _user() -> tuple[int, str]:
    uid = os.geteuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, str(uid)


def probe(timeout: float = 30.0, cfg: SlurmConfig | None = None) -> Privileges:
    """The mode for the calling user, read from the running Slurm (nothing is changed).

    `cfg`: a `scontrol show config` already read (`fthsdp doctor` has one)."""
    uid, user = _user()
    if uid == 0:
        return decide(uid, user, None)
    if cfg is None:
        try:
            cfg = read_config(timeout)
        except (EnvironmentProblem, SlurmOutputError) as exc:
            return decide(uid, user, None, problem=str(exc))
    if not accounting(cfg):
        return decide(uid, user, cfg)
    argv = admin_level_argv(user)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return decide(uid, user, cfg, problem=f"{' '.join(argv)}: {exc}")
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        return decide(uid, user, cfg, problem=f"{' '.join(argv)} failed: {last[0]}")
    try:
        level = parse_admin_level(r.stdout, user)
    except SlurmOutputError as exc:
        return decide(uid, user, cfg, problem=str(exc))
    return decide(uid, user, cfg, level)


def check_setting(value: str, field: str = "drain") -> str:
    """`value` when it is one of `DRAIN_SETTINGS`; else one line naming the field."""
    if value not in DRAIN_SETTINGS:
        raise InputError(field, value, f"one of {', '.join(DRAIN_SETTINGS)}")
    return value


def resolve(setting: str, timeout: float = 30.0) -> Privileges:
    """The mode a coordinator uses under `setting`: `auto` probes, the others are taken."""
    check_setting(setting)
    if setting == "auto":
        return probe(timeout)
    _, user = _user()
    return Privileges(cast(DrainMode, setting), f"set by drain = {setting!r}", user)
