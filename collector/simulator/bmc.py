"""A simulated node's BMC: sensor readings every minute and SEL entries, as the ``ipmi`` source gives them.

Power and cooling faults show in the BMC before (or without) any GPU counter: a power
supply asserts *Predictive failure*, then *Failure detected*, while its share of the
node's load drifts away; a fan slows and stalls (*Lower Critical going low*); the inlet
air warms past the BMC's upper critical threshold. Every event has the exact shape of
:func:`collector.sources.bmc_common.sensor_event` and ``IpmiSource.sel_event``.

Healthy nodes report five sensors (``Inlet Temp``, ``FAN1``, ``FAN2``, ``PSU1/PSU2 Input
Power``) once a minute (``SimConfig.bmc_sensor_period_s``) — not every sample: ~5 events per
node-minute — with sensor noise
and the BMC's resolution (1 °C, 100 RPM, 1 W), and a rare benign SEL background: a fan
crossing its *lower non-critical* threshold for a minute or two (assert, then deassert)
and an inlet crossing its *upper non-critical* one on a warm afternoon. Neither is a
failure class of :mod:`collector.bmc_events`.

Everything random is drawn up front (:func:`plan_bmc`) from its own stream, and sensor
noise per reading minute from a stream of its own: the GPU and port rows of a seed do not
move when BMC events are switched on (``SimConfig.bmc``), and chunk sizes change nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from collector.schema import FaultClass
from collector.sources.base import Record
from collector.sources.bmc_common import sensor_event

if TYPE_CHECKING:
    from .plan import FleetPlan, Incident

_STREAM = 0xB3C

#: (name, sensor type, unit, thresholds): an HGX-class 8-GPU node as ``ipmitool sensor`` shows it
SENSORS: tuple[tuple[str, str, str, dict[str, float | None]], ...] = (
    ("Inlet Temp", "temperature", "degrees C",
     {"lower_critical": 0.0, "lower_noncritical": 5.0, "upper_noncritical": 40.0, "upper_critical": 45.0,
      "upper_fatal": 50.0}),
    ("FAN1", "fan", "RPM", {"lower_critical": 1000.0, "lower_noncritical": 1600.0}),
    ("FAN2", "fan", "RPM", {"lower_critical": 1000.0, "lower_noncritical": 1600.0}),
    ("PSU1 Input Power", "power_supply", "Watts", {"upper_noncritical": 3800.0, "upper_critical": 4000.0}),
    ("PSU2 Input Power", "power_supply", "Watts", {"upper_noncritical": 3800.0, "upper_critical": 4000.0}),
)
_INLET, _FAN, _PSU = 0, (1, 2), (3, 4)
_RESOLUTION = np.array([1.0, 100.0, 100.0, 1.0, 1.0])
#: node input power: idle, and added at full load (8 GPUs at ~700 W plus the host), W
NODE_IDLE_W, NODE_BUSY_W = 1300.0, 5600.0
#: benign SEL background per node-day: a fan's lower non-critical blip, an inlet's upper non-critical one
FAN_BLIP_PER_NODE_DAY, INLET_BLIP_PER_NODE_DAY = 0.3, 0.05
#: share of warned power incidents whose PSU asserts Predictive failure first (the rest fail unannounced)
PSU_PREDICTIVE_FRAC = 0.85
#: share of thermal incidents caused by a fan (the rest by hot inlet air)
THERMAL_FAN_FRAC = 0.6


@dataclass
class SelLine:
    """One planned SEL entry, ``t`` in seconds after the recording start."""

    t: float
    node: int
    sensor: str
    event_text: str
    asserted: bool
    detail: str = ""
    sel_id: int = 0


@dataclass
class BmcFault:
    """How one power or thermal incident shows in its node's BMC (times in seconds from the start)."""

    inc: "Incident"
    cause: str          # "psu" | "fan" | "inlet"
    part: int           # PSU or fan index (0, 1)
    onset: float        # precursor start (= failure when sudden)
    event: float        # PSU failure / fan stall / inlet past upper critical
    failure: float
    repair: float


@dataclass
class BmcPlan:
    """Per-node BMC traits, the SEL entries and the faults of a fleet."""

    phase_s: np.ndarray        # (N,) offset of the readings within the minute
    inlet_c: np.ndarray        # (N,) inlet air of the node's position, °C
    fan_rpm: np.ndarray        # (N, 2) fan speed at idle
    first_sel_id: np.ndarray   # (N,) entries the SEL held before the recording
    sel: list[SelLine] = field(default_factory=list)
    faults: list[BmcFault] = field(default_factory=list)


def plan_bmc(plan: "FleetPlan") -> BmcPlan:
    """Draw the BMC side of *plan* from its own random stream (the plan's other draws are untouched)."""
    cfg = plan.cfg
    rng = np.random.default_rng([cfg.seed, _STREAM])
    N, dt, dur = cfg.nodes, cfg.interval_s, cfg.n_ticks * cfg.interval_s
    bp = BmcPlan(rng.uniform(1.0, 0.5 * min(cfg.bmc_sensor_period_s, 10.0), N), rng.uniform(20.0, 26.0, N)
                 + 0.2 * plan.node_hot[:N], rng.uniform(6500.0, 7500.0, (N, 2)), rng.integers(1, 400, N))
    for rate, fan, text, detail in ((FAN_BLIP_PER_NODE_DAY, True, "Lower Non-critical going low",
                                     "Reading 1500 < Threshold 1600 RPM"),
                                    (INLET_BLIP_PER_NODE_DAY, False, "Upper Non-critical going high",
                                     "Reading 41 > Threshold 40 degrees C")):
        for _ in range(rng.poisson(rate * N * dur / 86400)):
            t, n = float(rng.uniform(0, dur)), int(rng.integers(0, N))
            sensor = f"Fan #0x{0x30 + int(rng.integers(0, 2)):02x}" if fan else "Temperature #0x01"
            bp.sel.append(SelLine(t, n, sensor, text, True, detail))
            bp.sel.append(SelLine(t + float(rng.uniform(40, 180)), n, sensor, text, False, detail))
    for inc in plan.incidents:
        if inc.fault in (FaultClass.POWER, FaultClass.THERMAL):
            _plan_fault(bp, inc, rng, dt)
    bp.sel.sort(key=lambda s: (s.node, s.t))
    nxt: dict[int, int] = {}
    for s in bp.sel:  # each BMC numbers its entries in order
        s.sel_id = nxt.get(s.node, int(bp.first_sel_id[s.node]))
        nxt[s.node] = s.sel_id + 1
    bp.sel.sort(key=lambda s: (s.t, s.node))
    return bp


def _plan_fault(bp: BmcPlan, inc: "Incident", rng: np.random.Generator, dt: float) -> None:
    onset, failure, repair = inc.precursor_start() * dt, inc.failure * dt, inc.repair * dt
    warned = inc.variant == "warned" and onset < failure
    span = failure - onset
    add = bp.sel.append
    part = int(rng.integers(0, 2))
    if inc.fault is FaultClass.POWER:
        psu = f"Power Supply #0x{part + 1:02x}"
        pred = rng.random() < PSU_PREDICTIVE_FRAC
        at = onset + float(rng.uniform(0.0, 0.3)) * span
        event = onset + float(rng.uniform(0.6, 0.95)) * span if warned else failure
        if warned and pred:
            add(SelLine(at, inc.node, psu, "Predictive failure", True))
            add(SelLine(repair, inc.node, psu, "Predictive failure", False))
        add(SelLine(event, inc.node, psu, "Failure detected", True))
        add(SelLine(repair, inc.node, psu, "Failure detected", False))
        bp.faults.append(BmcFault(inc, "psu", part, onset, event, failure, repair))
        return
    cause = "fan" if rng.random() < THERMAL_FAN_FRAC else "inlet"
    event = onset + float(rng.uniform(0.3, 0.7) if cause == "fan" else rng.uniform(0.55, 0.85)) * span \
        if warned else failure
    if cause == "fan":
        fan = f"Fan #0x{0x30 + part:02x}"
        for text, thr in (("Lower Non-critical going low", 1600), ("Lower Critical going low", 1000)):
            add(SelLine(event, inc.node, fan, text, True, f"Reading 0 < Threshold {thr} RPM"))
            add(SelLine(repair, inc.node, fan, text, False, f"Reading 7000 > Threshold {thr} RPM"))
    else:
        temp = "Temperature #0x01"
        if warned:  # the climb crosses upper non-critical (40) on its way to upper critical (45)
            base = float(bp.inlet_c[inc.node])
            cross_nc = onset + (event - onset) * (40.0 - base) / (45.5 - base)
            add(SelLine(cross_nc, inc.node, temp, "Upper Non-critical going high", True,
                        "Reading 41 > Threshold 40 degrees C"))
            add(SelLine(repair, inc.node, temp, "Upper Non-critical going high", False,
                        "Reading 24 < Threshold 40 degrees C"))
        add(SelLine(event, inc.node, temp, "Upper Critical going high", True, "Reading 46 > Threshold 45 degrees C"))
        add(SelLine(repair, inc.node, temp, "Upper Critical going high", False, "Reading 24 < Threshold 45 degrees C"))
    bp.faults.append(BmcFault(inc, cause, part, onset, event, failure, repair))


def render_bmc(plan: "FleetPlan", bp: BmcPlan, a: int, b: int, level: np.ndarray) -> list[Record]:
    """BMC events of ticks [a, b): sensor readings and SEL entries whose time falls in them.

    *level* (b - a, N) is each node's load (0..1) at each tick of the chunk.
    """
    cfg = plan.cfg
    dt, N, every = cfg.interval_s, cfg.nodes, cfg.bmc_sensor_period_s
    t0, t1 = a * dt, min(b, cfg.n_ticks) * dt
    world = plan.cfg.world   # a drawn world gives a BMC to some nodes only; the home world to every node
    has = np.ones(N, bool) if world is None else np.array(world.bmc_node, bool)
    out = []
    for s in bp.sel:  # the node's next reading minute reads the entry (its sample reads the SEL and the sensors)
        read_t = math.ceil((s.t - bp.phase_s[s.node]) / every) * every + bp.phase_s[s.node]
        if t0 <= read_t < t1 and has[s.node]:
            out.append(_sel_event(plan, s, read_t))
    periods = np.arange(max(0, math.floor(t0 / every) - 1), math.ceil(t1 / every) + 1)
    t = periods[:, None] * every + bp.phase_s[None, :]  # (P, N)
    ok = (t >= t0) & (t < t1) & has[None, :]
    keep = ok.any(axis=1)
    periods, t, ok = periods[keep], t[keep], ok[keep]
    if len(periods) == 0:
        return out
    lv = level[np.clip((t // dt).astype(np.int64) - a, 0, b - a - 1), np.arange(N)[None, :]]
    noise = np.stack([np.random.default_rng([cfg.seed, _STREAM, int(p)]).standard_normal((N, len(SENSORS)))
                      for p in periods])  # (P, N, sensor): one stream per reading minute
    v = np.empty((len(periods), N, len(SENSORS)))
    v[..., _INLET] = bp.inlet_c + 0.6 * lv + 0.3 * noise[..., _INLET]
    for j, f in enumerate(_FAN):
        v[..., f] = bp.fan_rpm[:, j] * (1.0 + 0.3 * lv) + 80.0 * noise[..., f]
    node_w = NODE_IDLE_W + NODE_BUSY_W * lv
    share = np.full_like(node_w, 0.5)
    for fault in bp.faults:
        _apply(fault, t, v, node_w, share)
    v[..., _PSU[0]] = node_w * share + 15.0 * noise[..., _PSU[0]]
    v[..., _PSU[1]] = node_w * (1.0 - share) + 15.0 * noise[..., _PSU[1]]
    v = np.maximum(np.round(v / _RESOLUTION) * _RESOLUTION, 0.0)
    names = plan.node_names
    ts = np.round(cfg.start_ts + t, 3)
    for i, n in zip(*np.nonzero(ok)):
        for k, (name, stype, unit, thr) in enumerate(SENSORS):
            value = float(v[i, n, k])
            out.append(sensor_event(names[n], float(ts[i, n]), name, stype, value, unit, _status(value, thr),
                                    thr, "ipmi"))
    out.sort(key=lambda e: e["ts"])
    return out


def _apply(f: BmcFault, t: np.ndarray, v: np.ndarray, node_w: np.ndarray, share: np.ndarray) -> None:
    """Write fault *f* into the readings of its node at times *t* (P, N)."""
    n = f.inc.node
    tn = t[:, n]
    pre = (tn >= f.onset) & (tn < f.failure)
    broken = (tn >= f.event) & (tn < f.repair)
    if f.cause == "psu":
        # current sharing drifts away from the failing supply; once failed it carries nothing
        p = np.clip((tn - f.onset) / max(f.failure - f.onset, 1.0), 0.0, 1.0)
        s = np.where(broken, 0.0, 0.5 - 0.2 * p)
        on = pre | broken  # another incident of the node, at another time, keeps its own readings
        share[on, n] = s[on] if f.part == 0 else 1.0 - s[on]
        return
    if f.cause == "fan":
        # a worn bearing: the fan slows to ~65 % of its speed, then stalls
        col = _FAN[f.part]
        slow = pre & ~broken
        q = np.clip((tn - f.onset) / max(f.event - f.onset, 1.0), 0.0, 1.0)
        v[slow, n, col] *= 1.0 - 0.35 * q[slow]
        v[broken, n, col] = 0.0
        v[broken, n, _FAN[1 - f.part]] *= 1.3  # the other fan runs flat out
        return
    # inlet air: climbs from its usual level through upper critical (45) at the event, on to ~48
    base = v[:, n, _INLET]
    frac = (tn - f.onset) / max(f.event - f.onset, 1.0)
    hot = (tn >= f.onset) & (tn < f.repair)
    v[hot, n, _INLET] = np.minimum(base[hot] + (45.5 - base[hot]) * frac[hot], 48.0)
    for col in _FAN:
        v[hot, n, col] *= 1.0 + 0.3 * np.clip(frac[hot], 0.0, 1.0)


def _status(value: float, thr: dict[str, float | None]) -> str:
    """``ipmitool sensor``'s status column: ok, nc (non-critical), cr (critical), nr (non-recoverable)."""
    if thr.get("upper_fatal") is not None and value >= thr["upper_fatal"]:
        return "nr"
    for key, cmp in (("upper_critical", 1), ("lower_critical", -1)):
        lim = thr.get(key)
        if lim is not None and cmp * (value - lim) >= 0:
            return "cr"
    for key, cmp in (("upper_noncritical", 1), ("lower_noncritical", -1)):
        lim = thr.get(key)
        if lim is not None and cmp * (value - lim) >= 0:
            return "nc"
    return "ok"


def _sel_event(plan: "FleetPlan", s: SelLine, read_t: float) -> Record:
    """The ``kind="sel"`` event ``IpmiSource.sel_event`` makes of this entry's ``sel elist`` line, read by the node's
    BMC sample at *read_t* (seconds from the start): the agent stamps ``ts`` at the sample that reads the entry and
    keeps the BMC's own time of the entry as ``sel_ts`` (docs/simulator.md)."""
    sel_ts = float(math.floor(plan.cfg.start_ts + s.t))  # the SEL keeps whole seconds
    day, clock = time.strftime("%m/%d/%Y", time.gmtime(sel_ts)), time.strftime("%H:%M:%S", time.gmtime(sel_ts))
    # as the source's parser keeps the line: ipmitool pads the id, the parser strips it
    state = "Asserted" if s.asserted else "Deasserted"
    line = f"{s.sel_id:x} | {day} | {clock} | {s.sensor} | {s.event_text} | {state}"
    if s.detail:
        line += f" | {s.detail}"
    sensor_type = s.sensor.split(" #")[0]
    return {"ts": round(float(plan.cfg.start_ts + read_t), 3), "node": plan.node_names[s.node], "gpu": None,
            "source": "bmc", "kind": "sel", "code": s.sel_id if s.sel_id < 2**31 else None, "pci_bus_id": None,
            "sel_id": s.sel_id, "sel_ts": sel_ts, "sensor": s.sensor, "sensor_type": sensor_type,
            "event_text": s.event_text, "asserted": s.asserted, "message": line}

