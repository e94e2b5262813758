"""Scale simulator: effective training time of synchronous vs FT-HSDP training under failures.

numpy only (no torch): `params` holds the inputs and the `paper-100k` preset, `analytic` the
textbook's closed forms (cluster MTBF, Young/Daly), `engine` the vectorised Monte Carlo model,
`plot` the optional matplotlib figure. `fthsdp simulate` is a thin front end over `compare`.
"""

from runtime.sim.analytic import cluster_mtbf_hours, power_law_interpolate, young_daly_interval_s
from runtime.sim.engine import Comparison, ModeRuns, compare, simulate_mode, spares_sweep
from runtime.sim.params import PRESETS, SimParams, params_from_options

__all__ = [
    "PRESETS",
    "Comparison",
    "ModeRuns",
    "SimParams",
    "cluster_mtbf_hours",
    "compare",
    "params_from_options",
    "power_law_interpolate",
    "simulate_mode",
    "spares_sweep",
    "young_daly_interval_s",
]
