"""The precursor signals a node does not send: where gpuops is blind, and what to enable.

A fleet whose exporter leaves a counter out gives gpuops nothing to predict that class from:
dcgm-exporter's default counter set (``../shared/fixtures/dcgm_exporter/counters/default-counters.csv``)
has the ECC, NVLink-error and violation fields commented out and no clock-event (throttle) field at
all, so on such a node an HBM or NVLink fault is caught only when its XID arrives. On the tuning ground every NVLink
fault caught only at its XID was on such a node (bench/results/robustness.md, twenty-ninth session).
The operator can fix that in the exporter's counters file; this module tells them where.

Read from the features of one tick, no state: a GPU that is being read (two or more samples of a
gauge in the long window, so that a counter it sends has a delta there) and whose long-window
feature of a signal is NaN does not send that signal. ``ib_ports`` and ``bmc`` are the node's: no port of
it reported in the long window, no event of its BMC arrived in it. A node whose GPUs are all silent or lost
is not blind, just dark (``NodeScores.gpus_lost``, the stale-telemetry job). Nothing in the policy reads it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from collector.schema import FaultClass
from collector.sources.dcgm import PRECURSOR_FIELDS as _DCGM
from pipeline.batch import FeatureBatch


@dataclass(frozen=True)
class Signal:
    """One precursor signal: the long-window feature that is NaN when a GPU never sends it, the fault
    classes it warns of, and what to turn on (dcgm-exporter fields; the NVML agent reads them all)."""

    name: str
    feature: str
    faults: tuple[FaultClass, ...]
    enable: str


_F = FaultClass
#: the signals, in bit order (``NodeScores.blind`` bit *k* is ``SIGNALS[k]``); new ones go at the end
SIGNALS: tuple[Signal, ...] = (
    Signal("ecc", "ecc_sbe_per_h_long", (_F.HBM_ECC,), ", ".join(_DCGM["ecc"])),
    Signal("nvlink", "nvlink_crc_per_min_long", (_F.NVLINK,), ", ".join(_DCGM["nvlink"])),
    Signal("pcie", "pcie_replay_per_min_long", (_F.PCIE, _F.GPU_OFF_BUS), ", ".join(_DCGM["pcie"])),
    # a straggler and a thermal fault are read without it, by the GPU's temperature (ST, TT): a power brake is not
    Signal("throttle", "throttle_hw_thermal_frac_long", (_F.POWER,),
           "DCGM_FI_DEV_CLOCKS_EVENT_REASONS (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS before DCGM 3.3)"),
    Signal("temperature", "temp_gpu_c_mean_long", (_F.THERMAL,), ", ".join(_DCGM["temperature"])),
    Signal("power", "power_w_mean_long", (_F.POWER,), ", ".join(_DCGM["power"])),
    Signal("clocks", "sm_clock_mhz_mean_long", (_F.FAIL_SLOW,), ", ".join(_DCGM["clocks"])),
    Signal("ib_ports", "net_ports", (_F.IB_LINK,),
           "the agent's infiniband source (port counters under /sys/class/infiniband/*/ports/*/counters)"),
    # the node's BMC names a power or cooling fault's cause, and is the only witness of a supply failure that
    # takes the node dark at once (bench/results/robustness.md, thirtieth session: every such loss left uncaught
    # was on a node without one); its features are NaN for a node with no BMC event in the long window
    Signal("bmc", "node_bmc_psu_fail_count_long", (_F.POWER, _F.THERMAL),
           "the agent's ipmi or redfish source for this node's BMC (docs/collector.md): its sensor readings each "
           "minute say the BMC is read; SEL lines forwarded alone arrive only when something fails"),
)
_BY_NAME = {s.name: k for k, s in enumerate(SIGNALS)}
#: a GPU counts as being read when one of these gauges has two or more samples in the long window
_READ = tuple(f"{g}_slope_long" for g in ("util_gpu", "temp_gpu_c", "power_w", "sm_clock_mhz"))
#: signals read from a count of what reports, where 0 is as blind as NaN (a node with no port reporting)
_COUNTED = frozenset({"ib_ports"})
_SHIFTS = np.arange(len(SIGNALS), dtype=np.int64)


def blind_bits(batch: FeatureBatch, starts: np.ndarray) -> np.ndarray | None:
    """Per node (rows grouped by node, each group starting at *starts*): a bit per signal of :data:`SIGNALS`
    that a GPU of it being read does not send (0: it sends them all). None when the batch has none of the
    features (a feature set from before this module)."""
    names = batch.names
    if not all(f in names for f in _READ) or not len(batch):
        return None
    read = np.zeros(len(batch), bool)
    for f in _READ:
        read |= np.isfinite(batch.column(f))
    bits = np.zeros(len(batch), np.int64)
    for k, s in enumerate(SIGNALS):
        if s.feature not in names:
            continue
        col = batch.column(s.feature)
        missing = ~np.isfinite(col) | (col <= 0) if s.name in _COUNTED else ~np.isfinite(col)
        bits |= np.where(read & missing, 1 << k, 0)
    return np.bitwise_or.reduceat(bits, starts)


def names_of(bits: int) -> list[str]:
    """The signal names of a bit mask (``NodeScores.blind``), in :data:`SIGNALS` order. Every tick asks this of every
    node (the scores' wire, the fleet view), and a fleet shows a handful of distinct masks: each is spelt once."""
    names = _NAMES.get(bits)
    if names is None:
        names = _NAMES[bits] = tuple(s.name for k, s in enumerate(SIGNALS) if bits >> k & 1)
    return list(names)


_NAMES: dict[int, tuple[str, ...]] = {}


def bits_of(names: list[str] | tuple[str, ...]) -> int:
    """The bit mask of signal *names*; a name this version does not know is left out (a newer scorer's)."""
    out = 0
    for n in names:
        k = _BY_NAME.get(n)
        if k is not None:
            out |= 1 << k
    return out


def blind_to(bits: int, fault: FaultClass | str | None) -> list[str]:
    """The signals in *bits* that warn of *fault* (empty: gpuops sees that class's precursor here)."""
    if fault is None or str(getattr(fault, "value", fault)) not in FaultClass._value2member_map_:
        return []
    f = FaultClass(getattr(fault, "value", fault))
    return [s.name for k, s in enumerate(SIGNALS) if bits >> k & 1 and f in s.faults]


class CoverageTally:
    """What a replay saw of each node's signals: ticks scored, and ticks on which each signal was not sent. A node
    counts as not sending a signal when it did not on at least half of its scored ticks (a GPU's first tick, or a
    port read slower than its GPUs, leaves a tick or two without a delta)."""

    def __init__(self) -> None:
        self.ticks: Counter[str] = Counter()
        self.blind: dict[str, np.ndarray] = {}

    def add(self, nodes: np.ndarray, bits: np.ndarray | None) -> None:
        """One tick: the scored *nodes* and their ``NodeScores.blind`` (None: not known, nothing counted)."""
        if bits is None:
            return
        self.ticks.update(nodes.tolist())
        some = np.flatnonzero(bits)
        if not some.size:
            return
        for n, row in zip(nodes[some].tolist(), (bits[some, None] >> _SHIFTS) & 1):   # a 0/1 column per signal
            acc = self.blind.get(n)
            if acc is None:
                self.blind[n] = row.copy()
            else:
                acc += row

    def node_bits(self) -> dict[str, int]:
        """node -> the signals it did not send on at least half of its scored ticks (nodes with none left out)."""
        out = {}
        for n, row in self.blind.items():
            bits = sum(1 << k for k, c in enumerate(row) if 2 * c >= self.ticks[n])
            if bits:
                out[str(n)] = bits
        return out

    def report(self, incidents: list[dict] | None) -> dict:
        """The replay report's ``coverage``: per signal the nodes that did not send it, and the incidents on a node
        that did not send its class's precursor signal (with which)."""
        bits = self.node_bits()
        signals = {s.name: {"faults": [f.value for f in s.faults], "enable": s.enable,
                            "nodes": sorted(n for n, b in bits.items() if b >> k & 1)} for k, s in enumerate(SIGNALS)}
        blind_incidents = []
        for inc in incidents or ():
            names = blind_to(bits.get(str(inc.get("node")), 0), inc.get("fault"))
            if names:
                blind_incidents.append({"id": inc.get("id"), "node": inc.get("node"), "fault": inc.get("fault"),
                                        "predictable": inc.get("predictable"), "signals": names})
        return {"nodes_scored": len(self.ticks), "signals": signals, "incidents_on_blind_nodes": blind_incidents}
