"""Where GPU facts come from: NVML (nvidia-ml-py) or `nvidia-smi` text, behind one interface.

NVML is the interface NVIDIA keeps stable and it is fast (no process per query), so `auto`
prefers it whenever `libnvidia-ml.so` loads. Nodes without the Python bindings, tests and the
simulated dev-cluster nodes use `nvidia-smi`, whose text the parsers in `smi_parsers` turn into
the same records. A source memoises each query for the life of one suite run, so the gpu-count
and xid checks share one GPU list, and every nvidia-smi call runs under the calling check's
deadline.

NVML calls cannot be interrupted; a hung NVML call is contained by the runner, which abandons
the check's thread at its timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from prolog_epilog import smi_parsers as smi
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
from prolog_epilog.tools import run_tool

T = TypeVar("T")
EccBundle = tuple[list[EccCounts], list[RemappedRows], list[RetiredPages]]


class GpuSource(Protocol):
    kind: str

    def gpus(self, timeout: float) -> list[GpuInfo]: ...
    def ecc(self, timeout: float) -> EccBundle: ...
    def nvlink_status(self, timeout: float) -> list[NvLinkStatus]: ...
    def nvlink_errors(self, timeout: float) -> list[NvLinkErrors]: ...
    def pcie(self, timeout: float) -> list[PcieLink]: ...
    def thermal(self, timeout: float) -> list[ThermalState]: ...
    def processes(self, timeout: float) -> list[GpuProcess]: ...


class _Memo:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._values: dict[str, Any] = {}

    def get(self, key: str, fn: Callable[[], T]) -> T:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = fn()
            value: T = self._values[key]
            return value


class SmiSource:
    """GPU facts from the `nvidia-smi` binary (path from config; may be a stand-in)."""

    kind = "nvidia-smi"

    def __init__(self, binary: str = "nvidia-smi") -> None:
        self.binary = binary
        self._memo = _Memo()

    def _run(self, args: list[str], timeout: float) -> str:
        return run_tool([self.binary, *args], timeout).stdout

    def _csv(self, fields: list[str], timeout: float, query: str = "--query-gpu") -> str:
        return self._run([f"{query}={','.join(fields)}", "--format=csv,noheader,nounits"], timeout)

    def gpus(self, timeout: float) -> list[GpuInfo]:
        return self._memo.get("gpus", lambda: smi.gpus_from_csv(self._csv(smi.GPU_FIELDS, timeout)))

    def ecc(self, timeout: float) -> EccBundle:
        def fetch() -> EccBundle:
            tree = smi.parse_query(
                self._run(["-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT"], timeout)
            )
            return (
                smi.ecc_from_query(tree),
                smi.remapped_rows_from_query(tree),
                smi.retired_pages_from_query(tree),
            )

        return self._memo.get("ecc", fetch)

    def nvlink_status(self, timeout: float) -> list[NvLinkStatus]:
        return self._memo.get(
            "nvs", lambda: smi.parse_nvlink_status(self._run(["nvlink", "-s"], timeout))
        )

    def nvlink_errors(self, timeout: float) -> list[NvLinkErrors]:
        return self._memo.get(
            "nve", lambda: smi.parse_nvlink_errors(self._run(["nvlink", "-e"], timeout))
        )

    def pcie(self, timeout: float) -> list[PcieLink]:
        return self._memo.get(
            "pcie", lambda: smi.pcie_from_csv(self._csv(smi.PCIE_FIELDS, timeout))
        )

    def thermal(self, timeout: float) -> list[ThermalState]:
        return self._memo.get(
            "thermal", lambda: smi.thermal_from_csv(self._csv(smi.THERMAL_FIELDS, timeout))
        )

    def processes(self, timeout: float) -> list[GpuProcess]:
        return self._memo.get(
            "procs",
            lambda: smi.processes_from_csv(
                self._csv(smi.APPS_FIELDS, timeout, "--query-compute-apps")
            ),
        )


_NVML_LOCK = threading.Lock()
_NVML_READY = False


def nvml_module() -> Any:
    """pynvml, initialised once per process; raises if the library or driver is missing."""
    global _NVML_READY
    import pynvml

    with _NVML_LOCK:
        if not _NVML_READY:
            pynvml.nvmlInit()
            _NVML_READY = True
    return pynvml


def nvml_available() -> bool:
    try:
        nvml_module()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
        return False
    return True


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """GPU facts from NVML through nvidia-ml-py (pynvml)."""

    kind = "nvml"

    def __init__(self) -> None:
        self._memo = _Memo()

    def _handles(self) -> list[tuple[int, Any]]:
        nv = nvml_module()
        return [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]

    @staticmethod
    def _try(fn: Callable[[], T]) -> T | None:
        import pynvml

        try:
            return fn()
        except pynvml.NVMLError:
            return None

    def gpus(self, timeout: float) -> list[GpuInfo]:
        def fetch() -> list[GpuInfo]:
            nv = nvml_module()
            out = []
            for i, h in self._handles():
                pci = nv.nvmlDeviceGetPciInfo(h)
                out.append(
                    GpuInfo(
                        i, _s(pci.busId), _s(nv.nvmlDeviceGetUUID(h)), _s(nv.nvmlDeviceGetName(h))
                    )
                )
            return out

        return self._memo.get("gpus", fetch)

    def ecc(self, timeout: float) -> EccBundle:
        def fetch() -> EccBundle:
            nv = nvml_module()
            eccs, rows, pages = [], [], []
            unc, cor = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
            vol, agg = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
            for i, h in self._handles():
                mode = self._try(lambda h=h: nv.nvmlDeviceGetEccMode(h))
                enabled = None if mode is None else bool(mode[0] == nv.NVML_FEATURE_ENABLED)

                def total(kind: int, counter: int, h: Any = h) -> int | None:
                    return self._try(lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, kind, counter)))

                def loc(location: int, h: Any = h) -> int | None:
                    return self._try(
                        lambda: int(nv.nvmlDeviceGetMemoryErrorCounter(h, unc, vol, location))
                    )

                eccs.append(
                    EccCounts(
                        index=i,
                        enabled=enabled,
                        volatile_uncorrectable=total(unc, vol) if enabled else None,
                        volatile_correctable=total(cor, vol) if enabled else None,
                        aggregate_uncorrectable=total(unc, agg) if enabled else None,
                        aggregate_correctable=total(cor, agg) if enabled else None,
                        volatile_sram_uncorrectable=loc(nv.NVML_MEMORY_LOCATION_SRAM)
                        if enabled
                        else None,
                        volatile_dram_uncorrectable=loc(nv.NVML_MEMORY_LOCATION_DRAM)
                        if enabled
                        else None,
                    )
                )
                rr = self._try(lambda h=h: nv.nvmlDeviceGetRemappedRows(h))
                if rr is not None:
                    rows.append(RemappedRows(i, int(rr[0]), int(rr[1]), bool(rr[2]), bool(rr[3])))
                sbe = self._try(
                    lambda h=h: len(
                        nv.nvmlDeviceGetRetiredPages(
                            h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
                        )
                    )
                )
                dbe = self._try(
                    lambda h=h: len(
                        nv.nvmlDeviceGetRetiredPages(
                            h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                        )
                    )
                )
                pend = self._try(lambda h=h: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
                if sbe is not None or dbe is not None:
                    pages.append(RetiredPages(i, sbe, dbe, None if pend is None else bool(pend)))
            return eccs, rows, pages

        return self._memo.get("ecc", fetch)

    def nvlink_status(self, timeout: float) -> list[NvLinkStatus]:
        def fetch() -> list[NvLinkStatus]:
            nv = nvml_module()
            out = []
            for i, h in self._handles():
                links: dict[int, float | None] = {}
                supported = 0
                for link in range(nv.NVML_NVLINK_MAX_LINKS):
                    state = self._try(lambda h=h, link=link: nv.nvmlDeviceGetNvLinkState(h, link))
                    if state is None:
                        continue  # link does not exist on this GPU
                    supported += 1
                    if state != nv.NVML_FEATURE_ENABLED:
                        links[link] = None
                        continue
                    speed = self._nvlink_speed(nv, h, link)
                    links[link] = speed
                all_inactive = supported > 0 and all(v is None for v in links.values())
                out.append(
                    NvLinkStatus(
                        i, _s(nv.nvmlDeviceGetName(h)), {} if all_inactive else links, all_inactive
                    )
                )
            return out

        return self._memo.get("nvs", fetch)

    def _nvlink_speed(self, nv: Any, h: Any, link: int) -> float | None:
        field = nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 + link if link < 6 else None
        field = field if field is not None else nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
        values = self._try(lambda: nv.nvmlDeviceGetFieldValues(h, [field]))
        if not values or values[0].nvmlReturn != 0:
            return -1.0  # active, speed unknown
        mbps = float(values[0].value.uiVal)
        return round(mbps / 1000.0, 3)

    def nvlink_errors(self, timeout: float) -> list[NvLinkErrors]:
        def fetch() -> list[NvLinkErrors]:
            nv = nvml_module()
            names = {
                "Replay Errors": nv.NVML_NVLINK_ERROR_DL_REPLAY,
                "Recovery Errors": nv.NVML_NVLINK_ERROR_DL_RECOVERY,
                "CRC Errors": nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            }
            out = []
            for i, h in self._handles():
                links: dict[int, dict[str, int]] = {}
                for link in range(nv.NVML_NVLINK_MAX_LINKS):
                    if (
                        self._try(lambda h=h, link=link: nv.nvmlDeviceGetNvLinkState(h, link))
                        is None
                    ):
                        continue
                    for name, counter in names.items():
                        v = self._try(
                            lambda h=h, link=link, counter=counter: (
                                nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
                            )
                        )
                        if v is not None:
                            links.setdefault(link, {})[name] = int(v)
                out.append(NvLinkErrors(i, links))
            return out

        return self._memo.get("nve", fetch)

    def pcie(self, timeout: float) -> list[PcieLink]:
        def fetch() -> list[PcieLink]:
            nv = nvml_module()
            return [
                PcieLink(
                    i,
                    self._try(lambda h=h: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h))),
                    self._try(lambda h=h: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h))),
                    self._try(lambda h=h: int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))),
                    self._try(lambda h=h: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h))),
                )
                for i, h in self._handles()
            ]

        return self._memo.get("pcie", fetch)

    def thermal(self, timeout: float) -> list[ThermalState]:
        def fetch() -> list[ThermalState]:
            nv = nvml_module()
            out = []
            for i, h in self._handles():
                temp = self._try(
                    lambda h=h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                )
                mask = self._try(lambda h=h: int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
                out.append(
                    ThermalState(
                        i,
                        temp,
                        None
                        if mask is None
                        else bool(mask & nv.nvmlClocksThrottleReasonHwSlowdown),
                        None
                        if mask is None
                        else bool(mask & nv.nvmlClocksThrottleReasonHwThermalSlowdown),
                        None
                        if mask is None
                        else bool(mask & nv.nvmlClocksThrottleReasonSwThermalSlowdown),
                    )
                )
            return out

        return self._memo.get("thermal", fetch)

    def processes(self, timeout: float) -> list[GpuProcess]:
        def fetch() -> list[GpuProcess]:
            nv = nvml_module()
            out = []
            for _, h in self._handles():
                bus = _s(nv.nvmlDeviceGetPciInfo(h).busId)
                for p in self._try(lambda h=h: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []:
                    mem = getattr(p, "usedGpuMemory", None)
                    out.append(
                        GpuProcess(int(p.pid), bus, None if mem is None else int(mem) // 2**20)
                    )
            return out

        return self._memo.get("procs", fetch)


class AutoSource:
    """Picks NVML or nvidia-smi on first use, inside the calling check's thread.

    `nvmlInit` can itself hang on a sick GPU, so the choice is made lazily where the runner's
    per-check timeout covers it, never while the suite is being set up.
    """

    kind = "auto"

    def __init__(self, nvidia_smi: str = "nvidia-smi") -> None:
        self.nvidia_smi = nvidia_smi
        self._memo = _Memo()

    def resolve(self) -> GpuSource:
        def pick() -> GpuSource:
            return NvmlSource() if nvml_available() else SmiSource(self.nvidia_smi)

        return self._memo.get("source", pick)

    def gpus(self, timeout: float) -> list[GpuInfo]:
        return self.resolve().gpus(timeout)

    def ecc(self, timeout: float) -> EccBundle:
        return self.resolve().ecc(timeout)

    def nvlink_status(self, timeout: float) -> list[NvLinkStatus]:
        return self.resolve().nvlink_status(timeout)

    def nvlink_errors(self, timeout: float) -> list[NvLinkErrors]:
        return self.resolve().nvlink_errors(timeout)

    def pcie(self, timeout: float) -> list[PcieLink]:
        return self.resolve().pcie(timeout)

    def thermal(self, timeout: float) -> list[ThermalState]:
        return self.resolve().thermal(timeout)

    def processes(self, timeout: float) -> list[GpuProcess]:
        return self.resolve().processes(timeout)


def make_source(kind: str, nvidia_smi: str = "nvidia-smi") -> GpuSource:
    """`auto` -> NVML if it loads here (decided on first use), else nvidia-smi."""
    if kind == "nvml":
        return NvmlSource()
    if kind == "nvidia-smi":
        return SmiSource(nvidia_smi)
    return AutoSource(nvidia_smi)
