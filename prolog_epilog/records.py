"""Typed records that every GPU, fabric and kernel-log source produces.

The checks never see NVML handles or nvidia-smi text: they see these frozen dataclasses. The NVML
source (`gpu_source.NvmlSource`) and the nvidia-smi source (`gpu_source.SmiSource`) both produce
them, so a check behaves the same whichever library the node happens to have, and the pure
verdict functions in `prolog_epilog.checks` can be tested by tables of records.

`None` always means "the source could not say" (N/A, not supported, ECC disabled), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuInfo:
    index: int
    bus_id: str  # nvidia-smi form: 00000000:18:00.0
    uuid: str = ""
    name: str = ""


@dataclass(frozen=True)
class EccCounts:
    """One GPU's ECC state: mode and volatile/aggregate counts (DRAM and SRAM summed)."""

    index: int
    bus_id: str = ""
    enabled: bool | None = None
    volatile_uncorrectable: int | None = None
    volatile_correctable: int | None = None
    aggregate_uncorrectable: int | None = None
    aggregate_correctable: int | None = None
    volatile_sram_uncorrectable: int | None = None
    volatile_dram_uncorrectable: int | None = None
    sram_threshold_exceeded: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    index: int
    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass(frozen=True)
class RetiredPages:
    index: int
    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class NvLinkStatus:
    """Per-link speed in GB/s; `None` for a link reported `<inactive>`."""

    index: int
    name: str = ""
    links: dict[int, float | None] = field(default_factory=dict)
    all_inactive: bool = False


@dataclass(frozen=True)
class NvLinkErrors:
    """Per-link error counters by name (`Replay Errors`, `Recovery Errors`, `CRC Errors`, ...)."""

    index: int
    links: dict[int, dict[str, int]] = field(default_factory=dict)

    def total(self) -> int:
        return sum(sum(c.values()) for c in self.links.values())


@dataclass(frozen=True)
class PcieLink:
    index: int
    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None


@dataclass(frozen=True)
class ThermalState:
    index: int
    temperature_c: float | None = None
    hw_slowdown: bool | None = None
    hw_thermal_slowdown: bool | None = None
    sw_thermal_slowdown: bool | None = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    bus_id: str = ""
    used_memory_mib: int | None = None


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device, as sysfs or ibstat reports it."""

    device: str
    port: int
    state: str = ""  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str = ""  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None = None
    rate_text: str = ""
    link_layer: str = ""  # InfiniBand or Ethernet
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str  # as printed: 0000:9b:00
    message: str = ""
    time: float | None = None  # epoch seconds, None if the line had no usable time
    gpu_index: int | None = None
    line: str = ""


def normalize_bus(bus: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) from `00000000:9B:00.0`, `0000:9b:00` or `9b:00.0`; None if unparsable."""
    text = bus.strip().lower().replace("pci:", "")
    parts = text.split(":")
    try:
        if len(parts) == 3:
            domain, b, dev = parts
        elif len(parts) == 2:
            domain, (b, dev) = "0", parts
        else:
            return None
        return int(domain, 16), int(b, 16), int(dev.split(".")[0], 16)
    except ValueError:
        return None
