"""Simulated node hardware for the dev cluster: every health-check input, in the real formats.

The dev cluster has no GPUs and no InfiniBand, yet its prolog and HealthCheckProgram must run the
real checks. `write_node_inputs(root, node, gpus, faults)` writes, under `root/node/`:

- `bin/nvidia-smi`: a stand-in (see `simulated_smi`) answering from `smi/` fixture files written
  here in nvidia-smi's formats (driver 535, H100 80GB HBM3: `-q` with the SRAM/DRAM ECC split,
  18 NVLinks at 26.562 GB/s, CSV queries);
- `sys/class/infiniband/mlx5_*/ports/1/...`: eight NDR InfiniBand ports plus one RoCE port;
- `kern.log`: a syslog-format kernel log with ordinary driver noise.

Faults change exactly what the real fault changes: `xid79` adds the Xid 79 line and drops that
GPU from every nvidia-smi answer; `ecc` sets a volatile uncorrectable DRAM count; `nvlink` makes
one link `<inactive>`; `ib` takes one port DOWN/Polling; `hang` makes nvidia-smi never return.
Writing a node again without faults "repairs" it. A config whose paths contain `{node}` (see
`dev_config_toml`) points each dev node's checks at its own directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

from slurm.errors import InputError
from slurm.rundir.paths import write_whole

FAULTS = ("xid79", "ecc", "nvlink", "ib", "hang")
GPU_NAME = "NVIDIA H100 80GB HBM3"
DRIVER = "535.129.03"
HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
IB_DEVICES = 8
NVLINKS = 18
NVLINK_SPEED = "26.562 GB/s"


@dataclass(frozen=True)
class NodeInputs:
    root: Path  # root/node
    nvidia_smi: Path
    sysfs_root: Path
    kernel_log: Path
    smi_dir: Path
    gpus: int
    faults: tuple[str, ...]


def _bus(i: int) -> str:
    b = HGX_BUSES[i] if i < len(HGX_BUSES) else f"{0xE0 + i - len(HGX_BUSES):02X}"
    return f"00000000:{b}:00.0"


def _uuid(node: str, i: int) -> str:
    h = hashlib.sha1(f"{node}/{i}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _kv(level: int, key: str, value: str) -> str:
    return " " * (4 * level) + key.ljust(42 - 4 * level) + ": " + value


def _hdr(level: int, title: str) -> str:
    return " " * (4 * level) + title


def render_query(node: str, indices: list[int], dram_unc: dict[int, int]) -> str:
    """A full `nvidia-smi -q` log (the sections the checks read), driver 535 on H100."""
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        _kv(0, "Driver Version", DRIVER),
        _kv(0, "CUDA Version", "12.2"),
        "",
        _kv(0, "Attached GPUs", str(len(indices))),
    ]
    for i in indices:
        unc = str(dram_unc.get(i, 0))
        lines += [
            f"GPU {_bus(i)}",
            _kv(1, "Product Name", GPU_NAME),
            _kv(1, "Product Brand", "NVIDIA"),
            _kv(1, "Product Architecture", "Hopper"),
            _kv(1, "GPU UUID", _uuid(node, i)),
            _kv(1, "Minor Number", str(i)),
            _hdr(1, "ECC Mode"),
            _kv(2, "Current", "Enabled"),
            _kv(2, "Pending", "Enabled"),
            _hdr(1, "ECC Errors"),
            _hdr(2, "Volatile"),
            _kv(3, "SRAM Correctable", "0"),
            _kv(3, "SRAM Uncorrectable", "0"),
            _kv(3, "DRAM Correctable", "0"),
            _kv(3, "DRAM Uncorrectable", unc),
            _hdr(2, "Aggregate"),
            _kv(3, "SRAM Correctable", "0"),
            _kv(3, "SRAM Uncorrectable", "0"),
            _kv(3, "DRAM Correctable", "0"),
            _kv(3, "DRAM Uncorrectable", unc),
            _hdr(1, "Retired Pages"),
            _kv(2, "Single Bit ECC", "N/A"),
            _kv(2, "Double Bit ECC", "N/A"),
            _kv(2, "Pending Page Blacklist", "N/A"),
            _hdr(1, "Remapped Rows"),
            _kv(2, "Correctable Error", "0"),
            _kv(2, "Uncorrectable Error", "0"),
            _kv(2, "Pending", "No"),
            _kv(2, "Remapping Failure Occurred", "No"),
            _hdr(2, "Bank Remap Availability Histogram"),
            _kv(3, "Max", "2560 bank(s)"),
            _kv(3, "High", "0 bank(s)"),
            _kv(3, "Partial", "0 bank(s)"),
            _kv(3, "Low", "0 bank(s)"),
            _kv(3, "None", "0 bank(s)"),
            _hdr(1, "Temperature"),
            _kv(2, "GPU Current Temp", f"{30 + i} C"),
            _kv(2, "GPU Shutdown Temp", "92 C"),
            _kv(2, "GPU Slowdown Temp", "89 C"),
            "",
        ]
    return "\n".join(lines) + "\n"


def render_nvlink_status(node: str, indices: list[int], inactive: set[tuple[int, int]]) -> str:
    lines = []
    for i in indices:
        lines.append(f"GPU {i}: {GPU_NAME} (UUID: {_uuid(node, i)})")
        for link in range(NVLINKS):
            speed = "<inactive>" if (i, link) in inactive else NVLINK_SPEED
            lines.append(f"\t Link {link}: {speed}")
    return "\n".join(lines) + "\n"


def render_nvlink_errors(node: str, indices: list[int]) -> str:
    lines = []
    for i in indices:
        lines.append(f"GPU {i}: {GPU_NAME} (UUID: {_uuid(node, i)})")
        for link in range(NVLINKS):
            lines += [
                f"\t Link {link}: Replay Errors: 0",
                f"\t Link {link}: Recovery Errors: 0",
                f"\t Link {link}: CRC Errors: 0",
                "",
            ]
    return "\n".join(lines)


QUERY_GPU_HEADER = (
    "index, pci.bus_id, uuid, name, pcie.link.gen.current, pcie.link.gen.max, "
    "pcie.link.width.current, pcie.link.width.max, temperature.gpu, "
    "clocks_throttle_reasons.hw_slowdown, clocks_throttle_reasons.hw_thermal_slowdown, "
    "clocks_throttle_reasons.sw_thermal_slowdown"
)


def render_query_gpu(node: str, indices: list[int]) -> str:
    rows = [QUERY_GPU_HEADER]
    for i in indices:
        rows.append(
            f"{i}, {_bus(i)}, {_uuid(node, i)}, {GPU_NAME}, 5, 5, 16, 16, {30 + i}, "
            "Not Active, Not Active, Not Active"
        )
    return "\n".join(rows) + "\n"


def _syslog_time(t: float) -> str:
    d = datetime.fromtimestamp(t)
    return f"{d:%b} {d.day:2d} {d:%H:%M:%S}"


def render_kernel_log(node: str, xid_gpu: int | None, now: float) -> str:
    boot = now - 7200
    lines = [
        (
            boot + 4.1,
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  "
            + DRIVER
            + "  Thu Oct  5 21:04:00 UTC 2023",
        ),
        (boot + 4.3, "nvidia-nvlink: Nvlink Core is being initialized, major device number 511"),
        (
            boot + 9.8,
            "mlx5_core 0000:1a:00.0: mlx5_pcie_event:301:(pid 1035): "
            "PCIe slot advertised sufficient power (27W).",
        ),
        (
            boot + 11.2,
            "infiniband mlx5_0: mlx5_ib_test_wc:290:(pid 1178): writecombining is not supported",
        ),
        (
            now - 60,
            "perf: interrupt took too long (2513 > 2500), "
            "lowering kernel.perf_event_max_sample_rate to 79500",
        ),
    ]
    if xid_gpu is not None:
        pci = _bus(xid_gpu)[4:].lower().rsplit(".", 1)[0]
        lines.append(
            (
                now - 1,
                f"NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, "
                "GPU has fallen off the bus.",
            )
        )
    return "".join(
        f"{_syslog_time(t)} {node} kernel: [{t - boot:12.6f}] {msg}\n" for t, msg in lines
    )


def _runnable_by_all(path: Path) -> bool:
    """Whether every user may run `path`: the file and each folder above it open to others."""
    try:
        real = path.resolve(strict=True)
    except OSError:
        return False
    if not os.stat(real).st_mode & 0o001:
        return False
    return all(os.stat(d).st_mode & 0o001 for d in real.parents)


def shared_python() -> str:
    """The interpreter of the simulated `nvidia-smi`: one every job user can run, since the
    ranks' watchdogs run it as the job's user. `FTHSDP_SIM_PYTHON` names one; else this
    process's interpreter if others may run it, else the system's; else this one (a job user's
    watchdog then reports the node's tool as failing, as it would on a real node)."""
    named = os.environ.get("FTHSDP_SIM_PYTHON")
    if named:
        return named
    for candidate in (Path(sys.executable), Path("/usr/bin/python3")):
        if _runnable_by_all(candidate):
            return str(candidate)
    return sys.executable


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    """Whole, by rename: the checks run the simulated nvidia-smi and read these files while a
    fault is injected, and a half-written fault leaves a node half broken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, text, mode)


def _write_sysfs(sys_root: Path, ib_down: bool) -> None:
    base = sys_root / "class" / "infiniband"
    if base.exists():
        shutil.rmtree(base)
    for d in range(IB_DEVICES + 1):
        port = base / f"mlx5_{d}" / "ports" / "1"
        roce = d == IB_DEVICES
        down = ib_down and d == 1
        _write(port / "state", "1: DOWN\n" if down else "4: ACTIVE\n")
        _write(port / "phys_state", "2: Polling\n" if down else "5: LinkUp\n")
        _write(
            port / "rate",
            "10 Gb/sec (4X SDR)\n"
            if down
            else ("200 Gb/sec (4X HDR)\n" if roce else "400 Gb/sec (4X NDR)\n"),
        )
        _write(port / "link_layer", "Ethernet\n" if roce else "InfiniBand\n")
        for counter in ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors"):
            _write(port / "counters" / counter, "0\n")


def write_node_inputs(
    root: Path, node: str, gpus: int = 8, faults: Collection[str] = ()
) -> NodeInputs:
    """Write one node's complete simulated inputs under `root/node` (healthy unless `faults`)."""
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        raise InputError("fault", bad[0], f"allowed: {', '.join(FAULTS)}")
    if gpus < 1:
        raise InputError("gpus", gpus, "must be at least 1")
    faults = tuple(dict.fromkeys(faults))
    now = time.time()
    base = Path(root) / node
    smi = base / "smi"
    indices = list(range(gpus))
    xid_gpu = gpus - 1 if "xid79" in faults else None
    if xid_gpu is not None:
        indices.remove(xid_gpu)
    dram_unc = {min(2, gpus - 1): 2} if "ecc" in faults else {}
    inactive = {(min(1, gpus - 1), 7)} if "nvlink" in faults else set()
    _write(smi / "q.txt", render_query(node, indices, dram_unc))
    _write(smi / "query_gpu.csv", render_query_gpu(node, indices))
    _write(smi / "compute_apps.csv", "pid, gpu_bus_id, used_memory\n")
    _write(smi / "nvlink_s.txt", render_nvlink_status(node, indices, inactive))
    _write(smi / "nvlink_e.txt", render_nvlink_errors(node, indices))
    hang = smi / "hang"
    if "hang" in faults:
        hang.touch()
    elif hang.exists():
        hang.unlink()
    source = resources.files("prolog_epilog").joinpath("simulated_smi.py").read_text()
    binary = base / "bin" / "nvidia-smi"
    _write(binary, f"#!{shared_python()} -I\n" + source, mode=0o755)
    _write_sysfs(base / "sys", "ib" in faults)
    _write(base / "kern.log", render_kernel_log(node, xid_gpu, now))
    return NodeInputs(base, binary, base / "sys", base / "kern.log", smi, gpus, faults)


def dev_config_toml(
    root: Path, state_root: Path | None = None, log_dir: Path | None = None, **general: object
) -> str:
    """A health config pointing every check at `root/{node}/...` (one config for all dev nodes)."""
    state_root = state_root or root
    log_dir = log_dir or root
    lines = [
        "[general]",
        'gpu_source = "nvidia-smi"',
        f'nvidia_smi = "{root}/{{node}}/bin/nvidia-smi"',
        f'sysfs_root = "{root}/{{node}}/sys"',
        f'kernel_log = "{root}/{{node}}/kern.log"',
        f'state_dir = "{state_root}/{{node}}/state"',
        f'log_file = "{log_dir}/health-{{node}}.log"',
        f'json_log = "{log_dir}/health-{{node}}.jsonl"',
    ]
    for key, value in general.items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
