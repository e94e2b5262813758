"""`fthsdp doctor`'s checks: is this Slurm configured the way fthsdp relies on?

fthsdp leans on a handful of slurm.conf settings (docs/operators.md): requeue, a prolog that runs
at allocation and does not hold the job when it fails, the backfill scheduler for het replicas,
the health-check hooks, a topology plugin when the spec asks for placement, job records that live
long enough to be seen finishing, GPU GRES and the run's partitions. A site that lacks one of
them does not fail loudly: replicas sit held after a bad node, or land across NVLink domains. So
each setting gets one pure check here, over the parsed `scontrol show config`, that says pass,
warn or fail and, when not pass, the exact line to put in slurm.conf.

A setting the release did not print at all is a warning that says so, never a silent pass.
`require_topology_support` is the same topology check used by `fthsdp submit` before anything is
queued: sbatch before 24.05 has no `--segment`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from slurm.errors import InputError
from slurm.expedite import ENABLE, SBATCH_OPTION, expedited_requeue
from slurm.records import SlurmVersion
from slurm.slurm_config import Partition, SlurmConfig, Topology, read_config, read_topology
from slurm.slurm_json import TESTED_RELEASES
from slurm.spec import JobSpec

Status = Literal["pass", "warn", "fail"]
#: topology/block with BlockSizes and sbatch --segment appeared in Slurm 24.05 (its NEWS and man
#: pages; the plugin's first cut in 23.11 had neither).
BLOCK_SINCE = SlurmVersion(24, 5, 0)
MIN_JOB_AGE_S = 300
BF_INTERVAL_MAX_S = 30
PROLOG_LINE = "Prolog=/usr/local/bin/fthsdp-prolog"
EPILOG_LINE = "Epilog=/usr/local/bin/fthsdp-epilog"
HEALTHCHECK_LINE = "HealthCheckProgram=/usr/local/bin/fthsdp-healthcheck"


@dataclass(frozen=True)
class Finding:
    """One setting's verdict; `fix` is the slurm.conf line that turns it into a pass."""

    check: str
    status: Status
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


def _missing(cfg: SlurmConfig, key: str) -> Finding | None:
    if key in cfg.settings:
        return None
    return Finding(
        key, "warn", f"scontrol show config (Slurm {cfg.version_text}) printed no {key} line"
    )


def _with_item(cfg: SlurmConfig, key: str, item: str, drop: str | None = None) -> str:
    """`KEY=existing,items,item`: the site's other items kept, `drop=` ones replaced."""
    items = [i for i in cfg.items(key) if not (drop and i.startswith(drop))]
    return f"{key}={','.join([*items, item])}"


def check_version(cfg: SlurmConfig) -> Finding:
    if cfg.version.release in TESTED_RELEASES:
        return Finding("SLURM_VERSION", "pass", f"Slurm {cfg.version_text}")
    tested = ", ".join(TESTED_RELEASES)
    return Finding(
        "SLURM_VERSION",
        "warn",
        f"Slurm {cfg.version_text} is not one fthsdp is tested on ({tested})",
    )


def check_expedited_requeue(cfg: SlurmConfig) -> Finding:
    """Information, never a failure: without it a requeued replica waits its turn in the queue."""
    granted, why = expedited_requeue(cfg)
    if granted:
        return Finding(
            "expedited requeue",
            "pass",
            f"{why}: `fthsdp submit --expedite` asks for it ({SBATCH_OPTION}) where the run "
            "may drain",
        )
    fix = None
    if "lacks" in why:
        fix = _with_item(cfg, "SlurmctldParameters", ENABLE)
    return Finding(
        "expedited requeue",
        "pass",
        f"{why}: a requeued replica is made eligible at once and waits its turn by priority "
        "([spares] keeps a node for it)",
        fix,
    )


def check_requeue(cfg: SlurmConfig) -> Finding:
    if (missing := _missing(cfg, "JobRequeue")) is not None:
        return missing
    if cfg.get("JobRequeue") == "1":
        return Finding("JobRequeue", "pass", "batch jobs are requeueable by default")
    return Finding(
        "JobRequeue",
        "warn",
        "JobRequeue=0: fthsdp still passes --requeue on every job, which sbatch allows; "
        "a job_submit plugin that strips it would stop every recovery",
        "JobRequeue=1",
    )


def check_prolog_flags(cfg: SlurmConfig) -> Finding:
    if (missing := _missing(cfg, "PrologFlags")) is not None:
        return missing
    if any(i.lower() == "alloc" for i in cfg.items("PrologFlags")):
        return Finding("PrologFlags", "pass", f"PrologFlags={cfg.get('PrologFlags')}")
    return Finding(
        "PrologFlags",
        "fail",
        "without Alloc the prolog runs at the first step, after the batch script has started "
        "on a possibly bad node",
        _with_item(cfg, "PrologFlags", "Alloc"),
    )


def check_nohold(cfg: SlurmConfig) -> Finding:
    name = "SchedulerParameters:nohold_on_prolog_fail"
    if (missing := _missing(cfg, "SchedulerParameters")) is not None:
        return Finding(name, missing.status, missing.detail)
    if "nohold_on_prolog_fail" in cfg.items("SchedulerParameters"):
        return Finding(name, "pass", "a replica whose prolog failed is requeued, not held")
    return Finding(
        name,
        "fail",
        "a replica requeued after a prolog failure is held until an admin runs scontrol release",
        _with_item(cfg, "SchedulerParameters", "nohold_on_prolog_fail"),
    )


def check_scheduler(cfg: SlurmConfig, spec: JobSpec | None) -> Finding:
    if (missing := _missing(cfg, "SchedulerType")) is not None:
        return missing
    kind = cfg.get("SchedulerType")
    if kind == "sched/backfill":
        return Finding("SchedulerType", "pass", "sched/backfill (het jobs need it)")
    het = spec is not None and spec.replicas.helper is not None
    return Finding(
        "SchedulerType",
        "fail" if het else "warn",
        f"{kind}: only the backfill scheduler starts het jobs "
        + ("(this spec's replicas are het jobs)" if het else "(replicas with a [replicas.helper])"),
        "SchedulerType=sched/backfill",
    )


def check_bf_interval(cfg: SlurmConfig) -> Finding:
    items = cfg.items("SchedulerParameters")
    given = [i.split("=", 1)[1] for i in items if i.startswith("bf_interval=")]
    interval = int(given[-1]) if given and given[-1].isdigit() else None
    if given and interval is None:
        return Finding("bf_interval", "warn", f"bf_interval={given[-1]} is not a number of seconds")
    shown = interval if interval is not None else BF_INTERVAL_MAX_S
    if shown <= BF_INTERVAL_MAX_S:
        default = "" if given else " (the default)"
        return Finding("bf_interval", "pass", f"bf_interval={shown}s{default}")
    return Finding(
        "bf_interval",
        "warn",
        f"bf_interval={shown}s: a requeued het replica waits up to that long to be scheduled",
        _with_item(cfg, "SchedulerParameters", f"bf_interval={BF_INTERVAL_MAX_S}", "bf_interval="),
    )


#: What the fixes suggest; any positive weight orders a het job's components by size or GPUs.
PRIORITY_WEIGHT = 1000


def _het_replicas(spec: JobSpec | None) -> bool:
    """Whether replicas are het jobs: a spec with a helper, or no spec (the site in general)."""
    return spec is None or spec.replicas.helper is not None


def _weight(text: str | None) -> int:
    return int(text) if text is not None and text.lstrip("-").isdigit() else 0


def check_component_priority(cfg: SlurmConfig, spec: JobSpec | None) -> Finding:
    """Which component of a requeued replica the backfill plans first.

    The backfill plans a het job's components one at a time, and each holds whole nodes in its
    plan. With equal priorities it orders them by the second each was requeued: a helper
    planned first can take a node its GPU component needs under one switch, and the replica
    then waits for another job to end (seen on the 26.05 dev cluster, where multifactor without
    weights gives every job priority 1).
    """
    name = "PriorityWeightJobSize"
    if not _het_replicas(spec):
        return Finding(name, "pass", "replicas have no helper component")
    if (missing := _missing(cfg, "PriorityType")) is not None:
        return Finding(name, missing.status, missing.detail)
    kind = cfg.get("PriorityType")
    if kind == "priority/basic":
        return Finding(name, "pass", "priority/basic ranks a het job's GPU component first")
    if kind != "priority/multifactor":
        return Finding(name, "warn", f"{kind}: fthsdp knows only basic and multifactor")
    tres = {
        k.strip().lower(): _weight(v)
        for k, _, v in (i.partition("=") for i in cfg.items("PriorityWeightTRES"))
    }
    size = _weight(cfg.get("PriorityWeightJobSize"))
    favor_small = (cfg.get("PriorityFavorSmall") or "").lower() in ("yes", "1")
    if tres.get("gres/gpu", 0) > 0:
        return Finding(
            name, "pass", f"PriorityWeightTRES ranks GPUs ({cfg.get('PriorityWeightTRES')})"
        )
    if size > 0 and not favor_small:
        return Finding(
            name, "pass", f"PriorityWeightJobSize={size} ranks the larger component first"
        )
    detail = (
        "PriorityFavorSmall ranks a replica's helper ahead of its GPU component"
        if size > 0
        else "a requeued replica's components have equal priority"
    ) + (
        ": the backfill may plan the helper first on a node the GPU component needs, and the "
        "replica waits for another job to end"
    )
    if not favor_small:
        return Finding(name, "warn", detail, f"PriorityWeightJobSize={PRIORITY_WEIGHT}")
    return Finding(
        name,
        "warn",
        detail + " (a TRES weight needs gres/gpu in AccountingStorageTRES)",
        _with_item(cfg, "PriorityWeightTRES", f"GRES/gpu={PRIORITY_WEIGHT}", "GRES/gpu="),
    )


def check_hetjob_prio(cfg: SlurmConfig, spec: JobSpec | None) -> Finding:
    """Whether a het job's components are planned together. Ranked by size alone, every
    replica's GPU component comes before any helper; each holds whole nodes in the plan, so a
    helper that must share a GPU node finds none (seen on the 22.05 dev cluster: neither
    replica started)."""
    name = "SchedulerParameters:bf_hetjob_prio"
    if not _het_replicas(spec):
        return Finding(name, "pass", "replicas have no helper component")
    given = [i for i in cfg.items("SchedulerParameters") if i.startswith("bf_hetjob_prio=")]
    if given:
        return Finding(name, "pass", f"{given[-1]}: a replica's components are planned together")
    if cfg.get("PriorityType") == "priority/basic":
        return Finding(name, "pass", "priority/basic gives a het job consecutive priorities")
    return Finding(
        name,
        "warn",
        "the backfill may plan every replica's GPU component before any helper, and a helper "
        "that shares a GPU node then finds none free",
        _with_item(cfg, "SchedulerParameters", "bf_hetjob_prio=max", "bf_hetjob_prio="),
    )


def _points_at(value: str | None, entry: str) -> bool:
    return value is not None and any(os.path.basename(p.strip()) == entry for p in value.split(","))


def check_hook(cfg: SlurmConfig, key: str, entry: str, line: str, absent: Status) -> Finding:
    """Prolog / Epilog / HealthCheckProgram: set, and naming fthsdp's entry point.

    No line at all means unset: 24.11 and 26.05 print `Prolog[0] = ...` lines only for what is
    set (22.05 printed `Prolog = (null)`).
    """
    value = cfg.get(key)
    if value is None:
        return Finding(key, absent, f"unset: fthsdp's {entry} never runs", line)
    if _points_at(value, entry):
        return Finding(key, "pass", value)
    return Finding(
        key,
        "warn",
        f"{value} is not {entry}: fine only if it runs {entry} and keeps its exit status",
        line,
    )


def check_healthcheck_interval(cfg: SlurmConfig) -> Finding:
    if (missing := _missing(cfg, "HealthCheckInterval")) is not None:
        return missing
    interval = cfg.seconds("HealthCheckInterval") or 0
    if interval > 0:
        return Finding("HealthCheckInterval", "pass", f"{interval}s")
    program = cfg.get("HealthCheckProgram") is not None
    return Finding(
        "HealthCheckInterval",
        "fail" if program else "warn",
        "0: the HealthCheckProgram never runs, so drained nodes are never re-checked or resumed",
        "HealthCheckInterval=300",
    )


def check_healthcheck_state(cfg: SlurmConfig) -> Finding:
    state = cfg.get("HealthCheckNodeState")
    if state is None or "ANY" in [s.upper() for s in cfg.items("HealthCheckNodeState")]:
        return Finding("HealthCheckNodeState", "pass", state or "ANY (the default)")
    return Finding(
        "HealthCheckNodeState",
        "warn",
        f"{state}: drained nodes are not re-checked, so fthsdp never resumes a repaired node",
        "HealthCheckNodeState=ANY",
    )


def check_topology(
    cfg: SlurmConfig, required: str | None, topology: Topology | None = None
) -> Finding:
    """The topology the spec's placement needs (`tree` for switches, `block` for segments),
    judged by what `scontrol show topology` shows when read (a topology.yaml overrides
    `TopologyPlugin`), else by `TopologyPlugin`."""
    plugin = cfg.get("TopologyPlugin")
    if required is None:
        return Finding("TopologyPlugin", "pass", f"{plugin or 'none'} (no spec asks for one)")
    if required == "block" and cfg.version < BLOCK_SINCE:
        return Finding(
            "TopologyPlugin",
            "fail",
            f"the spec asks for topology/block, which Slurm {cfg.version_text} lacks "
            f"(it needs {BLOCK_SINCE.release} or later)",
        )
    want = f"topology/{required}"
    if topology is not None:
        have = f"topology/{topology.kind}" if topology.kind else "no topology"
        source = "scontrol show topology shows "
    else:
        have, source = plugin or "none", ""
    if have == want:
        return Finding("TopologyPlugin", "pass", f"{source}{have}, as the spec asks")
    return Finding(
        "TopologyPlugin",
        "fail",
        f"{source}{have}: the spec asks for {want} "
        + ("(--segment places nothing without it)" if required == "block" else "(--switches)"),
        f"TopologyPlugin={want}",
    )


def check_segment(spec: JobSpec, base_blocks: Mapping[str, int]) -> Finding:
    """Each `--segment` of a replica must fit in one base block: 24.11's sbatch refuses a
    larger one ("Requested topology configuration is not available"); 26.05 takes it, and its
    sbatch(1) says a segment holding all of a job's nodes has no effect, so the replica is
    spread over blocks as any job would be."""
    segment = spec.replicas.segment_option
    if segment is None:
        return Finding("segment", "pass", "none asked: topology/block places the replica")
    if not base_blocks:
        return Finding("segment", "fail", "scontrol show topology lists no blocks")
    smallest = min(base_blocks.values())
    if segment <= smallest:
        return Finding("segment", "pass", f"--segment={segment} fits a base block of {smallest}")
    return Finding(
        "segment",
        "fail",
        f"--segment={segment} exceeds the base block size {smallest}: set replicas.segment to "
        f"a divisor of replicas.nodes={spec.replicas.nodes} that is at most {smallest}",
    )


def check_min_job_age(cfg: SlurmConfig) -> Finding:
    if (missing := _missing(cfg, "MinJobAge")) is not None:
        return missing
    age = cfg.seconds("MinJobAge")
    if age is not None and (age == 0 or age >= MIN_JOB_AGE_S):
        return Finding("MinJobAge", "pass", f"{age}s" + (" (never purged)" if age == 0 else ""))
    return Finding(
        "MinJobAge",
        "warn",
        f"{cfg.get('MinJobAge')}: finished replica jobs vanish from squeue before "
        "fthsdp status and the coordinator see how they ended",
        f"MinJobAge={MIN_JOB_AGE_S}",
    )


def check_gres(cfg: SlurmConfig, spec: JobSpec | None) -> Finding:
    if (missing := _missing(cfg, "GresTypes")) is not None:
        return missing
    if "gpu" in cfg.items("GresTypes"):
        return Finding("GresTypes", "pass", f"GresTypes={cfg.get('GresTypes')}")
    wants_gpus = spec is not None and spec.replicas.gpus_per_node > 0
    return Finding(
        "GresTypes",
        "fail" if wants_gpus else "warn",
        "no gpu GRES: --gres=gpu requests fail and the prolog cannot count a node's GPUs",
        _with_item(cfg, "GresTypes", "gpu"),
    )


def spec_partitions(spec: JobSpec) -> list[str]:
    """Partitions a run submits to, in the order jobs are submitted (None = the default)."""
    r = spec.replicas
    names = [
        spec.control.partition or spec.job.partition,
        r.partition or spec.job.partition,
        (r.helper.partition or spec.job.partition) if r.helper else None,
    ]
    return sorted({n for n in names if n is not None})


def check_partitions(spec: JobSpec, partitions: Mapping[str, Partition]) -> list[Finding]:
    named = spec_partitions(spec)
    out = []
    for name in named:
        if name in partitions:
            out.append(Finding(f"partition {name}", "pass", f"exists ({partitions[name].state})"))
        else:
            known = ", ".join(sorted(partitions)) or "none"
            out.append(
                Finding(
                    f"partition {name}",
                    "fail",
                    f"the spec submits to {name}; this cluster has: {known}",
                    f"PartitionName={name} Nodes=<nodes> State=UP",
                )
            )
    uses_default = spec.job.partition is None and (
        spec.replicas.partition is None or spec.control.partition is None
    )
    if uses_default and not any(p.default for p in partitions.values()):
        out.append(
            Finding(
                "default partition",
                "fail",
                "the spec leaves a partition unset and no partition has Default=YES",
                "PartitionName=<name> Nodes=<nodes> Default=YES State=UP",
            )
        )
    return out


def diagnose(
    cfg: SlurmConfig,
    spec: JobSpec | None = None,
    partitions: Mapping[str, Partition] | None = None,
    topology: Topology | None = None,
) -> list[Finding]:
    """Every check, in the order an operator would fix them. Partitions and the topology go
    with a spec (`scontrol show topology` is read only when the spec asks for one)."""
    required = spec.replicas.required_topology if spec else None
    findings = [
        check_version(cfg),
        check_requeue(cfg),
        check_expedited_requeue(cfg),
        check_prolog_flags(cfg),
        check_nohold(cfg),
        check_scheduler(cfg, spec),
        check_bf_interval(cfg),
        check_component_priority(cfg, spec),
        check_hetjob_prio(cfg, spec),
        check_hook(cfg, "Prolog", "fthsdp-prolog", PROLOG_LINE, absent="fail"),
        check_hook(cfg, "Epilog", "fthsdp-epilog", EPILOG_LINE, absent="warn"),
        check_hook(cfg, "HealthCheckProgram", "fthsdp-healthcheck", HEALTHCHECK_LINE, "warn"),
        check_healthcheck_interval(cfg),
        check_healthcheck_state(cfg),
        check_topology(cfg, required, topology),
        check_min_job_age(cfg),
        check_gres(cfg, spec),
    ]
    segment = spec.replicas.segment if spec else None
    if spec is not None and segment is not None and topology and topology.kind == "block":
        findings.append(check_segment(spec, topology.base_blocks))
    if spec is not None and partitions is not None:
        findings += check_partitions(spec, partitions)
    return findings


def wants_topology(cfg: SlurmConfig, spec: JobSpec | None) -> bool:
    """Whether to read `scontrol show topology`: a spec asks for a topology this release has."""
    required = spec.replicas.required_topology if spec else None
    return required == "tree" or (required == "block" and cfg.version >= BLOCK_SINCE)


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when nothing fails (warnings included), 1 when any check fails."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def summary(findings: Sequence[Finding]) -> dict[Status, int]:
    counts: dict[Status, int] = {"pass": 0, "warn": 0, "fail": 0}
    for f in findings:
        counts[f.status] += 1
    return counts


def require_topology_support(
    spec: JobSpec,
    read: Callable[[], SlurmConfig] = read_config,
    read_shown: Callable[[SlurmVersion], Topology] = read_topology,
) -> None:
    """Refuse (InputError, exit 2) a block-topology spec where slurmctld schedules no blocks:
    a release before 24.05, or a cluster whose topology is not block.

    Reads the cluster only when the spec asks for block placement; an unreachable Slurm then
    raises `SlurmUnreachable` rather than letting sbatch guess.
    """
    if spec.replicas.required_topology != "block":
        return
    cfg = read()
    shown = read_shown(cfg.version) if wants_topology(cfg, spec) else None
    finding = check_topology(cfg, "block", shown)
    if finding.status == "fail":
        raise InputError("replicas.topology", "block", finding.detail)
