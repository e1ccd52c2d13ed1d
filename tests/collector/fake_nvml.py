"""A fake NVML module at our own boundary: the functions ``NvmlSource`` calls, in NVML's units.

It re-exports pynvml's constants and exception classes (importing pynvml needs no
driver), so the source under test sees the same error types as on a real GPU node.
A field is made unsupported by naming its NVML function in ``FakeGpu.unsupported``;
``FakeGpu.failing`` maps a function name to an NVML return code to raise instead.

For GPU resets, ``FakeGpu.processes`` lists the PIDs of its compute processes and
:meth:`FakeNvml.nvidia_smi` stands in for running ``nvidia-smi --gpu-reset -i N`` (NVML
itself has no reset): it refuses a GPU with processes, like the real tool, and counts
each reset in ``FakeNvml.resets``.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    """One GPU's raw NVML readings (bytes, mW, ns, counts), as NVML returns them."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:18:00.0"
    util_gpu: int = 97
    util_mem: int = 41
    mem_total: int = 81559 * 2**20
    mem_reserved: int = 479 * 2**20
    mem_used: int = 19818 * 2**20
    temp_gpu: int = 59
    temp_mem: int = 54
    power_mw: int = 631950
    power_limit_mw: int = 700000
    sm_clock: int = 1980
    mem_clock: int = 2619
    throttle: int = 0x4
    viol_thermal_ns: int = 12_000_000
    viol_power_ns: int = 3_500_000_000
    ecc: dict = field(default_factory=lambda: {(0, 0): 3, (1, 0): 0, (0, 1): 120, (1, 1): 1})
    retired_sbe: list = field(default_factory=lambda: [0x1000, 0x2000])
    retired_dbe: list = field(default_factory=lambda: [0x3000])
    retired_pending: int = 0
    remapped: tuple = (2, 1, 0, 0)
    pcie_replay: int = 7
    #: link → {DL counter id → value}
    nvlink: dict = field(default_factory=lambda: {l: {0: 1, 1: 0, 2: 2, 3: 3} for l in range(18)})
    unsupported: set = field(default_factory=set)
    failing: dict = field(default_factory=dict)
    #: PIDs of the compute processes running on the GPU
    processes: list = field(default_factory=list)
    #: columns whose batched field id this driver refuses (their own functions still work)
    refused_fields: set = field(default_factory=set)


class FakeNvml:
    """Stands in for the ``pynvml`` module; counts calls per function."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.shutdown_called = False
        #: GPU index -> how many times ``nvidia_smi`` reset it
        self.resets: Counter[int] = Counter()
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlMemory_v")) or name == "NVMLError":
                setattr(self, name, getattr(pynvml, name))

    # --- plumbing
    def _gpu(self, h: Any, fn: str) -> FakeGpu:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        g = self.gpus[h]
        if fn in g.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in g.failing:
            raise pynvml.NVMLError(g.failing[fn])
        return g

    # --- library
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    # --- identity
    def nvmlDeviceGetUUID(self, h):
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._gpu(h, "nvmlDeviceGetPciInfo").pci_bus_id)

    # --- gauges
    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        if version:  # v2: used excludes the reserve, as nvidia-smi shows it
            return SimpleNamespace(total=g.mem_total, reserved=g.mem_reserved, used=g.mem_used,
                                   free=g.mem_total - g.mem_reserved - g.mem_used)
        return SimpleNamespace(total=g.mem_total, used=g.mem_used + g.mem_reserved,
                               free=g.mem_total - g.mem_reserved - g.mem_used)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._gpu(h, "nvmlDeviceGetTemperature").temp_gpu

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        """Every field id ``NvmlSource`` batches, from the same readings as the per-function calls.

        A field is refused (NOT_SUPPORTED) when its per-function call is unsupported, or when its
        column is named in ``unsupported`` / ``refused_fields`` (the driver lacks only the field id).
        """
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        out = []
        for fid in field_ids:
            fn, col, value = _FIELD_SOURCES.get(fid, (None, None, None))
            ok = fn is not None and fn not in g.unsupported and col not in g.unsupported \
                and col not in g.refused_fields
            ret = pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED
            if ok and fn in g.failing:  # a lost GPU fails its field values the same way
                ret, ok = g.failing[fn], False
            v = value(g) if ok else 0
            kind = 1 if v < 2**32 else 3
            out.append(SimpleNamespace(fieldId=fid, valueType=kind, nvmlReturn=ret,
                                       value=SimpleNamespace(uiVal=v if kind == 1 else 0, ullVal=v)))
        return out

    def nvmlDeviceGetPowerUsage(self, h):
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self._gpu(h, "nvmlDeviceGetPowerManagementLimit").power_limit_mw

    def nvmlDeviceGetClockInfo(self, h, kind):
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock if kind == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").throttle

    def nvmlDeviceGetViolationStatus(self, h, policy):
        g = self._gpu(h, "nvmlDeviceGetViolationStatus")
        ns = g.viol_thermal_ns if policy == pynvml.NVML_PERF_POLICY_THERMAL else g.viol_power_ns
        return SimpleNamespace(referenceTime=0, violationTime=ns)

    # --- counters
    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        return self._gpu(h, "nvmlDeviceGetTotalEccErrors").ecc[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, h, cause):
        g = self._gpu(h, "nvmlDeviceGetRetiredPages")
        return list(g.retired_dbe if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                    else g.retired_sbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetRemappedRows(self, h):
        return self._gpu(h, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetNvLinkState(self, h, link):
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if link not in g.nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        g = self._gpu(h, "nvmlDeviceGetNvLinkErrorCounter")
        try:
            return g.nvlink[link][counter]
        except KeyError:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED) from None

    # --- processes and reset
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in g.processes]

    def nvidia_smi(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``nvidia-smi --gpu-reset -i N`` on this fake node."""
        self.calls["nvidia-smi"] = self.calls.get("nvidia-smi", 0) + 1
        if argv[1:3] != ["--gpu-reset", "-i"] or len(argv) != 4:
            return subprocess.CompletedProcess(argv, 2, "", f"unexpected arguments {argv[1:]}")
        i = int(argv[3])
        if not 0 <= i < len(self.gpus):
            return subprocess.CompletedProcess(argv, 6, "", f"No devices were found matching index {i}")
        if self.gpus[i].processes:
            return subprocess.CompletedProcess(
                argv, 255, "", f"GPU 00000000:{0x18 + i:02X}:00.0 is currently in use by another process.")
        self.resets[i] += 1
        return subprocess.CompletedProcess(argv, 0, f"GPU 00000000:{0x18 + i:02X}:00.0 was successfully reset.", "")


#: field id → (per-function NVML call it mirrors, column, reading) for ``nvmlDeviceGetFieldValues``
_FIELD_SOURCES = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: ("temp_mem", "temp_mem_c", lambda g: g.temp_mem),
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: ("nvmlDeviceGetPowerManagementLimit", "power_limit_w",
                                             lambda g: g.power_limit_mw),
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: ("nvmlDeviceGetViolationStatus", "thermal_violation_us",
                                             lambda g: g.viol_thermal_ns),
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: ("nvmlDeviceGetViolationStatus", "power_violation_us",
                                           lambda g: g.viol_power_ns),
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ("nvmlDeviceGetTotalEccErrors", "ecc_sbe_vol", lambda g: g.ecc[(0, 0)]),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("nvmlDeviceGetTotalEccErrors", "ecc_dbe_vol", lambda g: g.ecc[(1, 0)]),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: ("nvmlDeviceGetTotalEccErrors", "ecc_sbe_agg", lambda g: g.ecc[(0, 1)]),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ("nvmlDeviceGetTotalEccErrors", "ecc_dbe_agg", lambda g: g.ecc[(1, 1)]),
    pynvml.NVML_FI_DEV_RETIRED_SBE: ("nvmlDeviceGetRetiredPages", "retired_pages_sbe", lambda g: len(g.retired_sbe)),
    pynvml.NVML_FI_DEV_RETIRED_DBE: ("nvmlDeviceGetRetiredPages", "retired_pages_dbe", lambda g: len(g.retired_dbe)),
    pynvml.NVML_FI_DEV_RETIRED_PENDING: ("nvmlDeviceGetRetiredPagesPendingStatus", "retired_pages_pending",
                                         lambda g: g.retired_pending),
    pynvml.NVML_FI_DEV_REMAPPED_COR: ("nvmlDeviceGetRemappedRows", "remapped_rows_corr", lambda g: g.remapped[0]),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: ("nvmlDeviceGetRemappedRows", "remapped_rows_uncorr", lambda g: g.remapped[1]),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: ("nvmlDeviceGetRemappedRows", "row_remap_pending", lambda g: g.remapped[2]),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: ("nvmlDeviceGetRemappedRows", "row_remap_failure", lambda g: g.remapped[3]),
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: ("nvmlDeviceGetPcieReplayCounter", "pcie_replay", lambda g: g.pcie_replay),
}
