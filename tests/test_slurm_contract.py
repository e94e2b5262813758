"""The launch contract: every variable a rendered script exports is named in `slurm.contract`,
and the worker's parser reads the names the scripts export."""

from __future__ import annotations

import re
from pathlib import Path

from runtime.env import parse_env
from slurm import contract
from slurm.render import render_run
from slurm.spec import load_spec

SPECS = Path(__file__).with_name("specs")
NAMES = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}
EXPORT = re.compile(r"^export ((?:FTHSDP|TORCHFT)_[A-Z_]+|REPLICA_GROUP_ID|NUM_REPLICA_GROUPS)=")


def test_every_exported_name_is_a_contract_name() -> None:
    seen: set[str] = set()
    for spec_file in sorted(SPECS.glob("*.toml")):
        try:
            spec = load_spec(spec_file)
        except ValueError:
            continue  # specs that exist to be refused
        for script in render_run(spec):
            for line in script.text.splitlines():
                if m := EXPORT.match(line):
                    assert m.group(1) in NAMES, (spec_file.name, script.filename, line)
                    seen.add(m.group(1))
    assert {contract.RUN_DIR, contract.REPLICA_ID, contract.DUMP_DIR} <= seen


def test_a_rendered_replica_environment_parses() -> None:
    spec = load_spec(SPECS / "helper.toml")
    replica = render_run(spec, [0], control=False)[0].text
    env = {}
    for line in replica.splitlines():
        if (m := EXPORT.match(line)) and m.group(1).startswith("FTHSDP_"):
            env[m.group(1)] = line.split("=", 1)[1].strip("'")
    env |= {contract.SLURM_PROCID: "0", contract.SLURM_NTASKS: "1", contract.SLURM_JOB_ID: "7"}
    env[contract.SLURM_STEP_NODELIST] = "n1"
    parsed = parse_env(env)
    assert parsed.replica_id == 0 and parsed.num_replicas == spec.replicas.count
    assert parsed.control_file == spec.run_dir / "control.json"
