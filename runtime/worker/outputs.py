"""Files a worker leaves in the run directory, readable without importing torch.

The launcher and the tests read these to judge a run; keeping their names here (not in
`runtime.api` or the other worker modules, which import torch) lets them do so from a
torch-free process.
"""

from __future__ import annotations

from pathlib import Path

#: Written to the run directory by the leaders that complete the last step.
FINISHED_MARKER = "finished"


def list_final_shards(run_dir: Path) -> dict[int, dict[int, Path]]:
    """replica -> rank -> final shard file, as written by `FTHSDP.finish`."""
    out: dict[int, dict[int, Path]] = {}
    for path in sorted((run_dir / "final").glob("r*_rank*.pt")):
        replica, rank = path.stem[1:].split("_rank")
        out.setdefault(int(replica), {})[int(rank)] = path
    return out
