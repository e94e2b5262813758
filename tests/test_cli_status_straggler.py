"""`fthsdp status` shows the coordinator's straggler verdicts with the decision taken."""

from __future__ import annotations

from pathlib import Path

from fthsdp_cli.commands.status import straggler_rows
from runtime.control.client import fetch_state


def test_straggler_rows_join_verdicts_and_decisions() -> None:
    view = {
        "stragglers": [
            {"replica": 1, "state": "straggler", "factor": 2.0, "slow_node": "node4", "steps": 52},
            {"replica": 2, "state": "suspect", "factor": 1.6, "slow_node": None, "steps": 3},
        ],
        "straggler_decisions": [{"replica": 1, "action": "evict", "why": "pays: 2000s > 120s"}],
    }
    rows = straggler_rows(view)
    assert [(r["replica"], r["action"]) for r in rows] == [(1, "evict"), (2, None)]
    assert rows[0]["why"].startswith("pays")


def test_no_control_plane_means_no_view(tmp_path: Path) -> None:
    assert fetch_state(tmp_path) is None
    (tmp_path / "control.json").write_text('{"coordinator": "http://127.0.0.1:9"}')
    assert fetch_state(tmp_path, timeout=0.5) is None
