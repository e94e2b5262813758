"""Slurm hostlists (`node[1-4],gpu7`): the one place fthsdp expands and compresses them.

Slurm speaks in hostlists wherever it names several nodes: a job's `nodes`, its
`ExcNodeList`, `SLURM_STEP_NODELIST`, the spec's `exclude`/`nodelist`. python-hostlist does the
work; this module maps its `BadHostlist` to an `InputError` naming where the list came from, and
knows squeue's placeholders for a job that has no nodes yet.
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist

from slurm.errors import InputError


def expand(value: str, where: str = "hostlist") -> list[str]:
    """The node names of a hostlist, in Slurm's order; `InputError` naming `where` if it is
    not one."""
    try:
        return list(hostlist.expand_hostlist(value))
    except hostlist.BadHostlist as exc:
        raise InputError(where, value, f"a valid hostlist ({exc})") from None


def compress(names: Iterable[str]) -> str:
    """The shortest hostlist for `names` (`node1,node2,node3` -> `node[1-3]`)."""
    return str(hostlist.collect_hostlist(list(names)))


def job_nodes(nodes: str) -> list[str]:
    """The nodes of a job as squeue lists them; empty for a job that has none yet (`""`,
    `"(null)"`, `"None assigned"`)."""
    if not nodes or nodes.startswith("(") or " " in nodes:
        return []
    return expand(nodes, "job nodes")
