"""`prolog_epilog.checks.dcgm`: dcgmi's JSON to a pass or a fail."""

from __future__ import annotations

from health_harness import FIX

from prolog_epilog.checks.dcgm import judge as dcgm_judge
from prolog_epilog.checks.dcgm import parse_dcgm_json


def test_dcgm_json_pass_and_fail():
    results, err = parse_dcgm_json((FIX / "dcgm_diag_r1_pass.json").read_text())
    assert err is None and len(results) == 9
    assert dcgm_judge(results, err).status == "pass"
    results, err = parse_dcgm_json(
        "WARNING: noise\n" + (FIX / "dcgm_diag_r1_fail.json").read_text()
    )
    verdict = dcgm_judge(results, err)
    assert verdict.status == "fail" and "row remapping failed" in verdict.detail
