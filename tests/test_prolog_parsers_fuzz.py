"""Garbage never raises out of a parser or a check; no Xid is lost to its wrapper (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from prolog_epilog import smi_parsers as smi
from prolog_epilog.checks import dcgm, ecc, nvlink, xid
from prolog_epilog.config import load_config
from prolog_epilog.fabric import parse_ibstat, parse_rate
from prolog_epilog.kernel_log import parse_kernel_log, parse_xid_lines

FIX = Path(__file__).parent / "fixtures" / "health"
CFG = load_config()
SEEDS = [
    (FIX / n).read_text()[:6000]
    for n in (
        "q_h100_r550_parity_secded.txt",
        "nvlink_s_h100.txt",
        "dmesg_T.txt",
        "captures/gpud/dmesg-time-format-iso.log",
        "captures/gpud/dmesg.decode.iso.log.0",
        "captures/gpud/kmsg.1.log",
        "captures/gpud/journalctl-time-format-short-iso-2.log",
        "captures/issues/nvsentinel_155_dmesg_fallen_off_bus.txt",
        "captures/gpud/nvidia-smi-query.560.35.03.out.0.valid",
    )
]
text = st.one_of(
    st.text(max_size=400),
    st.sampled_from(SEEDS).flatmap(
        lambda s: st.tuples(st.integers(0, len(s)), st.text(max_size=40)).map(
            lambda t: s[: t[0]] + t[1] + s[t[0] :]
        )
    ),
)


@settings(max_examples=150, deadline=None)
@given(text)
def test_smi_parsers_and_verdicts_never_raise(data: str) -> None:
    tree = smi.parse_query(data)
    eccs, rows, pages = (
        smi.ecc_from_query(tree),
        smi.remapped_rows_from_query(tree),
        smi.retired_pages_from_query(tree),
    )
    assert ecc.judge(eccs, rows, pages, CFG.section("ecc")).status in ("pass", "warn", "fail")
    status, errors = smi.parse_nvlink_status(data), smi.parse_nvlink_errors(data)
    assert nvlink.judge(status, errors, CFG.section("nvlink")).status in ("pass", "warn", "fail")
    for parse in (
        smi.gpus_from_csv,
        smi.pcie_from_csv,
        smi.thermal_from_csv,
        smi.processes_from_csv,
    ):
        parse(data)
    parse_ibstat(data)
    parse_rate(data)
    for e in parse_xid_lines(data, boot_time=0.0):
        assert isinstance(e.code, int)
    found = parse_kernel_log(data, now=1.9e9, boot_time=1.7e9)
    assert xid.judge(found.xids, 1.8e9, CFG.section("xid"), found.lost).status in (
        "pass",
        "warn",
        "fail",
    )


XID48 = "NVRM: Xid (PCI:0000:19:00): 48, pid=7, name=python, An uncorrectable double bit error"
# Every wrapper a kernel line arrives in, with its time left to hypothesis (seconds since boot or
# a wall-clock instant after 2001); see test_prolog_kernel_log for where each layout comes from.
# Local-time forms (-T, syslog) live in that table: a DST fold would make a property flaky.
WRAPPERS = [
    lambda t, m: f"[{m:12.6f}] ",
    lambda t, m: f"<4>[{m:12.6f}] ",
    lambda t, m: f"kern  :warn  : [{m:12.6f}] ",
    lambda t, m: f"4,77,{int(m * 1e6)},-;",
    lambda t, m: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00 "),
    lambda t, m: datetime.fromtimestamp(t, UTC).strftime(
        "kern  :err   : %Y-%m-%dT%H:%M:%S.%f+00:00 "
    ),
    lambda t, m: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000 host kernel: "),
    lambda t, m: f"{t:.6f} host kernel: ",
    lambda t, m: f"[{m:12.6f}] host kernel: ",
]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(WRAPPERS),
    st.floats(1.0e9, 2.0e9),
    st.floats(0.5, 1.0e7),
)
def test_a_fatal_xid_in_any_wrapper_fails_when_inside_the_window(wrap, wall, mono):
    """Read time inside the window -> fail; read time before it -> pass; never dropped otherwise."""
    boot = wall - mono
    line = wrap(wall, mono) + XID48
    found = parse_kernel_log(line, now=wall + 10, boot_time=boot)
    assert len(found.xids) == 1
    t = found.xids[0].time
    assert t is not None and abs(t - wall) < 1.5  # short-iso prints whole seconds
    cfg = CFG.section("xid")
    assert xid.judge(found.xids, wall - 2, cfg, found.lost).status == "fail"
    assert xid.judge(found.xids, wall + 2, cfg, found.lost).status == "pass"


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Nd", "Cs", "Zl", "Zp", "Cc")), max_size=60
    )
)
def test_a_fatal_xid_behind_any_unknown_prefix_is_never_dropped(prefix):
    """Without digits no time can be read: the Xid must count as inside any window."""
    found = parse_kernel_log(prefix.lstrip() + XID48, now=1.9e9, boot_time=1.7e9)
    assert [e.code for e in found.xids] == [48] and found.xids[0].time is None
    res = xid.judge(found.xids, 1.9e9, CFG.section("xid"), found.lost)
    assert res.status == "fail" and "time unreadable" in res.detail


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_dcgm_garbage_is_a_value_error_not_a_crash(data: str) -> None:
    try:
        results, err = dcgm.parse_dcgm_json(data)
    except ValueError:  # json.JSONDecodeError is a ValueError: the runner reports "error"
        return
    dcgm.judge(results, err)
