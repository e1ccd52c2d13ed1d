"""Features per GPU per tick, vectorised over every GPU scored in the tick.

:data:`FEATURES` lists every column of the feature matrix as (name, unit, meaning);
:data:`FEATURE_NAMES` is its name column. Both are a contract with ``models/``: add
columns at the end, never rename or reorder (docs/pipeline.md lists them).

Windows: ``short`` is the last ``short_window_s`` before the tick end, ``long`` the last
``long_window_s``. Rates use the real time between samples, so irregular sampling is
exact; a counter reset counts from zero; NaN means unknown (unsupported field, no
samples in the window), never zero.

Features appended in the second set (see docs/pipeline.md) mean the same on any fleet:
each error counter against the part's own online baseline (:mod:`pipeline.baselines`),
and port rates as the worst single port rather than a sum that grows with the number of
HCAs a node has. Which features the learned models may read is the models' choice
(``models/inputs.py``); the rules may read any.
"""

from __future__ import annotations

import numpy as np

from collector.schema import GPU_COUNTERS
from collector.bmc_events import SEL_CLASSES
from pipeline.baselines import RHO, TREND_TAU_S, DeficitTrend, RateBaselines
from pipeline.bmc import MARGINS as BMC_MARGINS
from pipeline.bmc import NodeBmcState
from pipeline.samples import GPU_COL, NET_STATE_COUNTERS
from pipeline.peers import group_medians, robust_z_rows
from pipeline.ports import PORT_STATS, NodeXidState, PortWindowState
from pipeline.registry import GpuRegistry, PortRegistry
from pipeline.state import STATS, THROTTLE_BITS, WINDOW_GAUGES, XID_CLASSES, GpuWindowState
from pipeline.storms import SbeStorm

_W = ("short", "long")
_GAUGE_UNITS = {"temp_gpu_c": "degC", "temp_mem_c": "degC", "power_w": "W", "sm_clock_mhz": "MHz", "util_gpu": "%"}
#: (feature stem, counters summed, unit, per seconds, meaning, windows)
_RATES = (
    ("ecc_sbe_per_h", ("ecc_sbe_vol", "ecc_sbe_agg"), "1/h", 3600, "single-bit ECC errors per hour (volatile, else aggregate counter)", _W),
    ("ecc_dbe_per_h", ("ecc_dbe_vol", "ecc_dbe_agg"), "1/h", 3600, "double-bit ECC errors per hour (volatile, else aggregate counter)", _W),
    ("retired_pages_per_h", ("retired_pages_sbe", "retired_pages_dbe"), "1/h", 3600, "pages retired per hour (SBE + DBE)", ("long",)),
    ("remapped_rows_corr_per_h", ("remapped_rows_corr",), "1/h", 3600, "HBM rows remapped for correctable errors per hour", ("long",)),
    ("remapped_rows_uncorr_per_h", ("remapped_rows_uncorr",), "1/h", 3600, "HBM rows remapped for uncorrectable errors per hour", ("long",)),
    ("pcie_replay_per_min", ("pcie_replay",), "1/min", 60, "PCIe replays per minute", _W),
    ("nvlink_crc_per_min", ("nvlink_crc_flit_err", "nvlink_crc_data_err"), "1/min", 60, "NVLink CRC (flit + data) errors per minute", _W),
    ("nvlink_replay_per_min", ("nvlink_replay_err",), "1/min", 60, "NVLink replays per minute", _W),
    ("nvlink_recovery_per_min", ("nvlink_recovery_err",), "1/min", 60, "NVLink recoveries per minute", _W),
    ("thermal_violation_frac", ("thermal_violation_us",), "0-1", 1e-6, "fraction of time clocks were held by thermal violation", _W),
    ("power_violation_frac", ("power_violation_us",), "0-1", 1e-6, "fraction of time clocks were held by power violation", _W),
)
#: "either" counters use the second only where the first is unsupported; others add up.
_EITHER = {"ecc_sbe_per_h", "ecc_dbe_per_h"}
_LAST = (
    ("ecc_dbe_total", ("ecc_dbe_agg", "ecc_dbe_vol"), "count", "double-bit ECC errors since ever (aggregate, else volatile)"),
    ("remapped_rows_corr_total", ("remapped_rows_corr",), "count", "rows remapped for correctable errors, cumulative"),
    ("remapped_rows_uncorr_total", ("remapped_rows_uncorr",), "count", "rows remapped for uncorrectable errors, cumulative"),
    ("row_remap_pending", ("row_remap_pending",), "0/1", "a row remap waits for a GPU reset (last sample)"),
    ("row_remap_failure", ("row_remap_failure",), "0/1", "a row remap failed: no spare rows left (last sample)"),
    ("retired_pages_total", ("retired_pages_sbe", "retired_pages_dbe"), "count", "pages retired, cumulative (SBE + DBE)"),
    ("retired_pages_pending", ("retired_pages_pending",), "0/1", "a page retirement waits for a reboot (last sample)"),
)
_PEERS = (
    ("sm_clock_deficit_vs_peers", "sm_clock_mhz", "ratio", "(node median - own) / node median of short-window SM clock; > 0 slower"),
    ("util_deficit_vs_peers", "util_gpu", "%", "node median - own short-window utilisation; > 0 less busy"),
    ("temp_gpu_excess_vs_peers", "temp_gpu_c", "degC", "own - node median short-window GPU temperature; > 0 hotter"),
    ("power_abs_dev_vs_peers", "power_w", "ratio", "|own - node median| / node median short-window power"),
)
#: A GPU at or above this short-window utilisation is busy, and only busy GPUs are one another's
#: peers for clocks (research/robust-detection.md §1: peers share the workload). Idle GPUs sit at
#: 0 %; a busy one in a checkpoint dip stays well above 10 %.
BUSY_UTIL_PCT = 10.0
#: a GPU's clock deficit feeds its trend (straggler) only in a minute of steady work (not a job's start,
#: end or checkpoint dip, whose minute mixes in idle clocks) without thermal slowdown (a hot GPU slows
#: itself and says so: the thermal class's matter). A GPU that does not say (no throttle reasons sent,
#: as on dcgm-exporter's default counters) says it by its temperature: under STEADY_COOL_C it is not
#: slowing itself for heat; at or over it, or with no temperature, it has no steady minute, since its hot
#: slowdown would read as a straggler (candidates SU and ST, bench/results/robustness.md, 29th-30th sessions)
STEADY_UTIL_PCT = 50.0
#: a GPU this cool is not in thermal slowdown: NVIDIA's SW thermal slowdown starts at the max operating
#: temperature, 85 degC on A100 and 87 degC on H100/H200, HW slowdown at 89 degC (research/field-rates.md
#: §2, from nvidia-smi -q dumps); 5 degC under the lowest of them
STEADY_COOL_C = 80.0
#: a busy GPU this far under its busy peers' clock is slow in that minute (sm_clock_slow_share): the straggler
#: rule's own line for "still slow now" (models.rules.STRAGGLER_NOW)
SLOW_DEFICIT = 0.10
#: NVIDIA's HW thermal slowdown starts here on A100 and H100 (research/field-rates.md §2): a GPU this hot is in
#: it, whether or not its exporter sends the flag (candidate TT, bench/results/robustness.md, 30th session)
HW_SLOWDOWN_C = 89.0
#: a node whose GPU was held by HW power brake this share of the long window (90 s of 30 min) has braked:
#: what rule hw_power_brake asks of a node's own brake, and what other_nodes_power_brake_long counts
BRAKE_LONG_FRAC = 0.05
#: (feature, gauge, floor of the robust scale in the gauge's unit)
_FLEET = (("node_sm_clock_fleet_z", "sm_clock_mhz", 5.0), ("node_temp_gpu_fleet_z", "temp_gpu_c", 1.0),
          ("node_power_fleet_z", "power_w", 5.0), ("node_util_fleet_z", "util_gpu", 2.0))


#: GPU counter rates with a per-GPU baseline: (stem, counters, meaning); two counters are
#: "either" (ECC: volatile, else aggregate) or summed (NVLink CRC: flit + data) as in _RATES.
_BASELINE_STEMS = (
    ("ecc_sbe", ("ecc_sbe_vol", "ecc_sbe_agg"), "single-bit ECC errors against this GPU's own rate"),
    ("pcie_replay", ("pcie_replay",), "PCIe replays against this GPU's own rate"),
    ("nvlink_crc", ("nvlink_crc_flit_err", "nvlink_crc_data_err"), "NVLink CRC errors against this GPU's own rate"),
    ("nvlink_replay", ("nvlink_replay_err",), "NVLink replays against this GPU's own rate"),
    ("nvlink_recovery", ("nvlink_recovery_err",), "NVLink recoveries against this GPU's own rate"),
    ("remapped_rows_corr", ("remapped_rows_corr",), "rows remapped for correctable errors against this GPU's own rate"),
)
#: Port error counters (congestion, port_xmit_wait, is traffic, not an error).
NET_ERROR_COUNTERS: tuple[str, ...] = tuple(c for c in NET_STATE_COUNTERS if c != "port_xmit_wait")


def _build() -> tuple[tuple[str, str, str], ...]:
    f: list[tuple[str, str, str]] = []
    for g in WINDOW_GAUGES:
        u = _GAUGE_UNITS[g]
        for w in _W:
            f += [(f"{g}_mean_{w}", u, f"mean of {g} over the {w} window"),
                  (f"{g}_std_{w}", u, f"standard deviation of {g} over the {w} window"),
                  (f"{g}_slope_{w}", f"{u}/min", f"least-squares slope of {g} over the {w} window")]
    for stem, _, unit, _, meaning, wins in _RATES:
        f += [(f"{stem}_{w}", unit, f"{meaning}, {w} window") for w in wins]
    f += [(name, unit, meaning) for name, _, unit, meaning in _LAST]
    for bit, mask in THROTTLE_BITS:
        f += [(f"throttle_{bit}_frac_{w}", "0-1", f"fraction of samples with throttle bit {mask:#x} ({bit}), {w} window") for w in _W]
    for cls, _ in XID_CLASSES:
        f += [(f"xid_{cls}_count_{w}", "count", f"XID events of class {cls} (collector.xid) on this GPU, {w} window") for w in _W]
    f += [(f"node_xid_{cls}_count_short", "count", f"XID events of class {cls} on this GPU's node that name no GPU "
           "(PCI bus id not resolved), short window") for cls, _ in XID_CLASSES]
    f += [("sample_age_s", "s", "tick end - time of the GPU's last sample (grows when a GPU goes silent)"),
          ("samples_short", "count", "samples received in the short window"),
          ("node_gpus_scored", "count", "GPUs of this node scored in this tick")]
    f += [(name, unit, meaning) for name, _, unit, meaning in _PEERS]
    f += [(name, "z", f"robust z of the node's median short-window {g} against all nodes (median/MAD, scale floor {fl})")
          for name, g, fl in _FLEET]
    for c in NET_STATE_COUNTERS:
        note = " (congestion, not a fault on its own)" if c == "port_xmit_wait" else ""
        f += [(f"net_{c}_per_min_{w}", "1/min", f"{c} per minute summed over the node's ports, {w} window{note}") for w in _W]
    f += [("net_ports_not_active_frac_short", "0-1", "fraction of the node's port samples not ACTIVE, short window"),
          ("net_ports", "count", "ports of the node reporting in the long window"),
          ("net_port_down_after_active_s", "s", "longest time, over the node's ports seen ACTIVE before, that a port "
           "has stayed not ACTIVE since (first to latest not-ACTIVE sample, however long ago); 0 when none")]
    # ---- second set: the same meaning on every fleet
    f += [(f"{stem}_excess_long", "ln ratio", f"{meaning}: ln((events + 1) / (own baseline x exposure + 1)) over "
           "the long window; 0 = what this GPU usually does") for stem, _, meaning in _BASELINE_STEMS]
    for c in NET_ERROR_COUNTERS:
        f += [(f"net_{c}_per_min_port_max_{w}", "1/min", f"{c} per minute on the node's worst port, {w} window")
              for w in _W]
    f += [(f"net_{c}_excess_long_port_max", "ln ratio", f"{c} on the node's port furthest above its own baseline: "
           "ln((events + 1) / (own baseline x exposure + 1)), long window") for c in NET_ERROR_COUNTERS]
    f += [("other_nodes_power_brake_short", "count", "other nodes with a GPU held by HW power brake most of the short "
           "window: a rack's or facility's brake hits many nodes at once, a failing PSU one")]
    # ---- third set: the node's BMC (pipeline.bmc); NaN where the node has no BMC data
    f += [(f"node_bmc_{c.name}_count_{w}", "count", f"asserted BMC SEL entries: {c.meaning}, {w} window")
          for w in _W for c in SEL_CLASSES]
    f += list(BMC_MARGINS)
    # ---- fourth set: rate CUSUMs against each part's own rate (pipeline.baselines)
    f += [(f"{stem}_cusum", "nats", f"{meaning}: Poisson CUSUM for {RHO:g}x the GPU's own rate, evidence "
           "beyond the alarm level (0 = no sustained rise; one or two stray errors never show)")
          for stem, _, meaning in _BASELINE_STEMS]
    f += [(f"net_{c}_cusum_port_max", "nats", f"{c} on the node's port with the most evidence of erring {RHO:g}x "
           "its own rate: Poisson CUSUM beyond the alarm level") for c in NET_ERROR_COUNTERS]
    # ---- fifth set: peers that share the workload
    f += [("sm_clock_deficit_vs_busy_peers", "ratio", "(median of the node's busy GPUs - own) / that median, "
           f"short-window SM clock, for a busy GPU (utilisation >= {BUSY_UTIL_PCT:g} %); NaN while it idles: an idle "
           "GPU beside busy ones (a node shared by several jobs) is not slow")]
    f += [("sm_clock_deficit_vs_busy_peers_trend", "ratio", "sm_clock_deficit_vs_busy_peers averaged over the GPU's "
           f"minutes of steady work (utilisation >= {STEADY_UTIL_PCT:g} %, and no thermal slowdown: its throttle "
           f"reasons say so, or, on a GPU that sends none, its temperature is under {STEADY_COOL_C:g} degC), from 0, "
           "time constant "
           f"{TREND_TAU_S / 60:g} min (other minutes decay it towards 0; one without a sample of the GPU is "
           "skipped); NaN in any other minute. A straggler stays slow; a GPU at its power cap dips and comes back")]
    # ---- sixth set: whether a brake is the node's own
    f += [("other_nodes_power_brake_long_ratio", "ratio", "the most any other node (its worst GPU) was held by HW "
           "power brake in the long window, divided by this node's own (its worst GPU); 0 when no other node braked, "
           "NaN when this node did not: at 0.5 or more another node braked at least half as much, a shared cause")]
    # ---- seventh set: a node that stops reporting, and what its peers did before it
    f += [("node_silent_s", "s", "tick end - time of the node's latest GPU sample (the least sample_age_s of its "
           "GPUs): grows only when every GPU of the node has gone silent")]
    f += [("other_nodes_power_brake_long", "count", f"other nodes with a GPU held by HW power brake at least "
           f"{BRAKE_LONG_FRAC:.0%} of the long window: a shared brake that has ended still explains a node's own")]
    # ---- eighth set: a storm of corrected errors that is falling (pipeline.storms)
    f += [("ecc_sbe_per_h_10m", "1/h", "single-bit ECC errors per hour over the last 10 minutes (the short windows of "
           "its last ten one-minute buckets); NaN without exposure in that time"),
          ("ecc_sbe_10m_of_peak", "ratio", "ecc_sbe_per_h_10m over the highest it read on this GPU in the last 2 h "
           "(10-minute buckets: 110-120 min): under 1 a storm is falling from its peak; 1 when no error in that time, "
           "NaN when the 10-minute rate is")]
    # ---- ninth set: whether that storm is still growing (pipeline.storms)
    f += [("ecc_sbe_10m_growth", "ratio", "ecc_sbe_per_h_10m over this GPU's corrected-error rate in the hour before "
           "it (ending 10-20 min ago; floored at 1 per hour): about 1 for a storm that holds its rate, above 1 for "
           "errors that grow; NaN when the 10-minute rate is, or that hour holds under 30 min of exposure")]
    # ---- tenth set: a GPU lost from its node (what a held node waits for before it is resumed)
    f += [("node_gpus_lost", "count", "GPUs of the node that have had a reading (a sample with a value; a row of "
           "nulls is none) but none for retain_silent_s: a GPU off the bus sends no row through NVML, or rows of "
           "nulls from an exporter")]
    f += [("node_gpus_reading", "count", "GPUs of the node with a reading within retain_silent_s: what a node gpuops "
           "takes out had, and must have again before it is resumed (a scoring worker that restarted never saw a GPU "
           "lost before it)")]
    # ---- eleventh set: what a GPU that sends no throttle reasons says by its temperature
    f += [("temp_gpu_c_without_reasons_short", "degC", "short-window mean GPU temperature of a GPU that sends no "
           "throttle reasons (dcgm-exporter's default counters), NaN on one that sends them (its slowdown flags say "
           f"it): at {HW_SLOWDOWN_C:g} degC or more it is in HW thermal slowdown (rule hw_thermal_by_temperature)")]
    # ---- twelfth set: a straggler that is slow in spells (the trend averages its spells with its fast minutes)
    f += [("sm_clock_slow_share", "0-1", f"share of the GPU's minutes of steady work (as for "
           f"sm_clock_deficit_vs_busy_peers_trend) in which it ran at least {SLOW_DEFICIT:.0%} under its busy peers' "
           f"clock and not held by its power cap or a power brake (throttle bits 0x4, 0x80 under half the short "
           "window; a GPU that sends no throttle reasons cannot say, and its minutes count as not slow), averaged the "
           f"same way (from 0, time constant {TREND_TAU_S / 60:g} min); NaN in any other minute. A straggler slow half "
           "its minutes reads about 0.5 whatever its depth; a healthy GPU's dip at its power cap is not counted")]
    return tuple(f)


#: Every feature column as (name, unit, meaning), in matrix order.
FEATURES: tuple[tuple[str, str, str], ...] = _build()
#: Column names of the feature matrix (stable; append only).
FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _, _ in FEATURES)
FEATURE_INDEX: dict[str, int] = {n: i for i, n in enumerate(FEATURE_NAMES)}

_CNT = {c: i for i, c in enumerate(GPU_COUNTERS)}


def _cols(names: list[list[str]]) -> np.ndarray:
    return np.array([[FEATURE_INDEX[n] for n in row] for row in names], np.intp)


# Output columns of each block of features, shaped like the block (window, …), so a whole block
# is written with one assignment instead of one call per column.
_GAUGE_COLS = {stat: _cols([[f"{g}_{stat}_{w}" for g in WINDOW_GAUGES] for w in _W]) for stat in ("mean", "std", "slope")}
_N, _SX, _ST, _SXX, _STT, _STX = (STATS[k] for k in ("n", "sx", "st", "sxx", "stt", "stx"))
_CNT_DELTA, _CNT_DT, _THR_BITS, _XID = STATS["cnt_delta"], STATS["cnt_dt"], STATS["thr_bits"], STATS["xid"]
_THR_KNOWN, _SAMPLES = STATS["thr_known"].start, STATS["samples"].start
#: rate stems: first and second counter (second = first when there is one), "either" flag, per seconds
_RATE_FIRST = np.array([_CNT[c[0]] for _, c, *_ in _RATES])
_RATE_SECOND = np.array([_CNT[c[-1]] for _, c, *_ in _RATES])
_RATE_PAIR = np.array([len(c) == 2 for _, c, *_ in _RATES])
_RATE_EITHER = np.array([stem in _EITHER for stem, *_ in _RATES])
_RATE_PER = np.array([float(per) for _, _, _, per, _, _ in _RATES])
_RATE_IN = [np.flatnonzero([w in wins for *_, wins in _RATES]) for w in _W]
_RATE_COLS = [np.array([FEATURE_INDEX[f"{_RATES[i][0]}_{w}"] for i in sel], np.intp) for w, sel in zip(_W, _RATE_IN)]
_THR_COLS = _cols([[f"throttle_{bit}_frac_{w}" for bit, _ in THROTTLE_BITS] for w in _W])
_XID_COLS = _cols([[f"xid_{cls}_count_{w}" for cls, _ in XID_CLASSES] for w in _W])
_NODE_XID_COLS = np.array([FEATURE_INDEX[f"node_xid_{cls}_count_short"] for cls, _ in XID_CLASSES], np.intp)
#: the BMC block, in NodeBmcState.features order: counts (window, class), then the margins
_BMC_COLS = np.array([FEATURE_INDEX[f"node_bmc_{c.name}_count_{w}"] for w in _W for c in SEL_CLASSES]
                     + [FEATURE_INDEX[name] for name, _, _ in BMC_MARGINS], np.intp)
#: last-value features: first and second column, "either" flag (ecc_dbe_total)
_LAST_FIRST = np.array([GPU_COL[c[0]] for _, c, _, _ in _LAST])
_LAST_SECOND = np.array([GPU_COL[c[-1]] for _, c, _, _ in _LAST])
_LAST_PAIR = np.array([len(c) == 2 for _, c, _, _ in _LAST])
_LAST_EITHER = np.array([name == "ecc_dbe_total" for name, *_ in _LAST])
_LAST_COLS = np.array([FEATURE_INDEX[name] for name, *_ in _LAST], np.intp)
#: gauges with a node median (peers and fleet), and where each sits in WINDOW_GAUGES
_MED_GAUGES = tuple(dict.fromkeys(p[1] for p in _PEERS + _FLEET))
_MED_IDX = np.array([WINDOW_GAUGES.index(g) for g in _MED_GAUGES])
_FLEET_COLS = np.array([FEATURE_INDEX[name] for name, _, _ in _FLEET], np.intp)
_CLOCK_MED, _UTIL_MED = _MED_GAUGES.index("sm_clock_mhz"), _MED_GAUGES.index("util_gpu")
_TEMP_MED = _MED_GAUGES.index("temp_gpu_c")
_TEMP_WITHOUT_REASONS = FEATURE_INDEX["temp_gpu_c_without_reasons_short"]
_BUSY_DEFICIT = FEATURE_INDEX["sm_clock_deficit_vs_busy_peers"]
_DEFICIT_TREND = FEATURE_INDEX["sm_clock_deficit_vs_busy_peers_trend"]
_SLOW_SHARE = FEATURE_INDEX["sm_clock_slow_share"]
_SW_THERMAL_SHORT, _HW_THERMAL_SHORT = (FEATURE_INDEX[f"throttle_{b}_frac_short"] for b in ("sw_thermal", "hw_thermal"))
_FLEET_GAUGE = np.array([_MED_GAUGES.index(g) for _, g, _ in _FLEET])
_FLEET_FLOOR = np.array([floor for _, _, floor in _FLEET])
_BRAKE_SHORT, _OTHER_BRAKE = FEATURE_INDEX["throttle_hw_power_brake_frac_short"], FEATURE_INDEX["other_nodes_power_brake_short"]
_CAP_SHORT = FEATURE_INDEX["throttle_sw_power_cap_frac_short"]
_BRAKE_LONG, _BRAKE_RATIO = FEATURE_INDEX["throttle_hw_power_brake_frac_long"], FEATURE_INDEX["other_nodes_power_brake_long_ratio"]
_OTHER_BRAKE_LONG = FEATURE_INDEX["other_nodes_power_brake_long"]
_AGE, _NODE_SILENT = FEATURE_INDEX["sample_age_s"], FEATURE_INDEX["node_silent_s"]
_SAMPLES_SHORT, _NODE_LOST = FEATURE_INDEX["samples_short"], FEATURE_INDEX["node_gpus_lost"]
_NODE_READING = FEATURE_INDEX["node_gpus_reading"]
_BASE_FIRST = np.array([_CNT[c[0]] for _, c, _ in _BASELINE_STEMS])
_BASE_SECOND = np.array([_CNT[c[-1]] for _, c, _ in _BASELINE_STEMS])
_BASE_PAIR = np.array([len(c) == 2 for _, c, _ in _BASELINE_STEMS])
_BASE_EITHER = np.array([stem == "ecc_sbe" for stem, _, _ in _BASELINE_STEMS])
_BASE_COLS = np.array([FEATURE_INDEX[f"{stem}_excess_long"] for stem, _, _ in _BASELINE_STEMS], np.intp)
_NET_ERR = np.array([NET_STATE_COUNTERS.index(c) for c in NET_ERROR_COUNTERS])
_NET_MAX_COLS = _cols([[f"net_{c}_per_min_port_max_{w}" for c in NET_ERROR_COUNTERS] for w in _W])
_NET_EXCESS_COLS = np.array([FEATURE_INDEX[f"net_{c}_excess_long_port_max"] for c in NET_ERROR_COUNTERS], np.intp)
_CUSUM_COLS = np.array([FEATURE_INDEX[f"{stem}_cusum"] for stem, _, _ in _BASELINE_STEMS], np.intp)
_NET_CUSUM_COLS = np.array([FEATURE_INDEX[f"net_{c}_cusum_port_max"] for c in NET_ERROR_COUNTERS], np.intp)
#: pipeline.storms' three readings, in SbeStorm.update's order
_SBE_STORM_COLS = np.array([FEATURE_INDEX[n] for n in ("ecc_sbe_per_h_10m", "ecc_sbe_10m_of_peak",
                                                       "ecc_sbe_10m_growth")], np.intp)
_SBE_STEM = [stem for stem, _, _ in _BASELINE_STEMS].index("ecc_sbe")


class PartBaselines:
    """Online rate baselines of every GPU (per :data:`_BASELINE_STEMS`) and every port (per
    :data:`NET_ERROR_COUNTERS`), updated by :func:`compute_features` once per tick with the
    short window, which is the tick (``short_window_s == cadence_s``)."""

    def __init__(self, gpu_capacity: int = 1024, port_capacity: int = 1024) -> None:
        self.gpu = RateBaselines(len(_BASELINE_STEMS), gpu_capacity)
        self.port = RateBaselines(len(NET_ERROR_COUNTERS), port_capacity)
        self.clock = DeficitTrend(gpu_capacity, columns=2)  # the deficit, and 0/1 "slow this minute" (a share)
        self.storm = SbeStorm(gpu_capacity)

    @property
    def nbytes(self) -> int:
        return self.gpu.nbytes + self.port.nbytes + self.clock.nbytes + self.storm.nbytes

    def restart(self, gpu_slots: np.ndarray, port_slots: np.ndarray) -> int:
        """Restart the baselines of repaired parts at the prior; how many parts restarted."""
        for base, parts in ((self.gpu, gpu_slots), (self.port, port_slots), (self.clock, gpu_slots),
                            (self.storm, gpu_slots)):
            if len(parts):
                base.ensure(int(parts.max()) + 1)
                base.restart(parts)
        return len(gpu_slots) + len(port_slots)


def _stem_events(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(events, exposure s) per baseline stem from window sums *s* (stat, GPU)."""
    d, t = s[_CNT_DELTA], s[_CNT_DT]
    pair, either = _BASE_PAIR[:, None], _BASE_EITHER[:, None]
    events = _either_or_sum(d[_BASE_FIRST], d[_BASE_SECOND], pair, either)
    t1, t2 = t[_BASE_FIRST], t[_BASE_SECOND]
    exposure = np.where(np.isfinite(d[_BASE_FIRST]) & (t1 > 0), t1, t2)
    return events, np.where(np.isfinite(events), exposure, np.nan)


def _node_brake_long(brake_long: np.ndarray, grp: np.ndarray, n_nodes: int) -> np.ndarray:
    """Per node: its worst GPU's share of the long window held by HW power brake (0 where unknown)."""
    node = np.zeros(n_nodes)
    np.maximum.at(node, grp, np.nan_to_num(brake_long, nan=0.0))
    return node


def _brake_ratio(node: np.ndarray, grp: np.ndarray) -> np.ndarray:
    """Per row: the most any *other* node braked in the long window over this row's node's own (*node*:
    :func:`_node_brake_long`); 0 when no other node braked, NaN when this node did not."""
    n_nodes = len(node)
    if n_nodes < 2:
        others = np.zeros(n_nodes)
    else:
        top = np.argmax(node)
        second = np.max(np.delete(node, top))
        others = np.full(n_nodes, node[top])
        others[top] = second
    own = node[grp]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(own > 0, others[grp] / own, np.nan)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b where b > 0, else NaN (one pass; nothing is divided where b is not > 0)."""
    out = np.full(np.broadcast_shapes(np.shape(a), np.shape(b)), np.nan)
    return np.divide(a, b, out=out, where=b > 0)


def _either_or_sum(first: np.ndarray, second: np.ndarray, pair: np.ndarray, either: np.ndarray) -> np.ndarray:
    """Per column (last axis): *first* where only one part; for pairs, *first* else *second*
    (``either``) or the sum ignoring NaN parts, NaN when both are NaN."""
    ok1 = np.isfinite(first)
    total = np.where(np.isnan(first), 0.0, first) + np.where(np.isnan(second), 0.0, second)
    summed = np.where(ok1 | np.isfinite(second), total, np.nan)
    return np.where(pair, np.where(either, np.where(ok1, first, second), summed), first)


def compute_features(gpu: GpuWindowState, ports: PortWindowState, node_xids: NodeXidState,
                     gpus: GpuRegistry, port_reg: PortRegistry, slots: np.ndarray, tick_end: float,
                     n_short: int, baselines: PartBaselines | None = None, muted: np.ndarray | None = None,
                     node_bmc: NodeBmcState | None = None, lost_after_s: float = np.inf) -> np.ndarray:
    """Feature matrix (len(slots), len(FEATURE_NAMES)) float32 for *slots* at *tick_end*.

    Each group of features is computed for both windows and every gauge, counter or class
    at once, as contiguous (window, column, GPU) blocks written to a (feature, GPU) matrix:
    a few dozen numpy calls per tick whatever the number of columns, each over contiguous
    rows. The matrix is transposed to (GPU, feature) float32 once at the end.

    *baselines* are read (excess features), then updated with this tick's short window;
    without them (a one-off computation) every part is compared with the prior alone. The
    baselines of the GPUs and ports of nodes flagged in *muted* (per node id: silenced or
    under maintenance this tick) are read but frozen, not updated.
    Without *node_bmc* the BMC features are NaN (no BMC data). A GPU whose last reading is
    *lost_after_s* or more old is lost (``node_gpus_lost``; never, by default), a younger one
    is reading (``node_gpus_reading``).
    """
    baselines = baselines if baselines is not None else PartBaselines(gpus.n, port_reg.n)
    r = len(slots)
    f = np.empty((len(FEATURE_NAMES), r))  # every row is written below
    s = np.empty((2, gpu.ring.n_stats, r))  # (window, stat, GPU)
    for w, parts in enumerate(gpu.windows(gpus.n, tick_end, n_short)):
        for (lo, hi), part in zip(gpu.ring.bounds, parts):
            s[w, lo:hi] = part.take(slots, axis=0, mode="clip").T  # slots < n: "clip" skips a buffer

    n, sx, st, sxx, stt, stx = s[:, _N], s[:, _SX], s[:, _ST], s[:, _SXX], s[:, _STT], s[:, _STX]
    mean = _div(sx, n)
    var = np.maximum(_div(sxx, n) - mean * mean, 0.0)
    slope = _div(n * stx - st * sx, n * stt - st * st) * 60.0
    f[_GAUGE_COLS["mean"]] = mean
    f[_GAUGE_COLS["std"]] = np.sqrt(var)
    f[_GAUGE_COLS["slope"]] = np.where(n >= 2, slope, np.nan)

    rate = _div(s[:, _CNT_DELTA], s[:, _CNT_DT])  # per second, NaN when unsupported or no interval
    v = _either_or_sum(rate[:, _RATE_FIRST], rate[:, _RATE_SECOND], _RATE_PAIR[:, None], _RATE_EITHER[:, None])
    v *= _RATE_PER[:, None]
    for w, (sel, cols) in enumerate(zip(_RATE_IN, _RATE_COLS)):
        f[cols] = v[w, sel]
    f[_THR_COLS] = _div(s[:, _THR_BITS], s[:, _THR_KNOWN, None])

    nodes = gpus.slot_node[slots]
    f[_XID_COLS] = s[:, _XID]
    f[_NODE_XID_COLS] = node_xids.windows(len(gpus.nodes), tick_end, n_short)[0].T[:, nodes]  # (class, GPU)
    if node_bmc is None:
        f[_BMC_COLS] = np.nan
    else:
        counts, margins = node_bmc.features(len(gpus.nodes), tick_end, n_short)
        f[_BMC_COLS] = np.concatenate([counts.reshape(-1, counts.shape[-1]), margins])[:, nodes]

    last = gpu.last_vals[:, slots]
    f[_LAST_COLS] = _either_or_sum(last[_LAST_FIRST], last[_LAST_SECOND], _LAST_PAIR[:, None], _LAST_EITHER[:, None])
    f[FEATURE_INDEX["sample_age_s"]] = tick_end - gpu.last_ts[slots]
    f[_SAMPLES_SHORT] = s[0, _SAMPLES]

    # peers: each GPU against its node's median; each node against the fleet
    per_node = np.bincount(nodes, minlength=len(gpus.nodes))  # node ids are dense: no sort needed
    scored = per_node > 0
    grp = (np.cumsum(scored) - 1)[nodes]  # index of each GPU's node among the nodes scored, by id
    f[FEATURE_INDEX["node_gpus_scored"]] = per_node[nodes]
    n_scored = int(scored.sum())
    own = mean[0, _MED_IDX]  # (gauge, GPU) short-window means
    clock, busy = own[_CLOCK_MED], own[_UTIL_MED] >= BUSY_UTIL_PCT
    # one grouping for every gauge's node median and the median clock of the node's busy GPUs
    meds = group_medians(np.vstack([own, np.where(busy, clock, np.nan)[None]]), grp, n_scored)
    node_med, busy_med = meds[:-1], meds[-1, grp]  # one median per node and gauge; busy clock per GPU
    med = node_med[:, grp]
    for name, g, _, _ in _PEERS:
        j = _MED_GAUGES.index(g)
        o, m = own[j], med[j]
        if name.startswith("temp"):
            v = o - m
        elif name.startswith("util"):
            v = m - o
        elif name.startswith("sm_clock"):
            v = _div(m - o, m)
        else:
            v = _div(np.abs(o - m), m)
        f[FEATURE_INDEX[name]] = v
    f[_BUSY_DEFICIT] = np.where(busy, _div(busy_med - clock, busy_med), np.nan)
    f[_FLEET_COLS] = robust_z_rows(node_med[_FLEET_GAUGE], _FLEET_FLOOR)[:, grp]
    with np.errstate(invalid="ignore"):
        braking = np.bincount(grp, weights=f[_BRAKE_SHORT] > 0.5, minlength=n_scored) > 0
    node_brake = _node_brake_long(f[_BRAKE_LONG], grp, n_scored)
    braked = node_brake >= BRAKE_LONG_FRAC
    f[_OTHER_BRAKE] = braking.sum() - braking[grp]
    f[_BRAKE_RATIO] = _brake_ratio(node_brake, grp)
    f[_OTHER_BRAKE_LONG] = braked.sum() - braked[grp]
    node_age = np.full(n_scored, np.inf)
    np.minimum.at(node_age, grp, f[_AGE])
    f[_NODE_SILENT] = node_age[grp]
    age, of_node = tick_end - gpu.last_read[: gpus.n], gpus.slot_node[: gpus.n]
    with np.errstate(invalid="ignore"):
        lost, reading = age >= lost_after_s, age < lost_after_s  # NaN (never read): neither
    f[_NODE_LOST] = np.bincount(of_node[lost], minlength=len(gpus.nodes))[nodes]
    f[_NODE_READING] = np.bincount(of_node[reading], minlength=len(gpus.nodes))[nodes]

    frozen = None if muted is None else muted[nodes]
    baselines.clock.ensure(gpus.n)
    # a share not sent (NaN) is not "no slowdown": unknown is not clean (SU); a GPU that sends no throttle
    # reasons is read cool, not slowing for heat, by its temperature (ST)
    sw, hw = f[_SW_THERMAL_SHORT], f[_HW_THERMAL_SHORT]
    unsaid = np.isnan(sw) & np.isnan(hw)
    f[_TEMP_WITHOUT_REASONS] = np.where(unsaid, own[_TEMP_MED], np.nan)
    with np.errstate(invalid="ignore"):
        cool = (sw < 0.5) & (hw < 0.5) | unsaid & (own[_TEMP_MED] < STEADY_COOL_C)
        steady = (own[_UTIL_MED] >= STEADY_UTIL_PCT) & cool
    deficit = np.where(steady, f[_BUSY_DEFICIT], np.nan)
    with np.errstate(invalid="ignore"):  # at the power cap or braked (or cannot say) a minute is not a straggler's
        uncapped = (f[_CAP_SHORT] < 0.5) & (f[_BRAKE_SHORT] < 0.5)
        slow = np.where(np.isnan(deficit), np.nan, (deficit >= SLOW_DEFICIT) & uncapped)
    f[[_DEFICIT_TREND, _SLOW_SHARE]] = baselines.clock.update(slots, tick_end, n_short * gpu.bucket_s,
                                                              np.column_stack([deficit, slow]), frozen,
                                                              unread=f[_SAMPLES_SHORT] == 0).T

    base = baselines.gpu
    base.ensure(gpus.n)
    events, exposure = _stem_events(s[1])
    f[_BASE_COLS] = base.excess(slots, events, exposure)
    events, exposure = _stem_events(s[0])
    base.update(slots, tick_end, events, exposure, frozen=frozen)
    f[_CUSUM_COLS] = base.cusum_excess(slots)
    baselines.storm.ensure(gpus.n)  # a window, not a learnt normal: muted time counts
    f[_SBE_STORM_COLS] = baselines.storm.update(slots, tick_end, events[_SBE_STEM], exposure[_SBE_STEM])

    _net_features(f, ports, port_reg, nodes, len(gpus.nodes), tick_end, n_short, baselines.port, muted)
    return np.ascontiguousarray(f.T, dtype=np.float32)


#: Node-level port sums, one column each: rate Σ and "some port known" per (window, counter),
#: then samples with a known link state, samples not ACTIVE and live ports (short window).
_K = len(NET_STATE_COUNTERS)
_NET_RATE_COLS = _cols([[f"net_{c}_per_min_{w}" for c in NET_STATE_COUNTERS] for w in _W])
_NET_WIDTH = 4 * _K + 3
_NET_LAST_COLS = np.array([FEATURE_INDEX["net_ports_not_active_frac_short"], FEATURE_INDEX["net_ports"]], np.intp)
_NET_DOWN_COL = FEATURE_INDEX["net_port_down_after_active_s"]


def _net_features(f: np.ndarray, ports: PortWindowState, reg: PortRegistry, nodes: np.ndarray, n_nodes: int,
                  tick_end: float, n_short: int, base: RateBaselines, muted: np.ndarray | None = None) -> None:
    """Port features per node, written into the (feature, GPU) matrix *f* for each GPU's node
    (NaN without any port): sums over the node's ports, and its worst single port.

    Every node sum is one ``bincount`` over a (port, column) block: each node's ports are
    added in canonical port order, so features do not depend on arrival order. Every worst
    port is one ``fmax.reduceat`` over the same order (a node's ports are contiguous in it).
    """
    if reg.n == 0:
        f[_NET_RATE_COLS.ravel()] = np.nan
        f[_NET_LAST_COLS] = np.nan
        f[_NET_MAX_COLS.ravel()] = np.nan
        f[_NET_EXCESS_COLS] = np.nan
        f[_NET_CUSUM_COLS] = np.nan
        f[_NET_DOWN_COL] = np.nan
        return
    order = reg.canonical_order()  # fixed summation order: features do not depend on arrival order
    pnode = reg.port_node[order]
    wins = [win[order] for win in ports.windows(reg.n, tick_end, n_short)]  # (short, long), canonical order
    p, e = len(order), len(_NET_ERR)
    block = np.empty((p, _NET_WIDTH))
    # per port, reduced to the node's worst: error rates (short, long), excess over the port's own
    # baseline (long), time down after being ACTIVE, CUSUM against the port's own rate
    worst = np.empty((p, 4 * e + 1))
    live = wins[1][:, PORT_STATS["samples"].start] > 0
    for w, s in enumerate(wins):
        rate = _div(s[:, PORT_STATS["cnt_delta"]], s[:, PORT_STATS["cnt_dt"]]) * 60.0
        ok = np.isfinite(rate)
        ok &= live[:, None]
        block[:, w * _K:(w + 1) * _K] = np.where(ok, rate, 0.0)
        block[:, (2 + w) * _K:(3 + w) * _K] = ok
        worst[:, w * e:(w + 1) * e] = np.where(live[:, None], rate[:, _NET_ERR], np.nan)
        if w == 0:
            block[:, 4 * _K] = s[:, PORT_STATS["state_known"].start]
            block[:, 4 * _K + 1] = s[:, PORT_STATS["not_active"].start]
    block[:, 4 * _K + 2] = live
    bins = (pnode[:, None] * _NET_WIDTH + np.arange(_NET_WIDTH)).ravel()
    per_node = np.bincount(bins, weights=block.ravel(), minlength=n_nodes * _NET_WIDTH).reshape(n_nodes, _NET_WIDTH)
    totals = np.where(per_node[:, 2 * _K:4 * _K] > 0, per_node[:, :2 * _K], np.nan)
    f[_NET_RATE_COLS.ravel()] = totals.T[:, nodes]
    known, down, n_live = per_node[:, 4 * _K], per_node[:, 4 * _K + 1], per_node[:, 4 * _K + 2]
    f[_NET_LAST_COLS] = np.stack((_div(down, known), n_live))[:, nodes]

    base.ensure(reg.n)
    events, exposure = (wins[1][:, PORT_STATS[k]][:, _NET_ERR].T for k in ("cnt_delta", "cnt_dt"))
    worst[:, 2 * e:3 * e] = np.where(live[:, None], base.excess(order, events, exposure).T, np.nan)
    base.update(order, tick_end, *(wins[0][:, PORT_STATS[k]][:, _NET_ERR].T for k in ("cnt_delta", "cnt_dt")),
                frozen=None if muted is None else muted[pnode])
    worst[:, 3 * e] = ports.down_after_active_s(reg.n)[order]
    worst[:, 3 * e + 1:] = np.where(live[:, None], base.cusum_excess(order).T, np.nan)
    starts = np.flatnonzero(np.r_[True, pnode[1:] != pnode[:-1]])  # a node's ports are contiguous in canonical order
    with np.errstate(invalid="ignore"):
        node_worst = np.fmax.reduceat(worst, starts, axis=0)  # NaN only where every port is NaN
    full = np.full((n_nodes, 4 * e + 1), np.nan)             # nodes without ports stay NaN
    full[pnode[starts]] = node_worst
    f[_NET_MAX_COLS.ravel()] = full[:, :2 * e].T[:, nodes]
    f[_NET_EXCESS_COLS] = full[:, 2 * e:3 * e].T[:, nodes]
    f[_NET_DOWN_COL] = full[nodes, 3 * e]
    f[_NET_CUSUM_COLS] = full[:, 3 * e + 1:].T[:, nodes]


def markdown_table() -> str:
    """The feature table of docs/pipeline.md (``python -m pipeline.features`` prints it)."""
    rows = ["| # | name | unit | meaning |", "|---|---|---|---|"]
    rows += [f"| {i} | `{name}` | {unit} | {meaning} |" for i, (name, unit, meaning) in enumerate(FEATURES)]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
