"""Every kernel-log line form a node prints, each read to the right time and judged (tables).

Each form's layout follows the tool's source: util-linux `dmesg.c` (`[%5ld.%06ld] `, `<%d>`,
`%-6s:%-6s: `, `%a %b %e %H:%M:%S %Y`, ISO with a comma and `+HH:MM`) and systemd `logs-show.c`
(`%b %d %H:%M:%S`, `.%06d`, `%Y-%m-%dT%H:%M:%S` plus `%+03d:%02d` or, before v255, `%z`,
`[%5d.%06d]`, `%10d.%06d`). A fatal Xid in each form fails the check; a benign line passes; the
same fatal Xid timed before the window passes, which proves its time was really read.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from health_harness import FIX

from prolog_epilog import load_config, run_checks
from prolog_epilog.checks import xid
from prolog_epilog.kernel_log import (
    line_time,
    log_records,
    parse_kernel_log,
    parse_xid_lines,
    read_boot_time,
)
from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs

CFG = load_config()
XID48 = (
    "NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit"
    " error (DBE) has been detected on GPU in the framebuffer at physAddr 0x12bac1c3e0."
)
BENIGN = "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
UTC_T = datetime(2026, 11, 30, 12, 2, 3, 470068, tzinfo=UTC).timestamp()
LOCAL_T = datetime(2026, 11, 30, 12, 2, 3).timestamp()  # forms printed in local time
MONO = 1126.635824
BOOT = UTC_T - MONO
NOW = UTC_T + 600
HOST = "gpu-node-017 kernel: "

FORMS = [
    # (form, prefix, epoch the prefix stands for)
    ("dmesg", "[ 1126.635824] ", UTC_T),
    ("dmesg -r", "<4>[ 1126.635824] ", UTC_T),
    ("dmesg -d", "[ 1126.635824 <    0.000012>] ", UTC_T),
    ("dmesg -x", "kern  :warn  : [ 1126.635824] ", UTC_T),
    ("dmesg -T", "[Mon Nov 30 12:02:03 2026] ", LOCAL_T),
    ("dmesg -x -T", "kern  :err   : [Mon Nov 30 12:02:03 2026] ", LOCAL_T),
    ("dmesg --time-format=iso", "2026-11-30T12:02:03,470068+00:00 ", UTC_T),
    ("dmesg --time-format=iso (dot)", "2026-11-30T12:02:03.470068+00:00 ", UTC_T),
    ("dmesg --time-format=iso (+01:00)", "2026-11-30T13:02:03,470068+01:00 ", UTC_T),
    ("dmesg -x --time-format=iso", "kern  :warn  : 2026-11-30T12:02:03,470068+00:00 ", UTC_T),
    ("/dev/kmsg", "4,1234,1126635824,-;", UTC_T),
    ("syslog", f"Nov 30 12:02:03 {HOST}", LOCAL_T),
    ("syslog + kernel time", f"Nov 30 12:02:03 {HOST}[ 1126.635824] ", LOCAL_T),
    ("syslog RFC 3339", f"2026-11-30T12:02:03.470068+00:00 {HOST}", UTC_T),
    ("journalctl -k -o short", f"Nov 30 12:02:03 {HOST}", LOCAL_T),
    ("journalctl -k -o short-precise", f"Nov 30 12:02:03.470068 {HOST}", LOCAL_T + 0.470068),
    ("journalctl -k -o short-iso", f"2026-11-30T12:02:03+00:00 {HOST}", UTC_T - 0.470068),
    ("journalctl -k -o short-iso (<v255)", f"2026-11-30T12:02:03+0000 {HOST}", UTC_T - 0.470068),
    ("journalctl -k -o short-iso-precise", f"2026-11-30T12:02:03.470068+00:00 {HOST}", UTC_T),
    ("journalctl -k -o short-monotonic", f"[ 1126.635824] {HOST}", UTC_T),
    ("journalctl -k -o short-delta", f"[ 1126.635824 <    0.000012 >] {HOST}", UTC_T),
    ("journalctl -k -o short-full", f"Mon 2026-11-30 12:02:03 UTC {HOST}", UTC_T - 0.470068),
    ("journalctl -k -o short-unix", f"{UTC_T:.6f} {HOST}", UTC_T),
]
IDS = [f[0] for f in FORMS]


def verdict(text: str, since: float, boot: float | None = BOOT) -> xid.CheckResult:
    found = parse_kernel_log(text, now=NOW, boot_time=boot)
    return xid.judge(found.xids, since, CFG.section("xid"), found.lost)


@pytest.mark.parametrize(("form", "prefix", "expected"), FORMS, ids=IDS)
def test_each_form_reads_its_time(form, prefix, expected):
    assert line_time(prefix + XID48, NOW, BOOT) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(("form", "prefix", "expected"), FORMS, ids=IDS)
def test_each_form_fatal_fails_benign_passes_old_passes(form, prefix, expected):
    window = expected - 60
    res = verdict(prefix + XID48, window)
    assert res.status == "fail" and res.reason == "Xid 48 0000:19:00", res
    assert "unreadable" not in res.detail
    assert verdict(prefix + BENIGN, window).status == "pass"
    assert verdict(prefix + XID48, expected + 1).status == "pass"  # read, and older than the window


def test_dmesg_T_pads_single_digit_days_with_a_space():
    t = line_time(f"[Mon Nov  2 09:05:07 2026] {XID48}", NOW, None)
    assert t == datetime(2026, 11, 2, 9, 5, 7).timestamp()
    assert line_time(f"Nov  2 09:05:07 {HOST}{XID48}", NOW, None) == t  # syslog pads too
    assert line_time(f"Nov 02 09:05:07 {HOST}{XID48}", NOW, None) == t  # journalctl uses %d


@pytest.mark.parametrize(
    ("now", "stamp", "year"),
    [
        (datetime(2027, 1, 1, 0, 10).timestamp(), "Dec 31 23:59:00", 2026),  # across new year
        (datetime(2026, 11, 30, 12, 30).timestamp(), "Nov 30 12:40:00", 2026),  # clock skew
        (datetime(2026, 11, 30, 12, 30).timestamp(), "Jan  2 03:00:00", 2026),
        (datetime(2027, 3, 1, 8, 0).timestamp(), "Feb 29 10:00:00", 2024),  # last leap year
    ],
)
def test_syslog_year_is_the_latest_not_in_the_future(now, stamp, year):
    t = line_time(f"{stamp} {HOST}{XID48}", now, None)
    assert t is not None and datetime.fromtimestamp(t).year == year


@pytest.mark.parametrize(
    "line",
    [
        f"@@ host 12h02 {XID48}",  # a form nobody taught us
        f"[ 1126.635824] {XID48}",  # raw seconds, but the boot time could not be read
        f"<4>[ 1126.635824] {XID48}",
        f"Mon 2026-11-30 12:02:03 XYZT {HOST}{XID48}",  # a zone name we cannot resolve
        f"Smarch 30 12:02:03 {HOST}{XID48}",
    ],
)
def test_an_xid_whose_time_cannot_be_read_fails_safe(line):
    found = parse_kernel_log(line, now=NOW, boot_time=None)
    assert [e.time for e in found.xids] == [None]
    res = xid.judge(found.xids, NOW, CFG.section("xid"), found.lost)
    assert res.status == "fail" and "time unreadable" in res.detail


LOST = [
    ("[ 2012.001300] NVRM: GPU 0000:db:00.0: GPU has fallen off the bus.", "0000:db:00.0"),
    (
        f"Nov 30 12:02:03 {HOST}[159259.989773] NVRM: GPU 0000:02:00.0: RmInitAdapter failed!"
        " (0x24:0x65:1185)",
        "0000:02:00.0",
    ),
    (
        "kern  :err   : 2026-11-30T12:02:03,470068+00:00 NVRM: GPU 0000:02:00.0: rm_init_adapter"
        " failed, device minor number 0",
        "0000:02:00.0",
    ),
    (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.",
        "0000:b3:00.0",
    ),
    ("[ 2012.5] NVRM: GPU is lost, skipping nvidia_ioctl", ""),
]


@pytest.mark.parametrize(("text", "pci"), LOST, ids=[p or "no-pci" for _, p in LOST])
def test_lost_gpu_messages_fail_without_an_xid(text, pci):
    found = parse_kernel_log(text, now=NOW, boot_time=BOOT)
    assert found.xids == [] and [g.pci for g in found.lost] == [pci]
    res = xid.judge([], NOW - 3600 * 24 * 365, CFG.section("xid"), found.lost)
    assert res.status == "fail" and res.reason.startswith("GPU lost")


def test_multi_line_record_takes_the_time_of_its_first_line():
    found = parse_kernel_log(LOST[3][0], now=NOW, boot_time=BOOT)
    assert found.lost[0].time == pytest.approx(BOOT + 1843.308145)
    assert "fallen off the bus and is not responding" in found.lost[0].message


def test_xid_79_line_is_one_xid_not_also_a_lost_gpu():
    found = parse_kernel_log(
        "[ 2012.001234] NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>,"
        " GPU has fallen off the bus.",
        now=NOW,
        boot_time=BOOT,
    )
    assert [e.code for e in found.xids] == [79] and found.lost == []


@pytest.mark.parametrize(
    ("action", "status"),
    [
        ("0x0 (None) to 0x2 (Node Reboot Required)", "fail"),
        ("0x0 (None) to 0x1 (GPU Reset Required)", "fail"),
        ("0x2 (Node Reboot Required) to 0x0 (None)", "warn"),
    ],
)
def test_xid_154_follows_the_recovery_action(action, status):
    line = "[ 1126.635824] NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from "
    assert verdict(line + action, UTC_T - 60).status == status


def test_boot_time_comes_from_proc_stat_btime(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4\nintr 5\nctxt 77\nbtime 1796030000\nprocesses 9\n")
    assert read_boot_time(str(stat)) == 1796030000.0
    stat.write_text("cpu  1 2 3 4\n")
    assert read_boot_time(str(stat)) is None
    assert read_boot_time(str(tmp_path / "missing")) is None
    real = read_boot_time()  # this host's: in the past, and within a century
    assert real is None or time.time() - 3.2e9 < real < time.time()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "form",
    ["dmesg --time-format=iso", "dmesg -x --time-format=iso", "journalctl -k -o short-unix"],
)
def test_xid_check_on_a_log_file_in_each_wall_clock_form(tmp_path, form):
    """The whole check, end to end, on a kernel log written in the form the issue was about."""
    write_node_inputs(tmp_path, "node1")
    (tmp_path / "c.toml").write_text(dev_config_toml(tmp_path))
    cfg = load_config(tmp_path / "c.toml", node="node1")
    now = time.time()
    stamp = {
        "dmesg --time-format=iso": datetime.fromtimestamp(now - 5, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S,%f+00:00 "
        ),
        "dmesg -x --time-format=iso": datetime.fromtimestamp(now - 5, UTC).strftime(
            "kern  :warn  : %Y-%m-%dT%H:%M:%S,%f+00:00 "
        ),
        "journalctl -k -o short-unix": f"{now - 5:.6f} {HOST}",
    }[form]
    log = Path(tmp_path / "kern.log")
    log.write_text(f"{stamp}{BENIGN}\n{stamp}{XID48}\n")
    res = run_checks(["xid"], cfg, kernel_log=log, since=now - 60).by_name()["xid"]
    assert res.status == "fail" and "Xid 48" in res.detail and "unreadable" not in res.detail
    res = run_checks(["xid"], cfg, kernel_log=log, since=now + 60).by_name()["xid"]
    assert res.status == "pass"


DMESG_FORMS = [
    [],
    ["-r"],
    ["-T"],
    ["--time-format=iso"],
    ["-x"],
    ["-x", "--time-format=iso"],
]


def _dmesg(args: list[str]) -> str:
    res = subprocess.run(["dmesg", *args], capture_output=True, text=True, timeout=30)
    if res.returncode != 0 or not res.stdout.strip():
        why = res.stderr.strip()[:80]
        pytest.skip(f"dmesg {' '.join(args)}: the kernel log needs root here ({why})")
    return res.stdout


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("dmesg") is None, reason="no dmesg on this host")
@pytest.mark.parametrize("args", DMESG_FORMS, ids=[" ".join(a) or "raw" for a in DMESG_FORMS])
def test_this_hosts_dmesg_every_line_time_is_read_and_agrees(args):
    """The real util-linux on this host, in each form: every record's time is read, and it is
    the instant the raw seconds since boot plus /proc/stat btime give (dmesg -T and iso compute
    the same sum themselves, from a boot time good to a second)."""
    boot = read_boot_time()
    assert boot is not None
    now = time.time()
    raw = [line_time(r, now, boot) for r in log_records(_dmesg([])) if r.strip()]
    other = [line_time(r, now, boot) for r in log_records(_dmesg(args)) if r.strip()]
    assert raw and None not in raw and None not in other
    n = min(len(raw), len(other))  # the ring buffer may grow between the two reads
    assert n > 0 and all(abs(a - b) < 2.0 for a, b in zip(raw[:n], other[:n], strict=True))


def test_a_log_read_from_its_middle_starts_at_a_whole_line(tmp_path):
    """Cutting a big log must not leave half a line whose time is gone and so counts as new."""
    old = f"[    5.000000] {XID48}\n"
    new = f"[ 1126.635824] {BENIGN}\n"
    log = tmp_path / "kern.log"
    log.write_text(old + new)
    for max_bytes in range(len(new) - 5, len(old) + len(new)):
        text = xid.read_kernel_log(str(log), 5.0, max_bytes)
        assert "Xid" not in text or text.startswith("[    5.0"), (max_bytes, text)
        assert verdict(text, BOOT + 100).status == "pass"
    assert xid.read_kernel_log(str(log), 5.0, len(old) + len(new)) == old + new
    assert verdict(xid.read_kernel_log(str(log), 5.0, 10**6), BOOT + 1).status == "fail"


def test_a_lost_gpu_is_said_once_and_not_again_after_its_xid_79():
    spam = "".join(f"[ {2013 + i}.5] NVRM: GPU is lost, skipping nvidia_ioctl\n" for i in range(50))
    res = verdict(spam, BOOT)
    assert res.status == "fail" and "GPU lost a GPU x50" in res.detail
    assert res.reason == "GPU lost a GPU"
    xid79 = (
        "[ 2012.001234] NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>,"
        " GPU has fallen off the bus.\n"
        "[ 2012.001300] NVRM: GPU 0000:db:00.0: GPU has fallen off the bus.\n"
    )
    res = verdict(xid79, BOOT)
    assert (
        res.status == "fail" and res.reason == "Xid 79 0000:db:00" and "GPU lost" not in res.detail
    )


def test_xid_lines_in_dmesg_T_and_syslog_forms():
    events = parse_xid_lines((FIX / "dmesg_T.txt").read_text())
    assert [e.code for e in events] == [63, 48, 119, 79]
    assert events[3].pci == "0000:db:00" and events[3].message == "GPU has fallen off the bus."
    assert events[1].message.startswith("An uncorrectable double bit error")
    assert all(e.time is not None for e in events)
    assert events[3].time - events[0].time == 16 * 60 + 47
    syslog = parse_xid_lines((FIX / "kern_log_syslog.txt").read_text())
    assert [e.code for e in syslog] == [63, 79] and syslog[1].time is not None
    raw = parse_xid_lines((FIX / "dmesg_raw.txt").read_text(), boot_time=1_000_000.0)
    assert [(e.code, e.time) for e in raw] == [(79, 1_002_012.001234), (94, 1_002_100.5)]
    assert parse_xid_lines((FIX / "dmesg_noise.txt").read_text()) == []


def test_line_time_forms():
    assert line_time(
        "2024-03-12T10:31:09.123+00:00 host kernel: NVRM: Xid", 0, None
    ) == pytest.approx(1710239469.123)
    assert line_time("no time here", 0, None) is None
    assert line_time("[ 12.5] x", 0, None) is None  # raw seconds need the boot time
