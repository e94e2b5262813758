"""`prolog_epilog.checks.ecc`: ECC counters, remapped rows and retired pages to a verdict, by
tables."""

from __future__ import annotations

import time

import pytest
from health_harness import FIX, sec, sim_config

from prolog_epilog import run_checks
from prolog_epilog import smi_parsers as smi
from prolog_epilog.checks import ecc
from prolog_epilog.records import (
    EccCounts,
    GpuInfo,
    RemappedRows,
    RetiredPages,
)
from prolog_epilog.simulated_hardware import write_node_inputs


@pytest.mark.parametrize(
    ("rec", "over", "status"),
    [
        (EccCounts(0, enabled=True, volatile_uncorrectable=0), {}, "pass"),
        (EccCounts(0, enabled=True, volatile_uncorrectable=1), {}, "fail"),
        (
            EccCounts(0, enabled=True, volatile_uncorrectable=1),
            {"volatile_uncorrectable_max": 1},
            "pass",
        ),
        (EccCounts(0, enabled=False), {}, "warn"),
        (EccCounts(0, enabled=None), {"ecc_disabled": "fail"}, "fail"),
        (EccCounts(0, enabled=True, aggregate_uncorrectable=2), {}, "warn"),
        (EccCounts(0, enabled=True, volatile_correctable=20000), {}, "warn"),
        (
            EccCounts(0, enabled=True, volatile_correctable=20000),
            {"volatile_correctable_fail": 15000},
            "fail",
        ),
        (EccCounts(0, enabled=True, sram_threshold_exceeded=True), {}, "fail"),
    ],
)
def test_ecc_counts_table(rec, over, status):
    assert ecc.judge([rec], [], [], sec("ecc", **over)).status == status


@pytest.mark.parametrize(
    ("rows", "pages", "status"),
    [
        ([RemappedRows(0, 0, 0, False, False)], [], "pass"),
        ([RemappedRows(0, 1, 0, True, False)], [], "fail"),
        ([RemappedRows(0, 0, 4, False, True)], [], "fail"),
        ([], [RetiredPages(0, 2, 0, True)], "warn"),
        ([], [RetiredPages(0, 40, 24, True)], "fail"),
    ],
)
def test_ecc_rows_and_pages_table(rows, pages, status):
    eccs = [EccCounts(0, enabled=True, volatile_uncorrectable=0)]
    assert ecc.judge(eccs, rows, pages, sec("ecc")).status == status


@pytest.mark.parametrize(
    ("eccs", "rows", "pages", "gpus", "status"),
    [
        ([], [RemappedRows(0, 0, 0, True, False)], [], 1, "fail"),  # no ECC counters read
        ([], [], [RetiredPages(0, 40, 24, True)], 1, "fail"),
        ([EccCounts(0, enabled=False)], [RemappedRows(0, 0, 4, False, True)], [], 1, "fail"),
        ([EccCounts(0, enabled=None, volatile_uncorrectable=2)], [], [], 1, "fail"),  # mode unread
        ([EccCounts(0, enabled=True, volatile_uncorrectable=0)], [], [], 2, "error"),  # GPU1 unread
        ([], [RemappedRows(0, 0, 0, False, False)], [], 1, "pass"),
    ],
)
def test_ecc_judges_what_was_read_and_errors_on_what_was_not(eccs, rows, pages, gpus, status):
    assert ecc.judge(eccs, rows, pages, sec("ecc"), gpu_count=gpus).status == status


class RecordsSource:
    """A GPU source that hands out fixed records, as a node without ECC counters would."""

    kind = "records"

    def __init__(self, gpus: int, rows: list[RemappedRows]) -> None:
        self._gpus, self._rows = gpus, rows

    def gpus(self, timeout: float) -> list[GpuInfo]:
        return [GpuInfo(i, f"00000000:{i:02X}:00.0") for i in range(self._gpus)]

    def ecc(self, timeout: float) -> tuple[list[EccCounts], list[RemappedRows], list[RetiredPages]]:
        return [], self._rows, []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("gpus", "rows", "status"),
    [
        (1, [RemappedRows(0, 1, 0, True, False)], "fail"),
        (1, [], "error"),
        (0, [], "skip"),
    ],
)
def test_ecc_check_does_not_skip_when_counters_are_missing(tmp_path, gpus, rows, status):
    write_node_inputs(tmp_path, "node1")
    res = run_checks(["ecc"], sim_config(tmp_path), source=RecordsSource(gpus, rows))
    assert res.by_name()["ecc"].status == status, res.by_name()["ecc"]


def test_ecc_correctable_rate_from_two_samples():
    now = time.time()
    rates = ecc.correctable_rates(
        [EccCounts(0, enabled=True, volatile_correctable=2100)],
        {"time": now - 3600, "counts": {"0": 100}},
        now,
    )
    assert rates[0] == pytest.approx(2000)
    res = ecc.judge(
        [EccCounts(0, enabled=True, volatile_correctable=2100)], [], [], sec("ecc"), rates
    )
    assert res.status == "warn" and "rate" in res.detail
    # A smaller count means the driver reloaded: no rate.
    assert (
        ecc.correctable_rates(
            [EccCounts(0, volatile_correctable=5)], {"time": now - 10, "counts": {"0": 9}}, now
        )
        == {}
    )


def test_fixture_files_through_ecc_verdict():
    for name, status in [
        ("q_h100_r535_healthy.txt", "pass"),
        ("q_h100_r550_parity_secded.txt", "fail"),
        ("q_a100_r535_remap.txt", "fail"),
        ("q_v100_r470_legacy.txt", "fail"),
        ("q_ecc_disabled.txt", "warn"),
    ]:
        gpus = smi.parse_query((FIX / name).read_text())
        res = ecc.judge(
            smi.ecc_from_query(gpus),
            smi.remapped_rows_from_query(gpus),
            smi.retired_pages_from_query(gpus),
            sec("ecc"),
        )
        assert res.status == status, (name, res)
