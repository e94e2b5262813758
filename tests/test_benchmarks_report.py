"""benchmarks/report.py rewrites only the regions it owns and refuses JSON it cannot read;
benchmarks/harness.py interleaves configurations and takes ratios within a repeat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import harness, report

PAGE = """# Benchmarks

Intro kept.

<!-- BEGIN generated: overhead -->
old overhead text
<!-- END generated: overhead -->

## Someone else's section
kept as it is

<!-- BEGIN generated: recovery -->
old recovery text
<!-- END generated: recovery -->
"""


def test_rewrite_touches_only_owned_regions() -> None:
    new, done, missing = report.rewrite(PAGE, {"overhead": "NEW\n", "control_load": "X\n"})
    assert done == ["overhead"] and missing == ["control_load"]
    assert "NEW\n<!-- END generated: overhead -->" in new
    assert "old overhead text" not in new
    # regions without a JSON and text outside regions are left exactly as they were
    assert "old recovery text" in new and "## Someone else's section\nkept as it is" in new
    assert new.replace("NEW\n", "old overhead text\n") == PAGE


def _result(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "overhead",
        "title": "Runtime overhead",
        "script": "benchmarks/overhead.py",
        "setup": "setup text",
        "repeats": 5,
        "provenance": {"date": "2026-11-30 15:00 UTC", "loadavg_start": [1.0, 2.0, 3.0]},
        "rows": [
            {"figure": "ratio", **harness.summary([1.0, 1.1, 0.9]), "unit": "x", "target": "≤ 1.05"}
        ],
    }
    data.update(changes)
    return data


def test_render_shows_median_range_and_provenance(tmp_path: Path) -> None:
    path = tmp_path / "overhead.json"
    path.write_text(json.dumps(_result()))
    text = report.render(report.load(path))
    assert "| ratio | 1.000× | 0.900× – 1.100× | 3 | ≤ 1.05 |" in text
    assert "2026-11-30 15:00 UTC" in text and "1.00 / 2.00 / 3.00" in text


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        json.dumps({"name": "x"}),
        json.dumps(_result(rows=[{"figure": "no numbers"}])),
    ],
)
def test_load_refuses_unknown_shapes(tmp_path: Path, data: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(data)
    with pytest.raises(report.ShapeError, match=r"bad\.json"):
        report.load(path)


def test_interleave_rotates_and_ratios_pair_repeats() -> None:
    order: list[str] = []
    values = {"a": iter([1.0, 2.0, 3.0]), "b": iter([2.0, 4.0, 3.0])}

    def make(name: str) -> object:
        def run() -> float:
            order.append(name)
            return next(values[name])

        return run

    got = harness.interleave({"a": make("a"), "b": make("b")}, 3)  # type: ignore[dict-item]
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert harness.ratios(got, "a", "b") == [0.5, 0.5, 1.0]
    assert harness.summary(harness.ratios(got, "a", "b"))["median"] == 0.5
