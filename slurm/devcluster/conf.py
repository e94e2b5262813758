"""The dev cluster's Slurm configuration text: slurm.conf, gres.conf and topology.conf.

Pure functions of a `DevClusterConfig`, so the files can be read and tested without starting
anything. The settings are chosen so that failures and requeues are fast.
"""

from __future__ import annotations

import socket

from slurm import hostlist
from slurm.devcluster.config import DevClusterConfig
from slurm.doctor import PRIORITY_WEIGHT
from slurm.expedite import ENABLE, EXPEDITE_SINCE


def _hl(names: list[str]) -> str:
    return hostlist.compress(names)


def slurm_conf(cfg: DevClusterConfig, release: tuple[int, int] | None = None) -> str:
    """slurm.conf for the dev cluster; settings chosen so failures and requeues are fast.

    `release`, the installed Slurm's (major, minor), turns on what only newer releases know:
    the expedited requeue (25.11+, `slurm.expedite`)."""
    d = cfg.directory
    host = socket.gethostname().split(".")[0]
    sched = ["bf_interval=1", "bf_continue", "bf_hetjob_prio=max"]
    if cfg.nohold_on_prolog_fail:
        sched.append("nohold_on_prolog_fail")
    lines = [
        "# Written by fthsdp cluster up; regenerated on every start.",
        "ClusterName=fthsdp-dev",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={cfg.ctld_port}",
        f"SlurmdPort={cfg.slurmd_base_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={cfg.munge_socket}",
        f"SlurmUser={cfg.slurm_user}",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n'}",
        f"SlurmctldPidFile={d / 'ctld' / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # TaskPlugin, MpiDefault, SwitchType, AccountingStorageType, JobAcctGatherType and
        # JobCompType stay unset: their 22.05 defaults are the "none" plugins, which 23.x dropped
        # (24.11 and 26.05 document them as "unset by default" and ship no */none plugins).
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ProctrackType=proctrack/linuxproc",
        f"TopologyPlugin=topology/{cfg.topology}",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "JobRequeue=1",
        "ReturnToService=2",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "MessageTimeout=10",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=600",
        "SchedulerType=sched/backfill",
        f"SchedulerParameters={','.join(sched)}",
        # What `fthsdp doctor` asks of a site for het replicas: a requeued replica's GPU
        # component planned before its helper (docs/design-facts.md, fact 26).
        "PriorityType=priority/multifactor",
        f"PriorityWeightJobSize={PRIORITY_WEIGHT}",
        *(
            [f"SlurmctldParameters={ENABLE}"]
            if release and release >= (EXPEDITE_SINCE.major, EXPEDITE_SINCE.minor)
            else []
        ),
        f"PrologEpilogTimeout={cfg.prolog_epilog_timeout}",
    ]
    if cfg.prolog:
        lines += [f"Prolog={cfg.prolog}", f"PrologFlags={cfg.prolog_flags}"]
    if cfg.epilog:
        lines.append(f"Epilog={cfg.epilog}")
    if cfg.task_prolog:
        lines.append(f"TaskProlog={cfg.task_prolog}")
    if cfg.health_check_program:
        lines += [
            f"HealthCheckProgram={cfg.health_check_program}",
            f"HealthCheckInterval={cfg.health_check_interval or 30}",
            "HealthCheckNodeState=ANY",
        ]
    for k, name in enumerate(cfg.node_names):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"Port={cfg.slurmd_base_port + k} CPUs={cfg.cpus_per_node} "
            f"RealMemory={cfg.memory_mb} Gres=gpu:{cfg.gpu_type}:{cfg.gpus_per_node} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={cfg.partition} Nodes={_hl(cfg.node_names)} Default=YES "
        "MaxTime=INFINITE State=UP OverSubscribe=NO"
    )
    return "\n".join(lines) + "\n"


def gres_conf(cfg: DevClusterConfig) -> str:
    """gres.conf pointing each node's GPUs at placeholder files (no GPU hardware here)."""
    last = cfg.gpus_per_node - 1
    dev = cfg.directory / "dev"
    return (
        f"NodeName={_hl(cfg.node_names)} Name=gpu Type={cfg.gpu_type} File={dev}/nvidia[0-{last}]\n"
        if last > 0
        else f"NodeName={_hl(cfg.node_names)} Name=gpu Type={cfg.gpu_type} File={dev}/nvidia0\n"
    )


def topology_conf(cfg: DevClusterConfig) -> str:
    """topology.conf: nodes under leaf switches of `switch_size`, leaves under one spine."""
    leaves = cfg.switches
    if cfg.topology == "block":
        blocks = [f"BlockName=b{name[1:]} Nodes={_hl(nodes)}" for name, nodes in leaves.items()]
        # Base blocks of switch_size, paired into higher levels (2x, 4x, ...) as Slurm does.
        sizes = [cfg.switch_size * 2**k for k in range(len(blocks).bit_length())]
        return "\n".join([*blocks, f"BlockSizes={','.join(map(str, sizes))}"]) + "\n"
    lines = [f"SwitchName={name} Nodes={_hl(nodes)}" for name, nodes in leaves.items()]
    lines.append(f"SwitchName=spine Switches={_hl(list(leaves))}")
    return "\n".join(lines) + "\n"
