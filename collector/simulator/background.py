"""Benign background on healthy parts: what real fleets show every day and never fail on.

Per part, zero-inflated and heavy-tailed: most GPUs and ports log nothing, a few trickle
steadily (lognormal rates around the world's median), a chronic card or two trickles
hard, and rare bursts come and go: SBE bursts (half of them tailing off over hours) with a
row remap left pending until the GPU is reset, IB error bursts, link flaps that recover,
informational XIDs 63/92 and application XIDs; and *rises*: a healthy part's SBE, PCIe replay, NVLink CRC or IB error
rate goes up mid-recording for hours and comes back down, so a sustained rise against a
part's own rate is not, by itself, a precursor. Counters already carry history at recording start (aggregate ECC,
remapped rows, IB counters, some stuck at their width). None of it is an incident.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .ranges import IB_COUNTER_BITS
from .world import World, log_uniform

if TYPE_CHECKING:
    from .generate import Chunk

#: IB error counters that trickle on healthy ports (issue 8: a healthy H100 node).
IB_TRICKLE = ("port_rcv_errors", "symbol_error", "excessive_buffer_overrun_errors", "link_error_recovery")
#: share of a noisy port's rate each trickling counter gets (rcv errors and symbol errors dominate) (D)
IB_TRICKLE_SHARE = {"port_rcv_errors": 1.0, "symbol_error": 0.6, "excessive_buffer_overrun_errors": 0.05,
                    "link_error_recovery": 0.01}
REMAP_MESSAGE = "Row Remapper: New row marked for remapping, reset gpu to activate."
SBE_RATE_MESSAGE = "High single-bit ECC error rate"
#: Corrected errors per hour at which the simulated driver logs XID 92 ("excessive SBE interrupts",
#: IGNORE): the least rate of a benign burst (100 SBE in 30 min), which logs it at its onset, so a
#: failing HBM's precursor logs it too once its errors come as fast. NVIDIA publishes no trigger;
#: what matters is that it follows the rate, not the cause (D).
SBE_XID92_PER_H = 200.0
SBE_LOG_SD = 1.5       # heavy tail of per-GPU SBE rates, log units (FR §2 SBE: 98 % from a few cards)
TRICKLE_LOG_SD = 1.0   # spread of PCIe/NVLink/IB trickle rates around the world's median, log units (D)
NVLINK_DATA_SHARE = 0.05  # NVLink data CRC errors per flit CRC error on a healthy link (D)


@dataclass
class Episode:
    """A benign burst on one part over ticks [a, b)."""

    kind: str            # "sbe_burst", "ib_burst", "flap", "app_xid", "info_xid", "rise"
    part: int            # GPU column or port column
    a: int
    b: int
    per_tick: float = 0.0
    remap: bool = False
    pending_until: int = 0
    code: int = 0
    counter: str = ""    # a rise's GPU counter ("" on a port: the IB trickle counters)
    tau_ticks: float = 0.0   # an SBE burst's decay time constant in ticks (0: flat until b)


@dataclass
class Background:
    """Per-part background rates, episodes and counter values at recording start."""

    sbe_per_h: np.ndarray                 # (G,)
    pcie_per_min: np.ndarray              # (G,)
    nvlink_per_min: np.ndarray            # (G,)
    ib_per_h: np.ndarray                  # (NP,)
    episodes: list[Episode]
    gpu_start: dict[str, np.ndarray] = field(default_factory=dict)   # counter -> (G,)
    net_start: dict[str, np.ndarray] = field(default_factory=dict)   # counter -> (NP,)


def _trickle(rng: np.random.Generator, n: int, frac: float, median: float, sd: float) -> np.ndarray:
    on = rng.random(n) < frac
    return np.where(on, median * np.exp(rng.normal(0.0, sd, n)), 0.0)


def draw_background(world: World, rng: np.random.Generator, *, n_ticks: int, dt: float, gpus_per_node: int,
                    ports_per_node: int, app_codes: tuple[int, ...]) -> Background:
    """Draw every healthy part's background for one recording."""
    N = len(world.node_interval_s)
    G, NP = N * gpus_per_node, N * ports_per_node
    r = world.rates
    sbe = _trickle(rng, G, r["sbe_gpu_frac"], r["sbe_rate_per_h"], SBE_LOG_SD)
    chronic = rng.choice(G, size=min(G, int(r["chronic_sbe_cards"])), replace=False)
    sbe[chronic] = rng.uniform(20, 200, chronic.size)
    pcie = _trickle(rng, G, r["pcie_gpu_frac"], r["pcie_rate_per_min"], TRICKLE_LOG_SD)
    pcie = np.minimum(pcie, world.ranges.pcie_cap_per_min)
    nvl = _trickle(rng, G, r["nvlink_gpu_frac"], r["nvlink_rate_per_min"], TRICKLE_LOG_SD)
    ib = _trickle(rng, NP, r["ib_noisy_port_frac"], r["ib_rate_per_h"], TRICKLE_LOG_SD)
    ib = np.minimum(ib, world.ranges.ib_cap_per_h)
    days = n_ticks * dt / 86400
    eps: list[Episode] = []

    def spans(rate_per_part_day: float, parts: int, lo_s: float, hi_s: float) -> list[tuple[int, int, int]]:
        k = rng.poisson(rate_per_part_day * parts * days)
        out = []
        for _ in range(k):
            a = int(rng.integers(0, n_ticks))
            out.append((int(rng.integers(0, parts)), a, min(n_ticks, a + max(1, int(rng.uniform(lo_s, hi_s) / dt)))))
        return out

    shapes = np.random.default_rng([world.seed, 0x5BE])    # burst shapes: the other draws stay as they were
    for part, a, b in spans(r["sbe_burst_per_gpu_day"], G, 60, 1800):
        total = float(np.exp(rng.uniform(np.log(100), np.log(5000))))
        remap = bool(rng.random() < 0.5)
        pend = min(n_ticks, b + int(rng.uniform(3600, 12 * 3600) / dt)) if remap else 0
        per_tick = total / max(b - a, 1)
        tau = 0.0
        if shapes.random() < world.ranges.sbe_burst_decay_frac:
            # the same count, tailing off: e^(-t/tau) for 4 tau carries 98 % of tau x the onset rate
            tau = max(1.0, log_uniform(shapes, world.ranges.sbe_burst_tau_s) / dt)
            b, per_tick = min(n_ticks, a + max(1, int(4 * tau))), total / tau
            pend = max(pend, b) if remap else 0
        eps.append(Episode("sbe_burst", part, a, b, per_tick, remap, pend, tau_ticks=tau))
    for part, a, b in spans(r["ib_burst_per_port_day"], NP, 60, 900):
        total = float(np.exp(rng.uniform(np.log(20), np.log(3000))))
        eps.append(Episode("ib_burst", part, a, b, total / max(b - a, 1)))
    for part, a, b in spans(r["link_flap_per_port_day"], NP, *world.ranges.flap_s):
        eps.append(Episode("flap", part, a, b))
    for part, a, _ in spans(r["app_xid_per_gpu_day"], G, 1, 1):
        eps.append(Episode("app_xid", part, a, a + 1, code=int(app_codes[int(rng.integers(0, len(app_codes)))])))
    for part, a, _ in spans(r["info_xid_per_gpu_day"], G, 1, 1):
        eps.append(Episode("info_xid", part, a, a + 1, code=int(rng.choice([63, 92]))))
    eps += _rises(world, n_ticks=n_ticks, dt=dt, gpus=G, ports=NP)
    bg = Background(sbe, pcie, nvl, ib, eps)
    _legacy(bg, world, rng, G, NP, ports_per_node)
    return bg


#: GPU counter of a rise, its range field and the unit of that range, in seconds
_RISE_GPU = (("ecc_sbe_vol", "rise_sbe_per_h", 3600.0), ("pcie_replay", "rise_pcie_per_min", 60.0),
             ("nvlink_crc_flit_err", "rise_nvlink_per_min", 60.0))


def _rises(world: World, *, n_ticks: int, dt: float, gpus: int, ports: int) -> list[Episode]:
    """Benign sustained rises (ranges.py ``rise_*``), from their own random stream: a seed's
    other background is the same with or without them."""
    rng = np.random.default_rng([world.seed, 0x7153])
    r, rg = world.rates, world.ranges
    days = n_ticks * dt / 86400
    out: list[Episode] = []
    for is_port, per_day, parts in ((False, r["rise_per_gpu_day"], gpus),
                                    (True, r["rise_per_port_day"], ports)):
        for _ in range(rng.poisson(per_day * parts * days)):
            a = int(rng.integers(0, n_ticks))
            b = min(n_ticks, a + max(1, int(log_uniform(rng, rg.rise_s) / dt)))
            part = int(rng.integers(0, parts))
            if is_port:
                out.append(Episode("rise", part, a, b, log_uniform(rng, rg.rise_ib_per_h) * dt / 3600))
            else:
                counter, field_, unit_s = _RISE_GPU[int(rng.integers(0, len(_RISE_GPU)))]
                per_tick = log_uniform(rng, getattr(rg, field_)) * dt / unit_s
                out.append(Episode("rise", part, a, b, per_tick, counter=counter))
    return out


def _legacy(bg: Background, world: World, rng: np.random.Generator, G: int, NP: int, ports_per_node: int) -> None:
    """Counter values at recording start: years of history on some parts, time since driver load on all."""
    r = world.rates
    old = rng.random(G) < r["legacy_gpu_frac"]
    logn = lambda lo, hi, n: np.exp(rng.uniform(np.log(lo), np.log(hi), n))  # noqa: E731
    s = bg.gpu_start
    s["ecc_sbe_agg"] = np.where(old, np.round(logn(1, 2e6, G)), 0.0)
    s["ecc_dbe_agg"] = np.where(old & (rng.random(G) < 0.05), rng.integers(1, 4, G), 0).astype(float)
    s["remapped_rows_corr"] = np.where(old & (rng.random(G) < 0.5), rng.integers(1, 9, G), 0).astype(float)
    s["remapped_rows_uncorr"] = np.where(old & (rng.random(G) < 0.1), rng.integers(1, 3, G), 0).astype(float)
    s["retired_pages_sbe"] = np.where(old & (rng.random(G) < 0.05), rng.integers(1, 6, G), 0).astype(float)
    s["retired_pages_dbe"] = np.where(old & (rng.random(G) < 0.02), rng.integers(1, 3, G), 0).astype(float)
    # volatile counters hold what accrued since the driver last loaded (hours to weeks)
    since = rng.uniform(0.05, 1.0, G)
    s["thermal_violation_us"] = np.round(since * rng.uniform(0, 5e8, G))
    s["power_violation_us"] = np.round(since * rng.uniform(0, 5e9, G))
    s["ecc_sbe_vol"] = np.round(np.minimum(s["ecc_sbe_agg"], bg.sbe_per_h * since * 24 * 7))
    s["pcie_replay"] = np.round(bg.pcie_per_min * since * 60 * 24 * 7)
    s["nvlink_crc_flit_err"] = np.round(bg.nvlink_per_min * since * 60 * 24 * 7)
    # IB history is a node's: its HCAs share a cable plant and an uptime (a healthy H100 node read
    # excessive_buffer_overrun_errors = 15 on all 9 HCAs and link_downed = 255 on one; issue 8)
    n = bg.net_start
    N = NP // ports_per_node
    node_old = rng.random(N) < r["legacy_port_frac"]
    legacy = np.repeat(node_old, ports_per_node) & (rng.random(NP) < 0.85)
    node_stuck = node_old & (rng.random(N) < r["saturated_port_frac"])
    for name in IB_TRICKLE + ("link_downed", "port_rcv_remote_physical_errors", "local_link_integrity_errors"):
        top = float(2 ** IB_COUNTER_BITS[name] - 1)
        level = np.repeat(logn(1, top, N), ports_per_node) * rng.uniform(0.3, 1.5, NP)
        v = np.where(legacy & (rng.random(NP) < 0.6), np.minimum(np.round(level), top), 0.0)
        all_ports = np.repeat(node_stuck & (rng.random(N) < 0.4), ports_per_node)
        one_port = np.zeros(NP, bool)
        for nd in np.flatnonzero(node_stuck & (rng.random(N) < 0.3)):
            one_port[nd * ports_per_node + int(rng.integers(0, ports_per_node))] = True
        n[name] = np.where(all_ports | one_port, top, v)
    n["port_xmit_wait"] = np.round(rng.uniform(0, 1e12, NP))


def apply_background(ch: "Chunk", bg: Background) -> None:
    """Render rates and the episodes overlapping this chunk into *ch*."""
    dt = ch.dt
    if bg.sbe_per_h.any():
        ch.rate("ecc_sbe_vol")[:] += bg.sbe_per_h * dt / 3600
    if bg.pcie_per_min.any():
        ch.rate("pcie_replay")[:] += bg.pcie_per_min * dt / 60
    if bg.nvlink_per_min.any():
        ch.rate("nvlink_crc_flit_err")[:] += bg.nvlink_per_min * dt / 60
        ch.rate("nvlink_crc_data_err")[:] += bg.nvlink_per_min * NVLINK_DATA_SHARE * dt / 60
    if bg.ib_per_h.any():
        for name, share in IB_TRICKLE_SHARE.items():
            ch.net_rate(name)[:] += bg.ib_per_h * share * dt / 3600
    for e in bg.episodes:
        end = max(e.b, e.pending_until)
        if e.a >= ch.b or end <= ch.a:
            continue
        lo, hi = max(e.a, ch.a) - ch.a, max(min(e.b, ch.b) - ch.a, 0)
        at = e.a - ch.a if ch.a <= e.a < ch.b else None
        if e.kind == "sbe_burst":
            if hi > lo:
                ch.rate("ecc_sbe_vol")[lo:hi, e.part] += e.per_tick if not e.tau_ticks else \
                    e.per_tick * np.exp(-(np.arange(ch.a + lo, ch.a + hi) - e.a) / e.tau_ticks)
            if at is not None:
                ch.bg_event(at, e.part, 92, SBE_RATE_MESSAGE)
            if e.remap:
                # a flat burst remaps its row half-way; a tailing one near its onset, where its errors are
                r = e.a + max(1, (e.b - e.a) // 2 if not e.tau_ticks else int(e.tau_ticks // 2))
                if ch.a <= r < ch.b:
                    ch.inc("remapped_rows_corr")[r - ch.a, e.part] += 1
                    ch.bg_event(r - ch.a, e.part, 63, REMAP_MESSAGE)
                plo, phi = max(r, ch.a) - ch.a, max(min(e.pending_until, ch.b) - ch.a, 0)
                if phi > plo:
                    ch.g["row_remap_pending"][plo:phi, e.part] = 1.0
        elif e.kind == "ib_burst" and hi > lo:
            ch.net_rate("port_rcv_errors")[lo:hi, e.part] += e.per_tick
            ch.net_rate("symbol_error")[lo:hi, e.part] += e.per_tick * 0.5
        elif e.kind == "rise" and hi > lo:
            if e.counter:
                ch.rate(e.counter)[lo:hi, e.part] += e.per_tick
                if e.counter == "nvlink_crc_flit_err":
                    ch.rate("nvlink_crc_data_err")[lo:hi, e.part] += e.per_tick * NVLINK_DATA_SHARE
            else:
                for name, share in IB_TRICKLE_SHARE.items():
                    ch.net_rate(name)[lo:hi, e.part] += e.per_tick * share
        elif e.kind == "flap":
            if hi > lo:
                ch.link_down[lo:hi, e.part] = True
            if at is not None:
                ch.net_inc("link_downed")[at, e.part] += 1
                ch.net_inc("link_error_recovery")[at, e.part] += 1
        elif e.kind in ("app_xid", "info_xid") and at is not None:
            msg = REMAP_MESSAGE if e.code == 63 else \
                SBE_RATE_MESSAGE if e.code == 92 else "Application error"
            ch.bg_event(at, e.part, e.code, msg)


def saturate_ib(name: str, values: np.ndarray) -> np.ndarray:
    """IB PortCounters stick at 2^w - 1 (robust-detection.md §6)."""
    bits = IB_COUNTER_BITS.get(name)
    return values if bits is None else np.minimum(values, float(2 ** bits - 1))

