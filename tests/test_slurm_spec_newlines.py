"""A newline or carriage return in a spec value never reaches a rendered script.

`re.match` with `$` accepts `"gpu\\n"`; rendered, `#SBATCH --partition='gpu` + a line `'` is a
script bash rejects, and sbatch stops reading `#SBATCH` lines there (dropping `--requeue` when
the field is `name`). Every string field of the spec is tried here through `fthsdp render`, with
a trailing LF and with a CR: each is exit 2, one line, naming the field. The free-text fields
(commands, setup lines, `[job].env` values) may span lines by design; they are checked to render
a script whose `#SBATCH` block is intact and that `bash -n` accepts.
"""

from __future__ import annotations

import subprocess
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from click.testing import CliRunner

from fthsdp_cli.main import cli
from slurm.errors import InputError
from slurm.render import _quote, render_run
from slurm.spec import load_spec
from slurm.spec.model import NESTED, SECTIONS

SPECS = Path(__file__).with_name("specs")

#: A valid value for every string field, and the --set lines the field needs to be valid at all.
VALID: dict[str, tuple[str, tuple[str, ...]]] = {
    "job.name": ("t", ()),
    "job.run_dir": ("/tmp/fthsdp-r", ()),
    "job.account": ("acct", ()),
    "job.qos": ("normal", ()),
    "job.time": ("10", ()),
    "job.partition": ("gpu", ()),
    "job.mail_user": ("a@example.org", ()),
    "job.mail_type": ("END", ()),
    "replicas.gpu_type": ("h100", ("replicas.gpus_per_node=8",)),
    "replicas.mem": ("2G", ()),
    "replicas.partition": ("gpu", ()),
    "replicas.switches_wait": ("10", ("replicas.switches=1",)),
    "replicas.constraint": ("a100", ()),
    "replicas.exclude": ("node1", ()),
    "replicas.nodelist": ("node[1-2]", ()),
    "replicas.gres_flags": ("enforce-binding", ()),
    "replicas.reservation": ("r1", ()),
    "replicas.topology": ("block", ()),
    "replicas.helper.partition": ("cpu", ("replicas.helper.command=x",)),
    "replicas.helper.mem": ("1G", ("replicas.helper.command=x",)),
    "control.partition": ("cpu", ()),
    "control.mem": ("1G", ()),
    "control.time": ("10", ()),
    "control.python": ("python3", ()),
    "control.drain": ("request", ()),
    "train.straggler_mode": ("report", ()),
    "train.mode": ("torchft", ("train.progress_regex=step (?P<step>[0-9]+)",)),
    "train.progress_regex": ("step (?P<step>[0-9]+)", ("train.mode=torchft",)),
    "train.progress_file": ("progress.jsonl", ("train.mode=torchft",)),
    "health.checks": ('["ecc"]', ()),
}
#: Shell text by design: a quoted multi-line word after the #SBATCH block is plain shell.
FREE_TEXT = {"train.command", "replicas.helper.command", "job.setup"}


def _takes_str(tp: Any) -> bool:
    if tp is str:
        return True
    if get_origin(tp) in (Union, types.UnionType, tuple):
        return any(_takes_str(a) for a in get_args(tp))
    return False


def string_fields() -> list[str]:
    """Every spec field whose type admits a string (discovered, so a new field is covered)."""
    out = []
    for section, cls in SECTIONS.items():
        for name, tp in get_type_hints(cls).items():
            nested = NESTED.get((cls, name))
            if nested is not None:
                for sub, stp in get_type_hints(nested).items():
                    if _takes_str(stp):
                        out.append(f"{section}.{name}.{sub}")
            elif _takes_str(tp):
                out.append(f"{section}.{name}")
    return sorted(out)


def test_every_string_field_is_in_the_table() -> None:
    assert set(string_fields()) <= set(VALID) | FREE_TEXT


def _present(fields: list[str]) -> list[str]:
    return [f for f in fields if f in string_fields()]


def _render(*sets: str) -> Any:
    args = ["render", str(SPECS / "cpu.toml")]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize("field", _present(sorted(VALID)))
def test_valid_value_renders(field: str) -> None:
    value, needs = VALID[field]
    r = _render(*needs, f"{field}={value}")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("end", ["\n", "\r", "\r\n"], ids=["lf", "cr", "crlf"])
@pytest.mark.parametrize("field", _present(sorted(VALID)))
def test_line_break_in_a_field_is_exit_2_naming_it(field: str, end: str) -> None:
    value, needs = VALID[field]
    if value.startswith("["):  # a list field: the break goes inside its one string
        bad = value.replace('"]', "\\n" if end == "\n" else "\\r" if end == "\r" else "\\r\\n")
        bad += '"]'
    else:
        bad = value + end
    r = _render(*needs, f"{field}={bad}")
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert field in lines[0], lines[0]
    assert "Traceback" not in r.output


def test_line_break_in_an_env_name_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[job]\nname = "t"\nrun_dir = "/r"\n[job.env]\n"A\\n" = "1"\n'
        '[replicas]\ncount = 1\n[train]\ncommand = "x"\n'
    )
    r = CliRunner().invoke(cli, ["render", str(spec)])
    assert r.exit_code == 2 and "job.env.A" in r.output


@pytest.mark.parametrize("value", ["gpu\n", "a\rb", "x\r\n", "\n", "nul\0"])
def test_the_shell_quoting_helper_refuses_line_breaks(value: str) -> None:
    with pytest.raises(InputError):
        _quote(value)
    assert _quote("gpu") == "gpu" and _quote("a b") == "'a b'"


def test_multi_line_commands_and_env_values_render_a_valid_script(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[job]\nname = "t"\nrun_dir = "/r"\nsetup = ["module load x\\nexport Y=1"]\n'
        '[job.env]\nMSG = "two\\nlines\\r\\n"\n'
        '[replicas]\ncount = 1\n[replicas.helper]\ncommand = "echo a\\necho b\\n"\n'
        '[train]\ncommand = """\npython train.py \\\\\n  --steps 3\n"""\n'
    )
    for script in render_run(load_spec(spec)):
        check = subprocess.run(
            ["bash", "-n"], input=script.text, capture_output=True, text=True, timeout=30
        )
        assert check.returncode == 0, check.stderr
        head = script.text.split("\nset -eo pipefail", 1)[0].splitlines()[2:]
        # The #SBATCH block is intact: every line of it is an option (or the hetjob separator).
        assert head and all(line.startswith("#SBATCH --") or line in ("", "#SBATCH hetjob")
                            for line in head), head  # fmt: skip
        assert any(line == "#SBATCH --requeue" for line in head)
