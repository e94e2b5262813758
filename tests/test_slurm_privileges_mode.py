"""`slurm.privileges`: the drain mode of the calling user, by tables over real outputs.

The captures: `scontrol show config` of the dev cluster on each release
(tests/fixtures/slurm_config/, the same text for root and for `nobody`), and under
tests/fixtures/privileges/ what `nobody` got from `sacctmgr -nP show user nobody
format=adminlevel` (the dev cluster keeps no accounting) and from `scontrol update NodeName=N
State=DRAIN` on its own job's node, on 22.05.8, 24.11.5 and 26.05.5. The sacctmgr answers of a
cluster with slurmdbd (`None`, `Operator`, `Administrator`, one per line) could not be captured
here and are written as `sacctmgr -nP` prints them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm.errors import InputError
from slurm.privileges import (
    Privileges,
    check_setting,
    decide,
    lacks_rights,
    parse_admin_level,
    parse_slurm_user,
    resolve,
)
from slurm.records import SlurmCommandError, SlurmOutputError
from slurm.slurm_config import SlurmConfig, parse_show_config

FIXTURES = Path(__file__).with_name("fixtures")
RELEASES = ("22.05.8", "24.11.5", "26.05.5")


def config(release: str, **changes: str) -> SlurmConfig:
    cfg = parse_show_config((FIXTURES / "slurm_config" / f"show-config-{release}.txt").read_text())
    return SlurmConfig(cfg.version_text, {**cfg.settings, **changes})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("root(0)", ("root", 0)),
        ("slurm(64030)", ("slurm", 64030)),
        (" slurm(64030) ", ("slurm", 64030)),
    ],
)
def test_slurm_user(value: str, expected: tuple[str, int]) -> None:
    assert parse_slurm_user(value) == expected


@pytest.mark.parametrize("value", [None, "", "slurm", "slurm(x)", "(0)"])
def test_slurm_user_unknown_shape_is_an_error(value: str | None) -> None:
    with pytest.raises(SlurmOutputError, match="scontrol show config"):
        parse_slurm_user(value)


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("None\n", "None"),
        ("Operator\n", "Operator"),
        ("Administrator\n", "Administrator"),
        ("", None),
    ],
)
def test_admin_level(text: str, level: str | None) -> None:
    assert parse_admin_level(text, "alice") == level


@pytest.mark.parametrize("text", ["Admin\n", "None\nOperator\n", "alice|None\n"])
def test_admin_level_unknown_shape_is_an_error(text: str) -> None:
    with pytest.raises(SlurmOutputError, match=r"sacctmgr -nP show user alice format=adminlevel"):
        parse_admin_level(text, "alice")


SLURMDBD = {"AccountingStorageType": "accounting_storage/slurmdbd"}
CASES: list[tuple[str, int, str, dict[str, str], str | None, str | None, str, str]] = [
    ("root", 0, "root", {}, None, None, "direct", "running as root"),
    ("SlurmUser by uid", 64030, "slurm", {"SlurmUser": "slurm(64030)"}, None, None, "direct",
     "SlurmUser"),
    ("plain user, no accounting", 65534, "nobody", {}, None, None, "request",
     "keeps no accounting"),
    ("Operator", 1000, "alice", SLURMDBD, "Operator", None, "direct", "AdminLevel Operator"),
    ("Administrator", 1000, "alice", SLURMDBD, "Administrator", None, "direct",
     "AdminLevel Administrator"),
    ("AdminLevel None", 1000, "alice", SLURMDBD, "None", None, "request", "AdminLevel None"),
    ("not in accounting", 1000, "alice", SLURMDBD, None, None, "request", "no accounting record"),
    ("sacctmgr failed", 1000, "alice", SLURMDBD, None, "slurmdbd down", "request",
     "cannot read alice's Slurm admin level: slurmdbd down"),
]  # fmt: skip


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    ("name", "uid", "user", "changes", "level", "problem", "mode", "why"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_decide(
    release: str, name: str, uid: int, user: str, changes: dict[str, str],
    level: str | None, problem: str | None, mode: str, why: str,
) -> None:  # fmt: skip
    got = decide(uid, user, config(release, **changes), level, problem)
    assert got.mode == mode
    assert why in got.reason
    assert got.user == user


def test_unreadable_config_is_request_mode_with_the_reason() -> None:
    got = decide(1000, "alice", None, problem="scontrol show config failed: x")
    assert got == Privileges(
        "request", "cannot tell whether alice may drain: scontrol show config failed: x", "alice"
    )


@pytest.mark.parametrize("release", RELEASES)
def test_the_captured_answers_are_those_fthsdp_knows(release: str) -> None:
    """No accounting on the dev cluster: sacctmgr refuses (so the mode is decided without it),
    and the owner's drain is refused in the words `lacks_rights` looks for."""
    sacct = (FIXTURES / "privileges" / f"sacctmgr-no-accounting-{release}.txt").read_text()
    assert "not running a supported accounting_storage plugin" in sacct
    assert config(release).get("AccountingStorageType") in (None, "accounting_storage/none")
    refused = (FIXTURES / "privileges" / f"drain-as-owner-{release}.txt").read_text()
    assert lacks_rights(SlurmCommandError(["scontrol", "update"], 1, refused))
    assert not lacks_rights(SlurmCommandError(["scontrol", "update"], 1, "Invalid node name"))


@pytest.mark.parametrize("setting", ["direct", "request"])
def test_a_forced_setting_is_taken(setting: str) -> None:
    got = resolve(setting)
    assert got.mode == setting
    assert setting in got.reason


def test_a_bad_setting_names_the_field() -> None:
    with pytest.raises(InputError, match=r"control\.drain"):
        check_setting("maybe", "control.drain")
