"""`ft.record(loss=...)`: what a trainer may record per step, and what it writes.

Each value becomes a plain float in one `metrics` record of the replica's progress file, keyed
by the step being trained; a bad call raises `MetricError` naming the metric and what is allowed
(on every rank alike, before anything is written).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from runtime.api import FTHSDP, MAX_METRICS, MetricError, metric_values


@pytest.mark.parametrize(
    ("scalars", "expected"),
    [
        ({"loss": 1.5}, {"loss": 1.5}),
        ({"loss": 2}, {"loss": 2.0}),
        ({"loss": torch.tensor(0.25)}, {"loss": 0.25}),
        ({"loss": torch.tensor([3.0], requires_grad=True)}, {"loss": 3.0}),
        ({"a.b_C9": 1.0, "lr": 1e-3}, {"a.b_C9": 1.0, "lr": 1e-3}),
        ({f"m{i}": float(i) for i in range(MAX_METRICS)}, {f"m{i}": float(i) for i in range(16)}),
    ],
)
def test_metric_values(scalars: dict[str, Any], expected: dict[str, float]) -> None:
    got = metric_values(scalars)
    assert got == expected and all(type(v) is float for v in got.values())


@pytest.mark.parametrize(
    ("scalars", "says"),
    [
        ({}, "no metric given"),
        ({f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}, "at most 16"),
        ({"bad name": 1.0}, "metric name 'bad name'"),
        ({"x" * 33: 1.0}, "1-32 of"),
        ({"loss": math.nan}, "a finite number"),
        ({"loss": math.inf}, "a finite number"),
        ({"loss": torch.tensor(float("nan"))}, "a finite number"),
        ({"loss": "0.5"}, "(str); a number"),
        ({"loss": True}, "(bool); a number"),
        ({"loss": None}, "a number"),
        ({"loss": torch.ones(2)}, "tensor of 2 elements"),
    ],
)
def test_bad_metrics_raise_one_clear_error(scalars: dict[str, Any], says: str) -> None:
    with pytest.raises(MetricError, match=r"^ft\.record: ") as info:
        metric_values(scalars)
    assert says in str(info.value)
    assert "\n" not in str(info.value)


def _worker(plan_step: int | None, committed: int) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """The parts of a worker `record` uses: the step plan, the committed step, `event`."""
    written: list[tuple[str, dict[str, Any]]] = []
    plan = None if plan_step is None else SimpleNamespace(step=plan_step)
    ft = SimpleNamespace(
        steps=SimpleNamespace(plan=plan),
        step=committed,
        event=lambda event, **fields: written.append((event, fields)),
    )
    return ft, written


@pytest.mark.parametrize(("plan_step", "step"), [(7, 7), (None, 3)])
def test_record_writes_one_metrics_event_with_the_step(plan_step: int | None, step: int) -> None:
    ft, written = _worker(plan_step, 3)
    FTHSDP.record(ft, loss=torch.tensor(0.5), acc=1)
    assert written == [("metrics", {"step": step, "metrics": {"loss": 0.5, "acc": 1.0}})]


def test_a_bad_record_writes_nothing() -> None:
    ft, written = _worker(7, 6)
    with pytest.raises(MetricError):
        FTHSDP.record(ft, loss=1.0, other=math.nan)
    assert written == []
