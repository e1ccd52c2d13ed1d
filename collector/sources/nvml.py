"""NVML source: every GPU-sample column of spec §1 that NVML exposes, via ``pynvml``.

The NVML module is injected (``NvmlSource(node, nvml=fake)``); by default ``pynvml``
(nvidia-ml-py) is imported when the source is built, never at import time. Units are
converted to the contract's: bytes → MiB, mW → W, violation time ns → µs.

Per field, an NVML error never costs the rest of the sample: the field is ``None``.
"Not supported" is remembered per GPU and field, so a counter the GPU lacks (retired
pages on Hopper, NVLink on a PCIe card) costs one call at start, not one per tick.
Any other error (GPU lost, timeout) is counted in ``field_errors`` and retried next
tick. No driver / no library → :class:`NvmlUnavailableError` naming what is missing.

``xid_last`` is left ``None``: NVML only exposes XIDs through an event set, and the
kernel-log source (``kmsg``) already turns every XID into an event.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

from collector.sources.base import (PermanentSourceError, SourceBatch, SourceOptions,
                                    normalize_pci_bus_id)

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class NvmlUnavailableError(PermanentSourceError):
    """NVML cannot start on this host (no library, no driver, no permission)."""


# NVML return codes that mean "this GPU does not have that field": null, never retried.
_UNSUPPORTED_NAMES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND",
                      "NVML_ERROR_NOT_FOUND", "NVML_ERROR_NO_PERMISSION")


class NvmlSource:
    """Samples every NVIDIA GPU on the node through NVML (one row per GPU per tick)."""

    name = "nvml"

    def __init__(self, node: str, nvml: Any = None) -> None:
        self.node = node
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._init()
        m = self._nvml
        self._unsupported_codes = {getattr(m, n) for n in _UNSUPPORTED_NAMES if hasattr(m, n)}
        self._unsupported: set[tuple[int, str]] = set()
        #: Per-field count of NVML errors other than "not supported" (GPU lost, timeout…).
        self.field_errors: Counter[str] = Counter()
        n = m.nvmlDeviceGetCount()
        self._handles = [m.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        self._uuids = [self._static(i, m.nvmlDeviceGetUUID) for i in range(n)]
        self._links = [self._nvlinks(h) for h in self._handles]
        self._mem_version = getattr(m, "nvmlMemory_v2", None)

    @classmethod
    def from_options(cls, options: SourceOptions) -> "NvmlSource":
        """Build from agent options (the real pynvml)."""
        return cls(node=options.node)

    # ------------------------------------------------------------------ start-up

    def _init(self) -> None:
        m = self._nvml
        try:
            m.nvmlInit()
        except m.NVMLError as e:
            raise NvmlUnavailableError(_why_no_nvml(m, e)) from e

    def _static(self, i: int, fn: Callable[[Any], Any]) -> Any:
        try:
            v = fn(self._handles[i])
        except self._nvml.NVMLError:
            return None
        return v.decode() if isinstance(v, bytes) else v

    def _nvlinks(self, handle: Any) -> list[int]:
        """Links that exist on this GPU (state readable), found once at start-up."""
        m = self._nvml
        links = []
        for link in range(getattr(m, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                m.nvmlDeviceGetNvLinkState(handle, link)
            except m.NVMLError:
                continue
            links.append(link)
        return links

    def gpu_index_by_pci(self) -> dict[str, int]:
        """Normalised PCI bus id (``0000:3b:00``) → GPU index, for resolving XID lines."""
        out = {}
        for i, h in enumerate(self._handles):
            try:
                bus = self._nvml.nvmlDeviceGetPciInfo(h).busId
            except self._nvml.NVMLError:
                continue
            out[normalize_pci_bus_id(bus.decode() if isinstance(bus, bytes) else bus)] = i
        return out

    # ------------------------------------------------------------------ sampling

    def sample(self, now: float) -> SourceBatch:
        """One row per GPU; any field NVML cannot give is ``None``."""
        return SourceBatch(gpu=[self._sample_gpu(i, h, now) for i, h in enumerate(self._handles)])

    def _read(self, i: int, name: str, fn: Callable[[], Any]) -> Any:
        if (i, name) in self._unsupported:
            return None
        try:
            return fn()
        except self._nvml.NVMLError as e:
            if getattr(e, "value", None) in self._unsupported_codes:
                self._unsupported.add((i, name))
            else:
                if not self.field_errors[name]:
                    log.warning("nvml: GPU %d field %s failed: %s", i, name, e)
                self.field_errors[name] += 1
            return None

    def _sample_gpu(self, i: int, h: Any, now: float) -> dict[str, Any]:
        m = self._nvml
        r = self._read
        row: dict[str, Any] = {"ts": now, "node": self.node, "gpu": i, "gpu_uuid": self._uuids[i]}
        bus = r(i, "pci_bus_id", lambda: m.nvmlDeviceGetPciInfo(h).busId)
        row["pci_bus_id"] = bus.decode() if isinstance(bus, bytes) else bus if isinstance(bus, str) else None

        util = r(i, "util", lambda: m.nvmlDeviceGetUtilizationRates(h))
        row["util_gpu"] = _num(util and util.gpu)
        row["util_mem"] = _num(util and util.memory)
        mem = r(i, "memory", lambda: self._memory(h))
        row["fb_used_mib"] = None if mem is None else mem.used / MIB
        row["fb_free_mib"] = None if mem is None else mem.free / MIB
        row["temp_gpu_c"] = _num(r(i, "temp_gpu", lambda: m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU)))
        row["temp_mem_c"] = _num(r(i, "temp_mem", lambda: _field_value(m, h, m.NVML_FI_DEV_MEMORY_TEMP)))
        row["power_w"] = _milli(r(i, "power", lambda: m.nvmlDeviceGetPowerUsage(h)))
        row["power_limit_w"] = _milli(r(i, "power_limit", lambda: m.nvmlDeviceGetPowerManagementLimit(h)))
        row["sm_clock_mhz"] = _num(r(i, "sm_clock", lambda: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM)))
        row["mem_clock_mhz"] = _num(r(i, "mem_clock", lambda: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_MEM)))
        row["throttle_reasons"] = r(i, "throttle", lambda: self._throttle(h))
        row["thermal_violation_us"] = _violation_us(
            r(i, "viol_thermal", lambda: m.nvmlDeviceGetViolationStatus(h, m.NVML_PERF_POLICY_THERMAL)))
        row["power_violation_us"] = _violation_us(
            r(i, "viol_power", lambda: m.nvmlDeviceGetViolationStatus(h, m.NVML_PERF_POLICY_POWER)))

        corr, unc = m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        vol, agg = m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC
        for col, et, ct in (("ecc_sbe_vol", corr, vol), ("ecc_dbe_vol", unc, vol),
                            ("ecc_sbe_agg", corr, agg), ("ecc_dbe_agg", unc, agg)):
            row[col] = _num(r(i, col, lambda et=et, ct=ct: m.nvmlDeviceGetTotalEccErrors(h, et, ct)))

        for col, cause in (("retired_pages_sbe", m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                           ("retired_pages_dbe", m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)):
            pages = r(i, col, lambda cause=cause: m.nvmlDeviceGetRetiredPages(h, cause))
            row[col] = None if pages is None else float(len(pages))
        row["retired_pages_pending"] = _num(r(i, "retired_pending", lambda: m.nvmlDeviceGetRetiredPagesPendingStatus(h)))

        remap = r(i, "remapped_rows", lambda: m.nvmlDeviceGetRemappedRows(h))
        (row["remapped_rows_corr"], row["remapped_rows_uncorr"],
         row["row_remap_pending"], row["row_remap_failure"]) = (
            (None,) * 4 if remap is None else tuple(float(x) for x in remap[:4]))
        row["pcie_replay"] = _num(r(i, "pcie_replay", lambda: m.nvmlDeviceGetPcieReplayCounter(h)))

        for col, counter in (("nvlink_crc_flit_err", m.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                             ("nvlink_crc_data_err", m.NVML_NVLINK_ERROR_DL_CRC_DATA),
                             ("nvlink_replay_err", m.NVML_NVLINK_ERROR_DL_REPLAY),
                             ("nvlink_recovery_err", m.NVML_NVLINK_ERROR_DL_RECOVERY)):
            row[col] = r(i, col, lambda counter=counter: self._nvlink_sum(h, self._links[i], counter))
        row["xid_last"] = None
        return row

    def _memory(self, h: Any) -> Any:
        """Memory info v2 (what nvidia-smi shows: used excludes the driver's reserve), else v1."""
        m = self._nvml
        if self._mem_version is not None:
            try:
                return m.nvmlDeviceGetMemoryInfo(h, version=self._mem_version)
            except m.NVMLError as e:
                if getattr(e, "value", None) not in self._unsupported_codes:
                    raise
                self._mem_version = None
        return m.nvmlDeviceGetMemoryInfo(h)

    def _throttle(self, h: Any) -> int:
        m = self._nvml
        fn = getattr(m, "nvmlDeviceGetCurrentClocksEventReasons", None) or m.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(h))

    def _nvlink_sum(self, h: Any, links: list[int], counter: int) -> float | None:
        """Sum of one DL error counter over the GPU's links; ``None`` when no link reports it."""
        m = self._nvml
        total, seen = 0, False
        for link in links:
            try:
                total += m.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
            except m.NVMLError:
                continue
            seen = True
        if not seen:
            raise m.NVMLError(m.NVML_ERROR_NOT_SUPPORTED)
        return float(total)

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down; nothing left to save
                log.debug("nvml: shutdown failed", exc_info=True)
            self._nvml = None


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailableError(
            "the nvml source needs the Python package nvidia-ml-py (import pynvml); "
            "install it, or run without nvml (--sources infiniband,kmsg,dcgm)") from e
    return pynvml


def _why_no_nvml(m: Any, e: Exception) -> str:
    code = getattr(e, "value", None)
    if code == getattr(m, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        what = ("the NVML library libnvidia-ml.so.1 was not found: install the NVIDIA driver, or in a "
                "container run with the NVIDIA container toolkit (--gpus / runtimeClassName: nvidia)")
    elif code == getattr(m, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        what = "the NVIDIA kernel driver is not loaded (lsmod | grep nvidia; dmesg for why)"
    elif code == getattr(m, "NVML_ERROR_NO_PERMISSION", object()):
        what = "no permission to open /dev/nvidia* (run as root or in the video group)"
    else:
        what = f"NVML failed to initialise: {e}"
    return f"nvml source cannot start: {what}. To run without GPUs, leave nvml out of --sources."


def _field_value(m: Any, h: Any, field_id: int) -> Any:
    """One NVML field value (``nvmlDeviceGetFieldValues``), raising its own per-field error."""
    v = m.nvmlDeviceGetFieldValues(h, [field_id])[0]
    if v.nvmlReturn != m.NVML_SUCCESS:
        raise m.NVMLError(v.nvmlReturn)
    kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return getattr(v.value, kind.get(int(v.valueType), "ullVal"))


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _milli(v: Any) -> float | None:
    return None if v is None else v / 1000.0


def _violation_us(v: Any) -> float | None:
    return None if v is None else v.violationTime / 1000.0
