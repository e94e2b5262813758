"""nvlink: every expected NVLink up at the expected speed, and error counters not growing.

A degraded NVLink (one link down, or trained at a lower speed) makes every collective on the node
slower without failing anything, which in lock-step training slows every replica. The expected
link count and speed come from the config or, by default, from the GPU model (H100/H200/H20: 18
links at 26.562 GB/s; A100 SXM: 12 at 25 GB/s). A GPU with no NVLink prints nothing and is fine
unless links are expected; `all links are inActive` where links are expected fails.
Error counters (replay, recovery, CRC) only count up; growth since the previous run above a
threshold fails.
"""

from __future__ import annotations

from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings, threshold_hit
from prolog_epilog.records import NvLinkErrors, NvLinkStatus

#: (substring of the GPU name, links, GB/s per link as nvidia-smi prints it)
MODEL_LINKS: tuple[tuple[str, int, float], ...] = (
    ("H100", 18, 26.562),
    ("H200", 18, 26.562),
    ("H20", 18, 26.562),
    ("H800", 8, 26.562),
    ("A100-SXM", 12, 25.0),
    ("A800-SXM", 8, 25.0),
)


def expected_for(name: str, cfg: dict[str, Any]) -> tuple[int, float]:
    """(links, GB/s) expected for a GPU; links 0 means none expected."""
    links, speed = int(cfg["expected_links"]), float(cfg["expected_speed_gbps"])
    if links < 0:
        return 0, 0.0
    if links == 0:
        for key, n, s in MODEL_LINKS:
            if key in name and not ("PCIe" in name and key in ("H100", "A100-SXM")):
                return n, speed or s
        return 0, speed
    return links, speed


def judge(
    status: list[NvLinkStatus],
    errors: list[NvLinkErrors],
    cfg: dict[str, Any],
    previous_totals: dict[str, int] | None = None,
) -> CheckResult:
    f = Findings("nvlink")
    up_total = 0
    for s in status:
        g = f"GPU{s.index}"
        want_links, want_speed = expected_for(s.name, cfg)
        if s.all_inactive or not s.links:
            if want_links:
                f.add(
                    "fail", f"{g} all NVLinks inactive (expected {want_links})", f"{g} NVLink down"
                )
            continue
        inactive = sorted(k for k, v in s.links.items() if v is None)
        active = {k: v for k, v in s.links.items() if v is not None}
        up_total += len(active)
        if inactive:
            f.add(
                "fail",
                f"{g} NVLink {','.join(map(str, inactive))} inactive",
                f"{g} link {inactive[0]} down",
            )
        if want_links and len(active) < want_links and not inactive:
            f.add(
                "fail",
                f"{g} {len(active)} of {want_links} NVLinks",
                f"{g} {len(active)}/{want_links} links",
            )
        if want_speed > 0:
            slow = sorted(k for k, v in active.items() if 0 <= v < want_speed - 0.01)
            if slow:
                f.add(
                    "fail",
                    f"{g} NVLink {','.join(map(str, slow))} below {want_speed} GB/s"
                    f" ({active[slow[0]]} GB/s)",
                    f"{g} link {slow[0]} slow",
                )
    prev = previous_totals or {}
    for e in errors:
        g = f"GPU{e.index}"
        total = e.total()
        before = prev.get(str(e.index))
        if (
            before is not None
            and total >= before
            and threshold_hit(total - before, cfg["error_growth_max"])
        ):
            f.add("fail", f"{g} NVLink errors grew by {total - before}", f"{g} NVLink errors")
        if threshold_hit(total, cfg["error_total_max"]):
            f.add("fail", f"{g} NVLink error total {total}", f"{g} NVLink errors")
    if not status:
        return f.result("no NVLink reported")
    return f.result(f"{up_total} links up on {len(status)} GPUs")


def run(ctx: CheckContext) -> CheckResult:
    cfg = ctx.config.section("nvlink")
    status = ctx.source.nvlink_status(ctx.remaining())
    if not status:
        if int(cfg["expected_links"]) > 0:
            return CheckResult(
                "nvlink",
                "fail",
                f"no NVLink reported, {cfg['expected_links']} expected",
                "no NVLink",
            )
        return CheckResult("nvlink", "pass", "no NVLink on this node")
    errors = ctx.source.nvlink_errors(ctx.remaining())
    previous = ctx.state.get("nvlink")
    ctx.state.put("nvlink", {str(e.index): e.total() for e in errors})
    return judge(status, errors, cfg, previous)
