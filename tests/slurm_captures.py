"""Where the real Slurm captures of each release live, and how tests read them.

`tests/fixtures/slurm/<release>/` holds byte-for-byte output of the dev cluster on each release
of the matrix (PROVENANCE.md there says how it was made). Per-node records come from a different
command per release: `sinfo --json` on 22.05, `scontrol show nodes --json` from 23.02 on.
"""

from __future__ import annotations

from pathlib import Path

from slurm.records import SlurmVersion
from slurm.slurm_json import parse_version

CAPTURES = Path(__file__).with_name("fixtures") / "slurm"
RELEASES = ("22.05", "24.11", "26.05")
#: The per-node source of each release, as captured (`<source>_<stage>.json`).
NODE_FILE = {"22.05": "sinfo", "24.11": "scontrol_show_nodes", "26.05": "scontrol_show_nodes"}


def capture(release: str, name: str) -> str:
    return (CAPTURES / release / name).read_text()


def version_of(release: str) -> SlurmVersion:
    return parse_version(capture(release, "scontrol_version.txt"))
