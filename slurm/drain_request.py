"""A run's request that root drain a node: the one channel from a job user to the root hooks.

A job user may not drain a node (only root, SlurmUser and Slurm operators may), but the run is
often the first to know a node is bad: a straggler, a silent replica, a hung trainer, an
operator's `fthsdp requeue --drain`. So the coordinator, as the job's owner, writes a request
into its own job's `Comment` (`scontrol update JobId=J Comment=...`, which Slurm lets only the
owner and operators do), then requeues the job. The Epilog runs as root on every node of the
ending job, reads the comment from slurmctld (never from a file the user controls), and accepts
the request only for the node it runs on (so only a node the job held), within the site's policy
and limits (`prolog_epilog.drain_requests`).

The text is one line: `fthsdp-drain-request/1 seq=N node=NAME kind=KIND detail=TEXT`. `seq`
makes a request idempotent (a requeued job's Epilog sees the same comment again); `kind` is one
of `KINDS` and is chosen by the coordinator's policy; `detail` is printable ASCII, bounded, and
only ever shown, never parsed. Anything else in a comment is not a request: a job's comment is
the user's to use for other things.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm.errors import InputError
from slurm.records import NODE_NAME

#: The marker and version every request starts with.
MAGIC = "fthsdp-drain-request/1"
#: Why the run asks for a drain; the hooks' policy may treat the kinds differently.
KINDS = ("straggler", "silent", "hung", "operator", "fault")
#: Longest detail kept (Slurm's drain reason is the detail's only reader).
DETAIL_MAX = 160
#: Longest comment accepted as a request at all.
TEXT_MAX = 400

_FIELDS = re.compile(
    rf"{re.escape(MAGIC)} seq=(?P<seq>[0-9]{{1,9}}) node=(?P<node>\S+) "
    r"kind=(?P<kind>[a-z]+) detail=(?P<detail>.*)"
)


def printable(text: str, limit: int = DETAIL_MAX) -> str:
    """`text` reduced to printable ASCII on one line (no control characters, no terminal
    escapes, no quotes that would need escaping in a drain reason), at most `limit` long."""
    kept = "".join(c if " " <= c <= "~" and c not in "\"'\\" else " " for c in text)
    return " ".join(kept.split())[:limit]


@dataclass(frozen=True)
class DrainRequest:
    """One request: drain `node` for `kind`; `detail` says why, for the reason and the log."""

    seq: int
    node: str
    kind: str
    detail: str

    def __post_init__(self) -> None:
        if not isinstance(self.seq, int) or not 0 <= self.seq < 10**9:
            raise InputError("seq", self.seq, "an integer in 0..999999999")
        if not isinstance(self.node, str) or not NODE_NAME.fullmatch(self.node):
            raise InputError("node", self.node, "one Slurm node name (no hostlist)")
        if self.kind not in KINDS:
            raise InputError("kind", self.kind, f"one of {', '.join(KINDS)}")
        if self.detail != printable(self.detail):
            raise InputError("detail", self.detail, f"printable ASCII, at most {DETAIL_MAX}")

    @classmethod
    def make(cls, seq: int, node: str, kind: str, detail: str) -> DrainRequest:
        """A request with `detail` made printable first (a leader's text may be anything)."""
        return cls(seq, node, kind, printable(detail))

    def text(self) -> str:
        return f"{MAGIC} seq={self.seq} node={self.node} kind={self.kind} detail={self.detail}"


def parse(comment: str | None) -> DrainRequest | None:
    """The request in a job comment, or None when the comment is not one.

    Strict: a comment that starts with the marker but is malformed raises `InputError` naming
    what is wrong, so the hook can log a refused request instead of ignoring it silently.
    """
    if not comment or not comment.startswith(MAGIC):
        return None
    if len(comment) > TEXT_MAX or "\n" in comment:
        raise InputError("comment", comment[:80], f"one line of at most {TEXT_MAX} characters")
    m = _FIELDS.fullmatch(comment)
    if m is None:
        raise InputError("comment", comment[:80], f"'{MAGIC} seq=N node=NAME kind=KIND detail=...'")
    return DrainRequest(int(m["seq"]), m["node"], m["kind"], m["detail"])
