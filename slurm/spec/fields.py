"""The value checks every spec section uses: safe charsets, Slurm's formats, ports.

Each check is pure and raises `InputError` naming the dotted field, so a bad value anywhere in a
spec reads the same way. Every pattern is applied with `fullmatch`: `$` alone would let a
trailing newline through, and a newline in a value ends sbatch's reading of `#SBATCH` lines.
"""

from __future__ import annotations

import re

from slurm import hostlist
from slurm.errors import InputError

#: Job names, partitions, accounts, QoS, reservations: what Slurm and a shell both take unquoted.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Run directories: absolute or relative paths without whitespace, quotes or shell syntax.
SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-][A-Za-z0-9_./+@=-]*")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (plus UNLIMITED / INFINITE).
SLURM_TIME = re.compile(
    r"(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}"
    r"|\d+-\d{1,2}:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)"
)
SLURM_MEM = re.compile(r"\d+[KMGT]?")
#: Feature expressions: names joined by & | , with optional [] grouping and *count.
CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,\[\]*:-]+")
HOSTLIST = re.compile(r"[A-Za-z0-9_.,\[\]-]+")
EMAIL = re.compile(r"[A-Za-z0-9_.+-]+@[A-Za-z0-9.-]+")


def check_name(where: str, value: str | None, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value):
        raise InputError(where, value, "allowed: 1-64 characters of A-Z a-z 0-9 _ . - (no spaces)")


def check_time(where: str, value: str | None) -> None:
    if value is not None and not SLURM_TIME.fullmatch(value):
        raise InputError(
            where,
            value,
            "a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
        )


def check_mem(where: str, value: str | None) -> None:
    if value is not None and not SLURM_MEM.fullmatch(value):
        raise InputError(where, value, "a Slurm memory size: digits with optional K/M/G/T")


def check_positive(where: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise InputError(where, value, f"must be an integer >= {minimum}")


def check_hostlist(where: str, value: str | None) -> None:
    if value is None:
        return
    if not HOSTLIST.fullmatch(value):
        raise InputError(where, value, "a Slurm hostlist such as node[1-4],gpu7")
    hostlist.expand(value, where)


def check_constraint(where: str, value: str) -> None:
    if not CONSTRAINT.fullmatch(value):
        raise InputError(
            where, value, "a Slurm feature expression of A-Z a-z 0-9 _ . - joined by & | ,"
        )


def check_not_negative(where: str, value: float) -> None:
    if value < 0:
        raise InputError(where, value, "must be >= 0")


def check_port(where: str, value: int) -> None:
    if not (value == 0 or 1024 <= value <= 65535):
        raise InputError(where, value, "a port in 1024..65535, or 0 to pick a free one")
