"""Test helpers for rendered scripts: parse #SBATCH lines, run a body with a stub srun."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

# A PATH shim that stands in for srun: it records its argv (NUL-separated) and the value of
# every variable named in FTHSDP_TEST_DUMP, and runs nothing.
SRUN_SHIM = """#!/bin/bash
# Each call writes into its own folder, renamed into place when complete (calls may overlap,
# and a backgrounded helper srun may be killed at any time).
tmp="$(mktemp -d "$FTHSDP_TEST_OUT/.call.XXXXXX")"
printf '%s\\0' "$@" > "$tmp/args"
for name in $FTHSDP_TEST_DUMP; do printf '%s' "${!name}" > "$tmp/env-$name"; done
mv "$tmp" "$FTHSDP_TEST_OUT/call-$$"
"""


def sbatch_components(text: str) -> list[dict[str, str | None]]:
    """The #SBATCH options of each het component, as sbatch reads them (quotes removed)."""
    comps: list[dict[str, str | None]] = [{}]
    for line in text.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        (arg,) = shlex.split(line[len("#SBATCH") :])
        if arg == "hetjob":
            comps.append({})
            continue
        key, eq, value = arg.removeprefix("--").partition("=")
        comps[-1][key] = value if eq else None
    return comps


def run_body(script: Path, workdir: Path, dump: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a rendered script with bash, srun replaced by the shim; outputs land in workdir."""
    shim = workdir / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "srun").write_text(SRUN_SHIM)
    (shim / "srun").chmod(0o755)
    env = {
        "PATH": f"{shim}:/usr/bin:/bin",
        "HOME": str(workdir),
        "FTHSDP_TEST_OUT": str(workdir),
        "FTHSDP_TEST_DUMP": " ".join(dump),
    }
    return subprocess.run(
        ["bash", str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def srun_calls(workdir: Path) -> list[tuple[list[str], dict[str, str]]]:
    """Completed shim calls: (argv, {variable: value}) each."""
    calls = []
    for d in sorted(workdir.glob("call-*")):
        argv = (d / "args").read_text().split("\0")[:-1]
        env = {p.name.removeprefix("env-"): p.read_text() for p in d.glob("env-*")}
        calls.append((argv, env))
    return calls
