"""The `fthsdp` click group.

Each subcommand lives in its own module under `fthsdp_cli.commands` and is imported only when it
runs (or when its own `--help` is asked for). The group's `--help` reads the one-line summaries
from the table below, so it costs a click import and nothing else: no torch, no numpy, no jinja.

No command lets a Python traceback reach a user. The group turns what a command raises into one
line on stderr and a documented exit code (`EXIT_CODES`): bad input (`slurm.errors.InputError`)
exits 2; a broken environment (`EnvironmentProblem`, a failing or unreachable Slurm command, a
file the OS refuses) exits 3; anything else is a bug, reported as one line with exit 1, and
`FTHSDP_DEBUG=1` shows its traceback.
"""

from __future__ import annotations

import importlib
import os
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
    "cancel": ("cancel", "cancel", "Cancel a run's jobs that are still queued or running."),
    "requeue": ("status", "requeue", "Requeue one replica's job (optionally draining a node)."),
    "events": ("status", "events", "Print a run's event journal, newest last."),
    "report": ("report", "report", "Write a run's report: one self-contained HTML file."),
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


EXIT_INPUT = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 1
DEBUG_ENV = "FTHSDP_DEBUG"
EXIT_CODES = (
    "Exit codes: 0 done (for check: healthy); 1 the checked thing is unhealthy, or an internal "
    "error (set FTHSDP_DEBUG=1 for the traceback); 2 bad input or usage; 3 the environment "
    "failed (Slurm unreachable or a Slurm command failing, a command missing, a timeout, a port "
    "in use, a file that cannot be read or written)."
)


class BadInput(click.ClickException):
    """Bad input: one line, exit code 2."""

    exit_code = EXIT_INPUT

    def format_message(self) -> str:
        return self.message


class EnvironmentFailed(BadInput):
    """The environment failed (Slurm, a command, a port, a file): one line, exit code 3."""

    exit_code = EXIT_ENVIRONMENT


class InternalError(BadInput):
    """A bug: one line that says how to see the traceback, exit code 1."""

    exit_code = EXIT_INTERNAL


def _first_line(text: str) -> str:
    """The most telling line of a tool's stderr: its `fatal` line, else the first that says
    `error`, else the first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for word in ("fatal", "error"):
        for line in lines:
            if word in line.lower():
                return line[:300]
    return lines[0][:300] if lines else ""


def one_line(exc: BaseException) -> tuple[str, int]:
    """(message, exit code) for an exception a command raised: pure, tested by a table."""
    from slurm.backend import SlurmCommandError
    from slurm.errors import EnvironmentProblem, InputError
    from slurm.records import unreachable

    if isinstance(exc, InputError):
        return str(exc), EXIT_INPUT
    if isinstance(exc, SlurmCommandError):
        command = " ".join(exc.argv[:2]) if exc.argv else "a Slurm command"
        detail = _first_line(exc.stderr) or f"exit status {exc.returncode}"
        if "configuration" in detail and not os.environ.get("SLURM_CONF"):
            detail += " (SLURM_CONF is not set: for the dev cluster, run 'fthsdp cluster up')"
        elif unreachable(exc):
            detail += " (slurmctld is not answering; for the dev cluster: 'fthsdp cluster status')"
        return f"Slurm command '{command}' failed: {detail}", EXIT_ENVIRONMENT
    if isinstance(exc, EnvironmentProblem):
        return _first_line(str(exc)) or type(exc).__name__, EXIT_ENVIRONMENT
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        text = exc.strerror or _first_line(str(exc)) or type(exc).__name__
        return f"{text}{where}", EXIT_ENVIRONMENT
    text = _first_line(str(exc))
    return (
        f"internal error: {type(exc).__name__}{': ' + text if text else ''} "
        f"(set {DEBUG_ENV}=1 for the traceback)",
        EXIT_INTERNAL,
    )


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
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # one line, like every other bad input
            where = exc.ctx.command_path if exc.ctx else ctx.command_path
            raise BadInput(f"{exc.format_message()} (see '{where} --help')") from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            message, code = one_line(exc)
            kind = {EXIT_INPUT: BadInput, EXIT_ENVIRONMENT: EnvironmentFailed}.get(code)
            raise (kind or InternalError)(message) from exc


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EXIT_CODES,
)
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
