"""infiniband: every expected InfiniBand port ACTIVE/LinkUp at the expected rate.

Read from sysfs (no tool, cannot hang). A port `1: DOWN` / `2: Polling` has lost its cable or
its switch port; a port at a lower rate than expected (an NDR port trained at HDR) halves the
node's share of every cross-node collective. Ethernet (RoCE) ports are judged only when
`check_roce` is set, since many nodes carry a management Ethernet port on the same HCA family.
Error counters are reported when they reach the configured warning levels; the classic 8- and
16-bit counters saturate (link_downed at 255), and a saturated counter is reported as such
because its real value is unknown.
"""

from __future__ import annotations

from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings
from prolog_epilog.fabric import COUNTER_MAX, parse_ibstat, read_sysfs
from prolog_epilog.records import IbPort


def judge(ports: list[IbPort], cfg: dict[str, Any]) -> CheckResult:
    f = Findings("infiniband")
    judged = [p for p in ports if p.link_layer.lower() != "ethernet" or cfg["check_roce"]]
    expected = int(cfg["expected_ports"])
    if not judged and expected == 0:
        return CheckResult("infiniband", "skip", "no InfiniBand ports")
    active = 0
    for p in judged:
        name = f"{p.device}/{p.port}"
        if p.state != "ACTIVE" or p.phys_state.lower() != "linkup":
            f.add(
                "fail",
                f"{name} {p.state or '?'}/{p.phys_state or '?'}",
                f"{name} {p.state.lower() or 'down'}",
            )
            continue
        active += 1
        min_rate = float(cfg["min_rate_gbps"])
        if min_rate > 0 and (p.rate_gbps is None or p.rate_gbps < min_rate):
            f.add(
                "fail",
                f"{name} rate {p.rate_text or '?'} < {min_rate:g} Gb/s",
                f"{name} rate {p.rate_gbps or 0:g}",
            )
        for counter, value in sorted(p.counters.items()):
            limit = cfg["counter_warn"].get(counter)
            saturated = value >= COUNTER_MAX.get(counter, 1 << 64)
            if saturated or (limit is not None and value >= limit):
                sev = "fail" if cfg["counters_fail"] else "warn"
                note = " (saturated)" if saturated else ""
                f.add(sev, f"{name} {counter}={value}{note}", f"{name} {counter}")
    if expected and active < expected:
        f.add(
            "fail", f"{active} of {expected} expected ports active", f"{active}/{expected} IB ports"
        )
    return f.result(f"{active} ports active")


def run(ctx: CheckContext) -> CheckResult:
    cfg = ctx.config.section("infiniband")
    ports = read_sysfs(ctx.sysfs_root, list(cfg["devices"]) or None)
    return judge(ports, cfg)


__all__ = ["judge", "parse_ibstat", "run"]
