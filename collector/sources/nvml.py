"""NVML source: every GPU-sample column of spec §1 that NVML exposes, via ``pynvml``.

The NVML module is injected (``NvmlSource(node, nvml=fake)``); by default ``pynvml``
(nvidia-ml-py) is imported when the source is built, never at import time. Units are
converted to the contract's: bytes → MiB, mW → W, violation time ns → µs.

Counters and slow gauges come from **one** ``nvmlDeviceGetFieldValues`` call per GPU (the field
ids DCGM reads), not one call each. On a real H200 that took a sample from 2.0 to 1.2 ms of CPU;
the two violation-status calls alone had cost 2 ms (``bench/results/nvml-h200.md``). A column
whose field the driver refuses (older drivers lack some ids) falls back to its own function.

Per field, an NVML error never costs the rest of the sample: the field is ``None``.
"Not supported" is remembered per GPU and field, so a counter the GPU lacks (retired
pages on Hopper, NVLink on a PCIe card) costs one call at start, not one per tick.
Any other error (a timeout; a GPU lost between two reads) is counted in ``field_errors`` and
retried next tick. No driver / no library → :class:`NvmlUnavailableError` naming what is missing.

A GPU that NVML reports lost (``NVML_ERROR_GPU_IS_LOST`` on its first read of a sample, the
PCI info: the GPU fell off the bus) gets **no row** that tick, and none of its other reads
are made (on a lost GPU each can wait on the driver). Silence is what the pipeline and the
simulator treat as a GPU gone (a row of nulls would read as a GPU still reporting); the
kernel log's XID 79 says why. Logged when it goes and when it answers again; ``lost`` holds
the GPUs lost now.

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


# NVML return codes a field value carries when the driver does not know or serve that id:
# the column then uses its own NVML function instead.
_FIELD_REFUSED_NAMES = _UNSUPPORTED_NAMES + ("NVML_ERROR_INVALID_ARGUMENT",)

#: column → (NVML field id constant, divisor to the contract's unit), read in one batched call
FIELDS: tuple[tuple[str, str, float], ...] = (
    ("temp_mem_c", "NVML_FI_DEV_MEMORY_TEMP", 1.0),
    ("power_limit_w", "NVML_FI_DEV_POWER_CURRENT_LIMIT", 1000.0),  # mW
    ("thermal_violation_us", "NVML_FI_DEV_PERF_POLICY_THERMAL", 1000.0),  # ns
    ("power_violation_us", "NVML_FI_DEV_PERF_POLICY_POWER", 1000.0),  # ns
    ("ecc_sbe_vol", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0),
    ("ecc_dbe_vol", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
    ("ecc_sbe_agg", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0),
    ("ecc_dbe_agg", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0),
    ("retired_pages_sbe", "NVML_FI_DEV_RETIRED_SBE", 1.0),
    ("retired_pages_dbe", "NVML_FI_DEV_RETIRED_DBE", 1.0),
    ("retired_pages_pending", "NVML_FI_DEV_RETIRED_PENDING", 1.0),
    ("remapped_rows_corr", "NVML_FI_DEV_REMAPPED_COR", 1.0),
    ("remapped_rows_uncorr", "NVML_FI_DEV_REMAPPED_UNC", 1.0),
    ("row_remap_pending", "NVML_FI_DEV_REMAPPED_PENDING", 1.0),
    ("row_remap_failure", "NVML_FI_DEV_REMAPPED_FAILURE", 1.0),
    ("pcie_replay", "NVML_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
)


class _GpuLost(Exception):
    """NVML reports the GPU lost (``NVML_ERROR_GPU_IS_LOST``): its sample is skipped, not nulled."""


class NvmlSource:
    """Samples every NVIDIA GPU on the node through NVML (one row per GPU per tick)."""

    name = "nvml"
    #: the batched columns (a subclass with ``()`` reads every column through its own function)
    fields = FIELDS

    def __init__(self, node: str, nvml: Any = None) -> None:
        self.node = node
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._init()
        m = self._nvml
        self._unsupported_codes = {getattr(m, n) for n in _UNSUPPORTED_NAMES if hasattr(m, n)}
        self._refused_codes = {getattr(m, n) for n in _FIELD_REFUSED_NAMES if hasattr(m, n)}
        self._unsupported: set[tuple[int, str]] = set()
        #: Per-field count of NVML errors other than "not supported" (GPU lost, timeout…).
        self.field_errors: Counter[str] = Counter()
        #: GPUs whose last sample found them lost (NVML_ERROR_GPU_IS_LOST): they get no row.
        self.lost: set[int] = set()
        self._lost_code = getattr(m, "NVML_ERROR_GPU_IS_LOST", None)
        n = m.nvmlDeviceGetCount()
        self._handles = [m.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        self._uuids = [self._static(i, m.nvmlDeviceGetUUID) for i in range(n)]
        self._links = [self._nvlinks(h) for h in self._handles]
        self._mem_version = getattr(m, "nvmlMemory_v2", None)
        known = [(col, getattr(m, fid), k) for col, fid, k in self.fields if hasattr(m, fid)]
        #: per GPU, the columns still read as field values (a refused one leaves for good)
        self._batched: list[list[tuple[str, int, float]]] = [list(known) for _ in self._handles]
        #: per GPU, every batched column through its own function: the fallback, built once
        self._readers = [_legacy(m, h) for h in self._handles]

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
        """One row per GPU that is not lost; any field NVML cannot give is ``None``."""
        rows = [self._sample_gpu(i, h, now) for i, h in enumerate(self._handles)]
        return SourceBatch(gpu=[r for r in rows if r is not None])

    def _pci_info(self, h: Any) -> Any:
        """``nvmlDeviceGetPciInfo(h).busId``, raising :class:`_GpuLost` when NVML reports the GPU lost."""
        m = self._nvml
        try:
            return m.nvmlDeviceGetPciInfo(h).busId
        except m.NVMLError as e:
            if self._lost_code is not None and getattr(e, "value", None) == self._lost_code:
                raise _GpuLost from e
            raise

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

    def _sample_gpu(self, i: int, h: Any, now: float) -> dict[str, Any] | None:
        m = self._nvml
        r = self._read
        try:
            bus = r(i, "pci_bus_id", lambda: self._pci_info(h))
        except _GpuLost:
            if i not in self.lost:
                log.warning("nvml: GPU %d (%s) is lost (NVML_ERROR_GPU_IS_LOST): no row for it until NVML answers "
                            "for it again; the kernel log's XID 79 says why", i, self._uuids[i])
                self.lost.add(i)
            return None
        if i in self.lost:
            log.info("nvml: GPU %d (%s) answers again", i, self._uuids[i])
            self.lost.discard(i)
        row: dict[str, Any] = {"ts": now, "node": self.node, "gpu": i, "gpu_uuid": self._uuids[i]}
        row["pci_bus_id"] = bus.decode() if isinstance(bus, bytes) else bus if isinstance(bus, str) else None

        util = r(i, "util", lambda: m.nvmlDeviceGetUtilizationRates(h))
        row["util_gpu"] = _num(util and util.gpu)
        row["util_mem"] = _num(util and util.memory)
        mem = r(i, "memory", lambda: self._memory(h))
        row["fb_used_mib"] = None if mem is None else mem.used / MIB
        row["fb_free_mib"] = None if mem is None else mem.free / MIB
        row["temp_gpu_c"] = _num(r(i, "temp_gpu", lambda: m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU)))
        row["power_w"] = _milli(r(i, "power", lambda: m.nvmlDeviceGetPowerUsage(h)))
        row["sm_clock_mhz"] = _num(r(i, "sm_clock", lambda: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM)))
        row["mem_clock_mhz"] = _num(r(i, "mem_clock", lambda: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_MEM)))
        row["throttle_reasons"] = r(i, "throttle", lambda: self._throttle(h))
        row.update(self._field_values(i, h))
        for col, fn in self._readers[i].items():
            if col not in row:
                row[col] = r(i, col, fn)
        for col, counter in (("nvlink_crc_flit_err", m.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                             ("nvlink_crc_data_err", m.NVML_NVLINK_ERROR_DL_CRC_DATA),
                             ("nvlink_replay_err", m.NVML_NVLINK_ERROR_DL_REPLAY),
                             ("nvlink_recovery_err", m.NVML_NVLINK_ERROR_DL_RECOVERY)):
            row[col] = r(i, col, lambda counter=counter: self._nvlink_sum(h, self._links[i], counter))
        row["xid_last"] = None
        return row

    def _field_values(self, i: int, h: Any) -> dict[str, float | None]:
        """The batched columns of GPU ``i``; a column NVML refuses is left for its own function."""
        cols = self._batched[i]
        if not cols:
            return {}
        m = self._nvml
        try:
            values = m.nvmlDeviceGetFieldValues(h, [fid for _, fid, _ in cols])
        except m.NVMLError as e:
            if getattr(e, "value", None) in self._refused_codes:  # no batched reads on this driver
                self._batched[i] = []
                return {}
            if not self.field_errors["field_values"]:
                log.warning("nvml: GPU %d field values failed: %s", i, e)
            self.field_errors["field_values"] += 1
            return {col: None for col, _, _ in cols}
        out: dict[str, float | None] = {}
        refused = set()
        for (col, _, k), v in zip(cols, values):
            if v.nvmlReturn == m.NVML_SUCCESS:
                out[col] = float(_value_of(v)) / k
            elif v.nvmlReturn in self._refused_codes:
                refused.add(col)
            else:
                if not self.field_errors[col]:
                    log.warning("nvml: GPU %d field %s failed: NVML return %s", i, col, v.nvmlReturn)
                self.field_errors[col] += 1
                out[col] = None
        if refused:
            self._batched[i] = [c for c in cols if c[0] not in refused]
        return out

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


def _legacy(m: Any, h: Any) -> dict[str, Callable[[], float | None]]:
    """Each batched column through its own NVML function, in the contract's unit (the fallback)."""
    corr, unc = m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    vol, agg = m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC
    sbe = m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe = m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    ecc = m.nvmlDeviceGetTotalEccErrors
    remap = m.nvmlDeviceGetRemappedRows
    return {
        "temp_mem_c": lambda: _num(_field_value(m, h, m.NVML_FI_DEV_MEMORY_TEMP)),
        "power_limit_w": lambda: _milli(m.nvmlDeviceGetPowerManagementLimit(h)),
        "thermal_violation_us": lambda: _violation_us(m.nvmlDeviceGetViolationStatus(h, m.NVML_PERF_POLICY_THERMAL)),
        "power_violation_us": lambda: _violation_us(m.nvmlDeviceGetViolationStatus(h, m.NVML_PERF_POLICY_POWER)),
        "ecc_sbe_vol": lambda: _num(ecc(h, corr, vol)),
        "ecc_dbe_vol": lambda: _num(ecc(h, unc, vol)),
        "ecc_sbe_agg": lambda: _num(ecc(h, corr, agg)),
        "ecc_dbe_agg": lambda: _num(ecc(h, unc, agg)),
        "retired_pages_sbe": lambda: float(len(m.nvmlDeviceGetRetiredPages(h, sbe))),
        "retired_pages_dbe": lambda: float(len(m.nvmlDeviceGetRetiredPages(h, dbe))),
        "retired_pages_pending": lambda: _num(m.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "remapped_rows_corr": lambda: float(remap(h)[0]),
        "remapped_rows_uncorr": lambda: float(remap(h)[1]),
        "row_remap_pending": lambda: float(remap(h)[2]),
        "row_remap_failure": lambda: float(remap(h)[3]),
        "pcie_replay": lambda: _num(m.nvmlDeviceGetPcieReplayCounter(h)),
    }


def _field_value(m: Any, h: Any, field_id: int) -> Any:
    """One NVML field value (``nvmlDeviceGetFieldValues``), raising its own per-field error."""
    v = m.nvmlDeviceGetFieldValues(h, [field_id])[0]
    if v.nvmlReturn != m.NVML_SUCCESS:
        raise m.NVMLError(v.nvmlReturn)
    return _value_of(v)


def _value_of(v: Any) -> Any:
    """A field value's number, read from the union member its ``valueType`` names."""
    kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return getattr(v.value, kind.get(int(v.valueType), "ullVal"))


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _milli(v: Any) -> float | None:
    return None if v is None else v / 1000.0


def _violation_us(v: Any) -> float | None:
    return None if v is None else v.violationTime / 1000.0
