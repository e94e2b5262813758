"""The drain-request text: what the coordinator writes into its job's comment, what root reads."""

from __future__ import annotations

import pytest

from slurm.drain_request import DETAIL_MAX, MAGIC, TEXT_MAX, DrainRequest, parse, printable
from slurm.errors import InputError


def test_round_trip() -> None:
    req = DrainRequest.make(3, "node2", "straggler", "step time 3.1x the peers' median")
    assert parse(req.text()) == req


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("a\nb", "a b"),
        ("\x1b[31mred\x1b[0m", "[31mred [0m"),
        ('say "hi"', "say hi"),
        ("é" * 3, ""),
        ("x" * 500, "x" * DETAIL_MAX),
    ],
)
def test_detail_is_printable_one_line(raw: str, kept: str) -> None:
    assert printable(raw) == kept
    assert DrainRequest.make(1, "n1", "fault", raw).detail == kept


@pytest.mark.parametrize("comment", [None, "", "my own note", "fthsdp: xid: not a request"])
def test_other_comments_are_not_requests(comment: str | None) -> None:
    assert parse(comment) is None


@pytest.mark.parametrize(
    "comment",
    [
        f"{MAGIC} seq=1 node=node[1-2] kind=fault detail=x",
        f"{MAGIC} seq=1 node=node1 kind=manual detail=x",
        f"{MAGIC} seq=-1 node=node1 kind=fault detail=x",
        f"{MAGIC} seq=1 node=node1 kind=fault",
        f"{MAGIC} seq=1 node=node1 kind=fault detail=a\x1bb",
        f"{MAGIC} seq=1 node=node1 kind=fault detail=" + "x" * TEXT_MAX,
        f"{MAGIC} seq=1 node=node1 kind=fault detail=x\nseq=2",
    ],
)
def test_malformed_requests_are_refused_with_a_reason(comment: str) -> None:
    with pytest.raises(InputError):
        parse(comment)
