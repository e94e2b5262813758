"""Can one coordinator hold the configuration? The control plane's capacity in the scale model.

Every replica leader (or, with per-node watchdogs reporting, every node) sends a status report
every `report_interval_s`; the coordinator is one process (aiohttp, one event loop, one SQLite
journal), so it can answer at most about `1 / report_cost_s` reports per second. The cost per
report is measured by `benchmarks/control_load.py` on the development machine
(`MEASURED_REPORT_COST_S` below: one coordinator's CPU time per signed, journaled report at
1,000 reports/s, straggler detection included); a site can pass its own. The model keeps
`headroom` of the coordinator for bursts (a rack failure sends every affected leader's fatal
report at once) and its own ticks and polls. Pure arithmetic; `fthsdp simulate` prints the
warning and puts the figures in its JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm.errors import InputError

#: Seconds of coordinator time per status report, from `benchmarks/control_load.py`
#: (benchmarks/figures/control_load.json, 2026-11-30 19:24 UTC, shared 2-core VM): the
#: coordinator process's CPU time per report at 1,000 reports/s, median 0.55 ms (range
#: 0.53-0.64 ms; the journal committed in groups, decisions awaited), plus the straggler
#: detector's per-sample cost once 1,000 replicas are settled, 0.20 ms (0.19-0.28 ms), which
#: the load windows do not reach. Before group commit it was 7.8 ms (one fsync per report).
MEASURED_REPORT_COST_S = 0.00075
#: Fraction of the coordinator a steady report load may use (the rest: bursts, ticks, polls).
DEFAULT_HEADROOM = 0.5


@dataclass(frozen=True)
class ControlLoad:
    """What a configuration asks of its one coordinator."""

    reporters: int
    report_interval_s: float
    report_cost_s: float
    headroom: float

    @property
    def reports_per_s(self) -> float:
        return self.reporters / self.report_interval_s

    @property
    def utilisation(self) -> float:
        """Fraction of one coordinator the steady reports take."""
        return self.reports_per_s * self.report_cost_s

    @property
    def capacity_reports_per_s(self) -> float:
        """Reports per second one coordinator holds within its headroom."""
        return self.headroom / self.report_cost_s

    @property
    def fits(self) -> bool:
        return self.utilisation <= self.headroom

    @property
    def min_interval_s(self) -> float:
        """The shortest report interval that fits."""
        return self.reporters * self.report_cost_s / self.headroom

    def warning(self) -> str | None:
        """One line for the user when it does not fit; None when it does."""
        if self.fits:
            return None
        return (
            f"warning: {self.reporters:,} reporters every {self.report_interval_s:g} s send "
            f"{self.reports_per_s:,.0f} reports/s, {self.utilisation * 100:.0f} % of one "
            f"coordinator (it holds {self.capacity_reports_per_s:,.0f}/s at "
            f"{self.report_cost_s * 1000:.2f} ms per report with {self.headroom * 100:.0f} % "
            f"headroom); report every >= {math.ceil(self.min_interval_s * 10) / 10:g} s or "
            "fan reports in per replica"
        )

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "reporters": self.reporters,
            "report_interval_s": self.report_interval_s,
            "report_cost_s": self.report_cost_s,
            "headroom": self.headroom,
            "reports_per_s": self.reports_per_s,
            "utilisation": self.utilisation,
            "capacity_reports_per_s": self.capacity_reports_per_s,
            "fits": self.fits,
            "min_interval_s": self.min_interval_s,
        }


def control_load(
    replicas: int,
    reporters_per_replica: int,
    report_interval_s: float,
    report_cost_s: float = MEASURED_REPORT_COST_S,
    headroom: float = DEFAULT_HEADROOM,
) -> ControlLoad:
    """The load of `replicas` x `reporters_per_replica` reporters; InputError on bad input."""
    for name, value in (("replicas", replicas), ("reporters_per_replica", reporters_per_replica)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(name, value, "must be a whole number >= 1")
    for name, num in (("report_interval_s", report_interval_s), ("report_cost_s", report_cost_s)):
        if not (num > 0 and math.isfinite(num)):
            raise InputError(name, num, "must be a finite number > 0")
    if not 0 < headroom <= 1:
        raise InputError("headroom", headroom, "must be in (0, 1]")
    return ControlLoad(
        reporters=replicas * reporters_per_replica,
        report_interval_s=report_interval_s,
        report_cost_s=report_cost_s,
        headroom=headroom,
    )
