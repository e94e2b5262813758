"""GPU faults from the kernel log, in every line form a node produces, never dropped silently.

The NVIDIA driver logs GPU faults as `NVRM: Xid (PCI:0000:9b:00): 79, pid=..., <message>`, and a
GPU that is gone without an Xid as `NVRM: GPU 0000:db:00.0: GPU has fallen off the bus.`, as a
three-line `NVRM: The NVIDIA GPU ... fallen off the bus and is not responding to commands.`, or
as `NVRM: GPU 0000:02:00.0: RmInitAdapter failed!`. The same message reaches us in many wrappers,
each checked against the tool's own source (util-linux `dmesg.c`, systemd `logs-show.c`):

- `dmesg` (seconds since boot) `[ 1126.635824] `, `-d` `[ 1126.635824 <    0.000012>] `,
  `-r` `<4>[ 1126.635824] `; `journalctl -k -o short-monotonic` `[ 1126.635824] host kernel: `;
- `dmesg -T` `[Mon Nov 30 12:02:03 2026] ` (local time, `%e` pads the day with a space);
- `dmesg --time-format=iso` `2024-11-15T12:02:03,470068+00:00 ` (comma; dot accepted too);
- `dmesg -x` facility/level prefix `kern  :warn  : ` before any of the above;
- classic syslog and `journalctl -o short` / `short-precise` `Nov 30 12:02:03[.123456] host
  kernel: ` (no year: the latest year that is not in the future is taken);
- RFC 3339 syslog and `journalctl -o short-iso` / `short-iso-precise`
  `2026-11-30T12:02:03[.123456]+00:00 host kernel: ` (`+0000` in systemd before v255);
- `journalctl -o short-full` `Mon 2026-11-30 12:02:03 UTC host kernel: `, `-o short-unix`
  `1796040123.123456 host kernel: `, and `/dev/kmsg` records `4,1234,1126635824,-;`.

Seconds since boot become wall time through the boot time the caller passes (`/proc/stat`
btime, `read_boot_time`). A line whose time cannot be read keeps `time=None`; the xid check
counts such events as inside its window and says so, so an unknown log form can never hide a
fault. Continuation lines (indented, no time of their own) join the record above them, which is
how `dmesg` and `journalctl` print multi-line kernel messages.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from prolog_epilog.records import XidEvent

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")
_LOST = re.compile(
    r"fallen off the bus|RmInitAdapter failed|rm_init_adapter failed|GPU is lost"
    r"|GPU_IS_LOST|lost from the bus",
    re.IGNORECASE,
)
_PCI = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")

_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
_FACILITY = (
    r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res[0-3]|local[0-7])"
)
_LEVEL = r"(?:emerg|alert|crit|err|warn|notice|info|debug)"
_DECODE = re.compile(rf"^{_FACILITY} *:{_LEVEL} *: ")
_PRIORITY = re.compile(r"^<\d{1,3}>")
_MONOTONIC = re.compile(r"^\[\s*(\d+\.\d+)(?:\s*<\s*\d+\.\d+[ *]?>)?\]")
_CTIME = re.compile(r"^\[(\w{3} +\w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4})(?: <[^>]*>)?\]")
_ISO = re.compile(
    r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?(?=\s)"
)
_SYSLOG = re.compile(r"^(\w{3}) +(\d{1,2}) (\d\d:\d\d:\d\d)(?:\.(\d{1,9}))? \S+ ")
_FULL = re.compile(r"^\w{3} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{1,9}))? ([A-Za-z]+) \S+ ")
_UNIX = re.compile(r"^(\d{9,11}\.\d{6}) \S+ ")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1
    )
}


@dataclass(frozen=True)
class GpuLostEvent:
    """A driver message meaning a GPU is gone or failed to start, with or without an Xid."""

    pci: str  # as printed, e.g. 0000:b3:00.0 ("" if the message names none)
    message: str
    time: float | None = None  # epoch seconds; None if the line's time could not be read
    line: str = ""


@dataclass(frozen=True)
class KernelLogEvents:
    xids: list[XidEvent]
    lost: list[GpuLostEvent]


def read_boot_time(proc_stat: str = "/proc/stat") -> float | None:
    """Boot time in epoch seconds from the kernel's `btime` line, or None if unreadable."""
    try:
        with open(proc_stat) as f:
            for row in f:
                if row.startswith("btime "):
                    return float(row.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _fraction(digits: str | None) -> float:
    return float(f"0.{digits}") if digits else 0.0


def _syslog_time(month: str, day: int, clock: str, frac: float, now: float) -> float | None:
    """Classic syslog has no year: take the latest year whose date is not in the future."""
    mon = _MONTHS.get(month)
    if mon is None:
        return None
    hh, mm, ss = (int(x) for x in clock.split(":"))
    year = time.localtime(now).tm_year
    for y in (year, year - 1, year - 2, year - 3, year - 4):  # Feb 29 needs a leap year
        try:
            t = datetime(y, mon, day, hh, mm, ss).timestamp() + frac
        except ValueError:
            continue
        if t <= now + 86400:  # a clock a little ahead of ours is still this year
            return t
    return None


def _iso_time(m: re.Match[str]) -> float:
    date, clock, frac, zone = m.groups()
    stamp = datetime.fromisoformat(f"{date}T{clock}")
    if zone is None:
        return stamp.timestamp() + _fraction(frac)  # local time, as the tool printed it
    if zone == "Z":
        tz = UTC
    else:
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    return stamp.replace(tzinfo=tz).timestamp() + _fraction(frac)


def line_time(line: str, now: float, boot_time: float | None) -> float | None:
    """Epoch seconds of one kernel-log line, or None if its time cannot be read."""
    try:
        m = _KMSG.match(line)
        if m:
            return None if boot_time is None else boot_time + int(m.group(1)) / 1e6
        line = _DECODE.sub("", line, count=1)
        line = _PRIORITY.sub("", line, count=1)
        m = _MONOTONIC.match(line)
        if m:
            return None if boot_time is None else boot_time + float(m.group(1))
        m = _CTIME.match(line)
        if m:
            stamp = " ".join(m.group(1).split())
            return datetime.strptime(stamp, "%a %b %d %H:%M:%S %Y").timestamp()
        m = _ISO.match(line)
        if m:
            return _iso_time(m)
        m = _SYSLOG.match(line)
        if m:
            month, day, clock, frac = m.groups()
            return _syslog_time(month, int(day), clock, _fraction(frac), now)
        m = _FULL.match(line)
        if m:
            stamp, frac, zone = m.groups()
            parsed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
            if zone in ("UTC", "GMT"):
                return parsed.replace(tzinfo=UTC).timestamp() + _fraction(frac)
            if zone in time.tzname:
                return parsed.timestamp() + _fraction(frac)
            return None  # another zone's abbreviation: ambiguous, read as unknown
        m = _UNIX.match(line)
        if m:
            return float(m.group(1))
    except (ValueError, OverflowError, OSError):
        return None
    return None


def log_records(text: str) -> list[str]:
    """Lines joined with their continuation lines (indented, no time of their own)."""
    out: list[str] = []
    for line in text.splitlines():
        if out and line[:1] in (" ", "\t") and line.strip():
            out[-1] = f"{out[-1]} {line.strip()}"
        else:
            out.append(line)
    return out


def parse_kernel_log(
    text: str, now: float | None = None, boot_time: float | None = None
) -> KernelLogEvents:
    """Every Xid and every lost-GPU message in `text`, each with its time or None."""
    now = time.time() if now is None else now
    xids: list[XidEvent] = []
    lost: list[GpuLostEvent] = []
    for record in log_records(text):
        if "NVRM" not in record:
            continue
        m = _XID.search(record)
        if m:
            message = m.group(3).strip()
            # Newer drivers: "pid='<unknown>', name=<unknown>, msg"; older: "pid=1896, msg".
            message = re.sub(r"^pid=[^,]*,\s*(name=[^,]*,\s*)?", "", message)
            xids.append(
                XidEvent(
                    code=int(m.group(2)),
                    pci=m.group(1).lower(),
                    message=message,
                    time=line_time(record, now, boot_time),
                    line=record.strip(),
                )
            )
            continue
        lm = _LOST.search(record)
        if lm:
            nvrm = record[record.index("NVRM") :]
            pm = _PCI.search(nvrm)
            lost.append(
                GpuLostEvent(
                    pci=pm.group(1).lower() if pm else "",
                    message=" ".join(re.sub(r"NVRM:\s*", "", nvrm).split()),
                    time=line_time(record, now, boot_time),
                    line=record.strip(),
                )
            )
    return KernelLogEvents(xids, lost)


def parse_xid_lines(
    text: str, now: float | None = None, boot_time: float | None = None
) -> list[XidEvent]:
    return parse_kernel_log(text, now, boot_time).xids
