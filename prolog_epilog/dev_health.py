"""The dev cluster's simulated hardware and health gating (`fthsdp cluster up --health`).

A plain dev cluster (`slurm.devcluster`) knows its Prolog, Epilog, HealthCheckProgram and
TaskProlog only as paths. This module supplies what stands behind them: healthy simulated
hardware per node under `DIR/hardware/<node>/` (`simulated_hardware`), a health config whose
`{node}` paths point each node's checks at its own inputs, wrapper scripts that run this
checkout's `prolog_epilog.entrypoints` as root, and a TaskProlog that points jobs' watchdogs at
the inputs. `with_health` / `health_settings` hand the cluster these paths and the
`node_setup` that writes the files, so `up` and `reconfigure` write them with the config.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs
from slurm import contract
from slurm.devcluster import DevClusterConfig

HARDWARE_DIR = "hardware"
HEALTH_CONFIG = "health.toml"
WRAPPER_DIR = "bin"
HEALTHCHECK_INTERVAL_S = 30
REPO = Path(__file__).resolve().parent.parent


def hardware_dir(cfg: DevClusterConfig) -> Path:
    """Where each node's simulated hardware lives: `DIR/hardware/<node>/...`."""
    return cfg.directory / HARDWARE_DIR


def health_config_path(cfg: DevClusterConfig) -> Path:
    return hardware_dir(cfg) / HEALTH_CONFIG


def job_health_env(cfg: DevClusterConfig) -> dict[str, str]:
    """What a job's ranks need to read their node's simulated hardware (watchdog, slow fault).

    The cluster's TaskProlog exports these into every task that does not set them itself, so a
    spec needs no dev-cluster paths; a spec may still set them in `[job].env`.
    """
    hw = hardware_dir(cfg)
    return {
        contract.HEALTH_CONFIG: str(health_config_path(cfg)),
        contract.SLOW_FILE: f"{hw}/{{node}}/slow",
    }


def entrypoint_wrapper(path: Path, mode: str, config: Path, conf: Path) -> str:
    """A shell script slurmd can run as Prolog/Epilog/HealthCheckProgram: it runs this checkout's
    `prolog_epilog.entrypoints MODE --config CONFIG` with absolute paths (slurmd runs it as root
    in its own, nearly empty environment). Returns the script's path.

    Python runs isolated (`-I`): no `PYTHON*` variable, no user site, and neither the working
    directory nor a script's folder on the import path, so a root hook imports nothing a user
    could put in its way; the checkout is put first on the path by name instead."""
    path.parent.mkdir(parents=True, exist_ok=True)
    boot = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from prolog_epilog.entrypoints import main; sys.exit(main())"
    )
    path.write_text(
        "#!/bin/sh\n"
        f"export SLURM_CONF={shlex.quote(str(conf))}\n"
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"exec {shlex.quote(sys.executable)} -I -c {shlex.quote(boot)} {mode} "
        f"--config {shlex.quote(str(config))}\n"
    )
    path.chmod(0o755)
    return str(path)


def task_prolog_script(path: Path, env: Mapping[str, str]) -> str:
    """A TaskProlog that exports `env` into each task (slurmd reads `export K=V` lines from its
    output), leaving alone any variable the job already set."""
    lines = ["#!/bin/sh", "# Written by fthsdp cluster up --health: dev-cluster inputs for tasks."]
    for key, value in env.items():
        lines.append(f'[ -n "${{{key}:-}}" ] || echo {shlex.quote(f"export {key}={value}")}')
    path.parent.mkdir(parents=True, exist_ok=True)
    # slurmd runs the TaskProlog as the job's user, any user's: its folder must let them in
    # whatever umask created it.
    path.parent.chmod(0o755)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return str(path)


def health_settings(
    cfg: DevClusterConfig, interval: int = HEALTHCHECK_INTERVAL_S
) -> dict[str, object]:
    """The settings that turn on simulated hardware and the project's Prolog (PrologFlags=Alloc),
    Epilog, HealthCheckProgram and TaskProlog (their files are written by `write_health_files`,
    the `node_setup` the dev cluster calls from `write_files`); for
    `reconfigure(cfg, **health_settings(cfg))` on a running cluster."""
    bin_dir = cfg.directory / WRAPPER_DIR
    return {
        "health": True,
        "node_setup": write_health_files,
        "prolog": str(bin_dir / "fthsdp-prolog"),
        "epilog": str(bin_dir / "fthsdp-epilog"),
        "health_check_program": str(bin_dir / "fthsdp-healthcheck"),
        "health_check_interval": cfg.health_check_interval or interval,
        "task_prolog": str(bin_dir / "fthsdp-task-prolog"),
    }


def with_health(cfg: DevClusterConfig, interval: int = HEALTHCHECK_INTERVAL_S) -> DevClusterConfig:
    """`cfg` with `health_settings` applied (what `fthsdp cluster up --health` starts)."""
    return replace(cfg, **health_settings(cfg, interval))  # type: ignore[arg-type]


def write_health_files(cfg: DevClusterConfig, fresh: bool = False) -> None:
    """Healthy simulated hardware for every node (only for nodes that have none unless `fresh`:
    a reconfigure must not heal injected faults), the `{node}` health config and the wrappers."""
    hw = hardware_dir(cfg)
    for node in cfg.node_names:
        if fresh or not (hw / node / "bin" / "nvidia-smi").exists():
            write_node_inputs(hw, node, gpus=cfg.gpus_per_node)
            if fresh:
                (hw / node / "slow").unlink(missing_ok=True)
                (hw / node / "faults.json").unlink(missing_ok=True)
    config = health_config_path(cfg)
    config.write_text(
        dev_config_toml(hw, total_budget_s=10.0)
        + f"\n[checks.gpu-count]\nexpected = {cfg.gpus_per_node}\n"
    )
    bin_dir = cfg.directory / WRAPPER_DIR
    for mode in ("prolog", "epilog", "healthcheck"):
        entrypoint_wrapper(bin_dir / f"fthsdp-{mode}", mode, config, cfg.conf_path)
    task_prolog_script(bin_dir / "fthsdp-task-prolog", job_health_env(cfg))
