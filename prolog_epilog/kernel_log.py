"""Xid events from the kernel log, in every line form a node produces.

The NVIDIA driver logs GPU faults as `NVRM: Xid (PCI:0000:9b:00): 79, pid=..., <message>`. The
same line reaches operators in several wrappers: raw `dmesg` (`[ 1234.567890] NVRM: ...`,
seconds since boot), `dmesg -T` (`[Mon Oct 16 10:00:00 2023] NVRM: ...`), syslog's kern.log
(`Oct 16 10:00:00 host kernel: [ 1234.5] NVRM: ...`) and ISO-timestamped journald/rsyslog lines.
`parse_xid_lines` reads them all and gives each event an epoch time when the line carries one, so
the check can count only events since the job started or within a window.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

from prolog_epilog.records import XidEvent

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")
_DMESG_T = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
_DMESG_RAW = re.compile(r"^\[\s*(\d+\.\d+)\]")
_SYSLOG = re.compile(r"^(\w{3} +\d+ \d\d:\d\d:\d\d) \S+ kernel:")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s")


def line_time(line: str, now: float, boot_time: float | None) -> float | None:
    """Epoch seconds of a kernel-log line, or None if it carries no usable time."""
    try:
        m = _DMESG_T.match(line)
        if m:
            return datetime.strptime(
                " ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y"
            ).timestamp()
        m = _ISO.match(line)
        if m:
            return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        m = _SYSLOG.match(line)
        if m:
            year = time.localtime(now).tm_year
            stamp = " ".join(m.group(1).split())
            t = datetime.strptime(f"{year} {stamp}", "%Y %b %d %H:%M:%S").timestamp()
            if t > now + 86400:  # syslog has no year: December lines read in January
                t = datetime.strptime(f"{year - 1} {stamp}", "%Y %b %d %H:%M:%S").timestamp()
            return t
        m = _DMESG_RAW.match(line)
        if m and boot_time is not None:
            return boot_time + float(m.group(1))
    except (ValueError, OverflowError, OSError):
        return None
    return None


def parse_xid_lines(
    text: str, now: float | None = None, boot_time: float | None = None
) -> list[XidEvent]:
    now = time.time() if now is None else now
    out = []
    for line in text.splitlines():
        if "NVRM: Xid" not in line:
            continue
        m = _XID.search(line)
        if not m:
            continue
        try:
            code = int(m.group(2))
        except ValueError:
            continue
        message = m.group(3).strip()
        # Newer drivers: "pid='<unknown>', name=<unknown>, msg"; older: "pid=1896, msg".
        message = re.sub(r"^pid=[^,]*,\s*(name=[^,]*,\s*)?", "", message)
        out.append(
            XidEvent(
                code=code,
                pci=m.group(1).lower(),
                message=message,
                time=line_time(line, now, boot_time),
                line=line.strip(),
            )
        )
    return out


def boot_time(proc_uptime: str = "/proc/uptime") -> float | None:
    try:
        with open(proc_uptime) as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
