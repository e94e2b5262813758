"""What a cluster's Slurm says about itself: version, slurm.conf settings, partitions, blocks.

`fthsdp doctor` and the submit-time topology check need the settings slurmctld actually runs
with, not a guess from a file on the login node, so they read `scontrol show config` (one
`Key = value` line per setting, a format unchanged from 22.05 to 26.05), `scontrol show
partition --oneliner` and, for block topology, `scontrol show topology`. Parsing is pure and
kept apart from the small readers. Settings that may be given several times print as
`Prolog[0] = ...` from 24.11 on (and not at all when unset); they are folded into one comma
list under the plain name.

Fail safe: text that does not look like the output we know (no `Configuration data as of`
header, no `SLURM_VERSION`) raises `SlurmOutputError` naming the command and the version,
never an empty config a caller would read as "nothing is set".
"""

from __future__ import annotations

import re
import subprocess
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm.errors import EnvironmentProblem
from slurm.records import SlurmOutputError, SlurmVersion

SHOW_CONFIG = ("scontrol", "show", "config")
SHOW_PARTITIONS = ("scontrol", "show", "partition", "--oneliner")
SHOW_TOPOLOGY = ("scontrol", "show", "topology")
_HEADER = "Configuration data as of"
_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)\s*=\s?(?P<value>.*)$")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_PAIR = re.compile(r"(?:^|\s)(?P<key>[A-Za-z]+)=(?P<value>\S*)")


class SlurmUnreachable(EnvironmentProblem):
    """scontrol is missing, or slurmctld did not answer (`fthsdp doctor` exits 3)."""


def version_of(text: str) -> SlurmVersion | None:
    """'22.05.8' (SLURM_VERSION), 'slurm 26.05.0-0rc1' -> SlurmVersion; None if none is there."""
    m = _VERSION.search(text)
    return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


@dataclass(frozen=True)
class SlurmConfig:
    """The first block of `scontrol show config`: setting name -> value as Slurm prints it."""

    version_text: str
    settings: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", types.MappingProxyType(dict(self.settings)))

    @property
    def version(self) -> SlurmVersion:
        version = version_of(self.version_text)
        assert version is not None, "parse_show_config checks SLURM_VERSION"
        return version

    def get(self, key: str) -> str | None:
        """The value, or None when unset (`(null)`, empty, or not printed by this release)."""
        value = self.settings.get(key)
        if value is None or value.strip() in ("", "(null)", "(null type)"):
            return None
        return value.strip()

    def seconds(self, key: str) -> int | None:
        """'600 sec' / '30' -> 600 / 30; None when unset or not a number."""
        value = self.get(key)
        if value is None:
            return None
        m = re.match(r"^(\d+)", value)
        return int(m.group(1)) if m else None

    def items(self, key: str) -> list[str]:
        """A comma list (`SchedulerParameters`, `PrologFlags`, `GresTypes`) as its items."""
        value = self.get(key)
        return [v.strip() for v in value.split(",") if v.strip()] if value else []


def parse_show_config(text: str) -> SlurmConfig:
    """Parse `scontrol show config`; only the first block (later blocks are plugin configs)."""
    lines = text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith(_HEADER)), None)
    if start is None:
        raise SlurmOutputError(SHOW_CONFIG, None, f"no '{_HEADER}' line")
    settings: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        m = _LINE.match(line)
        if m:
            key, value = m.group("key"), m.group("value").rstrip()
            settings[key] = value
            if "[" in key:
                # 24.11+ print each of several Prolog/Epilog as `Prolog[0] = ...`, none if unset.
                base = key.split("[", 1)[0]
                settings[base] = f"{settings[base]},{value}" if base in settings else value
    text_version = settings.get("SLURM_VERSION", "").strip()
    version = version_of(text_version)
    if version is None:
        raise SlurmOutputError(SHOW_CONFIG, None, "no SLURM_VERSION line")
    if len(settings) < 20:
        raise SlurmOutputError(SHOW_CONFIG, version, f"only {len(settings)} settings")
    return SlurmConfig(text_version, settings)


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str | None


def parse_partitions(text: str, version: SlurmVersion | None) -> dict[str, Partition]:
    """`scontrol show partition --oneliner` -> name -> Partition (empty: the cluster has none)."""
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("No partitions"):
            continue
        pairs = {m.group("key"): m.group("value") for m in _PAIR.finditer(line)}
        name = pairs.get("PartitionName")
        if not name:
            raise SlurmOutputError(SHOW_PARTITIONS, version, f"no PartitionName in {line[:60]!r}")
        out[name] = Partition(name, pairs.get("Default") == "YES", pairs.get("State"))
    return out


@dataclass(frozen=True)
class Topology:
    """The topology slurmctld schedules with: `block`, `tree`, or None (flat: nothing shown).

    Read from `scontrol show topology`, not from `TopologyPlugin`: with a topology.yaml
    (25.05+) slurm.conf's `TopologyPlugin` still prints (26.05 showed `topology/tree` while the
    yaml's block topology was in force).
    """

    kind: str | None
    base_blocks: Mapping[str, int] = field(default_factory=dict)


def parse_topology(text: str, version: SlurmVersion | None) -> Topology:
    """`scontrol show topology` -> Topology. 24.11 and 26.05 print one `BlockName=b1
    BlockIndex=0 Nodes=node[1-2] BlockSize=2` line per base block (and `AggregatedBlock=` lines
    for higher levels); trees print `SwitchName=` lines (22.05 to 26.05)."""
    blocks: dict[str, int] = {}
    switches = False
    for line in text.splitlines():
        pairs = {m.group("key"): m.group("value") for m in _PAIR.finditer(line)}
        if "SwitchName" in pairs:
            switches = True
        if "BlockName" not in pairs:
            continue
        size = pairs.get("BlockSize", "")
        if not size.isdigit():
            raise SlurmOutputError(SHOW_TOPOLOGY, version, f"no BlockSize in {line[:60]!r}")
        blocks[pairs["BlockName"]] = int(size)
    if blocks and switches:
        raise SlurmOutputError(SHOW_TOPOLOGY, version, "both switches and blocks")
    return Topology("block" if blocks else "tree" if switches else None, blocks)


def _scontrol(argv: tuple[str, ...], timeout: float) -> str:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise SlurmUnreachable(f"{argv[0]} not found: is Slurm's client installed?") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"{' '.join(argv)}: no answer within {timeout:.0f}s") from None
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        raise SlurmUnreachable(f"{' '.join(argv)} failed: {last[0]}")
    return r.stdout


def read_config(timeout: float = 30) -> SlurmConfig:
    """The running slurmctld's configuration (the cluster that `SLURM_CONF` points at)."""
    return parse_show_config(_scontrol(SHOW_CONFIG, timeout))


def read_partitions(version: SlurmVersion, timeout: float = 30) -> dict[str, Partition]:
    return parse_partitions(_scontrol(SHOW_PARTITIONS, timeout), version)


def read_topology(version: SlurmVersion, timeout: float = 30) -> Topology:
    try:
        return parse_topology(_scontrol(SHOW_TOPOLOGY, timeout), version)
    except SlurmUnreachable as exc:
        if "No topology information available" in str(exc):
            return Topology(None)  # a flat cluster: topology/default
        raise
