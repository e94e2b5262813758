"""Scale simulator: effective training time of synchronous vs FT-HSDP training under failures.

numpy only (no torch): `params` holds the inputs and the `paper-100k` preset, `reliability` the
closed forms (cluster MTBF, Young/Daly), `engine` the vectorised Monte Carlo model,
`plot` the optional matplotlib figure. `fthsdp simulate` is a thin front end over `compare`.
"""

from runtime.sim.engine import Comparison, ModeRuns, compare, simulate_mode, spares_sweep
from runtime.sim.params import PRESETS, SimParams, params_from_options, power_law_interpolate
from runtime.sim.reliability import cluster_mtbf_hours, young_daly_interval_s

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
