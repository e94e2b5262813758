"""The coordinator-side monitor: reports in, one decision per change, evictions counted."""

from __future__ import annotations

from runtime.control.straggler.detect import describe
from runtime.control.straggler.evict import EvictionConfig
from runtime.control.straggler.monitor import StragglerMonitor
from runtime.protocol import ReplicaReport


def feed(
    mon: StragglerMonitor,
    steps: range,
    slow: dict[int, float],
    incarnations: dict[int, str],
    t0: float,
    healing: frozenset[int] = frozenset(),
    slow_from: int = 10,
) -> list[tuple[int, str, str]]:
    """Every replica reports each step, the `slow` ones slowed from step `slow_from` on (their
    own pace is known from the steps before); returns the decisions as (step, action, text)."""
    out: list[tuple[int, str, str]] = []
    seq = 0
    for step in steps:
        t = t0 + step * 0.5
        for r in range(len(incarnations)):
            seq += 1
            compute = 0.2 * (slow.get(r, 1.0) if step >= slow_from else 1.0)
            rep = ReplicaReport(
                replica=r,
                incarnation=incarnations[r],
                seq=seq,
                step=step,
                healing=r in healing,
                step_time_s=0.2 * max(slow.values(), default=1.0) + 0.05,
                compute_s=compute,
                nodes=[f"node{r + 1}"],
                rank_compute_s=[compute, 0.2],
            )
            mon.observe(rep, t + r * 0.001)
        for d in mon.decisions(participants=len(incarnations), now=t):
            out.append((step, d.action, d.reason or d.why))
    return out


def test_one_eviction_per_straggler_then_cap_and_cost_measured() -> None:
    mon = StragglerMonitor(evict=EvictionConfig(max_evictions=1), total_steps=100_000)
    inc = {0: "a0", 1: "a1", 2: "a2"}
    got = feed(mon, range(0, 120), {1: 2.0}, inc, t0=0.0)
    assert got == [(59, "evict", "fthsdp: straggler: node2 2.0x")]
    assert mon.evictions == 1
    (v,) = [v for v in mon.verdicts() if v.replica == 1]
    assert describe(v).startswith("straggler 2.0x node2 (")

    # The replica comes back as a new incarnation 20 s later: heals one step, then trains.
    inc[1] = "b1"
    assert feed(mon, range(160, 161), {}, inc, t0=0.0, healing=frozenset({1})) == []
    assert feed(mon, range(161, 170), {}, inc, t0=0.0) == []
    assert len(mon.requeue_costs) == 1
    assert 50.9 < mon.requeue_costs[0] < 51.1  # noted at step 59 (29.5 s), back at 80.5 s

    # Replica 2 slows down now: the cap (1) is reached, so it is reported once, not evicted.
    got = feed(mon, range(170, 300), {2: 2.0}, inc, t0=0.0, slow_from=170)
    assert got == [(219, "report", "eviction cap reached (1/1)")]


def test_two_slow_of_three_is_no_reference() -> None:
    mon = StragglerMonitor(total_steps=100_000)
    inc = {0: "a0", 1: "a1", 2: "a2"}
    assert feed(mon, range(0, 120), {1: 2.0, 2: 2.0}, inc, t0=0.0) == []


def test_two_stragglers_at_once_evict_one_at_a_time() -> None:
    mon = StragglerMonitor(total_steps=100_000)
    inc = {0: "a0", 1: "a1", 2: "a2", 3: "a3"}
    got = feed(mon, range(0, 60), {1: 2.0, 3: 2.0}, inc, t0=0.0)
    assert got == [
        (59, "evict", "fthsdp: straggler: node2 2.0x"),
        (59, "report", "another eviction or requeue is in flight"),
    ]


def test_near_the_end_it_only_reports() -> None:
    mon = StragglerMonitor(total_steps=60)
    got = feed(mon, range(0, 60), {0: 2.0}, {0: "a", 1: "b", 2: "c"}, t0=0.0)
    assert [(s, a) for s, a, _ in got] == [(59, "report")]
    assert "does not pay" in got[0][2]
