"""Reading a spec file: TOML, then overrides, then validation, with the run dir made absolute."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from pathlib import Path

from slurm.errors import InputError
from slurm.spec.coerce import parse_spec
from slurm.spec.model import JobSpec
from slurm.spec.overrides import apply_overrides


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """Read, override and validate a spec file. Raises InputError on any bad input."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise InputError("SPEC", str(p), "an existing TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError("SPEC", str(p), f"valid TOML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("SPEC", str(p), f"a readable UTF-8 file ({exc})") from None
    data = apply_overrides(raw, overrides)
    job = data.get("job")
    if isinstance(job, dict) and isinstance(job.get("run_dir"), str) and job["run_dir"]:
        # Slurm jobs and later commands run from other directories: pin the path now.
        job["run_dir"] = os.path.abspath(job["run_dir"])
    return parse_spec(data, source=str(p))
