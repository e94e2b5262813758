"""thermal (optional): GPU temperature and hardware clock slowdown.

A GPU throttled by HW slowdown (power brake, thermal) runs every step slower, and in synchronous
training the slowest GPU sets the pace for all. Temperatures above the warning level point at
cooling before the GPU starts throttling.
"""

from __future__ import annotations

from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings, threshold_hit
from prolog_epilog.records import ThermalState


def judge(states: list[ThermalState], cfg: dict[str, Any]) -> CheckResult:
    f = Findings("thermal")
    for s in states:
        g = f"GPU{s.index}"
        if threshold_hit(s.temperature_c, cfg["temperature_fail_c"]):
            f.add("fail", f"{g} at {s.temperature_c:g} C", f"{g} {s.temperature_c:g}C")
        elif threshold_hit(s.temperature_c, cfg["temperature_warn_c"]):
            f.add("warn", f"{g} at {s.temperature_c:g} C")
        if cfg["hw_slowdown"] != "ignore" and (s.hw_slowdown or s.hw_thermal_slowdown):
            kind = "HW thermal slowdown" if s.hw_thermal_slowdown else "HW slowdown"
            f.add(cfg["hw_slowdown"], f"{g} {kind} active", f"{g} HW slowdown")
        if s.sw_thermal_slowdown:
            f.add("warn", f"{g} SW thermal slowdown active")
    hottest = max((s.temperature_c for s in states if s.temperature_c is not None), default=None)
    return f.result(
        f"{len(states)} GPUs, hottest {hottest:g} C" if hottest is not None else "no data"
    )


def run(ctx: CheckContext) -> CheckResult:
    return judge(ctx.source.thermal(ctx.remaining()), ctx.config.section("thermal"))
