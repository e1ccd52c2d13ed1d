"""A world: one draw from :class:`~.ranges.WorldRanges`, recorded in the manifest.

``draw_world(seed, ranges, nodes)`` fixes everything about a recording's world that a
person would want to read back: each node's GPU generation, workload, sampling interval,
port cadence, clock skew and exporter set, and the world-wide rates (background, sampling
defects, fault shapes). Per-part details (which GPU trickles SBE, which port starts
saturated) are drawn later by the plan from the same seed, so the world stays small
enough for ``manifest.json`` and the whole recording is reproducible from the seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from collector.xid import restart_app_codes

from .ranges import GENERATIONS, UNSUPPORTED_FIELDS, WorldRanges

if TYPE_CHECKING:
    from .config import SimConfig

#: what a node does all recording (workload.py): jobs that start and stop, diurnal serving, nothing
WORKLOADS = ("training", "inference", "idle")


@dataclass(frozen=True)
class World:
    """The drawn world of one recording (per-node tuples are indexed like the node names)."""

    seed: int
    ranges: WorldRanges
    #: render grid, s: the greatest common step of every node's interval
    base_interval_s: float
    node_interval_s: tuple[float, ...]
    #: port-counter cadence per node, s
    port_interval_s: tuple[float, ...]
    generation: tuple[str, ...]
    workload: tuple[str, ...]
    #: constant clock offset of each node, s
    skew_s: tuple[float, ...]
    #: nodes on dcgm-exporter's default counter set (EXPORTER_DEFAULT_MISSING fields null)
    exporter_default: tuple[bool, ...]
    hot_node: tuple[bool, ...]
    rack_of_node: tuple[int, ...]
    #: nodes whose port data/packet counters are 32-bit and wrap
    wrap_data: tuple[bool, ...]
    ports_per_node: int
    #: world-wide rates drawn from the ranges (name → value, units as in WorldRanges)
    rates: dict[str, float]
    #: per UNSUPPORTED_FIELDS group, one bit mask per node: bit g set = GPU g does not report it
    unsupported: dict[str, tuple[int, ...]]
    #: nodes whose BMC gpuops reads
    bmc_node: tuple[bool, ...]

    def to_json(self) -> dict[str, Any]:
        """The ``"world"`` entry of manifest.json."""
        node = {
            "interval_s": list(self.node_interval_s), "port_interval_s": list(self.port_interval_s),
            "generation": list(self.generation), "workload": list(self.workload),
            "skew_s": [round(s, 3) for s in self.skew_s], "exporter_default": list(self.exporter_default),
            "hot": list(self.hot_node), "rack": list(self.rack_of_node), "wrap_data": list(self.wrap_data),
            "unsupported": {k: list(v) for k, v in self.unsupported.items()},
            "bmc": list(self.bmc_node),
        }
        r = asdict(self.ranges)
        return {"seed": self.seed, "ranges": self.ranges.name, "shift": self.ranges.shift,
                "base_interval_s": self.base_interval_s, "ports_per_node": self.ports_per_node,
                "rates": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.rates.items()},
                "nodes": node, "range_values": {k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()}}

    @property
    def typical_interval_s(self) -> float:
        """The most common node interval (manifest ``interval_s``)."""
        vals, counts = np.unique(self.node_interval_s, return_counts=True)
        return float(vals[int(np.argmax(counts))])


def world_config(cfg: "SimConfig", world: World) -> "SimConfig":
    """*cfg* rendered in *world*: its base grid, failure rate and lead times (nodes, hours, seed kept)."""
    scale = world.rates["lead_scale"]
    lead = {f: (lo * scale, hi * scale) for f, (lo, hi) in cfg.lead_s.items()}
    if len(world.node_interval_s) != cfg.nodes:
        raise ValueError(f"world drawn for {len(world.node_interval_s)} nodes, config has {cfg.nodes}")
    return replace(cfg, interval_s=world.base_interval_s, rate_multiplier=world.rates["rate_multiplier"],
                   lead_s=lead, ports_per_node=world.ports_per_node, world=world)


def _u(rng: np.random.Generator, r: tuple[float, float]) -> float:
    return float(rng.uniform(r[0], r[1])) if r[1] > r[0] else float(r[0])


def log_uniform(rng: np.random.Generator, r: tuple[float, float]) -> float:
    """A log-uniform draw from the range *r* (uniform when it starts at 0 or is one value)."""
    if r[0] <= 0 or r[1] <= r[0]:
        return _u(rng, r)
    return float(np.exp(rng.uniform(np.log(r[0]), np.log(r[1]))))


def draw_world(seed: int, ranges: WorldRanges, nodes: int) -> World:
    """Draw a world for *nodes* nodes (deterministic in *seed* and *ranges*). Ranges that name
    no application XIDs get every RESTART_APP code of the catalogue, recorded with the world."""
    if not ranges.app_xid_codes:
        ranges = replace(ranges, app_xid_codes=restart_app_codes())
    rng = np.random.default_rng([seed, 0x57D])
    gens = list(ranges.generations)
    for g in gens:
        if g not in GENERATIONS:
            raise ValueError(f"unknown GPU generation {g!r}; valid: {', '.join(GENERATIONS)}")
    if len(gens) > 1 and rng.random() < ranges.mixed_fleet_prob:
        k = int(rng.integers(2, len(gens) + 1))
        pool = [gens[i] for i in sorted(rng.choice(len(gens), k, replace=False))]
        generation = tuple(pool[i] for i in rng.integers(0, len(pool), nodes))
    else:
        generation = (gens[int(rng.integers(0, len(gens)))],) * nodes
    # workload: a block of idle nodes, a block of inference, the rest training (shuffled)
    idle, infer = _u(rng, ranges.idle_node_frac), _u(rng, ranges.inference_node_frac)
    draw = rng.random(nodes)
    workload = tuple(WORKLOADS[2] if d < idle else WORKLOADS[1] if d < idle + infer else WORKLOADS[0] for d in draw)
    # sampling intervals: one group, or 2–3 groups
    choices = list(ranges.interval_choices_s)
    if len(choices) > 1 and rng.random() < ranges.mixed_interval_prob:
        k = int(rng.integers(2, min(3, len(choices)) + 1))
        pool = [choices[i] for i in sorted(rng.choice(len(choices), k, replace=False))]
        node_iv = tuple(float(pool[i]) for i in rng.integers(0, len(pool), nodes))
    else:
        node_iv = (float(choices[int(rng.integers(0, len(choices)))]),) * nodes
    base = float(_gcd_all(node_iv))
    pchoices = list(ranges.port_interval_choices_s)
    pick = float(pchoices[int(rng.integers(0, len(pchoices)))])
    # a port cadence is a multiple of the node's interval (the exporter reads both on one timer)
    port_iv = tuple(iv if pick <= 0 else float(max(1, round(pick / iv)) * iv) for iv in node_iv)
    skew_sd = _u(rng, ranges.skew_sd_s)
    skew = tuple(float(s) for s in rng.normal(0.0, skew_sd, nodes))
    default = tuple(bool(x) for x in rng.random(nodes) < _u(rng, ranges.exporter_default_node_frac))
    hot = tuple(bool(x) for x in rng.random(nodes) < _u(rng, ranges.hot_node_frac))
    rack_size = int(rng.integers(ranges.rack_nodes[0], ranges.rack_nodes[1] + 1))
    racks = tuple(i // rack_size for i in range(nodes))
    wraps = tuple(bool(x) for x in rng.random(nodes) < _u(rng, ranges.wrap_data_node_frac))
    ports = int(ranges.ports_per_node_choices[int(rng.integers(0, len(ranges.ports_per_node_choices)))])
    rates = {
        name: (log_uniform(rng, getattr(ranges, name)) if name in _LOG_UNIFORM else _u(rng, getattr(ranges, name)))
        for name in _RATE_FIELDS
    }
    rates["chronic_sbe_cards"] = int(rng.integers(ranges.chronic_sbe_cards[0], ranges.chronic_sbe_cards[1] + 1))
    rates["skew_sd_s"] = skew_sd
    # drawn last and from their own stream, so adding them changed no other draw of a seed's world
    rise = np.random.default_rng([seed, 0x5153])
    rates["rise_per_gpu_day"] = _u(rise, ranges.rise_per_gpu_day)
    rates["rise_per_port_day"] = _u(rise, ranges.rise_per_port_day)
    rates["shared_node_frac"] = _u(np.random.default_rng([seed, 0x5AED]), ranges.shared_node_frac)
    bmc = np.random.default_rng([seed, 0xB3C])
    rates["bmc_node_frac"] = _u(bmc, ranges.bmc_node_frac)
    has_bmc = tuple(bool(x) for x in bmc.random(nodes) < rates["bmc_node_frac"])
    return World(seed, ranges, base, node_iv, port_iv, generation, workload, skew, default, hot, racks, wraps, ports,
                 rates, _unsupported(np.random.default_rng([seed, 0x0F1D]), ranges, nodes), has_bmc)


#: GPU bits a node mask holds (GPUs past this on a node always report every field)
MASK_GPUS = 16


def _unsupported(rng: np.random.Generator, ranges: WorldRanges, nodes: int) -> dict[str, tuple[int, ...]]:
    """Per optional-field group, which GPUs of each node lack it: a share of nodes drawn per group;
    such a node lacks it on every GPU half the time, else on a random subset (at least one GPU)."""
    out: dict[str, tuple[int, ...]] = {}
    everyone = (1 << MASK_GPUS) - 1
    for group in UNSUPPORTED_FIELDS:
        frac = _u(rng, ranges.unsupported_node_frac)
        hit, whole = rng.random(nodes) < frac, rng.random(nodes) < 0.5
        some = rng.random((nodes, MASK_GPUS)) < 0.5
        some[:, 0] |= ~some.any(axis=1)
        bits = (some * (1 << np.arange(MASK_GPUS))).sum(axis=1)
        out[group] = tuple(0 if not h else everyone if w else int(b) for h, w, b in zip(hit, whole, bits))
    return out


#: range fields drawn once per world (a uniform draw unless listed in _LOG_UNIFORM)
_RATE_FIELDS = (
    "power_cap_frac", "power_brake_per_rack_day", "jitter_frac", "gap_per_node_day", "late_row_frac",
    "driver_reload_per_node_day", "sbe_gpu_frac", "sbe_rate_per_h", "sbe_burst_per_gpu_day", "pcie_gpu_frac",
    "pcie_rate_per_min", "nvlink_gpu_frac", "nvlink_rate_per_min", "ib_noisy_port_frac", "ib_rate_per_h",
    "ib_burst_per_port_day", "link_flap_per_port_day", "app_xid_per_gpu_day", "info_xid_per_gpu_day",
    "legacy_gpu_frac", "legacy_port_frac", "saturated_port_frac", "rate_multiplier", "lead_scale",
)
_LOG_UNIFORM = frozenset({"sbe_rate_per_h", "pcie_rate_per_min", "nvlink_rate_per_min", "ib_rate_per_h",
                          "lead_scale"})


def _gcd_all(values: tuple[float, ...]) -> float:
    """Greatest common step of intervals given in whole seconds or tenths."""
    ints = [int(round(v * 10)) for v in values]
    g = 0
    for v in ints:
        g = math.gcd(g, v)
    return g / 10
