"""The simulator's hot spares: the slot rule of thumb, ETTR vs K, and the options, by tables."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from runtime.sim import PRESETS, spares_sweep
from slurm.errors import InputError

PER_18_MIN = 1 / 1080  # the paper's job: a failure every 18 minutes


def spare_slots_needed(failures_per_s: float, refill_s: float, availability: float = 0.95) -> int:
    """Spare slots so that a failure finds a free one with probability >= `availability`.

    Each failure takes a slot for as long as its refill waits (allocation + the queue), so the
    slots in use are an M/G/inf queue: Poisson with mean m = lambda * T_refill. The answer is the
    smallest K with P(Poisson(m) <= K - 1) >= availability; close to ceil(m + z * sqrt(m)) + 1
    (z = 1.64 for 95 %), the rule of thumb in docs/simulator.md.
    """
    if not (failures_per_s >= 0 and math.isfinite(failures_per_s)):
        raise InputError("failures_per_s", failures_per_s, "must be a finite number >= 0")
    if not (refill_s >= 0 and math.isfinite(refill_s)):
        raise InputError("refill_s", refill_s, "must be a finite number >= 0")
    if not 0 < availability < 1:
        raise InputError("availability", availability, "must be between 0 and 1 (exclusive)")
    m = failures_per_s * refill_s
    if failures_per_s == 0:
        return 0  # no failure ever needs a slot
    term = math.exp(-m)  # P(Poisson(m) = 0)
    cdf, k = term, 0
    while cdf < availability:
        k += 1
        term *= m / k
        cdf += term
        if k > 100_000:  # pragma: no cover - absurd inputs; the loop must end
            raise InputError("refill_s", refill_s, "needs fewer than 100,000 slots")
    return k + 1


@pytest.mark.parametrize(
    ("rate", "refill_s", "availability", "slots"),
    [
        (0.0, 3600, 0.95, 0),  # no failures: no spare needed
        (PER_18_MIN, 0, 0.95, 1),  # instant refill: one slot covers every failure
        (PER_18_MIN, 600, 0.95, 3),  # m = 0.56
        (PER_18_MIN, 3600, 0.95, 8),  # m = 3.3: ceil(3.3 + 1.64 * 1.83) + 1 = 8
        (PER_18_MIN, 3600, 0.99, 9),
        (PER_18_MIN, 36_000, 0.95, 44),  # m = 33: ceil(33.3 + 9.5) + 1 = 44
    ],
)
def test_spare_slots_needed(rate: float, refill_s: float, availability: float, slots: int) -> None:
    assert spare_slots_needed(rate, refill_s, availability) == slots
    m = rate * refill_s
    if m > 1:  # the rule of thumb in docs/simulator.md is within one slot of the exact answer
        rule = math.ceil(m + (1.64 if availability == 0.95 else 2.33) * math.sqrt(m)) + 1
        assert abs(rule - slots) <= 1


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1.0, 10.0), "failures_per_s"),
        ((1.0, math.inf), "refill_s"),
        ((1.0, 1.0, 1.0), "availability"),
    ],
)
def test_spare_slots_needed_refuses(args: tuple[float, ...], field: str) -> None:
    with pytest.raises(InputError) as err:
        spare_slots_needed(*args)
    assert err.value.field == field


BUSY = PRESETS["paper-100k"].with_changes(queue_wait_s=3600.0, runs=20, days=10.0)
SLOT = BUSY.nodes // BUSY.replicas  # 1024 nodes: a slot is a whole replica


def test_spares_buy_ettr_on_a_busy_cluster_and_cost_nodes() -> None:
    sweep = spares_sweep(BUSY, [0, SLOT - 1, SLOT, 4 * SLOT], kinds=("cold",))
    rows = {r["spare_nodes"]: r for r in sweep}
    # Fewer nodes than one replica make no slot: the same run as none (same random stream).
    assert rows[SLOT - 1]["spare_slots"] == 0 and rows[SLOT - 1]["ettr"] == rows[0]["ettr"]
    assert rows[0]["spare_moves_per_day"] == 0
    assert rows[0]["ettr"] < rows[SLOT]["ettr"] < rows[4 * SLOT]["ettr"]
    assert (
        rows[0]["recovery_s_mean"]
        > rows[SLOT]["recovery_s_mean"]
        > rows[4 * SLOT]["recovery_s_mean"]
    )
    # A slot is 1/12 of the job: counted over every node held, 4 slots cost more than they buy.
    held = rows[4 * SLOT]["ettr_per_node_held"]
    assert held == pytest.approx(rows[4 * SLOT]["ettr"] * BUSY.nodes / (BUSY.nodes + 4 * SLOT))
    assert held < rows[0]["ettr_per_node_held"]


def test_warm_slots_skip_the_start_of_the_replicas_processes() -> None:
    rows = spares_sweep(BUSY, [0, 4 * SLOT])
    assert [(r["spare_nodes"], r["spare_kind"]) for r in rows] == [
        (0, "-"),
        (4 * SLOT, "cold"),
        (4 * SLOT, "warm"),
    ]
    none, cold, warm = rows
    # The same stream: about the same failures find a slot (not exactly: a replica back sooner
    # changes what later failures meet), and the warm one is back sooner.
    assert warm["spare_moves_per_day"] == pytest.approx(cold["spare_moves_per_day"], rel=0.05)
    assert warm["recovery_s_mean"] < cold["recovery_s_mean"] < none["recovery_s_mean"]
    assert warm["ettr"] > cold["ettr"] > none["ettr"]
    # What a warm move saves is the replica's NCCL start, nothing else.
    saved = BUSY.nccl_init_s(BUSY.replica_gpus)
    moved = cold["spare_moves_per_day"] / (cold["failures_per_day"] or 1)
    gain = cold["recovery_s_mean"] - warm["recovery_s_mean"]
    assert gain == pytest.approx(saved * moved, rel=0.25), (gain, saved, moved)


def test_an_idle_cluster_is_unchanged_by_the_queue_model() -> None:
    idle = PRESETS["paper-100k"].with_changes(runs=10, days=5.0)
    assert idle.queue_wait_s == 0 and idle.spare_nodes == 0
    (row,) = spares_sweep(idle, [0])
    # Without a queue, a requeued replica is back after detection + 20-40 s allocation + NCCL.
    assert row["recovery_s_mean"] < 400


@pytest.mark.parametrize(
    ("field", "value"),
    [("spare_nodes", -1), ("spare_nodes", 1.5), ("queue_wait_s", -1.0), ("spare_kind", "hot")],
)
def test_bad_spare_params(field: str, value: object) -> None:
    with pytest.raises(InputError) as err:
        PRESETS["paper-100k"].with_changes(**{field: value}).validated()
    assert err.value.field == field


def test_cli_sweep_spares_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "simulate", "--queue-wait-s", "3600",
         "--sweep-spares", f"0,{SLOT}", "--runs", "4", "--days", "3", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows = json.loads(out.stdout)
    assert [(r["spare_nodes"], r["spare_kind"]) for r in rows] == [
        (0, "-"),
        (SLOT, "cold"),
        (SLOT, "warm"),
    ]
    assert [r["spare_slots"] for r in rows] == [0, 1, 1]


def test_cli_bad_sweep_names_the_option() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "simulate", "--sweep-spares", "one"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "--sweep-spares" in out.stderr and "Traceback" not in out.stderr
