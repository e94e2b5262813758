"""The per-release parsers of `slurm.slurm_json` on real captures of each release, and their
refusals of every shape they do not know.

The golden files are `tests/fixtures/slurm/<release>/` (see PROVENANCE.md there): real output of
the dev cluster on Slurm 22.05, 24.11 and 26.05. The stages are the same on each release: node4
drained by fthsdp while job 1 runs on node1 and het job 2 (+3) runs; then node4 drained by an
admin (`admin: fan swap`) and node1 by another (`RMA ticket 4711`); then jobs 1 and 4 cancelled.
Unknown shapes are made from those same captures by changing one thing in each.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from slurm_captures import NODE_FILE, RELEASES, capture, version_of

from slurm.records import (
    NodeInfo,
    SlurmCommandError,
    SlurmOutputError,
    SlurmVersion,
)
from slurm.slurm_json import (
    check_supported,
    jobs_argv,
    nodes_argv,
    parse_nodes,
    parse_scontrol_nodes,
    parse_sinfo_nodes,
    parse_squeue_jobs,
    parse_version,
)


def nodes_of(release: str, stage: str) -> dict[str, NodeInfo]:
    version = version_of(release)
    text = capture(release, f"{NODE_FILE[release]}_{stage}.json")
    return {n.name: n for n in parse_nodes(text, version, nodes_argv(version))}


# -- versions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "expected"),
    [("22.05", (22, 5, 8)), ("24.11", (24, 11, 5)), ("26.05", (26, 5, 5))],
)
def test_version_of_each_release(release: str, expected: tuple[int, int, int]) -> None:
    version = version_of(release)
    assert (version.major, version.minor, version.micro) == expected
    assert version.release == release
    check_supported(version)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm 24.11.5\n", "24.11.5"),
        ("slurm-wlm 22.05.8\n", "22.05.8"),
        ("slurm 26.05.0-0rc1\n", "26.05.0"),
    ],
)
def test_version_texts(text: str, expected: str) -> None:
    assert str(parse_version(text)) == expected


@pytest.mark.parametrize(
    "text",
    ["", "slurm 24.11", "scontrol: fatal: Could not establish a configuration source", "24.11.5"],
)
def test_unreadable_version_names_the_command(text: str) -> None:
    with pytest.raises(SlurmOutputError) as info:
        parse_version(text)
    assert "scontrol --version" in str(info.value) and "no Slurm version" in str(info.value)


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        (SlurmVersion(21, 8, 8), False),
        (SlurmVersion(22, 5, 0), True),
        (SlurmVersion(23, 11, 10), True),
        (SlurmVersion(26, 5, 9), True),
        (SlurmVersion(26, 11, 0), False),
        (SlurmVersion(27, 5, 0), False),
    ],
)
def test_supported_releases(version: SlurmVersion, ok: bool) -> None:
    if ok:
        check_supported(version)
    else:
        with pytest.raises(SlurmOutputError, match=f"release {version.release} is not one"):
            check_supported(version)


def test_commands_per_release() -> None:
    old, new = version_of("22.05"), version_of("24.11")
    assert nodes_argv(old) == ["sinfo", "--json"]
    assert nodes_argv(old, "node1") == ["sinfo", "--json", "-n", "node1"]
    assert nodes_argv(new) == ["scontrol", "--json", "show", "node"]
    assert nodes_argv(new, "node1") == ["scontrol", "--json", "show", "node", "node1"]
    assert jobs_argv(old, ["1"], None) == ["squeue", "--json", "--jobs=1"]
    assert jobs_argv(new, ["1", "2"], "x") == [
        "squeue",
        "--json",
        "--jobs=1,2",
        "--name=x",
        "--states=all",
    ]


def test_22_05_scontrol_has_no_json() -> None:
    """Why 22.05 reads nodes from sinfo: its scontrol refuses --json (captured)."""
    failed = capture("22.05", "scontrol_show_nodes_idle.json.fail.txt")
    assert "exit: 1" in failed and "unrecognized option '--json'" in failed


# -- nodes: one test per shape per release ---------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
def test_idle_nodes_have_addresses_gres_and_partitions(release: str) -> None:
    nodes = nodes_of(release, "idle")
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    for n in nodes.values():
        assert (n.state, n.flags, n.reason, n.address) == ("idle", (), "", "127.0.0.1")
        assert n.gres.startswith("gpu:h100:8") and n.partitions == ("gpu",)
        assert not n.drained and not n.foreign_reason


@pytest.mark.parametrize("release", RELEASES)
def test_our_drain_is_ours(release: str) -> None:
    nodes = nodes_of(release, "busy")
    node4 = nodes["node4"]
    assert node4.drained and node4.drained_by_us and not node4.foreign_reason
    assert node4.reason == "fthsdp: ecc: uncorrectable errors on GPU 3"
    assert nodes["node1"].state == "mixed" and not nodes["node1"].drained


@pytest.mark.parametrize("release", RELEASES)
def test_admin_drains_are_not_ours(release: str) -> None:
    nodes = nodes_of(release, "admin_drain")
    assert nodes["node4"].reason == "admin: fan swap"
    assert nodes["node1"].reason == "RMA ticket 4711"
    assert nodes["node1"].state == "mixed"  # drained under its running job
    for name in ("node1", "node4"):
        assert nodes[name].drained and nodes[name].foreign_reason
        assert not nodes[name].drained_by_us


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_grouped_sinfo_of_later_releases_is_refused(release: str) -> None:
    """24.11+ `sinfo --json` groups nodes without addresses: reading it as nodes is an error."""
    version = version_of(release)
    text = capture(release, "sinfo_busy.json")
    for parse in (parse_sinfo_nodes, parse_scontrol_nodes):
        with pytest.raises(SlurmOutputError) as info:
            parse(text, version, ["sinfo", "--json"])
        message = str(info.value)
        assert message.startswith(f"sinfo --json on Slurm {version}: unexpected output: ")
        assert "no top-level 'nodes' (keys: errors, meta, sinfo, warnings)" in message


@pytest.mark.parametrize(("other", "release"), [("22.05", "24.11"), ("24.11", "22.05")])
def test_one_release_parser_refuses_the_other_shape(other: str, release: str) -> None:
    """22.05's `state` is a string plus `state_flags`, 24.11's a list: neither reads as other."""
    version = version_of(release)
    text = capture(other, f"{NODE_FILE[other]}_busy.json")
    with pytest.raises(SlurmOutputError, match="node node1: 'state' is"):
        parse_nodes(text, version, nodes_argv(version))


# -- jobs ------------------------------------------------------------------------------------


def jobs_of(release: str, name: str) -> dict[str, Any]:
    version = version_of(release)
    return {
        j.job_id: j
        for j in parse_squeue_jobs(capture(release, name), version, jobs_argv(version, [], None))
    }


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_busy(release: str) -> None:
    jobs = jobs_of(release, "squeue_busy.json")
    assert sorted(jobs) == ["1", "2", "3", "4"]
    one, lead, second, pending = jobs["1"], jobs["2"], jobs["3"], jobs["4"]
    assert (one.state, one.nodes, one.het_job_id, one.base_id) == ("RUNNING", "node1", None, "1")
    assert (lead.het_job_id, lead.het_offset, second.het_job_id, second.het_offset) == (
        "2",
        0,
        "2",
        1,
    )
    assert second.base_id == "2" and second.state == "RUNNING"
    assert (pending.state, pending.nodes, pending.reason) == ("PENDING", "", "Resources")
    assert one.restarts == 0 and one.eligible_time > 1_700_000_000 and one.partition == "gpu"


@pytest.mark.parametrize("release", RELEASES)
def test_finished_jobs_are_kept_with_states_all(release: str) -> None:
    jobs = jobs_of(release, "squeue_states_all_cancelled.json")
    assert (jobs["1"].state, jobs["4"].state) == ("CANCELLED", "CANCELLED")
    done = jobs_of(release, "squeue_states_all_completed.json")
    assert done["5"].state == "COMPLETED"


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_plain_squeue_of_later_releases_drops_finished_jobs(release: str) -> None:
    """Why `jobs_argv` adds `--states=all` from 23.02 on: without it a cancelled job is gone."""
    assert "1" not in jobs_of(release, "squeue_cancelled.json")
    assert jobs_of(release, "squeue_completed.json") == {}


def test_plain_squeue_of_22_05_keeps_finished_jobs() -> None:
    assert jobs_of("22.05", "squeue_cancelled.json")["1"].state == "CANCELLED"
    assert jobs_of("22.05", "squeue_completed.json")["5"].state == "COMPLETED"


@pytest.mark.parametrize("release", ["24.11", "26.05"])
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("running", {"1": "RUNNING"}),
        ("pending", {"4": "PENDING"}),
        ("het", {"2": "RUNNING", "3": "RUNNING"}),
        ("cancelled", {"1": "CANCELLED"}),
        ("completed", {"5": "COMPLETED"}),
    ],
)
def test_scontrol_show_job_json(release: str, name: str, expected: dict[str, str]) -> None:
    jobs = jobs_of(release, f"scontrol_show_job_{name}.json")
    assert {k: j.state for k, j in jobs.items()} == expected


# -- unknown shapes --------------------------------------------------------------------------


def _edit(text: str, change: Callable[[Any], Any]) -> str:
    data = json.loads(text)
    out = change(data)
    return json.dumps(data if out is None else out)


def _first(key: str, field: str, value: Any) -> Callable[[Any], None]:
    def change(data: Any) -> None:
        if value is _DROP:
            del data[key][0][field]
        else:
            data[key][0][field] = value

    return change


_DROP = object()

NODE_SHAPES: list[tuple[str, Callable[[Any], Any], str]] = [
    ("not an object", lambda d: d["nodes"], "a JSON list, not an object"),
    (
        "no nodes key",
        lambda d: {k: v for k, v in d.items() if k != "nodes"},
        "no top-level 'nodes'",
    ),
    ("nodes not a list", lambda d: {**d, "nodes": {"node1": {}}}, "'nodes' is dict, not a list"),
    ("record not an object", lambda d: {**d, "nodes": ["node1"]}, "nodes[0] is str"),
    ("record without name", _first("nodes", "name", _DROP), "nodes[0]: 'name' is missing"),
    ("empty name", _first("nodes", "name", ""), "nodes[0]: 'name' is str"),
    ("name of wrong type", _first("nodes", "name", 7), "nodes[0]: 'name' is int"),
    ("state of wrong type", _first("nodes", "state", 3), "node node1: 'state' is int"),
    ("no state", _first("nodes", "state", _DROP), "node node1: 'state' is missing"),
    ("reason of wrong type", _first("nodes", "reason", ["x"]), "'reason' is list"),
    ("address of wrong type", _first("nodes", "address", 1), "'address' is int"),
    ("partitions of wrong type", _first("nodes", "partitions", "gpu"), "'partitions' is str"),
    (
        "errors reported",
        lambda d: {**d, "errors": [{"description": "Unable to contact slurm controller"}]},
        "Slurm reported errors: Unable to contact slurm controller",
    ),
]


def _refused(
    parse: Callable[[str, SlurmVersion, list[str]], Any],
    release: str,
    name: str,
    argv: list[str],
    change: Callable[[Any], Any],
    what: str,
) -> None:
    """`parse` on capture `name` changed by `change` raises, naming command, version and `what`."""
    version = version_of(release)
    with pytest.raises(SlurmOutputError) as info:
        parse(_edit(capture(release, name), change), version, argv)
    message = str(info.value)
    assert message.startswith(f"{' '.join(argv)} on Slurm {version}: unexpected output: ")
    assert what in message, message
    assert isinstance(info.value, SlurmCommandError)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("label", "change", "what"), NODE_SHAPES, ids=[s[0] for s in NODE_SHAPES])
def test_unknown_node_shapes_raise(
    release: str, label: str, change: Callable[[Any], Any], what: str
) -> None:
    argv = nodes_argv(version_of(release))
    _refused(parse_nodes, release, f"{NODE_FILE[release]}_busy.json", argv, change, what)


@pytest.mark.parametrize("text", ["", "sinfo: error: oops", "[]", "null", '"nodes"'])
def test_non_object_answers_raise(text: str) -> None:
    version = version_of("24.11")
    with pytest.raises(SlurmOutputError, match="unexpected output"):
        parse_nodes(text, version, nodes_argv(version))
    with pytest.raises(SlurmOutputError, match="unexpected output"):
        parse_squeue_jobs(text, version, ["squeue", "--json"])


JOB_SHAPES: list[tuple[str, Callable[[Any], Any], str]] = [
    ("no jobs key", lambda d: {k: v for k, v in d.items() if k != "jobs"}, "no top-level 'jobs'"),
    ("jobs not a list", lambda d: {**d, "jobs": {}}, "'jobs' is dict, not a list"),
    ("job without id", _first("jobs", "job_id", _DROP), "jobs[0]: 'job_id' is missing"),
    ("id as text", _first("jobs", "job_id", "1"), "jobs[0]: 'job_id' is str"),
    ("state missing", _first("jobs", "job_state", _DROP), "job 1: 'job_state' is missing"),
    ("state as object", _first("jobs", "job_state", {"current": "RUNNING"}), "'job_state' is dict"),
    ("empty state list", _first("jobs", "job_state", []), "'job_state' is list"),
    ("restarts as text", _first("jobs", "restart_cnt", "0"), "'restart_cnt' is str"),
    ("nodes as list", _first("jobs", "nodes", ["node1"]), "'nodes' is list"),
]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("label", "change", "what"), JOB_SHAPES, ids=[s[0] for s in JOB_SHAPES])
def test_unknown_job_shapes_raise(
    release: str, label: str, change: Callable[[Any], Any], what: str
) -> None:
    argv = jobs_argv(version_of(release), ["1"], None)
    _refused(parse_squeue_jobs, release, "squeue_busy.json", argv, change, what)


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_nodes_as_jobs_is_refused(release: str) -> None:
    version = version_of(release)
    with pytest.raises(SlurmOutputError, match="no top-level 'jobs'"):
        parse_squeue_jobs(capture(release, "sinfo_busy.json"), version, ["squeue", "--json"])
