"""The dev cluster: its generated config (pure), its CLI's refusals, and real het-job placement."""

from __future__ import annotations

import json
import os
import pwd
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import hostlist
import pytest
from user_harness import processes_of_run

from prolog_epilog import dev_health
from slurm import devcluster
from slurm.devcluster import DevClusterConfig
from slurm.devcluster.daemons import pid_files, read_pid
from slurm.errors import InputError

REPO = Path(__file__).resolve().parent.parent


def _cli(
    *args: str, env: dict[str, str] | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "fthsdp_cli", *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=120, cwd=REPO)


def test_topology_groups_nodes_under_leaf_switches() -> None:
    cfg = DevClusterConfig(directory=Path("/x"), nodes=5, switch_size=2)
    assert cfg.switches == {"s1": ["node1", "node2"], "s2": ["node3", "node4"], "s3": ["node5"]}
    topo = devcluster.topology_conf(cfg)
    assert "SwitchName=s1 Nodes=node[1-2]" in topo
    assert "SwitchName=s3 Nodes=node5" in topo
    assert "SwitchName=spine Switches=s[1-3]" in topo


def test_slurm_conf_has_fast_failure_settings_and_gres() -> None:
    cfg = DevClusterConfig(
        directory=Path("/c"),
        nodes=2,
        gpus_per_node=4,
        ctld_port=20000,
        slurmd_base_port=20001,
        prolog="/p",
        epilog="/e",
        health_check_program="/h",
        health_check_interval=5,
    )
    conf = devcluster.slurm_conf(cfg)
    for line in (
        "SchedulerParameters=bf_interval=1,bf_continue,bf_hetjob_prio=max,nohold_on_prolog_fail",
        "PriorityType=priority/multifactor",
        "PriorityWeightJobSize=1000",
        "ReturnToService=2",
        "SlurmdTimeout=10",
        "TopologyPlugin=topology/tree",
        "GresTypes=gpu",
        "JobRequeue=1",
        "Prolog=/p",
        "PrologFlags=Alloc",
        "Epilog=/e",
        "HealthCheckProgram=/h",
        "HealthCheckInterval=5",
        "SlurmctldPort=20000",
        "AuthInfo=socket=/c/munge/munge.socket",
    ):
        assert line in conf.splitlines(), line
    assert "NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=20002" in conf
    assert "Gres=gpu:h100:4" in conf
    assert (
        devcluster.gres_conf(cfg)
        == "NodeName=node[1-2] Name=gpu Type=h100 File=/c/dev/nvidia[0-3]\n"
    )


def test_health_settings_install_gating_and_task_env(tmp_path: Path) -> None:
    cfg = dev_health.with_health(DevClusterConfig(directory=tmp_path, nodes=2, gpus_per_node=4))
    devcluster.write_files(cfg, fresh_hardware=True)
    conf = devcluster.slurm_conf(cfg).splitlines()
    bin_dir = tmp_path / "bin"
    for line in (
        f"Prolog={bin_dir}/fthsdp-prolog",
        "PrologFlags=Alloc",
        f"Epilog={bin_dir}/fthsdp-epilog",
        f"HealthCheckProgram={bin_dir}/fthsdp-healthcheck",
        f"TaskProlog={bin_dir}/fthsdp-task-prolog",
    ):
        assert line in conf, line
    wrapper = (bin_dir / "fthsdp-prolog").read_text()
    assert " -I -c " in wrapper and "from prolog_epilog.entrypoints import main" in wrapper
    assert "main())' prolog --config" in wrapper and "PYTHONPATH" not in wrapper
    assert f"{tmp_path}/hardware/health.toml" in wrapper and repr(str(REPO)) in wrapper
    assert (tmp_path / "hardware" / "node2" / "bin" / "nvidia-smi").exists()
    assert "expected = 4" in (tmp_path / "hardware" / "health.toml").read_text()
    # The TaskProlog exports the job's hardware inputs unless the job set them itself.
    task_prolog = str(bin_dir / "fthsdp-task-prolog")
    clean = {"PATH": os.environ["PATH"]}
    out = subprocess.run([task_prolog], capture_output=True, text=True, env=clean, check=True)
    assert out.stdout.splitlines() == [
        f"export FTHSDP_HEALTH_CONFIG={tmp_path}/hardware/health.toml",
        f"export FTHSDP_SLOW_FILE={tmp_path}/hardware/{{node}}/slow",
    ]
    own = {**clean, "FTHSDP_HEALTH_CONFIG": "/mine.toml"}
    out = subprocess.run([task_prolog], capture_output=True, text=True, env=own, check=True)
    assert "FTHSDP_HEALTH_CONFIG" not in out.stdout and "FTHSDP_SLOW_FILE" in out.stdout
    # A reconfigure keeps injected faults; a fresh `up` heals them.
    from runtime.control.inject import inject, node_faults

    inject(tmp_path / "hardware", "node1", "xid79", gpus=4)
    devcluster.write_files(cfg)
    assert node_faults(tmp_path / "hardware", "node1") == ["xid79"]
    devcluster.write_files(cfg, fresh_hardware=True)
    assert node_faults(tmp_path / "hardware", "node1") == []
    assert devcluster.DevClusterConfig.load(tmp_path) == cfg


def test_sinfo_json_gives_node_address() -> None:
    from slurm.records import SlurmVersion
    from slurm.slurm_json import parse_sinfo_nodes

    text = json.dumps(
        {
            "nodes": [
                {"name": "node1", "hostname": "localhost", "address": "127.0.0.1", "state": "idle"}
            ]
        }
    )
    (node,) = parse_sinfo_nodes(text, SlurmVersion(22, 5, 8), ["sinfo", "--json"])
    assert (node.name, node.address) == ("node1", "127.0.0.1")


@pytest.mark.parametrize(
    ("field", "value"),
    [("nodes", 0), ("gpus_per_node", -1), ("switch_size", 0), ("ctld_port", 80), ("nodes", 100)],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(InputError) as info:
        DevClusterConfig(directory=Path("/x"), **{field: value})  # type: ignore[arg-type]
    assert field in str(info.value)


def test_cluster_up_rejects_bad_option_with_exit_2(tmp_path: Path) -> None:
    r = _cli("cluster", "up", "--dir", str(tmp_path), "--nodes", "0")
    assert r.returncode == 2
    assert "nodes" in r.stderr and "positive integer" in r.stderr


def test_cluster_up_without_slurm_says_what_is_missing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to reach the missing-binaries check")
    empty = tmp_path / "bin"
    empty.mkdir()
    r = _cli("cluster", "up", "--dir", str(tmp_path / "c"), env={"PATH": str(empty)})
    assert r.returncode == 3
    assert "missing" in r.stderr and "sinfo" in r.stderr and "apt-get install" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c" / "run" / "slurmctld.pid").exists()


def test_cluster_up_as_non_root_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The venv's interpreter lives under /root here, so another user cannot even start it;
    # the uid seen by the check is the one thing replaced.
    from click.testing import CliRunner

    from fthsdp_cli.main import cli

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = CliRunner().invoke(cli, ["cluster", "up", "--dir", str(tmp_path / "c")])
    assert r.exit_code == 3
    assert "must run as root" in r.output
    assert not (tmp_path / "c").exists()


def _free_block(n: int) -> int:
    return devcluster.free_port_block(n, start=23000 + (os.getpid() % 100) * 10)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_cluster_up_refuses_a_port_in_use_and_leaves_nothing(site_dir: Path) -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    base = _free_block(6)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + 2))
        blocker.listen()
        r = _cli(
            "cluster",
            "up",
            "--dir",
            str(site_dir),
            "--nodes",
            "2",
            "--port",
            str(base),
            "--slurmd-port",
            str(base + 1),
        )
    assert r.returncode == 3
    assert str(base + 2) in r.stderr and "in use" in r.stderr
    assert not devcluster.live_daemons(DevClusterConfig(directory=site_dir, nodes=2))


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_cluster_up_status_down_twice_in_a_row(site_dir: Path) -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    base = _free_block(4)
    ports = ["--port", str(base), "--slurmd-port", str(base + 1)]
    cfg = DevClusterConfig(directory=site_dir, nodes=2, ctld_port=base, slurmd_base_port=base + 1)
    try:
        for health in ([], ["--health"]):
            up = _cli("cluster", "up", "--dir", str(site_dir), "--nodes", "2", *ports, *health)
            assert up.returncode == 0, up.stderr
            assert up.stdout.strip() == f"export SLURM_CONF={site_dir}/etc/slurm.conf"
            conf = (site_dir / "etc" / "slurm.conf").read_text().splitlines()
            assert (f"Prolog={site_dir}/bin/fthsdp-prolog" in conf) == bool(health)
            if health:
                assert f"FTHSDP_HEALTH_CONFIG={site_dir}/hardware/health.toml" in up.stderr
            _assert_laid_out_like_a_site(cfg)
            again = _cli("cluster", "up", "--dir", str(site_dir), "--nodes", "2", *ports)
            assert again.returncode == 3 and "already runs a cluster" in again.stderr
            st = _cli("cluster", "status", "--dir", str(site_dir), "--json")
            assert st.returncode == 0, st.stderr
            assert '"node1": "idle"' in st.stdout and '"node2": "idle"' in st.stdout
            if health:  # inject/heal find the cluster's hardware under --dir
                inj = _cli("cluster", "inject", "node2", "--fault", "ecc", "--dir", str(site_dir))
                assert inj.returncode == 0 and "ecc" in inj.stdout, inj.stderr
                assert (site_dir / "hardware" / "node2" / "faults.json").read_text() == '["ecc"]'
            down = _cli("cluster", "down", "--dir", str(site_dir))
            assert down.returncode == 0 and "slurmctld" in down.stdout
            assert not devcluster.live_daemons(cfg)
            assert _cli("cluster", "status", "--dir", str(site_dir)).returncode == 1
    finally:
        devcluster.down(cfg)


def _assert_laid_out_like_a_site(cfg: DevClusterConfig) -> None:
    """slurmctld runs as the cluster's SlurmUser and slurmd as root; the config is readable by
    every user (any user's sinfo answers) and what runs as root is writable by root alone."""
    slurm_uid = pwd.getpwnam(cfg.slurm_user).pw_uid
    owners = {
        name: os.stat(f"/proc/{pid}").st_uid for name, pid in devcluster.live_daemons(cfg).items()
    }
    assert owners == {"munged": 0, "slurmctld": slurm_uid, "slurmd node1": 0, "slurmd node2": 0}
    d = cfg.directory
    assert stat.S_IMODE(d.stat().st_mode) == 0o755
    for name in ("slurm.conf", "gres.conf", "topology.conf"):
        assert stat.S_IMODE((d / "etc" / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE((d / "munge-key").stat().st_mode) == 0o700
    assert (d / "state").stat().st_uid == slurm_uid
    for hook in (d / "bin").glob("*") if (d / "bin").exists() else []:
        st = hook.stat()
        assert st.st_uid == 0 and not st.st_mode & 0o022, hook
    r = subprocess.run(
        ["runuser", "-u", "nobody", "--", "sinfo", "-h", "-o", "%N"],
        capture_output=True, text=True, env=cfg.env(), timeout=30, check=False,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "node[1-2]", r.stderr


HET_JOB = """#!/bin/bash
#SBATCH --job-name=het-check
#SBATCH --output={out}/slurm-%j.out
#SBATCH --nodes=2 --gres=gpu:h100:2 --switches=1@00:00:30
#SBATCH hetjob
#SBATCH --nodes=2 --switches=1@00:00:30
{{
  echo "SLURM_HET_SIZE=$SLURM_HET_SIZE"
  echo "G0=$SLURM_JOB_NODELIST_HET_GROUP_0"
  echo "G1=$SLURM_JOB_NODELIST_HET_GROUP_1"
  srun --het-group=0 bash -c 'echo "STEP0=$SLURMD_NODENAME"'
}} > {out}/result.txt
"""


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_het_job_components_each_land_under_one_switch(
    slurm_cluster: DevClusterConfig, tmp_path: Path
) -> None:
    script = tmp_path / "het.sh"
    script.write_text(HET_JOB.format(out=tmp_path))
    r = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        env=slurm_cluster.env(),
        timeout=30,
        check=True,
    )
    job_id = r.stdout.strip().split(";")[0]
    result = tmp_path / "result.txt"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        q = subprocess.run(
            ["squeue", "-h", "-j", job_id],
            capture_output=True,
            text=True,
            env=slurm_cluster.env(),
            timeout=30,
        )
        if result.exists() and not q.stdout.strip():
            break
        time.sleep(0.5)
    text = result.read_text()
    values = dict(line.split("=", 1) for line in text.split())
    assert values["SLURM_HET_SIZE"] == "2"
    switch_of = {n: s for s, ns in slurm_cluster.switches.items() for n in ns}
    for group in ("G0", "G1"):
        nodes = hostlist.expand_hostlist(values[group])
        assert len(nodes) == 2
        assert len({switch_of[n] for n in nodes}) == 1, f"{group}={nodes} spans switches"
    assert set(hostlist.expand_hostlist(values["G0"])).isdisjoint(
        hostlist.expand_hostlist(values["G1"])
    )


# ---------------------------------------------------------------------------------------------
# Finding the cluster's daemons across restarts, and stopping all of them


def _cfg(directory: str = "/c") -> DevClusterConfig:
    return DevClusterConfig(directory=Path(directory), nodes=2)


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/usr/sbin/slurmctld", "-c", "-f", "/c/etc/slurm.conf"], "slurmctld"),
        (["slurmctld", "-f", "/c/etc/slurm.conf"], "slurmctld"),
        (["/usr/sbin/slurmd", "-N", "node2", "-f", "/c/etc/slurm.conf"], "slurmd node2"),
        (["/usr/sbin/slurmd", "-f", "/c/etc/slurm.conf"], None),  # no node name
        (["/usr/sbin/slurmd", "-N", "node2", "-f", "/other/etc/slurm.conf"], None),
        (["/usr/sbin/slurmctld"], None),  # the site's own slurmctld
        (["/usr/sbin/munged", "--force", "--socket=/c/munge/munge.socket"], "munged"),
        (["/usr/sbin/munged", "--socket=/other/munge/munge.socket"], None),
        (["/usr/bin/vim", "-f", "/c/etc/slurm.conf"], None),
        ([], None),
    ],
)
def test_daemon_name_recognises_only_this_clusters_daemons(
    argv: list[str], name: str | None
) -> None:
    assert devcluster.daemon_name(argv, _cfg()) == name


@pytest.mark.parametrize(
    ("before", "processes", "pending"),
    [
        ({"munged": 1, "slurmctld": 2, "slurmd node1": 3},
         {1: "munged", 5: "slurmctld", 6: "slurmd node1"}, {}),
        ({"slurmctld": 2, "slurmd node1": 3}, {5: "slurmctld", 3: "slurmd node1"},
         {"slurmd node1": "pid 3 still running"}),
        ({"slurmctld": 2}, {2: "slurmctld", 5: "slurmctld"}, {"slurmctld": "pid 2 still running"}),
        ({"slurmctld": 2, "slurmd node1": 3}, {5: "slurmctld"},
         {"slurmd node1": "not running (was pid 3)"}),
        ({"munged": 1}, {1: "munged"}, {}),  # Slurm never restarts munged
    ],
)  # fmt: skip
def test_restart_pending_names_what_a_reconfigure_has_not_finished(
    before: dict[str, int], processes: dict[int, str], pending: dict[str, str]
) -> None:
    assert devcluster.restart_pending(before, processes) == pending


def _processes_of(cfg: DevClusterConfig) -> list[str]:
    """Every process that mentions the cluster's folder in its command line or environment,
    found without the module's own lookup (so the test checks it rather than repeats it)."""
    found = processes_of_run([str(cfg.directory)])
    return [f"{pid}: {cmd}" for pid, (_, cmd) in sorted(found.items())]


def _job_state(cfg: DevClusterConfig, job: str, want: str, timeout: float) -> str:
    """The job's state once it is `want`, or whatever it is when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        q = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"],
            capture_output=True, text=True, env=cfg.env(), timeout=30,
        )  # fmt: skip
        state = q.stdout.strip()
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.25)


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_reconfigure_follows_restarted_daemons_and_down_leaves_nothing(site_dir: Path) -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    base = _free_block(4)
    cfg = DevClusterConfig(directory=site_dir, nodes=2, ctld_port=base, slurmd_base_port=base + 1)
    try:
        devcluster.up(cfg)
        job = subprocess.run(
            ["sbatch", "--parsable", "-N1", f"--output={site_dir}/job.out", "--wrap", "sleep 300"],
            capture_output=True, text=True, env=cfg.env(), timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
        assert _job_state(cfg, job, "RUNNING", 60) == "RUNNING"
        before = devcluster.live_daemons(cfg)
        assert set(before) == {"munged", "slurmctld", "slurmd node1", "slurmd node2"}
        cfg = devcluster.reconfigure(cfg, prolog_epilog_timeout=61)
        after = devcluster.live_daemons(cfg)
        assert set(after) == set(before)
        for name, path in pid_files(cfg).items():
            assert read_pid(path) == after[name], name
        if devcluster.slurm_release() >= devcluster.RESTARTS_ON_RECONFIGURE:
            assert after["slurmctld"] != before["slurmctld"]
            assert after["slurmd node1"] != before["slurmd node1"]
            old = set(before.values()) - {before["munged"]}
            assert not old & set(devcluster.cluster_processes(cfg))  # predecessors are gone
        else:
            assert after == before
        assert _job_state(cfg, job, "RUNNING", 0) == "RUNNING"  # the job survived the restart
        stopped = devcluster.down(cfg)
        assert set(stopped) == set(before)
        assert _processes_of(cfg) == []
        # Down while a reconfigure is still restarting the daemons (no wait in between).
        devcluster.up(cfg)
        r = subprocess.run(["scontrol", "reconfigure"], env=cfg.env(), timeout=30, check=False)
        assert r.returncode == 0
        # A daemon that exits after its successor started deletes the pid file (24.11): down
        # must not depend on pid files.
        for path in pid_files(cfg).values():
            path.unlink(missing_ok=True)
        devcluster.down(cfg)
        assert _processes_of(cfg) == []
        assert devcluster.live_daemons(cfg) == {}
    finally:
        devcluster.down(cfg)


# ---------------------------------------------------------------------------------------------
# The cluster's folder is root's alone


@pytest.mark.parametrize(
    ("uid", "mode", "holds", "problem"),
    [
        (0, 0o40700, True, None),
        (0, 0o40755, True, None),
        (1000, 0o40700, True, "owned by uid 1000"),
        (0, 0o40770, True, "writable by group or others (mode 0770)"),
        (0, 0o41777, True, "writable by group or others (mode 1777)"),  # sticky is no excuse
        (0, 0o41777, False, None),  # like /tmp above the folder
        (0, 0o40777, False, "writable by group or others (mode 0777)"),
        (0, 0o40757, False, "writable by group or others"),
        (1000, 0o40755, False, "owned by uid 1000"),
    ],
)
def test_directory_problem_table(uid: int, mode: int, holds: bool, problem: str | None) -> None:
    found = devcluster.directory_problem(uid, mode, holds_cluster=holds)
    assert found is None if problem is None else problem in (found or "")


def test_default_folder_is_root_only_and_not_in_a_temp_folder() -> None:
    code = "from slurm import devcluster; print(devcluster.DEFAULT_DIR)"
    env = {k: v for k, v in os.environ.items() if k != "FTHSDP_CLUSTER_DIR"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert r.stdout.strip() == "/var/lib/fthsdp/devcluster"


def test_make_directory_creates_it_0755(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the folder check wants root as owner")
    target = tmp_path / "a" / "devcluster"
    devcluster.make_directory(target)
    assert target.stat().st_mode & 0o777 == 0o755
    devcluster.make_directory(target)  # an existing good folder is fine


@pytest.mark.parametrize("how", ["chown", "chmod", "parent", "env"])
def test_cli_refuses_a_folder_someone_else_controls(tmp_path: Path, how: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder away")
    target = tmp_path / "c"
    target.mkdir(mode=0o700)
    bad = target
    if how == "chown":
        os.chown(target, 65534, 65534)
    elif how == "chmod":
        target.chmod(0o777)
    elif how == "parent":
        tmp_path.chmod(0o777)  # anyone could rename c and put their own in its place
        bad = tmp_path
    args = [] if how == "env" else ["--dir", str(target)]
    env = {"FTHSDP_CLUSTER_DIR": str(target)} if how == "env" else None
    if how == "env":
        os.chown(target, 65534, 65534)
    try:
        for command in (["cluster", "up", *args, "--nodes", "1"], ["cluster", "down", *args]):
            r = _cli(*command, env=env)
            assert r.returncode == 2, (command, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and str(bad) in lines[0] and "root" in lines[0], lines
        assert not (target / "etc").exists()
    finally:
        tmp_path.chmod(0o700)
