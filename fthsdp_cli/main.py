"""The `fthsdp` click group.

Each subcommand lives in its own module under `fthsdp_cli.commands` and is imported only when it
runs (or when its own `--help` is asked for). The group's `--help` reads the one-line summaries
from the table below, so it costs a click import and nothing else: no torch, no numpy, no jinja.

Every command's bad input surfaces as `slurm.errors.InputError` (or `EnvironmentProblem` for
what the machine lacks); the group turns both into one line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

# name -> (module under fthsdp_cli.commands, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "render": (
        "render",
        "render",
        "Render a spec's sbatch scripts (dry run: nothing is submitted).",
    ),
    "submit": ("render", "submit", "Render a spec into its run_dir and submit the jobs."),
    "status": ("status", "status", "Show the state of a run's replicas and control job."),
    "cancel": ("render", "cancel", "Cancel every job of a run."),
    "requeue": ("status", "requeue", "Requeue one replica's job (optionally draining a node)."),
    "events": ("status", "events", "Print a run's event journal, newest last."),
    "check": ("check", "check", "Run the node health checks here and print the verdict."),
    "doctor": ("doctor", "doctor", "Check this Slurm's configuration against what fthsdp needs."),
    "prolog": ("check", "prolog", "Slurm Prolog entry point: check, drain on failure."),
    "epilog": (
        "check",
        "epilog",
        "Slurm Epilog entry point: clean up, re-check, drain on failure.",
    ),
    "healthcheck": ("check", "healthcheck", "Slurm HealthCheckProgram: check, drain or resume."),
    "run": ("run", "run", "Run a spec's FT-HSDP job locally (replicas as local processes)."),
    "simulate": ("simulate", "simulate", "Simulate effective training time at scale."),
    "cluster": ("cluster", "cluster", "Start, stop and inspect the local dev Slurm cluster."),
    "control": ("control", "control", "Run a run's control plane (Lighthouse + coordinator)."),
    "replica": ("control", "replica", "Run one replica's job body under its supervisor."),
}


class BadInput(click.ClickException):
    """Bad input or a missing prerequisite: one line, exit code 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr, _ = entry
        module = importlib.import_module(f"fthsdp_cli.commands.{module_name}")
        command: click.Command = getattr(module, attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        from slurm.errors import EnvironmentProblem, InputError

        try:
            return super().invoke(ctx)
        except InputError as exc:
            raise BadInput(str(exc)) from exc
        except EnvironmentProblem as exc:
            raise BadInput(str(exc)) from exc


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fthsdp", prog_name="fthsdp")
def cli() -> None:
    """fthsdp: Fault-Tolerant HSDP training on Slurm.

    Each data-parallel replica is its own requeueable Slurm job: when a GPU or node fails, only
    that replica is requeued onto healthy nodes and catches up from a peer while the others
    keep training.
    """


def main() -> None:  # pragma: no cover - console-script shim
    cli(prog_name="fthsdp")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli())
