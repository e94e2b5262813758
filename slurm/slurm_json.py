"""Slurm's JSON answers, per release, read into `NodeInfo` / `JobInfo`, or refused.

Slurm's JSON changes shape between release series (it follows the data_parser plugin of that
release), so which command gives per-node records, and how each field is written, depends on the
version:

* 22.05: `sinfo --json` has a top-level `nodes` list of per-node records; `state` is a string
  (`idle`) and the flags are a separate `state_flags` list (`["DRAIN"]`); `scontrol` has no
  `--json`. `squeue --json` ignores its filters and keeps finished jobs until `MinJobAge`;
  numbers are plain, `job_state` is a string.
* 23.02 and later (tested: 24.11, 26.05): `sinfo --json` is grouped by partition and state with
  no per-node address, so nodes come from `scontrol show nodes --json`, whose `nodes` records
  carry `state` as a list (`["IDLE", "DRAIN"]`). `squeue --json` honours its filters and drops
  a job from the queue's answer as soon as it ends, numbers are `{set, infinite, number}`, and
  `job_state` is a list.

Every parser here is pure (text in, records out) and strict: an answer that is not a JSON
object, lacks the top-level list, has a record without a name, or has a field of the wrong type
raises `SlurmOutputError` naming the command, the version and what was wrong. Fields fthsdp does
not read are ignored, so additions in a later release do not break it; a changed field does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from slurm.records import JobInfo, NodeInfo, SlurmAwayOutput, SlurmOutputError, SlurmVersion

#: The releases whose real output the test-suite checks (tests/fixtures/slurm/<release>/).
TESTED_RELEASES = ("22.05", "24.11", "26.05")
OLDEST = SlurmVersion(22, 5, 0)
#: Releases after this series are refused until their output has been checked.
NEWEST_SERIES = (26, 5)
#: The first release whose `scontrol` speaks JSON; from here on nodes come from scontrol.
SCONTROL_JSON = SlurmVersion(23, 2, 0)

VERSION_COMMAND = ("scontrol", "--version")


def parse_version(text: str, argv: Sequence[str] = VERSION_COMMAND) -> SlurmVersion:
    """`slurm 24.11.5` (or Debian's `slurm-wlm 22.05.8`) -> SlurmVersion(24, 11, 5)."""
    m = re.fullmatch(r"\s*slurm(?:-wlm)?\s+(\d+)\.(\d+)\.(\d+)\S*\s*", text)
    if not m:
        raise SlurmOutputError(argv, None, f"no Slurm version in {text.strip()[:80]!r}")
    return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def check_supported(version: SlurmVersion, argv: Sequence[str] = VERSION_COMMAND) -> None:
    """Refuse a release whose JSON fthsdp cannot know: before 22.05, or after the newest tested."""
    if version < OLDEST or (version.major, version.minor) > NEWEST_SERIES:
        raise SlurmOutputError(
            argv,
            version,
            f"release {version.release} is not one fthsdp reads "
            f"({OLDEST.release} to {NEWEST_SERIES[0]:02d}.{NEWEST_SERIES[1]:02d}; "
            f"tested: {', '.join(TESTED_RELEASES)})",
        )


def nodes_argv(version: SlurmVersion, name: str | None = None) -> list[str]:
    """The command that lists per-node records on `version` (one node when `name` is given).

    22.05's `sinfo --json` ignores `-n`; it is passed anyway and the caller filters.
    """
    if version < SCONTROL_JSON:
        return ["sinfo", "--json"] + (["-n", name] if name else [])
    return ["scontrol", "--json", "show", "node"] + ([name] if name else [])


def jobs_argv(version: SlurmVersion, job_ids: Sequence[str], name: str | None) -> list[str]:
    """The squeue command for these jobs; on 23.02+ finished ones too (`--states=all`)."""
    argv = ["squeue", "--json"]
    if job_ids:
        argv.append(f"--jobs={','.join(job_ids)}")
    if name:
        argv.append(f"--name={name}")
    if version >= SCONTROL_JSON:
        argv.append("--states=all")
    return argv


# -- shared plumbing -------------------------------------------------------------------------


class _Reader:
    """Type-checked access to one answer, raising `SlurmOutputError` with the context."""

    def __init__(self, argv: Sequence[str], version: SlurmVersion) -> None:
        self.argv = list(argv)
        self.version = version

    def fail(self, what: str) -> SlurmOutputError:
        return SlurmOutputError(self.argv, self.version, what)

    def document(self, text: str, key: str) -> list[dict[str, Any]]:
        """The top-level list `key` of a JSON object whose `errors` list is empty."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise self.fail(f"not JSON ({exc}); starts {text.strip()[:60]!r}") from None
        if not isinstance(data, dict):
            raise self.fail(f"a JSON {type(data).__name__}, not an object")
        errors = data.get("errors", [])
        if not isinstance(errors, list):
            raise self.fail(f"'errors' is {type(errors).__name__}, not a list")
        if errors:
            what = f"Slurm reported errors: {_error_text(errors)}"
            if data.get(key) == [] and all(_away_error(e) for e in errors):
                raise SlurmAwayOutput(self.argv, self.version, what)
            raise self.fail(what)
        if key not in data:
            raise self.fail(f"no top-level {key!r} (keys: {', '.join(sorted(data)) or 'none'})")
        items = data[key]
        if not isinstance(items, list):
            raise self.fail(f"top-level {key!r} is {type(items).__name__}, not a list")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}] is {type(item).__name__}, not an object")
        return items

    def text(self, rec: dict[str, Any], where: str, key: str, required: bool = False) -> str:
        value = rec.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value):
            raise self.fail(f"{where}: {key!r} is {_shown(value)}, not a non-empty string")
        return value

    def texts(self, rec: dict[str, Any], where: str, key: str) -> tuple[str, ...]:
        value = rec.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{where}: {key!r} is {_shown(value)}, not a list of strings")
        return tuple(value)

    def number(self, rec: dict[str, Any], where: str, key: str, required: bool = False) -> int:
        """A plain int (22.05) or `{set, infinite, number}` (23.02+); unset counts as 0."""
        value = rec.get(key)
        if value is None and not required:
            return 0
        if isinstance(value, dict) and isinstance(value.get("number"), int):
            return int(value["number"]) if value.get("set", True) else 0
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise self.fail(f"{where}: {key!r} is {_shown(value)}, not a number")


def _shown(value: Any) -> str:
    if value is None:
        return "missing"
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


def _away_error(error: Any) -> bool:
    """22.05's JSON error for a slurmctld it could not reach (real captures under
    tests/fixtures/slurm_outage/22.05/): errno -1, "Unspecified error" or "Failed while looking
    for jobs"; any other error is Slurm's verdict."""
    if not isinstance(error, dict):
        return False
    errno = error.get("errno", error.get("error_number"))
    said = f"{error.get('error', '')} {error.get('description', '')}"
    return errno == -1 and ("Unspecified error" in said or "Failed while looking for" in said)


def _error_text(errors: list[Any]) -> str:
    parts = []
    for e in errors[:3]:
        if isinstance(e, dict):
            parts.append(str(e.get("description") or e.get("error") or e)[:120])
        else:
            parts.append(str(e)[:120])
    return "; ".join(parts)


# -- nodes -----------------------------------------------------------------------------------


def parse_sinfo_nodes(text: str, version: SlurmVersion, argv: Sequence[str]) -> list[NodeInfo]:
    """22.05 `sinfo --json`: `nodes` of records with `state` a string and `state_flags` a list."""
    r = _Reader(argv, version)

    def state(rec: dict[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
        return r.text(rec, where, "state", required=True), r.texts(rec, where, "state_flags")

    return _nodes(r, text, state)


def parse_scontrol_nodes(text: str, version: SlurmVersion, argv: Sequence[str]) -> list[NodeInfo]:
    """23.02+ `scontrol --json show node`: `nodes` of records with `state` a list of flags."""
    r = _Reader(argv, version)

    def state(rec: dict[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
        flags = r.texts(rec, where, "state")
        if not flags:
            raise r.fail(f"{where}: 'state' is {_shown(rec.get('state'))}, not a list of states")
        return flags[0], flags[1:]

    return _nodes(r, text, state)


def _nodes(
    r: _Reader,
    text: str,
    state: Callable[[dict[str, Any], str], tuple[str, tuple[str, ...]]],
) -> list[NodeInfo]:
    out: list[NodeInfo] = []
    for i, rec in enumerate(r.document(text, "nodes")):
        where = f"nodes[{i}]"
        name = r.text(rec, where, "name", required=True)
        where = f"node {name}"
        base, flags = state(rec, where)
        out.append(
            NodeInfo(
                name=name,
                state=base.lower(),
                flags=tuple(f.upper() for f in flags),
                reason=r.text(rec, where, "reason"),
                gres=r.text(rec, where, "gres"),
                partitions=r.texts(rec, where, "partitions"),
                address=r.text(rec, where, "address"),
            )
        )
    return out


def parse_nodes(text: str, version: SlurmVersion, argv: Sequence[str]) -> list[NodeInfo]:
    """The node parser for `version` (the one that reads what `nodes_argv(version)` prints)."""
    if version < SCONTROL_JSON:
        return parse_sinfo_nodes(text, version, argv)
    return parse_scontrol_nodes(text, version, argv)


# -- jobs ------------------------------------------------------------------------------------


def parse_squeue_jobs(text: str, version: SlurmVersion, argv: Sequence[str]) -> list[JobInfo]:
    """`squeue --json` (and `scontrol --json show job`): `jobs`, one record per het component.

    22.05 writes `job_state` as a string and numbers plain; 23.02+ a list and
    `{set, infinite, number}`. Both are read on either release; any other type is refused.
    """
    r = _Reader(argv, version)
    out = []
    for i, rec in enumerate(r.document(text, "jobs")):
        where = f"jobs[{i}]"
        job_id = r.number(rec, where, "job_id", required=True)
        where = f"job {job_id}"
        raw_state = rec.get("job_state")
        if isinstance(raw_state, str) and raw_state:
            state = raw_state
        elif (
            isinstance(raw_state, list) and raw_state and all(isinstance(s, str) for s in raw_state)
        ):
            state = raw_state[0]
        else:
            raise r.fail(f"{where}: 'job_state' is {_shown(raw_state)}, not a state")
        het_id = r.number(rec, where, "het_job_id")
        out.append(
            JobInfo(
                job_id=str(job_id),
                name=r.text(rec, where, "name"),
                state=state,
                nodes=r.text(rec, where, "nodes"),
                restarts=r.number(rec, where, "restart_cnt"),
                reason=r.text(rec, where, "state_reason"),
                het_job_id=str(het_id) if het_id else None,
                het_offset=r.number(rec, where, "het_job_offset"),
                eligible_time=r.number(rec, where, "eligible_time"),
                partition=r.text(rec, where, "partition"),
                comment=r.text(rec, where, "comment"),
                excluded=r.text(rec, where, "excluded_nodes"),
            )
        )
    return out
