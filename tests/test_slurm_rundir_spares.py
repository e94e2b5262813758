"""`slurm.rundir.spares`: the pool file `spares.json` is read strictly or refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm.rundir import PoolFileError, read_pool


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"slots": []},  # no target
        {"target": -1},
        {"target": 1, "slots": [{"job_id": "1; rm -rf /"}]},
        {"target": 1, "slots": [{"job_id": "1", "replica": 0, "script": "../../bin/sh"}]},
        {"target": 1, "slots": [{"job_id": "1", "replica": 0}]},  # a replica without its script
        {"target": 1, "slots": [{"job_id": "1", "replica": -2, "script": "replica-00.sbatch"}]},
    ],
)
def test_a_bad_pool_file_is_refused(tmp_path: Path, data: object) -> None:
    (tmp_path / "spares.json").write_text(json.dumps(data))
    with pytest.raises(PoolFileError, match=r"spares\.json"):
        read_pool(tmp_path)


def test_no_pool_file_means_no_spares(tmp_path: Path) -> None:
    assert read_pool(tmp_path) is None
