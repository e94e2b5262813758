"""`prolog_epilog.checks.xid`: Xid lines in the window, mapped to GPUs, to a verdict."""

from __future__ import annotations

from health_harness import FIX, sec

from prolog_epilog.checks import xid
from prolog_epilog.kernel_log import parse_xid_lines
from prolog_epilog.records import (
    GpuInfo,
)


def test_xid_verdicts_window_and_gpu_mapping():
    events = parse_xid_lines((FIX / "dmesg_T.txt").read_text())
    gpus = [GpuInfo(7, "00000000:DB:00.0"), GpuInfo(4, "00000000:9B:00.0")]
    mapped = xid.attach_gpu_index(events, gpus)
    res = xid.judge(mapped, None, sec("xid"))
    assert (
        res.status == "fail" and "Xid 79 on GPU7" in res.detail and "Xid 48 on GPU4" in res.detail
    )
    assert res.reason.startswith("Xid 48 GPU4") or res.reason.startswith("Xid 79")
    only63 = [e for e in mapped if e.code == 63]
    assert xid.judge(only63, None, sec("xid")).status == "warn"
    assert xid.judge(only63 * 3, None, sec("xid")).status == "fail"  # repeated warning Xid
    after = max(e.time for e in events) + 1
    assert xid.judge(mapped, after, sec("xid")).status == "pass"
