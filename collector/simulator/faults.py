"""How each fault class shows in telemetry: precursor dynamics and failure signature.

Each effect in :data:`EFFECTS` renders one :class:`~.plan.Incident` into one chunk: it
raises counter *rates* (expected increments per tick, sampled as Poisson later),
adds deterministic increments, changes gauge targets, sets throttle bits and flags,
marks samples missing, and emits kernel-log events. Progress ``p`` runs 0 → 1 over
the precursor phase [onset, failure); the failed phase is [failure, repair).

The signatures follow what the hardware is documented to do (docs/simulator.md):
SBE growth and row remaps before a DBE (XID 48 → 63/64 → 94/95); PCIe replays before
some off-the-bus events (XID 79); NVLink CRC/replay growth before XID 74; symbol
errors and link-error recoveries before an IB link goes down; a node-wide temperature
climb with thermal throttle bits; intermittent power brake, then a node held braking (home
world) or one that goes dark (drawn worlds); a
straggler at reduced clocks with no errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Collection

import numpy as np

from collector.schema import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    FaultClass,
)

from .background import REMAP_MESSAGE, SBE_RATE_MESSAGE, SBE_XID92_PER_H

if TYPE_CHECKING:
    from .generate import Chunk
    from .plan import Incident


def _phases(ch: "Chunk", inc: "Incident") -> tuple[slice, np.ndarray, slice]:
    """Local slices of the precursor and failed phases, and progress over the precursor."""
    pre_a = inc.precursor_start()
    pa, pb = max(pre_a, ch.a) - ch.a, max(min(inc.failure, ch.b) - ch.a, max(pre_a, ch.a) - ch.a)
    ticks = np.arange(ch.a + pa, ch.a + pb)
    span = max(inc.failure - pre_a, 1)
    p = ((ticks - pre_a) / span).astype(np.float64)
    fa, fb = max(inc.failure, ch.a) - ch.a, max(min(inc.repair, ch.b) - ch.a, max(inc.failure, ch.a) - ch.a)
    return slice(pa, pb), p, slice(fa, fb)


def _at_failure(ch: "Chunk", inc: "Incident") -> int | None:
    """Local index of the failure tick if it falls in this chunk."""
    return inc.failure - ch.a if ch.a <= inc.failure < ch.b else None


def _ramp(p: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Exponential growth from *lo* to *hi* per tick as p goes 0 → 1."""
    return lo * np.exp(p * np.log(hi / lo))


def _gate(inc: "Incident", p: np.ndarray) -> np.ndarray | float:
    """A drawn world's magnitude and on/off intermittency over progress *p* (1 in the home world)."""
    m = inc.params.get("magnitude")
    if m is None:
        return 1.0
    return m * _on(inc, p)


def _on(inc: "Incident", p: np.ndarray) -> np.ndarray | float:
    """1 where an intermittent precursor is on at progress *p*, else 0 (1 when not intermittent)."""
    pattern = inc.params.get("on_pattern")
    if pattern is None:
        return 1.0
    seg = np.minimum((p * len(pattern)).astype(np.int64), len(pattern) - 1)
    return np.asarray(pattern, np.float64)[seg]


def _grow(inc: "Incident", p: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Precursor rate from *lo* to *hi*: exponential at home; a drawn world picks linear or a step too."""
    shape = inc.params.get("shape")
    if shape is None:
        return _ramp(p, lo, hi)
    if shape == "linear":
        base = lo + (hi - lo) * p
    elif shape == "step":
        base = np.where(p < inc.params["step_at"], lo, 0.5 * hi)
    else:
        base = _ramp(p, lo, hi)
    return base * _gate(inc, p)


def _hbm_sbe_per_h(inc: "Incident", p: np.ndarray) -> np.ndarray:
    """A failing HBM's corrected errors per hour at precursor progress *p*: 3 → 600 (docs/simulator.md)."""
    return _grow(inc, p, 3.0, 600.0)


def _sbe_rate_reached(inc: "Incident", per_h: float) -> int | None:
    """The first tick of *inc*'s precursor whose corrected-error rate is at least *per_h* (None: never)."""
    start = inc.precursor_start()
    ticks = np.arange(start, inc.failure)
    if not len(ticks):
        return None
    rate = _hbm_sbe_per_h(inc, (ticks - start) / max(inc.failure - start, 1))  # progress as _phases gives it
    hit = np.flatnonzero(rate >= per_h)
    return int(ticks[hit[0]]) if len(hit) else None


#: The fields an NVLink fault's precursor renders into (:func:`nvlink`; :func:`first_shown` reads it).
NVLINK_PRECURSOR_FIELDS = ("nvlink_crc_flit_err", "nvlink_crc_data_err", "nvlink_replay_err", "nvlink_recovery_err")
_NVLINK_PRECURSOR = frozenset(NVLINK_PRECURSOR_FIELDS)


def _remap_ticks(inc: "Incident") -> list[int]:
    """The ticks a failing HBM remaps a row (``remap_at``: shares of its precursor), each logging XID 63."""
    start, span = inc.precursor_start(), inc.failure - inc.precursor_start()
    return [start + int(rp * span) for rp in inc.params["remap_at"]]


def first_shown(inc: "Incident", lacks: Collection[str]) -> int | None:
    """The tick *inc*'s first precursor shows in the telemetry of a node that does not export the fields
    *lacks* (spec/recording.md: ``onset_ts`` is when the first precursor appears in telemetry): its onset,
    a later tick, or None when nothing shows before the failure. It reads what the effects below render
    each precursor into, and must change with them:

    * ``nvlink``: the four NVLink error counters and nothing else, so a node without them (dcgm-exporter's
      default counters) shows nothing before XID 74;
    * ``hbm_ecc``: without ``ecc_sbe_vol`` the corrected-error growth is unseen; what shows is the first row
      remap (``remapped_rows_corr`` and the driver's XID 63) or XID 92 at SBE_XID92_PER_H, whichever is first;
    * every other class shows in fields every node sends (GPU power and clocks, temperature, PCIe replays,
      IB port counters).
    """
    if inc.onset is None or not lacks:
        return inc.onset
    if inc.fault is FaultClass.NVLINK and _NVLINK_PRECURSOR.issubset(lacks):
        return None
    if inc.fault is FaultClass.HBM_ECC and "ecc_sbe_vol" in lacks:
        t92 = _sbe_rate_reached(inc, SBE_XID92_PER_H)
        return min(_remap_ticks(inc) + ([] if t92 is None else [t92]))
    return inc.onset


def hbm_ecc(ch: "Chunk", inc: "Incident") -> None:
    g = ch.gpu_col(inc)
    pre, p, failed = _phases(ch, inc)
    dt_h = ch.dt / 3600
    if inc.variant != "sudden" and p.size:
        ch.rate("ecc_sbe_vol")[pre, g] += _hbm_sbe_per_h(inc, p) * dt_h
        # a handful of rows remapped along the way; each stays pending until a GPU reset
        remap_ticks = _remap_ticks(inc)
        for t in remap_ticks:
            if ch.a <= t < ch.b:
                ch.inc("remapped_rows_corr")[t - ch.a, g] += 1
                # the driver logs every row it marks, whatever the cause (a benign burst's remap logs it too)
                ch.event(inc, t - ch.a, 63, REMAP_MESSAGE)
        lo, hi = max(remap_ticks[0], ch.a) - ch.a, min(inc.failure, ch.b) - ch.a
        if hi > lo:
            ch.g["row_remap_pending"][lo:hi, g] = 1.0
        t92 = _sbe_rate_reached(inc, SBE_XID92_PER_H)
        if t92 is not None and ch.a <= t92 < ch.b:  # the driver's "excessive SBE interrupts", whatever the cause
            ch.event(inc, t92 - ch.a, 92, SBE_RATE_MESSAGE)
    f = _at_failure(ch, inc)
    if f is not None:
        ch.inc("ecc_dbe_vol")[f, g] += 2
        ch.inc("remapped_rows_uncorr")[f, g] += 1
        ch.event(inc, f, 48, "DBE (Double Bit Error) ECC Error (0x2)")
        if inc.variant == "remap_failure":
            ch.event(inc, f, 64, "Row Remapper Error: failed to remap row")
            ch.event(inc, f, 95, "Uncontained: SRAM/HBM ECC error. Reset the GPU.")
        else:
            ch.event(inc, f, 63, REMAP_MESSAGE)
            ch.event(inc, f, 94, "Contained: ECC error. RST: No")
    ch.g["row_remap_pending"][failed, g] = 1.0
    if inc.variant == "remap_failure":
        ch.g["row_remap_failure"][failed, g] = 1.0


def gpu_off_bus(ch: "Chunk", inc: "Incident") -> None:
    g = ch.gpu_col(inc)
    pre, p, failed = _phases(ch, inc)
    if inc.variant == "warned" and p.size:
        ch.rate("pcie_replay")[pre, g] += _grow(inc, p, 0.5, 60.0) * ch.dt / 60
        spikes = np.random.default_rng([inc.failure, ch.a]).random(p.size) < 0.15 * (0.3 + p)
        ch.temp_add[pre, g] += np.where(spikes, 12.0, 0.0).astype(np.float32)
    f = _at_failure(ch, inc)
    if f is not None:
        ch.event(inc, f, 79, "GPU has fallen off the bus.")
    ch.missing[failed, g] = True


def nvlink(ch: "Chunk", inc: "Incident") -> None:
    g = ch.gpu_col(inc)
    pre, p, failed = _phases(ch, inc)
    per_min = ch.dt / 60
    flit, data, replay, recovery = NVLINK_PRECURSOR_FIELDS   # first_shown reads the same list
    if inc.variant == "warned" and p.size:
        crc = _grow(inc, p, 5.0, 4000.0) * per_min
        ch.rate(flit)[pre, g] += crc
        ch.rate(data)[pre, g] += crc * 0.1
        ch.rate(replay)[pre, g] += crc * 0.05
        ch.rate(recovery)[pre, g] += 0.6 * p * per_min * _gate(inc, p)
    f = _at_failure(ch, inc)
    if f is not None:
        ch.inc(recovery)[f, g] += 8
        ch.event(inc, f, 74, "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")


def pcie(ch: "Chunk", inc: "Incident") -> None:
    g = ch.gpu_col(inc)
    pre, p, failed = _phases(ch, inc)
    if inc.variant == "warned" and p.size:
        ch.rate("pcie_replay")[pre, g] += _grow(inc, p, 2.0, 600.0) * ch.dt / 60
        ch.util_factor[pre, g] *= (1.0 - 0.35 * np.clip((p - 0.6) / 0.4, 0, 1)).astype(np.float32)
    f = _at_failure(ch, inc)
    if f is not None:
        ch.inc("pcie_replay")[f, g] += 20000
    ch.rate("pcie_replay")[failed, g] += 2000.0 * ch.dt / 60


def fail_slow(ch: "Chunk", inc: "Incident") -> None:
    g = ch.gpu_col(inc)
    pre, p, failed = _phases(ch, inc)
    k = inc.params["clock_factor"]
    if inc.params.get("shape") is not None:   # a drawn world: _drawn_slow
        _drawn_slow(ch, inc, g, pre, p, failed, k)
        return
    for sl in (pre, failed):
        ch.clock_factor[sl, g] *= k
        ch.power_factor[sl, g] *= 0.55 + 0.45 * k
        ch.temp_add[sl, g] -= 6.0
    # the peers of a straggler wait at collectives: their utilisation sags a little
    peers = ch.node_cols(inc)
    ch.util_factor[pre, peers] *= 0.85
    ch.util_factor[pre, g] /= 0.85


def _drawn_slow(ch: "Chunk", inc: "Incident", g: int, pre: slice, p: np.ndarray, failed: slice, k: float) -> None:
    """A drawn world's straggler (clock factor *k* from :data:`.plan.SLOW_FACTOR_DRAWN`): a step
    or a sag that deepens over the first ``step_at`` of the precursor, and only while "on" when
    intermittent. Power and temperature follow the clock deficit."""
    full = 1.0 - k
    ramp = np.ones_like(p) if inc.params["shape"] == "step" else np.clip(p / inc.params["step_at"], 0.0, 1.0)
    d = (full * ramp * _on(inc, p)).astype(np.float32)
    for sl, deficit in ((pre, d), (failed, full)):
        ch.clock_factor[sl, g] *= 1.0 - deficit
        ch.power_factor[sl, g] *= 1.0 - 0.45 * deficit
        ch.temp_add[sl, g] -= 15.0 * deficit
    # the peers of a straggler wait at collectives while it is slow
    peers = ch.node_cols(inc)
    wait = (1.0 - 0.15 * (d > 0)).astype(np.float32)
    ch.util_factor[pre, peers] *= wait[:, None]
    ch.util_factor[pre, g] /= wait


def thermal(ch: "Chunk", inc: "Incident") -> None:
    cols = ch.node_cols(inc)
    pre, p, failed = _phases(ch, inc)
    if p.size:
        climb = 34.0 * (p if inc.variant == "warned" else (p > 0.9) * 1.0)
        ch.temp_add[pre, cols] += climb.astype(np.float32)[:, None]
    ch.temp_add[failed, cols] += 45.0


def power(ch: "Chunk", inc: "Incident") -> None:
    cols = ch.node_cols(inc)
    pre, p, failed = _phases(ch, inc)
    if inc.variant == "warned" and p.size:
        rng = np.random.default_rng([inc.failure, ch.a, 7])
        # the share of samples braking grows to 55 % at home; a drawn world scales it by the incident's
        # magnitude (a supply that lost its redundancy brakes as often as the load outgrows what is left:
        # peak 22-100 %) and switches it off between bursts when intermittent
        brake = rng.random(p.size) < np.clip((0.05 + 0.5 * p) * _gate(inc, p), 0.0, 1.0)
        bits = np.where(brake, THROTTLE_HW_POWER_BRAKE | THROTTLE_HW_SLOWDOWN, 0)
        ch.throttle[pre, cols] |= bits[:, None]
        ch.power_factor[pre, cols] *= np.where(brake, 0.4, 1.0).astype(np.float32)[:, None]
        ch.clock_factor[pre, cols] *= np.where(brake, 0.5, 1.0).astype(np.float32)[:, None]
    if ch.plan.world is not None:
        # a drawn world: the node loses its power and goes dark until repaired (no samples, no kernel
        # log), as a supply failure ends on a real fleet; the home world keeps its older rendering, a node
        # held braking, so its seeds stay comparable across versions
        ch.dark[failed, inc.node] = True
        return
    ch.throttle[failed, cols] |= THROTTLE_HW_POWER_BRAKE | THROTTLE_HW_SLOWDOWN
    ch.power_factor[failed, cols] *= 0.3
    ch.clock_factor[failed, cols] *= 0.3


def ib_link(ch: "Chunk", inc: "Incident") -> None:
    port = inc.node * ch.plan.cfg.ports_per_node + (inc.port or 0)
    pre, p, failed = _phases(ch, inc)
    per_min = ch.dt / 60
    if inc.variant == "warned" and p.size:
        ch.net_rate("symbol_error")[pre, port] += _grow(inc, p, 2.0, 3000.0) * per_min
        ch.net_rate("link_error_recovery")[pre, port] += (0.05 + 1.5 * p) * per_min * _gate(inc, p)
        ch.net_rate("port_rcv_errors")[pre, port] += _grow(inc, p, 0.5, 500.0) * per_min
        ch.net_rate("local_link_integrity_errors")[pre, port] += 0.3 * p * per_min * _gate(inc, p)
    f = _at_failure(ch, inc)
    if f is not None:
        ch.net_inc("link_downed")[f, port] += 1
        ch.net_inc("link_error_recovery")[f, port] += 3
    ch.link_down[failed, port] = True


def app_error(ch: "Chunk", inc: "Incident") -> None:
    f = _at_failure(ch, inc)
    if f is not None:
        ch.event(inc, f, inc.code or 13, {13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)",
                                          31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
                                          43: "Ch 00000010, errorString CTX SWITCH TIMEOUT",
                                          94: "Contained: ECC error. RST: No"}.get(inc.code or 13, "Application error"))


EFFECTS: dict[FaultClass, Callable[["Chunk", "Incident"], None]] = {
    FaultClass.HBM_ECC: hbm_ecc,
    FaultClass.GPU_OFF_BUS: gpu_off_bus,
    FaultClass.NVLINK: nvlink,
    FaultClass.PCIE: pcie,
    FaultClass.FAIL_SLOW: fail_slow,
    FaultClass.THERMAL: thermal,
    FaultClass.POWER: power,
    FaultClass.IB_LINK: ib_link,
    FaultClass.APP_ERROR: app_error,
}
