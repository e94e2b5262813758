"""pcie (optional): a GPU's PCIe link trained narrower (or slower) than it can run.

A x16 GPU running at x8 halves host<->GPU bandwidth (checkpoint loads, data loading, and the
NIC path when GPUDirect RDMA crosses the root complex). Width is the reliable signal; the link
generation drops by design when an idle GPU saves power, so it is judged only with `check_gen`.
"""

from __future__ import annotations

from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings
from prolog_epilog.records import PcieLink


def judge(links: list[PcieLink], cfg: dict[str, Any]) -> CheckResult:
    f = Findings("pcie")
    sev = cfg["on_downgrade"]
    for link in links:
        g = f"GPU{link.index}"
        if (
            link.width_current is not None
            and link.width_max
            and link.width_current < link.width_max
        ):
            f.add(
                sev,
                f"{g} PCIe x{link.width_current} of x{link.width_max}",
                f"{g} PCIe x{link.width_current}",
            )
        if (
            cfg["check_gen"]
            and link.gen_current is not None
            and link.gen_max
            and link.gen_current < link.gen_max
        ):
            f.add(
                sev,
                f"{g} PCIe gen{link.gen_current} of gen{link.gen_max}",
                f"{g} PCIe gen{link.gen_current}",
            )
    return f.result(f"{len(links)} GPU links at full width")


def run(ctx: CheckContext) -> CheckResult:
    return judge(ctx.source.pcie(ctx.remaining()), ctx.config.section("pcie"))
