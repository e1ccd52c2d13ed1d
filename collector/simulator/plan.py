"""The fleet plan: everything random about a simulated fleet, decided up front.

Planning draws per-GPU traits, each node's job timeline (jobs, idle gaps, checkpoint
dips), maintenance reboots, congestion episodes and the incidents with their onset,
failure and repair times. Generation (:mod:`.generate`) then only renders the plan
into samples, chunk by chunk, so the same seed gives the same fleet whatever the
chunk size of the consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from collector.schema import Action, FaultClass

from .background import Background, draw_background
from .bmc import BmcPlan, plan_bmc
from .config import FIELD_RATE_PER_NODE_DAY, SimConfig
from .faults import first_shown
from .ranges import EXPORTER_DEFAULT_MISSING
from .sampling import sample_masks
from .workload import (GpuTraits, draw_traits, hot_offsets, load_levels, power_brakes, serving_timelines,
                       shared_occupancy)

if TYPE_CHECKING:
    from .world import World

#: spec/recording.md: predictive recall counts a catch at least this far ahead (s), so a precursor that shows
#: later than this before its failure is no warning (``onset_ts`` null, ``predictable`` false).
MIN_WARNING_S = 60.0

#: Faults that hit one GPU; the others hit the node (or one of its network ports).
GPU_FAULTS = frozenset({FaultClass.HBM_ECC, FaultClass.GPU_OFF_BUS, FaultClass.NVLINK,
                        FaultClass.PCIE, FaultClass.FAIL_SLOW, FaultClass.APP_ERROR})
APP_XID_CODES = (13, 31, 43)


@dataclass
class Incident:
    """One planned incident, in tick indices (``onset`` is None when unpredictable)."""

    id: str
    node: int
    gpu: int | None
    fault: FaultClass
    failure: int
    repair: int
    onset: int | None
    predictable: bool
    variant: str = ""
    port: int | None = None
    code: int | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def precursor_start(self) -> int:
        return self.failure if self.onset is None else self.onset

    def shown(self, cfg: SimConfig) -> int | None:
        """The tick the first precursor appears in this node's telemetry (spec/recording.md ``onset_ts``):
        ``onset``, unless the node does not export the fields it starts in (a node on dcgm-exporter's default
        counters, :func:`.faults.first_shown`); None when nothing shows MIN_WARNING_S before the failure."""
        lacks = EXPORTER_DEFAULT_MISSING if cfg.world is not None and cfg.world.exporter_default[self.node] else ()
        tick = first_shown(self, lacks)
        if tick is None or (self.failure - tick) * cfg.interval_s < MIN_WARNING_S:
            return None
        return tick

    def label(self, cfg: SimConfig, node_names: list[str]) -> dict[str, Any]:
        """The ``incidents.jsonl`` line of spec/recording.md. The label's onset is where the precursor shows
        (:meth:`shown`); rendering starts it at ``onset`` whether or not the node sends it."""
        t = lambda i: round(cfg.start_ts + i * cfg.interval_s, 3)  # noqa: E731
        action = _expected_action(self)
        shown = self.shown(cfg)
        return {"id": self.id, "node": node_names[self.node], "gpu": self.gpu, "fault": self.fault.value,
                "onset_ts": None if shown is None else t(shown), "failure_ts": t(self.failure),
                "predictable": self.predictable and shown is not None, "action": action.value,
                "note": _note(self, cfg.world is not None, unseen=self.predictable and shown is None)}


def _expected_action(inc: Incident) -> Action:
    if inc.fault is FaultClass.APP_ERROR:
        return Action.NONE
    if inc.fault is FaultClass.HBM_ECC and inc.variant == "pending_remap":
        return Action.RESET
    return Action.DRAIN


def _note(inc: Incident, drawn_world: bool = False, unseen: bool = False) -> str:
    if unseen:   # a warned fault whose precursor this node does not export (Incident.shown)
        return {FaultClass.NVLINK: "NVLink CRC/replay growth in counters the node does not export, then XID 74"
                }.get(inc.fault, "a precursor in fields the node does not export, then the failure")
    if inc.fault is FaultClass.POWER and drawn_world:   # faults.power: a drawn world's node goes dark
        return {"warned": "intermittent power brake, then the node loses power and stops reporting",
                "sudden": "the node loses power and stops reporting, no warning"}.get(inc.variant, "")
    notes = {
        FaultClass.HBM_ECC: {"pending_remap": "SBE growth and row remaps, then DBE (XID 48, 63, 94)",
                             "remap_failure": "SBE growth, row remap failure (XID 48, 64, 95)",
                             "sudden": "DBE with no prior SBE growth (XID 48, 94)"},
        FaultClass.GPU_OFF_BUS: {"warned": "PCIe replays and thermal excursions, then XID 79",
                                 "sudden": "XID 79 with no warning"},
        FaultClass.NVLINK: {"warned": "NVLink CRC/replay growth, then XID 74", "sudden": "XID 74, no warning"},
        FaultClass.PCIE: {"warned": "PCIe replay growth, throughput loss", "sudden": "PCIe replay burst"},
        FaultClass.FAIL_SLOW: {"warned": "one GPU at reduced clocks, no errors"},
        FaultClass.THERMAL: {"warned": "node-wide temperature climb, thermal throttling",
                             "sudden": "cooling lost within a minute"},
        FaultClass.POWER: {"warned": "intermittent power brake, then sustained", "sudden": "power brake"},
        FaultClass.IB_LINK: {"warned": "symbol errors and link recoveries, then link down",
                             "sudden": "link down, no warning"},
        FaultClass.APP_ERROR: {"": "application XID; the job's own fault"},
    }
    return notes[inc.fault].get(inc.variant, "")


@dataclass
class WorldPlan:
    """What a drawn world adds to a plan (None in the home world)."""

    traits: GpuTraits
    background: Background
    level: np.ndarray                 # (T, N) float32 load 0..1
    gpu_sampled: np.ndarray           # (T, N) bool: base ticks each node samples its GPUs at
    port_sampled: np.ndarray          # (T, N) bool: ... and its ports at
    brakes: list[tuple[int, int, list[int]]]  # rack-wide power-brake events (a, b, nodes)
    gpu_occupancy: np.ndarray | None = None   # (T, G) bool: False while a shared node's GPU sits idle


@dataclass
class FleetPlan:
    """Static traits and timelines of one simulated fleet."""

    cfg: SimConfig
    node_names: list[str]
    gpu_uuids: list[str]
    node_of_gpu: np.ndarray          # (G,) int
    temp_offset: np.ndarray          # (G,) °C, per-GPU cooling variation
    power_offset: np.ndarray         # (G,) W
    sbe_rate_per_h: np.ndarray       # (G,) steady correctable-error rate (confounder GPUs)
    pcie_rate_per_h: np.ndarray      # (G,) steady low PCIe replay rate
    node_hot: np.ndarray             # (N,) °C added to hot-but-healthy nodes
    port_symbol_rate_per_h: np.ndarray  # (N*P,) steady low symbol-error rate
    job_active: np.ndarray           # (T, N) bool
    checkpoint: np.ndarray           # (T, N) bool
    congestion: np.ndarray           # (T, N) float32, 0..1 intensity
    reboots: list[tuple[int, int]]   # (tick, node) healthy maintenance reboots
    incidents: list[Incident]
    world: WorldPlan | None = None
    #: the nodes' BMC (None: the fleet's BMC events are switched off)
    bmc: BmcPlan | None = None

    @property
    def n_gpus(self) -> int:
        return len(self.node_of_gpu)


def plan_fleet(cfg: SimConfig) -> FleetPlan:
    """Draw a fleet for ``cfg.seed`` (deterministic)."""
    rng = np.random.default_rng([cfg.seed, 0x9E3779B9])
    N, Gn, P = cfg.nodes, cfg.gpus_per_node, cfg.ports_per_node
    G = N * Gn
    names = cfg.node_names()
    uu = rng.integers(0, 2**63, size=(G, 2), dtype=np.int64)
    uuids = [f"GPU-{a & 0xFFFFFFFF:08x}-{(a >> 32) & 0xFFFF:04x}-{(a >> 48) & 0xFFF:04x}-"
             f"{b & 0xFFFF:04x}-{(b >> 16) & 0xFFFFFFFFFFFF:012x}" for a, b in uu]
    node_of_gpu = np.repeat(np.arange(N), Gn)
    sbe = np.where(rng.random(G) < cfg.sbe_noisy_gpu_frac, rng.uniform(0.5, 4.0, G), 0.0)
    pcie = np.where(rng.random(G) < 0.02, rng.uniform(0.2, 2.0, G), 0.0)
    hot = np.where(rng.random(N) < cfg.hot_node_frac, rng.uniform(8, 12, N), 0.0)
    sym = np.where(rng.random(N * P) < 0.02, rng.uniform(0.5, 3.0, N * P), 0.0)
    job, ckpt = _job_timelines(cfg, rng)
    cong = _congestion(cfg, rng)
    reboots = _reboots(cfg, rng)
    incidents = _incidents(cfg, rng, job)
    if cfg.world is not None:
        serving_timelines(cfg.world, job, ckpt)
    # a failed node is idle (job killed, drained by its operators) until repaired
    for inc in incidents:
        hold = inc.repair if inc.fault is not FaultClass.APP_ERROR else inc.params["restart"]
        job[inc.failure:hold, inc.node] = False
        ckpt[inc.failure:hold, inc.node] = False
    plan = FleetPlan(cfg, names, uuids, node_of_gpu, rng.normal(0, 2.0, G).astype(np.float32),
                     rng.normal(0, 20.0, G).astype(np.float32), sbe, pcie, hot.astype(np.float32), sym,
                     job, ckpt, cong, reboots, incidents)
    if cfg.world is not None:
        _plan_world(plan)
    if cfg.bmc:
        plan.bmc = plan_bmc(plan)  # last, from its own stream: nothing above moves
    return plan


def _plan_world(plan: FleetPlan) -> None:
    """Draw the world's per-part details (own random stream: the home draws above are untouched)."""
    cfg, world = plan.cfg, plan.cfg.world
    if world is None:
        return
    rng = np.random.default_rng([cfg.seed, 0x3A7D])
    T, dt = cfg.n_ticks, cfg.interval_s
    traits = draw_traits(world, rng, cfg.gpus_per_node)
    plan.node_hot = hot_offsets(world, traits, rng, cfg.gpus_per_node, plan.temp_offset)
    # the home confounders give way to the world's background
    plan.sbe_rate_per_h = np.zeros(plan.n_gpus)
    plan.pcie_rate_per_h = np.zeros(plan.n_gpus)
    plan.port_symbol_rate_per_h = np.zeros(cfg.nodes * cfg.ports_per_node)
    k = rng.poisson(world.rates["driver_reload_per_node_day"] * cfg.nodes * cfg.hours / 24)
    plan.reboots = sorted(plan.reboots + [(int(rng.integers(1, T)), int(rng.integers(0, cfg.nodes)))
                                          for _ in range(k)])
    codes = tuple(world.ranges.app_xid_codes)
    for inc in plan.incidents:
        _shape(inc, world, rng, codes)
    level = load_levels(world, plan.job_active, plan.checkpoint, dt=dt, start_ts=cfg.start_ts, rng=rng)
    gpu_mask, port_mask = sample_masks(world, T, rng)
    bg = draw_background(world, rng, n_ticks=T, dt=dt, gpus_per_node=cfg.gpus_per_node,
                         ports_per_node=cfg.ports_per_node, app_codes=codes)
    plan.world = WorldPlan(traits, bg, level, gpu_mask, port_mask, power_brakes(world, rng, T, dt),
                           shared_occupancy(world, cfg.seed, T, dt, cfg.gpus_per_node))


#: A straggler's clock as a share of its peers': the home world's, and a drawn world's (the home
#: range is the severe half: Falcon's fail-slows delay jobs 1.34x on average, so many are milder).
SLOW_FACTOR_HOME = (0.55, 0.75)
SLOW_FACTOR_DRAWN = (0.55, 0.90)


def _shape(inc: Incident, world: "World", rng: np.random.Generator, codes: tuple[int, ...]) -> None:
    """Random precursor shape, magnitude and intermittency; app XIDs from the whole RESTART_APP set."""
    if inc.fault is FaultClass.APP_ERROR:
        inc.code = int(codes[int(rng.integers(0, len(codes)))])
        return
    r = world.ranges
    inc.params["shape"] = str(r.fault_shapes[int(rng.integers(0, len(r.fault_shapes)))])
    lo, hi = r.fault_magnitude
    inc.params["magnitude"] = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    inc.params["step_at"] = float(rng.uniform(0.2, 0.8))
    if rng.random() < r.intermittent_prob:
        pattern = rng.random(24) < rng.uniform(*r.on_frac)
        pattern[0] = True   # the precursor shows at its onset (the label's onset_ts)
        inc.params["on_pattern"] = tuple(bool(x) for x in pattern)
    if inc.fault is FaultClass.FAIL_SLOW:   # the home draw, mapped onto the drawn range (no extra draw)
        (a, b), (c, d) = SLOW_FACTOR_HOME, SLOW_FACTOR_DRAWN
        inc.params["clock_factor"] = c + (inc.params["clock_factor"] - a) / (b - a) * (d - c)


def _job_timelines(cfg: SimConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Jobs of 20 min–12 h separated by 2–10 min idle gaps; checkpoints every 30–60 min."""
    T, N, dt = cfg.n_ticks, cfg.nodes, cfg.interval_s
    job = np.zeros((T, N), bool)
    ckpt = np.zeros((T, N), bool)
    for n in range(N):
        t = int(rng.uniform(0, 600) / dt)  # first job starts within 10 min
        while t < T:
            dur = int(np.clip(rng.exponential(4 * 3600), 1200, 12 * 3600) / dt)
            job[t:t + dur, n] = True
            c = t + int(rng.uniform(1800, 3600) / dt)
            while c < min(t + dur, T):
                ckpt[c:c + max(1, int(rng.uniform(60, 150) / dt)), n] = True
                c += int(rng.uniform(1800, 3600) / dt)
            t += dur + max(1, int(rng.uniform(120, 600) / dt))
    return job, ckpt & job


def _congestion(cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """Episodes of 2–20 min where a random third of the fleet waits on the fabric."""
    T, N, dt = cfg.n_ticks, cfg.nodes, cfg.interval_s
    cong = np.zeros((T, N), np.float32)
    for _ in range(rng.poisson(cfg.congestion_per_day * cfg.hours / 24)):
        a = int(rng.integers(0, T))
        b = a + max(1, int(rng.uniform(120, 1200) / dt))
        nodes = rng.random(N) < 0.33
        cong[a:b, nodes] = rng.uniform(0.3, 1.0)
    return cong


def _reboots(cfg: SimConfig, rng: np.random.Generator) -> list[tuple[int, int]]:
    k = rng.poisson(cfg.reboot_per_node_day * cfg.nodes * cfg.hours / 24)
    return sorted((int(rng.integers(1, cfg.n_ticks)), int(rng.integers(0, cfg.nodes))) for _ in range(k))


def _incidents(cfg: SimConfig, rng: np.random.Generator, job: np.ndarray) -> list[Incident]:
    T, dt = cfg.n_ticks, cfg.interval_s
    node_days = cfg.nodes * cfg.hours / 24
    n = rng.poisson(FIELD_RATE_PER_NODE_DAY * cfg.rate_multiplier * node_days)
    classes = list(cfg.mix)
    probs = np.array([cfg.mix[c] for c in classes])
    busy: list[list[tuple[int, int]]] = [[] for _ in range(cfg.nodes)]
    out: list[Incident] = []
    warm = min(int(3600 / dt), T // 6)
    for _ in range(n):
        fault = classes[int(rng.choice(len(classes), p=probs))]
        for _attempt in range(20):
            inc = _draw(cfg, rng, fault, len(out), warm)
            if inc is None:
                break
            lo, hi = inc.precursor_start() - int(3600 / dt), inc.repair + int(3600 / dt)
            if all(hi < a or lo > b for a, b in busy[inc.node]):
                busy[inc.node].append((lo, hi))
                out.append(inc)
                break
    out.sort(key=lambda i: i.failure)
    for k, inc in enumerate(out):
        inc.id = f"inc-{k + 1:04d}"
    return out


def _draw(cfg: SimConfig, rng: np.random.Generator, fault: FaultClass, k: int, warm: int) -> Incident | None:
    T, dt = cfg.n_ticks, cfg.interval_s
    if T - warm < 4:
        return None
    failure = int(rng.integers(warm, T - 1))
    node = int(rng.integers(0, cfg.nodes))
    gpu = int(rng.integers(0, cfg.gpus_per_node)) if fault in GPU_FAULTS else None
    predictable = bool(rng.random() < cfg.predictable[fault])
    lo, hi = cfg.lead_s[fault]
    onset = None
    if predictable and hi > 0:
        lead = np.exp(rng.uniform(np.log(lo), np.log(hi)))  # log-uniform: short leads are common
        onset = max(0, failure - max(1, int(lead / dt)))
    repair = min(T, failure + int(rng.uniform(*cfg.repair_s) / dt))
    inc = Incident(f"inc-{k}", node, gpu, fault, failure, repair, onset, predictable)
    if fault is FaultClass.HBM_ECC:
        inc.variant = "sudden" if not predictable else ("remap_failure" if rng.random() < 0.3 else "pending_remap")
        inc.params["remap_at"] = sorted(rng.uniform(0.2, 0.95, int(rng.integers(2, 7))))
    elif fault is FaultClass.APP_ERROR:
        inc.code = int(rng.choice(APP_XID_CODES))
        inc.params["restart"] = min(T, failure + int(rng.uniform(180, 600) / dt))
        inc.repair = inc.params["restart"]
    elif fault is FaultClass.FAIL_SLOW:
        inc.variant = "warned"
        inc.params["clock_factor"] = float(rng.uniform(*SLOW_FACTOR_HOME))
    else:
        inc.variant = "warned" if predictable else "sudden"
    if fault is FaultClass.IB_LINK:
        inc.port = int(rng.integers(0, cfg.ports_per_node))
    return inc
