"""InfiniBand/RoCE port state from sysfs or `ibstat`, as `IbPort` records.

sysfs is the primary source (`/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,
link_layer}` and `counters/*`): it needs no tool, cannot hang on a sick HCA the way a MAD query
can, and reads in microseconds. Files come with or without a trailing newline depending on how
they were produced, so every read strips. `parse_ibstat` reads the same facts from `ibstat` text
for nodes where an operator prefers that, and for fixtures captured from it.
"""

from __future__ import annotations

import re
from pathlib import Path

from prolog_epilog.records import IbPort

COUNTERS = (
    "link_downed",
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
#: Width of the classic PortCounters fields: these stop counting at their maximum.
COUNTER_MAX = {
    "link_downed": 255,
    "link_error_recovery": 255,
    "symbol_error": 65535,
    "port_rcv_errors": 65535,
    "port_xmit_discards": 65535,
    "local_link_integrity_errors": 15,
    "excessive_buffer_overrun_errors": 15,
}


def parse_rate(text: str) -> float | None:
    """`400 Gb/sec (4X NDR)` -> 400.0; ibstat's bare `400` -> 400.0."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _state_word(text: str) -> str:
    """sysfs `4: ACTIVE` -> `ACTIVE`; ibstat `Active` -> `ACTIVE`."""
    word = text.split(":", 1)[1] if ":" in text else text
    return word.strip().upper()


def _phys_word(text: str) -> str:
    word = text.split(":", 1)[1] if ":" in text else text
    return word.strip()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def read_sysfs(sysfs_root: Path, devices: list[str] | None = None) -> list[IbPort]:
    base = sysfs_root / "class" / "infiniband"
    out: list[IbPort] = []
    try:
        devs = sorted(p for p in base.iterdir() if not devices or p.name in devices)
    except OSError:
        return out
    for dev in devs:
        try:
            ports = sorted((dev / "ports").iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError:
            continue
        for port in ports:
            if not port.name.isdigit():
                continue
            counters: dict[str, int] = {}
            for name in COUNTERS:
                value = _read(port / "counters" / name)
                if value.isdigit():
                    counters[name] = int(value)
            rate = _read(port / "rate")
            out.append(
                IbPort(
                    device=dev.name,
                    port=int(port.name),
                    state=_state_word(_read(port / "state")),
                    phys_state=_phys_word(_read(port / "phys_state")),
                    rate_gbps=parse_rate(rate),
                    rate_text=rate,
                    link_layer=_read(port / "link_layer"),
                    counters=counters,
                )
            )
    return out


def parse_ibstat(text: str) -> list[IbPort]:
    """`ibstat` output: `CA 'mlx5_0'` blocks with `Port 1:` sub-blocks."""
    out: list[IbPort] = []
    device = ""
    port: dict[str, str] | None = None
    port_no = 0

    def flush() -> None:
        if port is not None and device:
            rate = port.get("rate", "")
            out.append(
                IbPort(
                    device=device,
                    port=port_no,
                    state=_state_word(port.get("state", "")),
                    phys_state=_phys_word(port.get("physical state", "")),
                    rate_gbps=parse_rate(rate),
                    rate_text=rate,
                    link_layer=port.get("link layer", ""),
                )
            )

    for line in text.splitlines():
        stripped = line.strip()
        m = re.match(r"^CA '([^']+)'", stripped)
        if m:
            flush()
            device, port = m.group(1), None
            continue
        m = re.match(r"^Port (\d+):$", stripped)
        if m:
            flush()
            port, port_no = {}, int(m.group(1))
            continue
        if port is not None and ":" in stripped:
            key, value = stripped.split(":", 1)
            port[key.strip().lower()] = value.strip()
    flush()
    return out
