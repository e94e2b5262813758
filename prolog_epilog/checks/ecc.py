"""ecc: uncorrectable memory errors, row-remap failures and retired-page exhaustion.

A volatile uncorrectable error means the GPU corrupted data since the driver loaded: the job
that saw it is already lost and the next one will be too, so the default threshold is 0. Rows
pending remap or a remap failure need a GPU reset (or an RMA); retired pages at the table limit
mean the GPU cannot retire more. Correctable errors are normal in small numbers; their count
and their rate between two runs (from the state store) are thresholds in the config. GPUs with
ECC disabled or N/A are a warning or a failure by config, never a crash.

Rows and pages are judged whether or not ECC counters were read (an excerpt, a driver that
prints no mode, ECC turned off): a pending remap needs a reset either way. A GPU the source
lists but reports nothing about is an error, not a pass: an unread answer is not a healthy one.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings, threshold_hit
from prolog_epilog.records import EccCounts, RemappedRows, RetiredPages


def judge(
    eccs: list[EccCounts],
    rows: list[RemappedRows],
    pages: list[RetiredPages],
    cfg: dict[str, Any],
    rates_per_h: dict[int, float] | None = None,
    gpu_count: int | None = None,
) -> CheckResult:
    f = Findings("ecc")
    if gpu_count is not None:
        seen = {e.index for e in eccs} | {r.index for r in rows} | {p.index for p in pages}
        for i in sorted(set(range(gpu_count)) - seen):
            f.add(
                "error",
                f"GPU{i}: no ECC, row-remap or page-retirement data read",
                f"GPU{i} no ECC data",
            )
    for e in eccs:
        g = f"GPU{e.index}"
        counters = (e.volatile_uncorrectable, e.volatile_correctable, e.aggregate_uncorrectable)
        if e.enabled is False or (e.enabled is None and all(c is None for c in counters)):
            state = "disabled" if e.enabled is False else "N/A"
            f.add(cfg["ecc_disabled"], f"{g} ECC {state}", f"{g} ECC {state}")
            continue
        if threshold_hit(e.volatile_uncorrectable, cfg["volatile_uncorrectable_max"]):
            f.add(
                "fail",
                f"{g} volatile uncorrectable ECC {e.volatile_uncorrectable}"
                f" (DRAM {e.volatile_dram_uncorrectable}, SRAM {e.volatile_sram_uncorrectable})",
                f"{g} uncorr ECC {e.volatile_uncorrectable}",
            )
        if e.sram_threshold_exceeded:
            f.add("fail", f"{g} SRAM threshold exceeded", f"{g} SRAM threshold")
        if threshold_hit(e.aggregate_uncorrectable, cfg["aggregate_uncorrectable_fail"]):
            f.add("fail", f"{g} aggregate uncorrectable ECC {e.aggregate_uncorrectable}")
        elif threshold_hit(e.aggregate_uncorrectable, cfg["aggregate_uncorrectable_warn"] - 1):
            f.add("warn", f"{g} aggregate uncorrectable ECC {e.aggregate_uncorrectable}")
        if threshold_hit(e.volatile_correctable, cfg["volatile_correctable_fail"]):
            f.add("fail", f"{g} volatile correctable ECC {e.volatile_correctable}")
        elif threshold_hit(e.volatile_correctable, cfg["volatile_correctable_warn"]):
            f.add("warn", f"{g} volatile correctable ECC {e.volatile_correctable}")
        rate = (rates_per_h or {}).get(e.index)
        if threshold_hit(rate, cfg["correctable_rate_fail_per_h"]):
            f.add("fail", f"{g} correctable ECC rate {rate:.0f}/h")
        elif threshold_hit(rate, cfg["correctable_rate_warn_per_h"]):
            f.add("warn", f"{g} correctable ECC rate {rate:.0f}/h")
    for r in rows:
        g = f"GPU{r.index}"
        if r.failure:
            f.add("fail", f"{g} row remapping failure occurred", f"{g} remap failure")
        if r.pending:
            f.add("fail", f"{g} remapped rows pending (reset needed)", f"{g} remap pending")
    limit = int(cfg["retired_pages_limit"])
    for p in pages:
        g = f"GPU{p.index}"
        total = (p.single_bit or 0) + (p.double_bit or 0)
        if limit > 0 and total >= limit:
            f.add("fail", f"{g} {total} retired pages (table limit {limit})", f"{g} pages {total}")
        elif p.pending:
            f.add("warn", f"{g} page retirement pending (reset needed)")
    return f.result(f"{max(len(eccs), len(rows), len(pages))} GPUs clean")


def correctable_rates(
    eccs: list[EccCounts], previous: dict[str, Any] | None, now: float
) -> dict[int, float]:
    """Correctable errors per hour per GPU since the previous sample (same driver load only)."""
    if not previous:
        return {}
    dt = now - float(previous.get("time", now))
    if dt < 1.0:
        return {}
    counts = previous.get("counts", {})
    out = {}
    for e in eccs:
        before = counts.get(str(e.index))
        if e.volatile_correctable is None or before is None or e.volatile_correctable < before:
            continue  # a smaller count means the driver reloaded: no rate
        out[e.index] = (e.volatile_correctable - before) * 3600.0 / dt
    return out


def run(ctx: CheckContext) -> CheckResult:
    eccs, rows, pages = ctx.source.ecc(ctx.remaining())
    now = time.time()
    rates = correctable_rates(eccs, ctx.state.get("ecc"), now)
    ctx.state.put(
        "ecc",
        {
            "time": now,
            "counts": {
                str(e.index): e.volatile_correctable
                for e in eccs
                if e.volatile_correctable is not None
            },
        },
    )
    gpu_count = None
    with contextlib.suppress(Exception):  # the gpu-count check reports a broken GPU list
        gpu_count = len(ctx.source.gpus(ctx.remaining()))
    if not (eccs or rows or pages) and not gpu_count:
        return CheckResult("ecc", "skip", "no GPU reports ECC, remapped rows or retired pages")
    return judge(eccs, rows, pages, ctx.config.section("ecc"), rates, gpu_count)
