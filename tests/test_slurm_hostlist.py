"""`slurm.hostlist`: expansion, compression and a job's nodes, by tables."""

from __future__ import annotations

import pytest

from slurm import hostlist
from slurm.errors import InputError


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("node1", ["node1"]),
        ("node[1-3],gpu7", ["node1", "node2", "node3", "gpu7"]),
        ("node[09-10]", ["node09", "node10"]),
    ],
)
def test_expand_and_compress_round_trip(value: str, names: list[str]) -> None:
    assert hostlist.expand(value) == names
    assert sorted(hostlist.expand(hostlist.compress(names))) == sorted(names)


def test_a_bad_hostlist_is_an_input_error_naming_where() -> None:
    with pytest.raises(InputError) as err:
        hostlist.expand("node[3-1", "replicas.exclude")
    assert err.value.field == "replicas.exclude"
    assert "a valid hostlist" in err.value.allowed


@pytest.mark.parametrize(
    ("nodes", "names"),
    [
        ("", []),
        ("(null)", []),
        ("None assigned", []),
        ("node[1-2]", ["node1", "node2"]),
    ],
)
def test_job_nodes_of_a_pending_job_are_none(nodes: str, names: list[str]) -> None:
    assert hostlist.job_nodes(nodes) == names
