"""`prolog_epilog.checks.nvlink`: link status and error growth to a verdict."""

from __future__ import annotations

import pytest
from health_harness import FIX, sec

from prolog_epilog import smi_parsers as smi
from prolog_epilog.checks import nvlink
from prolog_epilog.records import (
    NvLinkErrors,
    NvLinkStatus,
)


@pytest.mark.parametrize(
    ("name", "over", "status", "needle"),
    [
        ("nvlink_s_h100.txt", {}, "pass", "144 links"),
        ("nvlink_s_a100.txt", {}, "pass", "96 links"),
        ("nvlink_s_h100_one_inactive.txt", {}, "fail", "GPU3 NVLink 11 inactive"),
        ("nvlink_s_all_inactive.txt", {}, "fail", "all NVLinks inactive"),
        (
            "nvlink_s_a100.txt",
            {"expected_links": 12, "expected_speed_gbps": 26.562},
            "fail",
            "below",
        ),
        ("nvlink_s_a100.txt", {"expected_links": 18}, "fail", "12 of 18"),
    ],
)
def test_nvlink_table(name, over, status, needle):
    res = nvlink.judge(smi.parse_nvlink_status((FIX / name).read_text()), [], sec("nvlink", **over))
    assert res.status == status and needle in res.detail


def test_nvlink_no_links_fine_unless_expected_and_error_growth():
    assert (
        nvlink.judge(
            [NvLinkStatus(0, "NVIDIA GeForce RTX 3090", {}, True)], [], sec("nvlink")
        ).status
        == "pass"
    )
    errs = smi.parse_nvlink_errors((FIX / "nvlink_e_h100.txt").read_text())
    assert nvlink.judge([], errs, sec("nvlink"), {"0": 0, "1": 0}).status == "fail"
    assert nvlink.judge([], errs, sec("nvlink"), {"0": 0, "1": 1000}).status == "pass"
    assert nvlink.judge([], errs, sec("nvlink")).status == "pass"  # first sample: no growth yet
    assert (
        nvlink.judge(
            [], [NvLinkErrors(0, {0: {"CRC Errors": 5}})], sec("nvlink", error_total_max=4)
        ).status
        == "fail"
    )
