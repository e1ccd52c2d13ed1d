"""Render a :class:`~.plan.FleetPlan` into telemetry, one chunk of ticks at a time.

All work is vectorised over (ticks x GPUs) numpy arrays; per-chunk state (counter
values, temperature lag, last XID) carries over so chunks join seamlessly. Output is
Arrow tables in the contract's schema plus event dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from scipy.signal import lfilter

from collector.schema import (
    GPU_COUNTERS,
    IB_COUNTERS,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
    FaultClass,
    RecordType,
    arrow_schema,
)

from .background import apply_background, saturate_ib
from .bmc import render_bmc
from .faults import EFFECTS
from .plan import FleetPlan, Incident
from .ranges import EXPORTER_DEFAULT_MISSING, GENERATIONS, UNSUPPORTED_FIELDS
from .sampling import late_order, timestamps
from .workload import HOME_TRAITS
from .world import MASK_GPUS, World

#: Counters that a reboot or driver reload sets back to zero (the rest persist in InfoROM).
VOLATILE_GPU = tuple(c for c in GPU_COUNTERS if not c.endswith("_agg") and not c.startswith(("retired", "remapped")))
GPU_IDLE_BIT = 0x1
TEMP_TAU_S = 90.0
_ERR_COUNTERS = tuple(c for c in IB_COUNTERS if not c.startswith(("port_xmit_data", "port_rcv_data", "port_xmit_packets",
                                                                  "port_rcv_packets", "port_xmit_wait")))

#: port counters that wrap at 2^32 on nodes reading 32-bit PortCounters (world.wrap_data)
_DATA_32BIT = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"})


#: SM clock of a busy sample at the SW power cap, as a share of its uncapped clock, in a drawn
#: world: the GPU lowers its clock to hold the power limit (DVFS), so healthy busy GPUs differ in
#: clock by a few to 15 % (the home world keeps its clock, as it always rendered it).
CAPPED_CLOCK_FACTOR = (0.85, 0.97)


class Chunk:
    """Mutable per-chunk buffers that fault effects write into."""

    def __init__(self, plan: FleetPlan, a: int, b: int):
        cfg = plan.cfg
        self.plan, self.a, self.b, self.n, self.dt = plan, a, b, b - a, cfg.interval_s
        G, NP, n = plan.n_gpus, cfg.nodes * cfg.ports_per_node, b - a
        self.G, self.NP = G, NP
        self.g = {k: np.zeros((n, G), np.float32) for k in ("row_remap_pending", "row_remap_failure",
                                                            "retired_pages_pending")}
        self.temp_add = np.zeros((n, G), np.float32)
        self.util_factor = np.ones((n, G), np.float32)
        self.clock_factor = np.ones((n, G), np.float32)
        self.power_factor = np.ones((n, G), np.float32)
        self.throttle = np.zeros((n, G), np.int64)
        self.missing = np.zeros((n, G), bool)
        #: (n, nodes) ticks a node is without power: no GPU or port sample, no kernel-log line (its BMC,
        #: on standby power, still speaks)
        self.dark = np.zeros((n, cfg.nodes), bool)
        self.link_down = np.zeros((n, NP), bool)
        self._rate: dict[str, np.ndarray] = {}
        self._inc: dict[str, np.ndarray] = {}
        self._net_rate: dict[str, np.ndarray] = {}
        self._net_inc: dict[str, np.ndarray] = {}
        self.events: list[tuple[int, int, int, str, Incident | None]] = []  # (tick, gpu col, code, msg, inc)

    def _lazy(self, d: dict[str, np.ndarray], name: str, width: int) -> np.ndarray:
        arr = d.get(name)
        if arr is None:
            arr = d[name] = np.zeros((self.n, width), np.float64)
        return arr

    def rate(self, name: str) -> np.ndarray:
        return self._lazy(self._rate, name, self.G)

    def inc(self, name: str) -> np.ndarray:
        return self._lazy(self._inc, name, self.G)

    def net_rate(self, name: str) -> np.ndarray:
        return self._lazy(self._net_rate, name, self.NP)

    def net_inc(self, name: str) -> np.ndarray:
        return self._lazy(self._net_inc, name, self.NP)

    def gpu_col(self, inc: Incident) -> int:
        return inc.node * self.plan.cfg.gpus_per_node + (inc.gpu or 0)

    def node_cols(self, inc: Incident) -> slice:
        k = self.plan.cfg.gpus_per_node
        return slice(inc.node * k, (inc.node + 1) * k)

    def event(self, inc: Incident, local_tick: int, code: int, message: str) -> None:
        self.events.append((self.a + local_tick, self.gpu_col(inc), code, message, inc))

    def bg_event(self, local_tick: int, gpu_col: int, code: int, message: str) -> None:
        """A kernel-log XID that belongs to no incident (benign background)."""
        self.events.append((self.a + local_tick, gpu_col, code, message, None))


@dataclass
class SimChunk:
    """One rendered chunk: GPU and port samples as Arrow tables, and events."""

    gpu: pa.Table
    net: pa.Table
    events: list[dict[str, Any]]


class Renderer:
    """Turns a plan into consecutive :class:`SimChunk`s (stateful; iterate once)."""

    def __init__(self, plan: FleetPlan):
        self.plan = plan
        cfg = plan.cfg
        G, NP = plan.n_gpus, cfg.nodes * cfg.ports_per_node
        self.gpu_cum = {c: np.zeros(G) for c in GPU_COUNTERS}
        self.net_cum = {c: np.zeros(NP) for c in IB_COUNTERS}
        self.traits = HOME_TRAITS if plan.world is None else plan.world.traits
        world = cfg.world
        #: ports whose data/packet counters are 32-bit and wrap (None: none do)
        self.wrap_ports = None if world is None or not any(world.wrap_data) else \
            np.repeat(np.array(world.wrap_data), cfg.ports_per_node)
        #: link speed of each port in a drawn world (its node's generation's HCA); None: 400 Gb/s everywhere
        self.port_gbps = None if world is None else np.repeat(
            np.array([GENERATIONS[g].ib_gbps for g in world.generation], np.float32), cfg.ports_per_node)
        #: column -> GPUs (G,) that never report it (None: every GPU reports every field)
        self.null_cols = None if world is None else null_columns(world, plan.node_of_gpu, cfg.gpus_per_node)
        if plan.world is not None:   # counters already high at recording start
            self.gpu_cum.update({c: v.astype(np.float64).copy() for c, v in plan.world.background.gpu_start.items()})
            self.net_cum.update({c: v.astype(np.float64).copy() for c, v in plan.world.background.net_start.items()})
        self.xid = np.zeros(G, np.float32)
        self.alpha = 1.0 - np.exp(-cfg.interval_s / TEMP_TAU_S)
        idle = self.traits.idle_c + plan.temp_offset + plan.node_hot[plan.node_of_gpu]
        self.temp_zi = ((1 - self.alpha) * idle)[None, :].astype(np.float64)
        self.gpu_schema = arrow_schema(RecordType.GPU)
        self.net_schema = arrow_schema(RecordType.NET)
        self.node_dict = pa.array(plan.node_names, pa.string())
        self.uuid_dict = pa.array(plan.gpu_uuids, pa.string())
        self.pci_dict = pa.array([f"00000000:{_pci_bus(g):02X}:00.0" for g in range(plan.cfg.gpus_per_node)],
                                 pa.string())  # NVML's form of the bus id the XID lines name
        resets = [(t, n, False) for t, n in plan.reboots]
        resets += [(i.repair, i.node, i.variant == "remap_failure") for i in plan.incidents
                   if i.fault is not FaultClass.APP_ERROR and i.repair < cfg.n_ticks]
        self.resets = sorted(resets)

    def chunks(self) -> Iterator[SimChunk]:
        cfg = self.plan.cfg
        for k, a in enumerate(range(0, cfg.n_ticks, cfg.chunk_ticks)):
            yield self.render(a, min(a + cfg.chunk_ticks, cfg.n_ticks), np.random.default_rng([cfg.seed, k, 1]))

    def render(self, a: int, b: int, rng: np.random.Generator) -> SimChunk:
        plan, cfg = self.plan, self.plan.cfg
        ch = Chunk(plan, a, b)
        for inc in plan.incidents:
            if inc.precursor_start() < b and max(inc.repair, inc.failure + 1) > a:
                EFFECTS[inc.fault](ch, inc)
        wp = plan.world
        if wp is not None:
            apply_background(ch, wp.background)
            self._power_brakes(ch)
        tr = self.traits
        n, G, dt = ch.n, ch.G, cfg.interval_s
        nog = plan.node_of_gpu
        if wp is None:
            level = np.where(plan.job_active[a:b], np.where(plan.checkpoint[a:b], 0.2, 1.0), 0.0).astype(np.float32)
        else:
            level = wp.level[a:b]
        load = level[:, nog]
        if wp is not None and wp.gpu_occupancy is not None:
            load = np.where(wp.gpu_occupancy[a:b], load, np.float32(0))
        busy = load > 0
        noise = rng.standard_normal((5, n, G), dtype=np.float32)
        util = np.where(busy, np.clip(95 * load * ch.util_factor + 2 * noise[0], 0, 100), 0).astype(np.float32)
        util_mem = np.where(busy, np.clip(55 * load * ch.util_factor + 3 * noise[1], 0, 100), 0).astype(np.float32)
        power = ((tr.idle_power_w + load * (tr.busy_power_w + plan.power_offset)) * ch.power_factor
                 + 10 * noise[2]).clip(50, tr.power_limit_w)
        capped = busy & (load > 0.5) & (rng.random((n, G)) < tr.power_cap_frac)
        power = np.where(capped, tr.power_limit_w - 1.0, power).astype(np.float32)
        target = tr.idle_c + load * tr.busy_rise_c + plan.temp_offset + plan.node_hot[nog] + ch.temp_add
        temp, self.temp_zi = lfilter([self.alpha], [1.0, self.alpha - 1.0], target, axis=0, zi=self.temp_zi)
        temp = (temp + 0.4 * noise[3]).astype(np.float32)
        thr = ch.throttle
        thr |= np.where(~busy, GPU_IDLE_BIT, 0) | np.where(capped, THROTTLE_SW_POWER_CAP, 0)
        thr |= np.where(temp > tr.sw_thermal_c, THROTTLE_SW_THERMAL, 0)
        thr |= np.where(temp > tr.hw_thermal_c, THROTTLE_HW_THERMAL | THROTTLE_HW_SLOWDOWN, 0)
        tfac = np.where(temp > tr.hw_thermal_c, 0.55, np.where(temp > tr.sw_thermal_c, 0.85, 1.0))
        if wp is not None:   # a drawn world's GPU at its power limit lowers its clock to hold it (DVFS)
            tfac = tfac * np.where(capped, np.random.default_rng([cfg.seed, a, 5]).uniform(
                *CAPPED_CLOCK_FACTOR, (n, G)), 1.0)
        clock = (np.where(busy, tr.max_sm_clock_mhz, tr.idle_sm_clock_mhz) * ch.clock_factor * tfac
                 + 3 * noise[4]).round().astype(np.float32)
        fb = np.where(busy, tr.fb_busy_mib + plan.power_offset * 10, 0.0).astype(np.float32)
        cols: dict[str, Any] = {
            "util_gpu": util, "util_mem": util_mem, "fb_used_mib": fb,
            "fb_free_mib": (tr.fb_total_mib - fb).astype(np.float32),
            "temp_gpu_c": temp, "temp_mem_c": temp + np.float32(6.0), "power_w": power,
            "power_limit_w": np.broadcast_to(np.float32(tr.power_limit_w), (n, G)), "sm_clock_mhz": clock,
            "mem_clock_mhz": np.broadcast_to(np.float32(tr.mem_clock_mhz), (n, G)), "throttle_reasons": thr,
        }
        cols.update(ch.g)
        # counters: steady confounder rates, fault rates, violation time, then Poisson
        dt_h = dt / 3600
        ch.rate("ecc_sbe_vol")[:] += plan.sbe_rate_per_h * dt_h
        ch.rate("pcie_replay")[:] += plan.pcie_rate_per_h * dt_h
        ch.inc("thermal_violation_us")[:] += ((thr & (THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL)) > 0) * dt * 1e6
        ch.inc("power_violation_us")[:] += ((thr & (THROTTLE_SW_POWER_CAP | 0x80)) > 0) * dt * 1e6 * 0.6
        for name, r in ch._rate.items():
            hit = np.nonzero(r.any(axis=0))[0]
            if hit.size:
                ch.inc(name)[:, hit] += rng.poisson(r[:, hit])
        for vol, agg in (("ecc_sbe_vol", "ecc_sbe_agg"), ("ecc_dbe_vol", "ecc_dbe_agg")):
            if vol in ch._inc:
                ch.inc(agg)[:] += ch._inc[vol]
        resets = [(t - a, nd, rep) for t, nd, rep in self.resets if a <= t < b]
        k = cfg.gpus_per_node
        for name in GPU_COUNTERS:
            cols[name] = self._cumulate(ch._inc.get(name), self.gpu_cum, name, resets, k, (n, G))
        cols["xid_last"] = self._xid(ch, resets)
        events = [self._event_dict(t, col, code, msg) for t, col, code, msg, _ in sorted(ch.events, key=lambda e: e[0])
                  if not ch.dark[t - a, col // k]]
        if plan.bmc is not None:
            events = sorted(events + render_bmc(plan, plan.bmc, a, b, level), key=lambda e: e["ts"])
        if wp is not None:
            return self._world_chunk(ch, rng, cols, level, resets, events)
        # each node's agent samples at its own phase (+ a little noise); phases increase with the
        # node index, so rows (tick-major, node-major) come out already sorted by ts
        span = min(0.5, dt / 4)
        phase = np.arange(cfg.nodes) * (span / cfg.nodes)
        jitter = phase + rng.uniform(0, 0.9 * span / cfg.nodes, (n, cfg.nodes))
        ts_node = cfg.start_ts + np.arange(a, b)[:, None] * dt + jitter
        gpu_tbl = self._gpu_table(ts_node, cols, ch.missing)
        net_tbl = self._net_table(ch, rng, ts_node, level, resets)
        return SimChunk(gpu_tbl, net_tbl, events)

    @staticmethod
    def _cumulate(inc: np.ndarray | None, carry: dict[str, np.ndarray], name: str,
                  resets: list[tuple[int, int, bool]], width: int, shape: tuple[int, int],
                  only_volatile: bool = True) -> np.ndarray:
        """Counter values from increments, continuing *carry*; a reboot sets a node's back to 0."""
        if inc is None and not resets:
            cum = np.broadcast_to(carry[name], shape)  # unchanged all chunk: no cumsum needed
            return cum
        cum = carry[name] + (np.cumsum(inc, axis=0) if inc is not None else np.zeros(shape))
        for r, nd, replaced in resets:
            if not only_volatile or name in VOLATILE_GPU or replaced:
                sl = slice(nd * width, (nd + 1) * width)
                cum[r:, sl] -= cum[r - 1, sl] if r > 0 else carry[name][sl]
        carry[name] = cum[-1].copy()
        return cum

    def _world_chunk(self, ch: Chunk, rng: np.random.Generator, cols: dict[str, Any], level: np.ndarray,
                     resets: list[tuple[int, int, bool]], events: list[dict[str, Any]]) -> SimChunk:
        """A drawn world's chunk: each node's own sample ticks, skew and jitter, null fields, late rows."""
        plan, cfg = self.plan, self.plan.cfg
        wp, world = plan.world, cfg.world
        assert wp is not None and world is not None  # only called in a drawn world
        nog = plan.node_of_gpu
        ts_node = timestamps(world, cfg.start_ts, ch.a, ch.b, rng)
        lit = ~ch.dark
        gpu_tbl = self._gpu_table(ts_node, cols, ch.missing, keep=(wp.gpu_sampled[ch.a:ch.b] & lit)[:, nog],
                                  null_cols=self.null_cols)
        nop = np.repeat(np.arange(cfg.nodes), cfg.ports_per_node)
        net_tbl = self._net_table(ch, rng, ts_node, level, resets, keep=(wp.port_sampled[ch.a:ch.b] & lit)[:, nop])
        frac = world.rates["late_row_frac"]
        order = late_order(gpu_tbl.num_rows, frac, rng)
        gpu_tbl = gpu_tbl if order is None else gpu_tbl.take(pa.array(order))
        order = late_order(net_tbl.num_rows, frac, rng)
        net_tbl = net_tbl if order is None else net_tbl.take(pa.array(order))
        index = {name: i for i, name in enumerate(plan.node_names)}
        for ev in events:   # the kernel log is stamped by the node's own clock
            ev["ts"] = round(ev["ts"] + world.skew_s[index[ev["node"]]], 3)
        return SimChunk(gpu_tbl, net_tbl, events)

    def _power_brakes(self, ch: Chunk) -> None:
        """Rack-wide HW power brake on healthy nodes for a few minutes."""
        wp, k = self.plan.world, self.plan.cfg.gpus_per_node
        for a, b, nodes in wp.brakes if wp is not None else ():
            lo, hi = max(a, ch.a) - ch.a, min(b, ch.b) - ch.a
            if hi <= lo:
                continue
            for nd in nodes:
                sl = slice(nd * k, (nd + 1) * k)
                ch.throttle[lo:hi, sl] |= THROTTLE_HW_POWER_BRAKE | THROTTLE_HW_SLOWDOWN
                ch.power_factor[lo:hi, sl] *= 0.5
                ch.clock_factor[lo:hi, sl] *= 0.6

    def _xid(self, ch: Chunk, resets: list[tuple[int, int, bool]]) -> np.ndarray:
        xid = np.broadcast_to(self.xid, (ch.n, ch.G)).copy()
        k = self.plan.cfg.gpus_per_node
        changes = [(t - ch.a, 1, col, code) for t, col, code, _, _ in ch.events]
        changes += [(r, 0, nd, 0) for r, nd, _ in resets]
        for t, kind, who, code in sorted(changes):
            if kind:
                xid[t:, who] = code
            else:
                xid[t:, who * k:(who + 1) * k] = 0
        self.xid = xid[-1].copy()
        return xid

    def _event_dict(self, tick: int, col: int, code: int, msg: str) -> dict[str, Any]:
        plan, cfg = self.plan, self.plan.cfg
        node, gpu = divmod(col, cfg.gpus_per_node)
        pci = f"0000:{_pci_bus(gpu):02x}:00"  # the kernel's form; GPU samples carry NVML's
        ts = round(cfg.start_ts + tick * cfg.interval_s + 0.25, 3)
        line = f"NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python3, {msg}"
        return {"ts": ts, "node": plan.node_names[node], "gpu": gpu, "source": "kmsg", "kind": "xid",
                "code": code, "pci_bus_id": pci, "message": line}

    def _gpu_table(self, ts_node: np.ndarray, cols: dict[str, Any], missing: np.ndarray,
                   keep: np.ndarray | None = None, null_cols: dict[str, np.ndarray] | None = None) -> pa.Table:
        """GPU rows; *keep* (n, G) selects the sampled ones, *null_cols* maps a column to GPUs (G,) lacking it."""
        plan, cfg = self.plan, self.plan.cfg
        n, G = missing.shape
        nog = plan.node_of_gpu
        sel = None if keep is None else np.flatnonzero(keep.ravel())
        pick = (lambda v: v) if sel is None else (lambda v: v[sel])  # noqa: E731
        arrays: dict[str, pa.Array] = {
            "ts": pa.array(pick(ts_node[:, nog].ravel())),
            "node": _dict_col(pick(np.broadcast_to(nog, (n, G)).ravel()), self.node_dict),
            "gpu": pa.array(pick(np.broadcast_to(np.arange(G) % cfg.gpus_per_node, (n, G)).ravel().astype(np.int16))),
            "gpu_uuid": _dict_col(pick(np.broadcast_to(np.arange(G), (n, G)).ravel()), self.uuid_dict),
            "pci_bus_id": _dict_col(pick(np.broadcast_to(np.arange(G) % cfg.gpus_per_node, (n, G)).ravel()), self.pci_dict),
        }
        any_missing = missing.any()
        flat_missing = pick(missing.ravel()) if any_missing else None
        for f in self.gpu_schema:
            if f.name in arrays:
                continue
            v = pick(np.asarray(cols[f.name]).ravel())
            mask = flat_missing
            if null_cols is not None and f.name in null_cols:
                absent = pick(np.broadcast_to(null_cols[f.name], (n, G)).ravel())
                mask = absent if mask is None else (mask | absent)
            if mask is not None:
                arrays[f.name] = pa.array(v, mask=mask).cast(f.type)
            else:
                arrays[f.name] = pa.array(v).cast(f.type)
        return pa.Table.from_pydict(arrays, schema=self.gpu_schema)

    def _net_table(self, ch: Chunk, rng: np.random.Generator, ts_node: np.ndarray, level: np.ndarray,
                   resets: list[tuple[int, int, bool]], keep: np.ndarray | None = None) -> pa.Table:
        """Port rows; *keep* (n, NP) selects the sampled ones and makes error counters stick at their width."""
        cfg, plan = self.plan.cfg, self.plan
        P, NP, n, dt = cfg.ports_per_node, ch.NP, ch.n, cfg.interval_s
        nop = np.repeat(np.arange(cfg.nodes), P)
        up = ~ch.link_down
        act = (level[:, nop] > 0) & up
        words_per_s = 12.5e9 if self.port_gbps is None else self.port_gbps * 12.5e9 / 400.0
        words = np.where(act, words_per_s * dt * rng.uniform(0.1, 0.3, (n, NP)) * level[:, nop], 0.0)
        words_rx = words * rng.uniform(0.9, 1.1, (n, NP))
        inc = {
            "port_xmit_data": words.round(), "port_rcv_data": words_rx.round(),
            "port_xmit_packets": (words / 1024).round(), "port_rcv_packets": (words_rx / 1024).round(),
            "port_xmit_wait": np.where(up, act * 2e3 * dt + plan.congestion[ch.a:ch.b][:, nop] * 4e6 * dt, 0.0).round(),
        }
        ch.net_rate("symbol_error")[:] += plan.port_symbol_rate_per_h * dt / 3600
        for name in _ERR_COUNTERS:
            v = ch._net_inc.get(name)
            r = ch._net_rate.get(name)
            if r is not None:
                hit = np.nonzero(r.any(axis=0))[0]
                if hit.size:
                    v = np.zeros((n, NP)) if v is None else v
                    v[:, hit] += rng.poisson(r[:, hit])
            if v is not None:
                inc[name] = v
        sel = None if keep is None else np.flatnonzero(keep.ravel())
        pick = (lambda v: v) if sel is None else (lambda v: v[sel])  # noqa: E731
        cols = {}
        for name in IB_COUNTERS:
            cum = self._cumulate(inc.get(name), self.net_cum, name, resets, P, (n, NP), only_volatile=False)
            if keep is not None:
                cum = saturate_ib(name, cum)
                if self.wrap_ports is not None and name in _DATA_32BIT:
                    cum = np.where(self.wrap_ports, np.mod(cum, 2.0 ** 32), cum)
            cols[name] = pa.array(pick(cum.ravel()))
        down = pick(ch.link_down.ravel().astype(np.int8))
        rows = down.size
        devs = pa.array([f"mlx5_{p}" for p in range(P)], pa.string())
        arrays = {
            "ts": pa.array(pick(ts_node[:, nop].ravel())),
            "node": _dict_col(pick(np.broadcast_to(nop, (n, NP)).ravel()), self.node_dict),
            "device": _dict_col(pick(np.broadcast_to(np.arange(NP) % P, (n, NP)).ravel()), devs),
            "port": pa.array(np.ones(rows, np.int16)),
            "link_state": _dict_col(down, pa.array(["ACTIVE", "DOWN"])),
            "phys_state": _dict_col(down, pa.array(["LinkUp", "Polling"])),
            "rate_gbps": pa.array(np.full(rows, 400.0, np.float32) if self.port_gbps is None else pick(
                np.broadcast_to(self.port_gbps, (n, NP)).ravel())),
        }
        arrays.update(cols)
        return pa.Table.from_pydict(arrays, schema=self.net_schema)


def _pci_bus(gpu: int) -> int:
    """PCI bus number of GPU *gpu* of a simulated node (one GPU every 0x20 buses, as on HGX boards)."""
    return 0x18 + 0x20 * gpu


def _dict_col(codes: np.ndarray, dictionary: pa.Array) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), dictionary).cast(pa.string())


def null_columns(world: World, node_of_gpu: np.ndarray, gpus_per_node: int) -> dict[str, np.ndarray] | None:
    """Which GPUs (G,) lack each column: a node on dcgm-exporter's defaults lacks
    EXPORTER_DEFAULT_MISSING; a GPU in a world's ``unsupported`` masks lacks that group's columns."""
    dflt = np.array(world.exporter_default)
    out = {name: dflt[node_of_gpu] for name in EXPORTER_DEFAULT_MISSING} if dflt.any() else {}
    local = np.arange(len(node_of_gpu)) % gpus_per_node
    for group, masks in world.unsupported.items():
        # a mask holds MASK_GPUS bits, so shifting by MASK_GPUS reads 0: GPUs past it report everything
        lacks = ((np.array(masks, np.int64)[node_of_gpu] >> np.minimum(local, MASK_GPUS)) & 1).astype(bool)
        if lacks.any():
            for name in UNSUPPORTED_FIELDS[group]:
                out[name] = out[name] | lacks if name in out else lacks
    return out or None
