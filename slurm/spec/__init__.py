"""The job spec: one TOML file that describes an FT-HSDP run, read into frozen dataclasses.

A user writes the run once (`[job]`, `[replicas]`, `[replicas.helper]`, `[control]`, `[train]`,
`[health]`, `[spares]`) and everything downstream (rendering, submission, the control plane, the
replica runtime) reads the same validated `JobSpec`. Validation happens here, once, so that
nothing that reaches a `#SBATCH` line or a shell line can be malformed or hostile: names are
limited to a safe charset, Slurm time and memory formats are checked, and every unknown key is an
error with a did-you-mean.

- `fields`: the value checks (charsets, Slurm formats) every section uses;
- `model`: the sections, whose fields are the schema, with their cross-field rules;
- `coerce`: TOML data to a `JobSpec`, typed by the schema, with the did-you-mean errors;
- `overrides`: `--set key=value`, typed by the field it targets;
- `load`: a spec file read, overridden and validated.

Bad input raises `slurm.errors.InputError(field, value, allowed)`, which the CLI prints as one line
with exit code 2.
"""

from __future__ import annotations

from slurm.spec.coerce import parse_spec
from slurm.spec.load import load_spec
from slurm.spec.model import (
    ControlSection,
    HealthSection,
    HelperSection,
    JobSection,
    JobSpec,
    ReplicasSection,
    SparesSection,
    TrainSection,
)
from slurm.spec.overrides import apply_overrides

__all__ = [
    "ControlSection",
    "HealthSection",
    "HelperSection",
    "JobSection",
    "JobSpec",
    "ReplicasSection",
    "SparesSection",
    "TrainSection",
    "apply_overrides",
    "load_spec",
    "parse_spec",
]
