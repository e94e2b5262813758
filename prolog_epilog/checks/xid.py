"""xid: NVIDIA Xid events in the kernel log since the job started (or within a window).

Xids are the driver's own verdicts on GPU faults. Some mean the GPU is gone or unsafe until reset
(79 fallen off the bus, 48 DBE, 74 NVLink, 94/95 contained/uncontained ECC, 119/120 GSP, 140+
memory and GSP faults): one is enough to drain. Others (63/92/94 by default) are warnings unless
they repeat. The PCI address in the line is mapped to the GPU index when the GPU list is
available, so the drain reason says which GPU.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings
from prolog_epilog.kernel_log import boot_time, parse_xid_lines
from prolog_epilog.records import GpuInfo, XidEvent, normalize_bus
from prolog_epilog.tools import ToolError, run_tool


def attach_gpu_index(events: list[XidEvent], gpus: list[GpuInfo]) -> list[XidEvent]:
    by_bus = {normalize_bus(g.bus_id): g.index for g in gpus}
    out = []
    for e in events:
        idx = by_bus.get(normalize_bus(e.pci))
        out.append(XidEvent(e.code, e.pci, e.message, e.time, idx, e.line))
    return out


def judge(events: list[XidEvent], since: float | None, cfg: dict[str, Any]) -> CheckResult:
    f = Findings("xid")
    recent = [e for e in events if since is None or (e.time is not None and e.time >= since)]
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
        text = f"Xid {e.code} on {where}{times}: {e.message[:80]}"
        if e.code in drain:
            f.add("fail", text, f"Xid {e.code} {where}")
        elif e.code in warn:
            repeat = int(cfg["warn_repeat_fail"])
            if repeat > 0 and n >= repeat:
                f.add("fail", text, f"Xid {e.code} {where} x{n}")
            else:
                f.add("warn", text)
        else:
            f.add("warn", text)
    return f.result(f"no Xid in window ({len(events)} older or none)" if events else "no Xid")


def read_kernel_log(source: str, timeout: float, max_bytes: int) -> str:
    if source == "dmesg":
        return run_tool(["dmesg", "-T"], timeout).stdout
    path = Path(source)
    size = path.stat().st_size
    with path.open("rb") as f:
        if size > max_bytes:
            f.seek(size - max_bytes)
        return f.read().decode(errors="replace")


def run(ctx: CheckContext) -> CheckResult:
    cfg = ctx.config.section("xid")
    now = time.time()
    boot = boot_time()
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
    events = parse_xid_lines(text, now=now, boot_time=boot)
    if any(e.time is not None and e.time >= since for e in events):
        try:
            events = attach_gpu_index(events, ctx.source.gpus(min(ctx.remaining(), 3.0)))
        except Exception:  # the GPU list is a nicety here; a dead nvidia-smi must not hide the Xid
            pass
    return judge(events, since, cfg)
