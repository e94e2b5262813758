"""The names of the node health checks: the vocabulary of a spec's `[health].checks`.

A job asks for checks by these names and the prolog runs them, so both sides read this one
list: the spec validates against it, and `prolog_epilog` implements one check module per name
(its check registry must name exactly these).
"""

from __future__ import annotations

CHECK_NAMES = (
    "gpu-count",
    "ecc",
    "nvlink",
    "infiniband",
    "xid",
    "pcie",
    "thermal",
    "dcgm",
    "gpu-procs",
    "disk",
)
