"""Property tests: any accepted spec renders scripts that bash accepts and that ask Slurm for
exactly the resources the spec requested."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from render_harness import run_body, sbatch_components, srun_calls

from slurm.errors import InputError
from slurm.render import render_run, write_scripts
from slurm.spec import JobSpec, parse_spec

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
features = st.from_regex(r"[a-z][a-z0-9_]{0,8}([&|][a-z][a-z0-9_]{0,8}){0,2}", fullmatch=True)
times = st.sampled_from(["30", "10:00", "01:00:00", "2-00", "1-12:00", "3-00:00:00", "UNLIMITED"])
free_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))
env_keys = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda k: not k.startswith(("FTHSDP_", "SLURM_"))
)


@st.composite
def spec_data(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 12))
    gpus = draw(st.integers(0, 8))
    replicas: dict[str, Any] = {"count": count, "nodes": draw(st.integers(1, 16))}
    if gpus:
        replicas["gpus_per_node"] = gpus
        if draw(st.booleans()):
            replicas["gpu_type"] = draw(names)
    if draw(st.booleans()):
        replicas["tasks_per_node"] = draw(st.integers(1, 64))
    if draw(st.booleans()):
        replicas["cpus_per_task"] = draw(st.integers(1, 64))
    if draw(st.booleans()):
        replicas["mem"] = f"{draw(st.integers(1, 2048))}{draw(st.sampled_from(['', 'M', 'G']))}"
    if draw(st.booleans()):
        replicas["switches"] = draw(st.integers(1, 4))
        if draw(st.booleans()):
            replicas["switches_wait"] = draw(times)
    choice = draw(st.sampled_from(["none", "one", "list"]))
    if choice == "one":
        replicas["constraint"] = draw(features)
    elif choice == "list":
        replicas["constraint"] = draw(st.lists(features, min_size=count, max_size=count))
    if draw(st.booleans()):
        replicas["partition"] = draw(names)
    if draw(st.booleans()):
        replicas["exclusive"] = True
    if draw(st.booleans()):
        replicas["helper"] = {
            "command": draw(free_text.filter(str.strip)),
            "nodes": draw(st.integers(1, 4)),
            "tasks_per_node": draw(st.integers(1, 4)),
        }
    job: dict[str, Any] = {
        "name": draw(names),
        "run_dir": "/" + draw(st.from_regex(r"[a-z0-9_./-]{1,30}", fullmatch=True)),
        "env": draw(st.dictionaries(env_keys, free_text, max_size=4)),
    }
    if draw(st.booleans()):
        job["time"] = draw(times)
    return {
        "job": job,
        "replicas": replicas,
        "train": {"command": draw(free_text.filter(str.strip)), "steps": draw(st.integers(1, 9))},
    }


def accepted(data: dict[str, Any]) -> JobSpec | None:
    try:
        return parse_spec(data)
    except InputError:
        return None  # e.g. a run_dir with '..'; rejection is tested elsewhere


@pytest.mark.timeout(240)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_data())
def test_rendered_scripts_pass_bash_n_and_round_trip_resources(data: dict[str, Any]) -> None:
    spec = accepted(data)
    if spec is None:
        return
    r = spec.replicas
    scripts = render_run(spec)
    for s in scripts:
        check = subprocess.run(["bash", "-n"], input=s.text, capture_output=True, text=True)
        assert check.returncode == 0, f"{s.filename}: {check.stderr}"
    for s in scripts[1:]:
        comps = sbatch_components(s.text)
        assert len(comps) == (2 if r.helper else 1)
        c0 = comps[0]
        assert s.replica is not None
        assert c0["job-name"] == spec.replica_name(s.replica)
        assert "requeue" in c0 and c0["dependency"] == "singleton"
        assert c0["nodes"] == str(r.nodes)
        assert c0["ntasks-per-node"] == str(r.tasks_per_node)
        assert c0.get("gres") == r.gres
        assert c0.get("constraint") == r.constraint_for(s.replica)
        assert c0.get("switches") == r.switches_option
        assert c0.get("partition") == r.partition
        assert c0.get("cpus-per-task") == (str(r.cpus_per_task) if r.cpus_per_task else None)
        assert c0.get("mem") == r.mem
        assert c0.get("time") == spec.job.time
        assert ("exclusive" in c0) == r.exclusive
        if r.helper:
            assert comps[1]["nodes"] == str(r.helper.nodes)
            assert comps[1]["ntasks-per-node"] == str(r.helper.tasks_per_node)


@pytest.mark.timeout(240)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spec_data())
def test_any_accepted_spec_hands_values_through_unchanged(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    spec = accepted(data)
    if spec is None:
        return
    work: Path = tmp_path_factory.mktemp("prop")
    (path,) = write_scripts(render_run(spec, [spec.replicas.count - 1], control=False), work)
    run = run_body(path, work, dump=[*spec.job.env, "FTHSDP_REPLICA_ID", "FTHSDP_STEPS"])
    assert run.returncode == 0, run.stderr
    trainer = [
        c
        for c in srun_calls(work)
        if c[0][-1] == spec.train.command and c[0][0] != "--het-group=1"  # not the helper
    ]
    assert len(trainer) == 1
    argv, env = trainer[0]
    assert argv[-2] == "-c"
    assert env["FTHSDP_REPLICA_ID"] == str(spec.replicas.count - 1)
    assert env["FTHSDP_STEPS"] == str(spec.train.steps)
    for key, value in spec.job.env.items():
        assert env[key] == value
