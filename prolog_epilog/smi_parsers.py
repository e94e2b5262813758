"""Parsers for `nvidia-smi` text: `-q` sections, `nvlink -s`, `nvlink -e` and CSV queries.

NVIDIA says the text output is not a stable interface, and it has indeed changed: drivers before
R510 print ECC counts as `Single Bit`/`Double Bit` per memory unit, R510..R535 as
`SRAM Correctable`/`SRAM Uncorrectable`/`DRAM ...`, and later drivers split SRAM uncorrectable
into `Parity` and `SEC-DED` and add `SRAM Threshold Exceeded`. The `-q` parser therefore reads
the indentation tree generically and the extractors look keys up case-insensitively, accepting
every known spelling. Each parser is a pure function from text to records and never raises on
garbage: lines it does not understand are skipped (fuzzed with hypothesis in the tests).
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from prolog_epilog.records import (
    EccCounts,
    GpuInfo,
    GpuProcess,
    NvLinkErrors,
    NvLinkStatus,
    PcieLink,
    RemappedRows,
    RetiredPages,
    ThermalState,
)

Tree = dict[str, Any]
_NA = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "", "[gpu is lost]"}

_KV = re.compile(r"^(\s*)([^:]+?)\s*:\s?(.*)$")


def parse_query(text: str) -> list[tuple[str, Tree]]:
    """`nvidia-smi -q` output -> [(bus id, tree)] in GPU order; keys lower-cased."""
    gpus: list[tuple[str, Tree]] = []
    stack: list[tuple[int, Tree]] = []
    for raw in text.splitlines():
        line = raw.replace("\t", "    ").rstrip()
        if not line.strip():
            continue
        if line.startswith("GPU ") and not line.startswith("GPU  "):
            bus = line[4:].strip()
            if re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]", bus):
                tree: Tree = {}
                gpus.append((bus, tree))
                stack = [(0, tree)]
                continue
        if not stack:
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            stack = []  # a top-level line (e.g. the next header) ends the GPU block
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        m = _KV.match(line)
        if m:
            parent[m.group(2).strip().lower()] = m.group(3).strip()
        else:
            child: Tree = {}
            parent[line.strip().lower()] = child
            stack.append((indent, child))
    return gpus


def _get(tree: Any, *path: str) -> Any:
    node = tree
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def to_int(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.lower() in _NA:
        return None
    m = re.match(r"^(\d+)", text)
    return int(m.group(1)) if m else None


def to_float(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    m = re.match(r"^\s*(\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def to_bool(value: Any) -> bool | None:
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text in ("yes", "enabled", "active", "true"):
        return True
    if text in ("no", "disabled", "not active", "false"):
        return False
    return None


def _sum(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _counts(block: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """(uncorrectable, correctable, sram uncorrectable, dram uncorrectable) of one block."""
    if not isinstance(block, dict):
        return None, None, None, None
    if "double bit" in block or "single bit" in block:  # before R510
        dbe = to_int(_get(block, "double bit", "total"))
        sbe = to_int(_get(block, "single bit", "total"))
        return dbe, sbe, None, dbe
    sram_unc = _sum(
        [
            to_int(block.get("sram uncorrectable")),
            to_int(block.get("sram uncorrectable parity")),
            to_int(block.get("sram uncorrectable sec-ded")),
        ]
    )
    dram_unc = to_int(block.get("dram uncorrectable"))
    corr = _sum([to_int(block.get("sram correctable")), to_int(block.get("dram correctable"))])
    return _sum([sram_unc, dram_unc]), corr, sram_unc, dram_unc


def ecc_from_query(gpus: list[tuple[str, Tree]]) -> list[EccCounts]:
    out = []
    for index, (bus, tree) in enumerate(gpus):
        mode = _get(tree, "ecc mode", "current")
        errors = tree.get("ecc errors")
        if mode is None and errors is None:
            continue
        vol_u, vol_c, vol_sram, vol_dram = _counts(_get(errors, "volatile"))
        agg_u, agg_c, _, _ = _counts(_get(errors, "aggregate"))
        out.append(
            EccCounts(
                index=index,
                bus_id=bus,
                enabled=to_bool(mode),
                volatile_uncorrectable=vol_u,
                volatile_correctable=vol_c,
                aggregate_uncorrectable=agg_u,
                aggregate_correctable=agg_c,
                volatile_sram_uncorrectable=vol_sram,
                volatile_dram_uncorrectable=vol_dram,
                sram_threshold_exceeded=to_bool(
                    _get(errors, "aggregate", "sram threshold exceeded")
                ),
            )
        )
    return out


def remapped_rows_from_query(gpus: list[tuple[str, Tree]]) -> list[RemappedRows]:
    out = []
    for index, (_, tree) in enumerate(gpus):
        block = tree.get("remapped rows")
        if not isinstance(block, dict):
            continue  # absent or "N/A" (no row remapping before Ampere)
        out.append(
            RemappedRows(
                index=index,
                correctable=to_int(block.get("correctable error")),
                uncorrectable=to_int(block.get("uncorrectable error")),
                pending=to_bool(block.get("pending")),
                failure=to_bool(block.get("remapping failure occurred")),
            )
        )
    return out


def retired_pages_from_query(gpus: list[tuple[str, Tree]]) -> list[RetiredPages]:
    out = []
    for index, (_, tree) in enumerate(gpus):
        block = tree.get("retired pages")
        if not isinstance(block, dict):
            continue
        sbe = block.get("single bit ecc")
        dbe = block.get("double bit ecc")
        if isinstance(sbe, dict):  # some drivers nest "Retired Count" under each cause
            sbe = sbe.get("retired count")
        if isinstance(dbe, dict):
            dbe = dbe.get("retired count")
        pending = block.get("pending page blacklist", block.get("pending"))
        rec = RetiredPages(index, to_int(sbe), to_int(dbe), to_bool(pending))
        if rec.single_bit is None and rec.double_bit is None and rec.pending is None:
            continue  # all N/A: page retirement replaced by row remapping on this GPU
        out.append(rec)
    return out


_GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
_LINK_SPEED = re.compile(r"^\s*Link (\d+): (.*)$")
_LINK_COUNTER = re.compile(r"^\s*Link (\d+): ([^:]+): (\d+)\s*$")


def parse_nvlink_status(text: str) -> list[NvLinkStatus]:
    """`nvidia-smi nvlink -s`: `\\t Link 0: 26.562 GB/s`, `<inactive>`, or all links inactive."""
    out: list[NvLinkStatus] = []
    cur: dict[str, Any] | None = None

    def flush() -> None:
        if cur is not None:
            out.append(NvLinkStatus(cur["index"], cur["name"], cur["links"], cur["all_inactive"]))

    for line in text.splitlines():
        m = _GPU_LINE.match(line.strip())
        if m:
            flush()
            cur = {"index": int(m.group(1)), "name": m.group(2), "links": {}, "all_inactive": False}
            continue
        if cur is None:
            continue
        if "all links are inactive" in line.lower():
            cur["all_inactive"] = True
            continue
        lm = _LINK_SPEED.match(line)
        if lm and ":" not in lm.group(2):
            value = lm.group(2).strip()
            speed = to_float(value) if "GB/s" in value else None
            cur["links"][int(lm.group(1))] = speed
    flush()
    return out


def parse_nvlink_errors(text: str) -> list[NvLinkErrors]:
    """`nvidia-smi nvlink -e`: `\\t Link 0: Replay Errors: 0` (any counter names)."""
    out: list[NvLinkErrors] = []
    index: int | None = None
    links: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        m = _GPU_LINE.match(line.strip())
        if m:
            if index is not None:
                out.append(NvLinkErrors(index, links))
            index, links = int(m.group(1)), {}
            continue
        cm = _LINK_COUNTER.match(line)
        if cm and index is not None:
            links.setdefault(int(cm.group(1)), {})[cm.group(2).strip()] = int(cm.group(3))
    if index is not None:
        out.append(NvLinkErrors(index, links))
    return out


def parse_csv(text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """Rows of `--format=csv,noheader,nounits` output keyed by the queried field names."""
    rows = []
    for record in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(record) != len(fields):
            continue
        row: dict[str, str | None] = {}
        for name, value in zip(fields, record, strict=True):
            value = value.strip()
            row[name] = None if value.lower() in _NA else value
        rows.append(row)
    return rows


GPU_FIELDS = ["index", "pci.bus_id", "uuid", "name"]
PCIE_FIELDS = [
    "index",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
]
THERMAL_FIELDS = [
    "index",
    "temperature.gpu",
    "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown",
]
APPS_FIELDS = ["pid", "gpu_bus_id", "used_memory"]


def gpus_from_csv(text: str) -> list[GpuInfo]:
    out = []
    for row in parse_csv(text, GPU_FIELDS):
        idx = to_int(row["index"])
        if idx is not None:
            out.append(GpuInfo(idx, row["pci.bus_id"] or "", row["uuid"] or "", row["name"] or ""))
    return out


def pcie_from_csv(text: str) -> list[PcieLink]:
    out = []
    for row in parse_csv(text, PCIE_FIELDS):
        idx = to_int(row["index"])
        if idx is not None:
            values = [to_int(row[f]) for f in PCIE_FIELDS[1:]]
            out.append(PcieLink(idx, *values))
    return out


def thermal_from_csv(text: str) -> list[ThermalState]:
    out = []
    for row in parse_csv(text, THERMAL_FIELDS):
        idx = to_int(row["index"])
        if idx is not None:
            out.append(
                ThermalState(
                    idx,
                    to_float(row["temperature.gpu"]),
                    *(to_bool(row[f]) for f in THERMAL_FIELDS[2:]),
                )
            )
    return out


def processes_from_csv(text: str) -> list[GpuProcess]:
    out = []
    for row in parse_csv(text, APPS_FIELDS):
        pid = to_int(row["pid"])
        if pid is not None:
            out.append(GpuProcess(pid, row["gpu_bus_id"] or "", to_int(row["used_memory"])))
    return out
