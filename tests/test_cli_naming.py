"""Help texts are complete and option names agree across commands.

A run's directory is the positional RUN_DIR of every command that acts on a run (the older
`--run-dir` of `control` and `replica` still works, hidden, for scripts rendered before); times
are in seconds (the `-ms` spellings are hidden aliases); the straggler window has one name; every
visible option says what it does; no summary is cut with `...`; `run` does not list an option
it then requires.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fthsdp_cli.commands.control import _run_dir
from fthsdp_cli.main import COMMANDS, cli

CTX = click.Context(cli)


def _commands() -> list[tuple[str, click.Command]]:
    out = []

    def walk(name: str, cmd: click.Command) -> None:
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(CTX):
                sub_cmd = cmd.get_command(CTX, sub)
                assert sub_cmd is not None
                walk(f"{name} {sub}", sub_cmd)
        else:
            out.append((name, cmd))

    for name in COMMANDS:
        cmd = cli.get_command(CTX, name)
        assert cmd is not None
        walk(name, cmd)
    return out


ALL = _commands()


@pytest.mark.parametrize(("name", "cmd"), ALL, ids=[n for n, _ in ALL])
def test_every_visible_option_has_help_and_no_ms(name: str, cmd: click.Command) -> None:
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"{name} {param.opts[0]} has no help"
            assert not param.opts[0].endswith("-ms"), f"{name} {param.opts[0]}: use seconds"


@pytest.mark.parametrize("args", [["--help"], ["cluster", "--help"]])
def test_command_summaries_are_not_cut(args: list[str]) -> None:
    r = CliRunner().invoke(cli, args, env={"COLUMNS": "80"})
    assert r.exit_code == 0
    commands = r.output.split("Commands:")[1]
    assert "..." not in commands, commands


@pytest.mark.parametrize("name", ["status", "cancel", "requeue", "events", "control", "replica"])
def test_run_dir_is_positional(name: str) -> None:
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0
    usage = r.output.splitlines()[0]
    assert "RUN_DIR" in usage, usage
    assert "--run-dir" not in r.output  # the older spelling is hidden


def test_straggler_window_has_one_name() -> None:
    for name in ("run", "control"):
        r = CliRunner().invoke(cli, [name, "--help"])
        assert "--straggler-window " in r.output, name
        assert "--straggler-window-steps" not in r.output, name


def test_run_does_not_list_a_flag_it_requires() -> None:
    r = CliRunner().invoke(cli, ["run", "--help"])
    assert "--local" not in r.output
    assert "--run-dir" in r.output and "--timeout" in r.output


@click.command()
@_run_dir
@click.option("--replica", type=int, default=0)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def _probe(run_dir: Path, replica: int, command: tuple[str, ...]) -> None:
    click.echo(json.dumps([run_dir.name, replica, list(command)]))


@pytest.mark.parametrize(
    ("args", "seen"),
    [
        (["{run}", "--replica", "1", "--", "srun", "-N1", "x"], ["run", 1, ["srun", "-N1", "x"]]),
        (["--run-dir", "{run}", "--replica", "1", "--", "srun", "x"], ["run", 1, ["srun", "x"]]),
        (["--run-dir", "{run}", "--", "true"], ["run", 0, ["true"]]),
        (["{run}"], ["run", 0, []]),
    ],
)
def test_run_dir_old_and_new_spelling(args: list[str], seen: list[object], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    r = CliRunner().invoke(_probe, [a.format(run=run) for a in args])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == seen


def test_the_rendered_replica_line_still_parses(tmp_path: Path) -> None:
    """What the replica script runs (`replica --run-dir D --replica K -- srun ...` or the
    positional form) reaches the command with D as the run dir and the srun step intact."""
    import shlex

    from slurm.render import render_run
    from slurm.spec import load_spec

    run = tmp_path / "run"
    run.mkdir()
    spec = load_spec(Path(__file__).with_name("specs") / "cpu.toml", [f"job.run_dir={run}"])
    scripts = render_run(spec, [0], control=False)
    text = "".join(s.text for s in scripts)
    line = next(x for x in text.splitlines() if "-m fthsdp_cli replica " in x)
    words = shlex.split(line.split(" || ")[0])
    args = words[words.index("replica") + 1 :]
    r = CliRunner().invoke(_probe, args)
    assert r.exit_code == 0, r.output
    name, replica, command = json.loads(r.output)
    assert (name, replica, command[0]) == ("run", 0, "srun")
