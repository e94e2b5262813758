"""`prolog_epilog.smi_parsers`: nvidia-smi's query, NVLink and CSV output, from fixture files."""

from __future__ import annotations

import pytest
from health_harness import FIX

from prolog_epilog import smi_parsers as smi


def q(name: str) -> list[tuple[str, dict]]:
    return smi.parse_query((FIX / name).read_text())


def test_h100_r535_sram_dram_split_is_clean():
    eccs = smi.ecc_from_query(q("q_h100_r535_healthy.txt"))
    assert len(eccs) == 8
    assert eccs[7].bus_id == "00000000:DB:00.0"
    assert all(e.enabled and e.volatile_uncorrectable == 0 for e in eccs)
    assert all(
        e.volatile_sram_uncorrectable == 0 and e.volatile_dram_uncorrectable == 0 for e in eccs
    )
    rows = smi.remapped_rows_from_query(q("q_h100_r535_healthy.txt"))
    assert len(rows) == 8 and not any(r.pending or r.failure for r in rows)
    # Retired pages are all N/A on Hopper: no records.
    assert smi.retired_pages_from_query(q("q_h100_r535_healthy.txt")) == []


def test_r550_parity_and_secded_are_both_counted():
    eccs = smi.ecc_from_query(q("q_h100_r550_parity_secded.txt"))
    assert [e.volatile_uncorrectable for e in eccs] == [0, 1]
    assert eccs[1].volatile_sram_uncorrectable == 1
    assert eccs[1].volatile_correctable == 3
    assert eccs[1].aggregate_correctable == 12
    assert eccs[1].sram_threshold_exceeded is False


def test_a100_remap_pending_and_failure():
    gpus = q("q_a100_r535_remap.txt")
    rows = smi.remapped_rows_from_query(gpus)
    assert (rows[0].pending, rows[0].failure, rows[0].correctable) == (True, False, 1)
    assert (rows[1].failure, rows[1].uncorrectable) == (True, 4)
    eccs = smi.ecc_from_query(gpus)
    assert eccs[0].volatile_correctable == 177 and eccs[1].volatile_dram_uncorrectable == 4


def test_legacy_single_double_bit_and_retired_pages():
    gpus = q("q_v100_r470_legacy.txt")
    eccs = smi.ecc_from_query(gpus)
    assert eccs[0].enabled is True  # "Ecc Mode" spelled the old way
    assert (eccs[1].volatile_correctable, eccs[1].aggregate_uncorrectable) == (40, 24)
    pages = smi.retired_pages_from_query(gpus)
    assert (pages[1].single_bit, pages[1].double_bit, pages[1].pending) == (40, 24, True)
    assert smi.remapped_rows_from_query(gpus) == []  # "Remapped Rows : N/A"


def test_ecc_disabled_and_na():
    eccs = smi.ecc_from_query(q("q_ecc_disabled.txt"))
    assert [e.enabled for e in eccs] == [False, None]
    assert all(e.volatile_uncorrectable is None for e in eccs)


@pytest.mark.parametrize(
    ("name", "gpus", "links", "speed", "inactive"),
    [
        ("nvlink_s_h100.txt", 8, 18, 26.562, []),
        ("nvlink_s_a100.txt", 8, 12, 25.0, []),
        ("nvlink_s_h100_one_inactive.txt", 8, 18, 26.562, [(3, 11)]),
    ],
)
def test_nvlink_status(name, gpus, links, speed, inactive):
    status = smi.parse_nvlink_status((FIX / name).read_text())
    assert len(status) == gpus
    assert all(len(s.links) == links for s in status)
    down = [(s.index, k) for s in status for k, v in s.links.items() if v is None]
    assert down == inactive
    assert status[0].links[0] == speed


def test_nvlink_all_inactive_and_errors():
    status = smi.parse_nvlink_status((FIX / "nvlink_s_all_inactive.txt").read_text())
    assert status[0].all_inactive and not status[0].links
    assert not status[1].all_inactive and len(status[1].links) == 18
    errors = smi.parse_nvlink_errors((FIX / "nvlink_e_h100.txt").read_text())
    assert [e.total() for e in errors] == [0, 142 + 3 + 891]
    assert errors[1].links[1] == {"Replay Errors": 142, "Recovery Errors": 3, "CRC Errors": 891}


def test_csv_queries():
    gpus = smi.gpus_from_csv((FIX / "query_gpu_ids.csv").read_text())
    assert [g.index for g in gpus] == list(range(8)) and gpus[7].bus_id == "00000000:DB:00.0"
    pcie = smi.pcie_from_csv((FIX / "query_pcie.csv").read_text())
    assert (pcie[2].width_current, pcie[2].width_max) == (8, 16)
    assert pcie[3].width_current is None  # [N/A]
    thermal = smi.thermal_from_csv((FIX / "query_thermal.csv").read_text())
    assert thermal[2].temperature_c == 97 and thermal[2].hw_thermal_slowdown is True
    procs = smi.processes_from_csv((FIX / "query_compute_apps.csv").read_text())
    assert [p.pid for p in procs] == [41230, 41231] and procs[0].used_memory_mib == 70512
