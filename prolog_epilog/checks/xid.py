"""xid: NVIDIA Xid events and lost-GPU messages in the kernel log since the job started.

Xids are the driver's own verdicts on GPU faults. Some mean the GPU is gone or unsafe until reset
(79 fallen off the bus, 48 DBE, 74 NVLink, 94/95 contained/uncontained ECC, 119/120 GSP, 140+
memory and GSP faults): one is enough to drain. Others (63/92/94 by default) are warnings unless
they repeat. Xid 154 carries the driver's recovery action; anything but "None" (reset or reboot
required, drain) fails whatever the lists say. A GPU can also vanish with no Xid at all ("GPU has
fallen off the bus", "RmInitAdapter failed"): that fails too.

Nothing is dropped for want of a time: an event whose timestamp could not be read counts as
inside the window and the detail says so. The PCI address is mapped to the GPU index when the
GPU list is available, so the drain reason says which GPU.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings
from prolog_epilog.kernel_log import GpuLostEvent, parse_kernel_log, read_boot_time
from prolog_epilog.records import GpuInfo, XidEvent, normalize_bus
from prolog_epilog.tools import ToolError, run_tool

_RECOVERY = re.compile(r"recovery action changed from .*? to 0x[0-9a-fA-F]+ \(([^)]*)\)")


def attach_gpu_index(events: list[XidEvent], gpus: list[GpuInfo]) -> list[XidEvent]:
    by_bus = {normalize_bus(g.bus_id): g.index for g in gpus}
    out = []
    for e in events:
        idx = by_bus.get(normalize_bus(e.pci))
        out.append(XidEvent(e.code, e.pci, e.message, e.time, idx, e.line))
    return out


def _in_window(t: float | None, since: float | None) -> bool:
    return since is None or t is None or t >= since


def _recovery_action(e: XidEvent) -> str | None:
    """The action an Xid 154 asks for, unless it is "None"."""
    m = _RECOVERY.search(e.message) if e.code == 154 else None
    return m.group(1) if m and m.group(1).strip().lower() != "none" else None


def judge(
    events: list[XidEvent],
    since: float | None,
    cfg: dict[str, Any],
    lost: list[GpuLostEvent] | None = None,
) -> CheckResult:
    f = Findings("xid")
    recent = [e for e in events if _in_window(e.time, since)]
    gone = [e for e in lost or [] if _in_window(e.time, since)]
    drain, warn = set(cfg["drain"]), set(cfg["warn"])
    counts = Counter((e.code, e.pci) for e in recent)
    reported: set[tuple[int, str]] = set()
    for e in recent:
        key = (e.code, e.pci)
        if key in reported:
            continue
        reported.add(key)
        where = f"GPU{e.gpu_index}" if e.gpu_index is not None else e.pci
        n = counts[key]
        times = f" x{n}" if n > 1 else ""
        unreadable = any(x.time is None for x in recent if (x.code, x.pci) == key)
        when = " (time unreadable)" if unreadable else ""
        text = f"Xid {e.code} on {where}{times}{when}: {e.message[:80]}"
        action = _recovery_action(e)
        if e.code in drain:
            f.add("fail", text, f"Xid {e.code} {where}")
        elif action is not None:
            f.add("fail", text, f"Xid {e.code} {where} {action}")
        elif e.code in warn:
            repeat = int(cfg["warn_repeat_fail"])
            if repeat > 0 and n >= repeat:
                f.add("fail", text, f"Xid {e.code} {where} x{n}")
            else:
                f.add("warn", text)
        else:
            f.add("warn", text)
    # A lost GPU already failing on an Xid (79 is followed by "GPU has fallen off the bus")
    # is said once; a message repeated for one GPU is said once with its count.
    failing = {normalize_bus(e.pci) for e in recent if e.code in drain}
    lost_counts = Counter(g.pci for g in gone)
    for pci in lost_counts:
        if pci and normalize_bus(pci) in failing:
            continue
        first = next(g for g in gone if g.pci == pci)
        unreadable = any(g.time is None for g in gone if g.pci == pci)
        where = pci or "a GPU"
        times = f" x{lost_counts[pci]}" if lost_counts[pci] > 1 else ""
        when = " (time unreadable)" if unreadable else ""
        text = f"GPU lost {where}{times}{when}: {first.message[:100]}"
        f.add("fail", text, f"GPU lost {where}")
    older = len(events) + len(lost or []) - len(recent) - len(gone)
    return f.result(f"no Xid in window ({older} older)" if older else "no Xid")


#: The check's mode when the kernel log follower woke it: the verdict without the GPU list.
FAST_MODE = "follow"


def _tail(text: str, max_bytes: int) -> str:
    """The last `max_bytes` of a log, starting at a whole line.

    A line cut in half has lost its time, and an unreadable time counts as recent: the cut
    must not turn an old Xid into a new one.
    """
    if len(text) <= max_bytes:
        return text
    tail = text[-max_bytes:]
    return tail[tail.find("\n") + 1 :] if "\n" in tail else ""


def read_kernel_log(source: str, timeout: float, max_bytes: int) -> str:
    if source == "dmesg":
        # Raw seconds since boot: every util-linux and busybox prints them, in any locale.
        return _tail(run_tool(["dmesg"], timeout).stdout, max_bytes)
    path = Path(source)
    size = path.stat().st_size
    with path.open("rb") as f:
        if size > max_bytes:
            f.seek(size - max_bytes - 1)  # one byte more: was the cut at a line start?
            data = f.read()
            start = data.find(b"\n") + 1
            return data[start:].decode(errors="replace") if start else ""
        return f.read().decode(errors="replace")


def run(ctx: CheckContext) -> CheckResult:
    cfg = ctx.config.section("xid")
    now = time.time()
    boot = read_boot_time()
    since = ctx.since
    if since is None:
        since = now - float(cfg["window_s"])
        if boot is not None:
            since = max(since, boot)
    try:
        text = read_kernel_log(ctx.kernel_log, ctx.remaining(), int(cfg["max_bytes"]))
    except FileNotFoundError:
        return CheckResult("xid", "skip", f"no kernel log at {ctx.kernel_log}")
    except ToolError as exc:
        if "exited" in str(exc) and os.geteuid() != 0:
            return CheckResult("xid", "skip", f"kernel log not readable ({exc})")
        raise
    found = parse_kernel_log(text, now=now, boot_time=boot)
    events = found.xids
    if ctx.mode != FAST_MODE and any(_in_window(e.time, since) for e in events):
        # The GPU list is a nicety here; a dead nvidia-smi must not hide the Xid, nor may
        # asking it slow the watchdog's answer to a fresh driver line (`FAST_MODE`).
        with contextlib.suppress(Exception):
            events = attach_gpu_index(events, ctx.source.gpus(min(ctx.remaining(), 3.0)))
    return judge(events, since, cfg, found.lost)
