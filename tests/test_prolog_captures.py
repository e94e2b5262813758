"""Published captures of real tools through the parsers and checks: the verdict an operator gives.

The files under fixtures/health/captures were printed by real `nvidia-smi`, `ibstat`, `dmesg`
and `journalctl` on real GPU nodes (see PROVENANCE.md there). Each row names the verdict a human
reading the capture would give and the words that must explain it; a parser that misreads a
real layout shows up here as a wrong verdict.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from prolog_epilog import smi_parsers as smi
from prolog_epilog.checks import ecc, infiniband, nvlink, xid
from prolog_epilog.checks.base import CheckResult
from prolog_epilog.config import load_config
from prolog_epilog.fabric import parse_ibstat
from prolog_epilog.kernel_log import parse_kernel_log

CAPTURES = Path(__file__).parent / "fixtures" / "health" / "captures"
CFG = load_config()
NOW = 1.9e9  # later than every capture
BOOT = 1.7e9  # dmesg raw and /dev/kmsg times are seconds since this boot


def sec(name: str, **over: object) -> dict:
    return {**CFG.section(name), **over}


def ecc_verdict(name: str) -> CheckResult:
    tree = smi.parse_query((CAPTURES / name).read_text())
    return ecc.judge(
        smi.ecc_from_query(tree),
        smi.remapped_rows_from_query(tree),
        smi.retired_pages_from_query(tree),
        sec("ecc"),
        gpu_count=len(tree),
    )


def xid_verdict(name: str, since: float | None = None) -> CheckResult:
    found = parse_kernel_log((CAPTURES / name).read_text(), now=NOW, boot_time=BOOT)
    return xid.judge(found.xids, since, sec("xid"), found.lost)


ECC = [
    # (capture, verdict, words in the detail)
    ("gpud/nvidia-smi-query.535.129.03.out.0.valid.a10", "fail", "GPU0 remapped rows pending"),
    ("gpud/nvidia-smi-query.535.154.05.out.0.valid", "warn", "GPU7 ECC disabled"),
    ("gpud/nvidia-smi-query.535.154.05.out.1.valid", "warn", "GPU0 ECC disabled"),
    ("gpud/nvidia-smi-query.535.154.05.out.2.valid", "warn", "GPU0 ECC disabled"),
    ("gpud/nvidia-smi-query.535.154.05.out.3.valid", "warn", "GPU0 ECC disabled"),
    ("gpud/nvidia-smi-query.535.154.05.out.0.valid.4090", "warn", "GPU0 ECC disabled"),
    ("gpud/nvidia-smi-query.535.161.08.out.0.valid", "pass", "8 GPUs clean"),
    ("gpud/nvidia-smi-query.535.183.01.out.0.valid", "pass", "8 GPUs clean"),
    ("gpud/nvidia-smi-query.535.183.01.out.0.invalid", "error", "GPU0: no ECC"),
    ("gpud/nvidia-smi-query.560.35.03.out.0.valid", "warn", "GPU0 ECC N/A"),
    ("ml-engineering/debug_md_l41-75_a100_510.73.08.txt", "fail", "GPU0 remapped rows pending"),
    ("hexo.post/nvidia-smi-usage_md_l112-296_v100_470.129.06.txt", "pass", "1 GPUs clean"),
]


@pytest.mark.parametrize(("name", "status", "words"), ECC, ids=[e[0] for e in ECC])
def test_nvidia_smi_q_captures(name, status, words):
    res = ecc_verdict(name)
    assert res.status == status and words in res.detail, res


def test_nvidia_smi_q_facts_read_from_captures():
    tree = smi.parse_query((CAPTURES / ECC[6][0]).read_text())
    eccs = smi.ecc_from_query(tree)
    assert len(tree) == 8 and all(e.enabled and e.volatile_uncorrectable == 0 for e in eccs)
    a10 = smi.parse_query((CAPTURES / ECC[0][0]).read_text())
    assert smi.remapped_rows_from_query(a10)[0].uncorrectable == 4
    titan = smi.ecc_from_query(smi.parse_query((CAPTURES / ECC[9][0]).read_text()))
    assert titan[0].enabled is None and titan[0].volatile_uncorrectable is None
    # The excerpt has no ECC mode line: its counters are still read and judged.
    a100 = smi.ecc_from_query(smi.parse_query((CAPTURES / ECC[10][0]).read_text()))
    assert (a100[0].enabled, a100[0].volatile_correctable) == (None, 177)
    res = ecc.judge(a100, [], [], sec("ecc", volatile_correctable_warn=100))
    assert res.status == "warn" and "volatile correctable ECC 177" in res.detail
    # V100, driver 470: "Single Bit            " keys carry trailing spaces; pages are read.
    v100 = smi.parse_query((CAPTURES / ECC[11][0]).read_text())
    assert smi.ecc_from_query(v100)[0].aggregate_correctable == 3
    assert smi.retired_pages_from_query(v100)[0].single_bit == 1
    assert smi.remapped_rows_from_query(v100) == []  # "Remapped Rows : N/A" before Ampere


def test_nvlink_captures():
    a100 = smi.parse_nvlink_status((CAPTURES / "gpud/nvidia-smi.nvlink.status.a100").read_text())
    assert len(a100) == 8 and all(len(s.links) == 12 for s in a100)
    res = nvlink.judge(a100, [], sec("nvlink"))
    assert res.status == "pass" and "96 links up on 8 GPUs" in res.detail
    a10 = smi.parse_nvlink_status((CAPTURES / "gpud/nvidia-smi.nvlink.status.a10").read_text())
    assert a10 == [] and nvlink.judge(a10, [], sec("nvlink")).status == "pass"


IB = [
    # (capture, config overrides, verdict, words)
    ("ibstat.47.0.h100.some.down.0", {}, "pass", "8 ports active"),
    ("ibstat.47.0.h100.some.down.0", {"check_roce": True}, "fail", "mlx5_2/1 DOWN/Disabled"),
    ("ibstat.47.0.h100.all.active.0", {}, "skip", "no InfiniBand ports"),
    ("ibstat.47.0.h100.all.active.0", {"check_roce": True}, "pass", "12 ports active"),
    ("ibstat.39.0.a100.failed.ibpanic.exit-255.0", {}, "pass", "8 ports active"),
    ("ibstat.39.0.a100.failed.ibpanic.exit-255.0", {"expected_ports": 9}, "fail", "8 of 9"),
]


@pytest.mark.parametrize(
    ("name", "over", "status", "words"), IB, ids=[f"{i[0]}-{i[1]}" for i in IB]
)
def test_ibstat_captures(name, over, status, words):
    ports = parse_ibstat((CAPTURES / "gpud" / name).read_text())
    res = infiniband.judge(ports, sec("infiniband", **over))
    assert res.status == status and words in res.detail, res


KERNEL = [
    # (capture, verdict, words, xids read, lost GPUs, times unreadable)
    ("gpud/dmesg-time-format-iso.log", "fail", "Xid 48 on 0000:19:00", 11, 0, 0),
    ("gpud/dmesg-with-xid-119.log", "fail", "Xid 119 on 0000:9b:00 x5", 5, 0, 0),
    ("gpud/dmesg.decode.iso.log.0", "warn", "Xid 13 on 0000:38:00 x629", 636, 0, 0),
    ("gpud/dmesg.decode.iso.log", "pass", "no Xid", 0, 0, 0),
    ("gpud/dmesg-time-format-short-iso.log", "pass", "no Xid", 0, 0, 0),
    ("gpud/journalctl-time-format-short-iso-2.log", "pass", "no Xid", 0, 0, 0),
    ("gpud/kmsg.1.log", "pass", "no Xid", 0, 0, 0),
    ("issues/nvsentinel_155_dmesg_fallen_off_bus.txt", "fail", "GPU lost 0000:b3:00.0", 0, 1, 0),
    ("issues/open-gpu-kernel-modules_1150_journal_no_time.txt", "warn", "time unreadable", 7, 0, 7),
]


@pytest.mark.parametrize(
    ("name", "status", "words", "n_xid", "n_lost", "n_unreadable"),
    KERNEL,
    ids=[k[0] for k in KERNEL],
)
def test_kernel_log_captures(name, status, words, n_xid, n_lost, n_unreadable):
    found = parse_kernel_log((CAPTURES / name).read_text(), now=NOW, boot_time=BOOT)
    assert (len(found.xids), len(found.lost)) == (n_xid, n_lost)
    assert sum(e.time is None for e in [*found.xids, *found.lost]) == n_unreadable
    res = xid_verdict(name)
    assert res.status == status and words in res.detail, res


def test_the_two_verdicts_that_were_wrong_are_right():
    """The iso-comma Xid 48 and the decode+iso form are read with their real times."""
    found = parse_kernel_log(
        (CAPTURES / "gpud/dmesg-time-format-iso.log").read_text(), now=NOW, boot_time=None
    )
    dbe = next(e for e in found.xids if e.code == 48)
    assert dbe.time == pytest.approx(1731672123.470068)  # 2024-11-15T12:02:03,470068+00:00
    assert xid_verdict("gpud/dmesg-time-format-iso.log", since=dbe.time - 1).status == "fail"
    assert xid_verdict("gpud/dmesg-time-format-iso.log", since=dbe.time + 60).status == "pass"
    decode = parse_kernel_log(
        (CAPTURES / "gpud/dmesg.decode.iso.log.0").read_text(), now=NOW, boot_time=None
    )
    assert decode.xids[0].time == pytest.approx(1737426093.498559)  # 2025-01-21T02:21:33,498559


def test_every_capture_is_listed_with_its_bytes_unchanged():
    listed = {}
    for row in (CAPTURES / "PROVENANCE.md").read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", row)
        if m:
            listed[m.group(1)] = m.group(2)
    files = {str(p.relative_to(CAPTURES)) for p in CAPTURES.rglob("*") if p.is_file()} - {
        "PROVENANCE.md"
    }
    assert files == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((CAPTURES / name).read_bytes()).hexdigest() == digest, name
    used = {e[0] for e in ECC} | {k[0] for k in KERNEL} | {f"gpud/{i[0]}" for i in IB}
    used |= {"gpud/nvidia-smi.nvlink.status.a100", "gpud/nvidia-smi.nvlink.status.a10"}
    assert files == used  # every capture has a verdict above
