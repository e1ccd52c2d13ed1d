"""Features per GPU per tick, vectorised over every GPU scored in the tick.

:data:`FEATURES` lists every column of the feature matrix as (name, unit, meaning);
:data:`FEATURE_NAMES` is its name column. Both are a contract with ``models/``: add
columns at the end, never rename or reorder (docs/pipeline.md lists them).

Windows: ``short`` is the last ``short_window_s`` before the tick end, ``long`` the last
``long_window_s``. Rates use the real time between samples, so irregular sampling is
exact; a counter reset counts from zero; NaN means unknown (unsupported field, no
samples in the window), never zero.
"""

from __future__ import annotations

import numpy as np

from collector.schema import GPU_COUNTERS
from pipeline.columns import GPU_COL, NET_STATE_COUNTERS
from pipeline.peers import group_median, robust_z
from pipeline.ports import PORT_STATS, NodeXidState, PortWindowState
from pipeline.registry import GpuRegistry, PortRegistry
from pipeline.state import STATS, THROTTLE_BITS, WINDOW_GAUGES, XID_CLASSES, GpuWindowState

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
#: (feature, gauge, floor of the robust scale in the gauge's unit)
_FLEET = (("node_sm_clock_fleet_z", "sm_clock_mhz", 5.0), ("node_temp_gpu_fleet_z", "temp_gpu_c", 1.0),
          ("node_power_fleet_z", "power_w", 5.0), ("node_util_fleet_z", "util_gpu", 2.0))


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
        f += [(f"xid_{cls}_count_{w}", "count", f"XID events of class {cls} on this GPU or unresolved on its node, {w} window") for w in _W]
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
          ("net_ports", "count", "ports of the node reporting in the long window")]
    return tuple(f)


#: Every feature column as (name, unit, meaning), in matrix order.
FEATURES: tuple[tuple[str, str, str], ...] = _build()
#: Column names of the feature matrix (stable; append only).
FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _, _ in FEATURES)
FEATURE_INDEX: dict[str, int] = {n: i for i, n in enumerate(FEATURE_NAMES)}

_CNT = {c: i for i, c in enumerate(GPU_COUNTERS)}


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b where b > 0, else NaN (one pass; nothing is divided where b is not > 0)."""
    out = np.full(np.broadcast_shapes(np.shape(a), np.shape(b)), np.nan)
    return np.divide(a, b, out=out, where=b > 0)


def compute_features(gpu: GpuWindowState, ports: PortWindowState, node_xids: NodeXidState,
                     gpus: GpuRegistry, port_reg: PortRegistry, slots: np.ndarray, tick_end: float,
                     n_short: int) -> np.ndarray:
    """Feature matrix (len(slots), len(FEATURE_NAMES)) float32 for *slots* at *tick_end*."""
    r = len(slots)
    x = np.full((r, len(FEATURE_NAMES)), np.nan, np.float32)

    def put(name: str, v: np.ndarray) -> None:
        x[:, FEATURE_INDEX[name]] = v

    short, long = gpu.windows(gpus.n, tick_end, n_short)
    short, long = short[slots], long[slots]
    means = {}
    for w, s in zip(_W, (short, long)):
        n, sx, sxx, st, stt, stx = (s[:, STATS[k]] for k in ("n", "sx", "sxx", "st", "stt", "stx"))
        mean = _div(sx, n)
        var = np.maximum(_div(sxx, n) - mean * mean, 0.0)
        slope = _div(n * stx - st * sx, n * stt - st * st) * 60.0
        for j, g in enumerate(WINDOW_GAUGES):
            put(f"{g}_mean_{w}", mean[:, j])
            put(f"{g}_std_{w}", np.sqrt(var[:, j]))
            put(f"{g}_slope_{w}", np.where(n[:, j] >= 2, slope[:, j], np.nan))
        means[w] = mean
        delta, dt = s[:, STATS["cnt_delta"]], s[:, STATS["cnt_dt"]]
        rate = _div(delta, dt)  # per second, NaN when unsupported or no interval
        for stem, counters, _, per, _, wins in _RATES:
            if w not in wins:
                continue
            cols = [rate[:, _CNT[c]] for c in counters]
            if stem in _EITHER:
                v = np.where(np.isfinite(cols[0]), cols[0], cols[1])
            else:
                v = _nansum(cols)
            put(f"{stem}_{w}", v * per)
        known = s[:, STATS["thr_known"].start]
        for k, (bit, _) in enumerate(THROTTLE_BITS):
            put(f"throttle_{bit}_frac_{w}", _div(s[:, STATS["thr_bits"].start + k], known))

    nodes = gpus.slot_node[slots]
    xs, xl = node_xids.windows(len(gpus.nodes), tick_end, n_short)
    for w, s, nx in zip(_W, (short, long), (xs, xl)):
        for k, (cls, _) in enumerate(XID_CLASSES):
            put(f"xid_{cls}_count_{w}", s[:, STATS["xid"].start + k] + nx[nodes, k])

    last = gpu.last_vals[:, slots]
    for name, cols, _, _ in _LAST:
        vs = [last[GPU_COL[c]] for c in cols]
        put(name, np.where(np.isfinite(vs[0]), vs[0], vs[1]) if name == "ecc_dbe_total" else _nansum(vs))
    put("sample_age_s", tick_end - gpu.last_ts[slots])
    put("samples_short", short[:, STATS["samples"].start])

    # peers: each GPU against its node's median; each node against the fleet
    uniq, grp = np.unique(nodes, return_inverse=True)
    put("node_gpus_scored", np.bincount(grp, minlength=len(uniq))[grp])
    short_mean = means["short"]
    node_med = {g: group_median(short_mean[:, WINDOW_GAUGES.index(g)], grp, len(uniq))
                for g in {p[1] for p in _PEERS + _FLEET}}  # one median per node and gauge
    for name, g, _, _ in _PEERS:
        own = short_mean[:, WINDOW_GAUGES.index(g)]
        med = node_med[g][grp]
        if name.startswith("temp"):
            v = own - med
        elif name.startswith("util"):
            v = med - own
        elif name.startswith("sm_clock"):
            v = _div(med - own, med)
        else:
            v = _div(np.abs(own - med), med)
        put(name, v)
    for name, g, floor in _FLEET:
        put(name, robust_z(node_med[g], floor)[grp])

    _net_features(put, ports, port_reg, nodes, len(gpus.nodes), tick_end, n_short)
    return x


def _net_features(put, ports: PortWindowState, reg: PortRegistry, nodes: np.ndarray, n_nodes: int,
                  tick_end: float, n_short: int) -> None:
    if reg.n == 0:
        return
    order = reg.canonical_order()  # fixed summation order: features do not depend on arrival order
    pnode = reg.port_node[order]
    ps, pl = ports.windows(reg.n, tick_end, n_short)
    ps, pl = ps[order], pl[order]
    live = pl[:, PORT_STATS["samples"].start] > 0
    for w, s in zip(_W, (ps, pl)):
        rate = _div(s[:, PORT_STATS["cnt_delta"]], s[:, PORT_STATS["cnt_dt"]]) * 60.0
        for k, c in enumerate(NET_STATE_COUNTERS):
            ok = np.isfinite(rate[:, k]) & live
            total = np.bincount(pnode, weights=np.where(ok, rate[:, k], 0.0), minlength=n_nodes)
            have = np.bincount(pnode, weights=ok, minlength=n_nodes) > 0
            put(f"net_{c}_per_min_{w}", np.where(have, total, np.nan)[nodes])
    known = np.bincount(pnode, weights=ps[:, PORT_STATS["state_known"].start], minlength=n_nodes)
    down = np.bincount(pnode, weights=ps[:, PORT_STATS["not_active"].start], minlength=n_nodes)
    put("net_ports_not_active_frac_short", _div(down, known)[nodes])
    put("net_ports", np.bincount(pnode, weights=live, minlength=n_nodes)[nodes])


def _nansum(cols: list[np.ndarray]) -> np.ndarray:
    """Sum that ignores unsupported (NaN) parts but stays NaN when every part is NaN."""
    if len(cols) == 1:
        return cols[0]
    stack = np.stack(cols)
    return np.where(np.isfinite(stack).any(0), np.nansum(stack, 0), np.nan)
