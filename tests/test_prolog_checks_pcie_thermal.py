"""`prolog_epilog.checks.pcie` and `prolog_epilog.checks.thermal`: their verdict tables."""

from __future__ import annotations

from health_harness import FIX, sec

from prolog_epilog import smi_parsers as smi
from prolog_epilog.checks import pcie, thermal


def test_pcie_and_thermal_tables():
    links = smi.pcie_from_csv((FIX / "query_pcie.csv").read_text())
    res = pcie.judge(links, sec("pcie"))
    assert res.status == "fail" and "GPU2 PCIe x8 of x16" in res.detail and "gen" not in res.detail
    assert "GPU1 PCIe gen1 of gen5" in pcie.judge(links, sec("pcie", check_gen=True)).detail
    states = smi.thermal_from_csv((FIX / "query_thermal.csv").read_text())
    res = thermal.judge(states, sec("thermal"))
    assert (
        res.status == "fail"
        and "GPU1 at 88 C" in res.detail
        and "HW thermal slowdown" in res.detail
    )
