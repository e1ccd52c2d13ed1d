"""Simulator settings: fleet shape, failure rates and mix, confounders.

Defaults come from published field data (sources in docs/simulator.md):

* **Rate.** Meta's Llama 3 405B training report (Dubey et al., 2024, §3.3.4) saw 419
  unexpected interruptions in 54 days on 16,384 H100 GPUs (2,048 nodes): 3.8e-3
  interruptions per node-day. ``rate_multiplier`` scales that so a short run of a small
  fleet holds enough incidents to train and evaluate on (1.0 = field rate).
* **Mix.** The same report's root causes (faulty GPU 30.1 %, HBM3 17.2 %, software bug
  12.9 %, network switch/cable 8.4 %, host maintenance 7.6 %, SRAM 4.5 %, GSP 4.1 %,
  NIC 1.7 %, NCCL watchdog 1.7 %, SDC 1.4 %, thermal interface 1.4 %, PSU 0.7 %), with
  "faulty GPU" split between off-the-bus, NVLink, PCIe and fail-slow using the NCSA
  Delta A100/H100 study (Cui et al., 2025: NVLink and GSP errors dominate, off-the-bus
  rarer) and the Titan K20X study (Ostrouchov et al., SC'20: DBE and off-the-bus).
* **Predictable share.** Fraction of each class whose precursors show in telemetry
  before the failure; the rest fail with no warning (e.g. most off-the-bus events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from collector.schema import FaultClass

if TYPE_CHECKING:
    from .world import World

#: Interruptions per node-day at field rates (Llama 3: 419 / (54 d x 2,048 nodes)).
FIELD_RATE_PER_NODE_DAY = 419 / (54 * 2048)

#: Share of each fault class among interruptions (sums to 1).
DEFAULT_MIX: dict[FaultClass, float] = {
    FaultClass.HBM_ECC: 0.22,      # HBM3 17.2 % + SRAM 4.5 %
    FaultClass.GPU_OFF_BUS: 0.10,  # part of "faulty GPU"; XID 79
    FaultClass.NVLINK: 0.10,       # part of "faulty GPU"; XID 74 is among Delta's most frequent
    FaultClass.PCIE: 0.05,         # part of "faulty GPU"
    FaultClass.FAIL_SLOW: 0.06,    # part of "faulty GPU" + SDC-like slowdowns
    FaultClass.THERMAL: 0.04,      # thermal interface + sensor 1.4 %, cooling incidents
    FaultClass.POWER: 0.03,        # PSU 0.7 % + power delivery seen at Delta
    FaultClass.IB_LINK: 0.12,      # switch/cable 8.4 % + NIC 1.7 % + NCCL watchdog 1.7 %
    FaultClass.APP_ERROR: 0.28,    # software bug 12.9 % + the far more common app XIDs
}

#: Fraction of incidents of each class that show precursors before failing.
DEFAULT_PREDICTABLE: dict[FaultClass, float] = {
    FaultClass.HBM_ECC: 0.80,
    FaultClass.GPU_OFF_BUS: 0.40,
    FaultClass.NVLINK: 0.75,
    FaultClass.PCIE: 0.85,
    FaultClass.FAIL_SLOW: 1.00,
    FaultClass.THERMAL: 0.90,
    FaultClass.POWER: 0.50,
    FaultClass.IB_LINK: 0.75,
    FaultClass.APP_ERROR: 0.00,
}

#: Precursor duration range (onset → failure), seconds.
DEFAULT_LEAD_S: dict[FaultClass, tuple[float, float]] = {
    FaultClass.HBM_ECC: (1800, 6 * 3600),
    FaultClass.GPU_OFF_BUS: (600, 3600),
    FaultClass.NVLINK: (900, 2 * 3600),
    FaultClass.PCIE: (1200, 3 * 3600),
    FaultClass.FAIL_SLOW: (1200, 2400),
    FaultClass.THERMAL: (900, 2400),
    FaultClass.POWER: (600, 1800),
    FaultClass.IB_LINK: (900, 2 * 3600),
    FaultClass.APP_ERROR: (0, 0),
}


@dataclass
class SimConfig:
    """Everything that shapes a simulated fleet; all times in seconds of telemetry time."""

    nodes: int = 16
    gpus_per_node: int = 8
    #: InfiniBand ports per node; a DGX H100 has 8 compute HCAs, 1 port each.
    ports_per_node: int = 8
    hours: float = 24.0
    interval_s: float = 10.0
    seed: int = 0
    #: Recording start (2026-01-01T00:00:00Z), fixed so recordings are comparable.
    start_ts: float = 1767225600.0
    node_prefix: str = "gpu-node-"
    #: explicit node names (overrides node_prefix numbering; length must equal nodes)
    names: tuple[str, ...] = ()
    #: 1.0 = field rate; 150 puts ~0.57 interruptions per node-day, enough to train on.
    rate_multiplier: float = 150.0
    mix: dict[FaultClass, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    predictable: dict[FaultClass, float] = field(default_factory=lambda: dict(DEFAULT_PREDICTABLE))
    lead_s: dict[FaultClass, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_LEAD_S))
    #: How long a failed node stays broken before repair + reboot (counters reset).
    repair_s: tuple[float, float] = (2 * 3600, 6 * 3600)
    # ---- confounders that must not trigger action
    #: GPUs with a steady low correctable-ECC rate that never fail (per GPU probability).
    sbe_noisy_gpu_frac: float = 0.03
    #: Nodes that run hot (+8–12 °C) but are healthy.
    hot_node_frac: float = 0.05
    #: Healthy maintenance reboots per node-day (reset volatile counters to zero).
    reboot_per_node_day: float = 0.08
    #: Fabric congestion episodes per day (port_xmit_wait bursts across many nodes).
    congestion_per_day: float = 6.0
    #: Extra application XIDs (13/31/43) per node-day that are *not* incidents.
    app_xid_per_node_day: float = 0.3
    #: Emit the nodes' BMC events (simulator/bmc.py): sensor readings every minute, SEL entries, and the
    #: power and thermal incidents' BMC precursors. Drawn from their own random stream, so switching
    #: them off (recordings made before they existed) leaves a seed's GPU and port rows as they are.
    bmc: bool = True
    #: Seconds between two sensor readings of a node's BMC: a minute, as BMC exporters are scraped, so a
    #: node adds ~5 events a minute, not one per sample (events.jsonl is read whole; a slower cadence
    #: keeps a big fleet's recording small).
    bmc_sensor_period_s: float = 60.0
    #: Ticks generated per chunk (memory ~ chunk x GPUs x columns x 8 B).
    chunk_ticks: int = 360
    #: A drawn world (world.py; None = the home world: one H100 fleet, one interval, no background).
    #: Build with ``world_config(cfg, draw_world(seed, ranges, nodes))``: it sets interval_s to the
    #: world's base grid and the world's failure rate and lead times.
    world: "World | None" = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("need at least one node and one GPU per node")
        if self.interval_s <= 0 or self.hours <= 0:
            raise ValueError("interval_s and hours must be > 0")
        if self.bmc_sensor_period_s <= 0:
            raise ValueError("bmc_sensor_period_s must be > 0")
        if self.rate_multiplier < 0:
            raise ValueError("rate_multiplier must be >= 0")
        total = sum(self.mix.values())
        if total <= 0:
            raise ValueError("fault mix must have a positive total")
        self.mix = {FaultClass(k): v / total for k, v in self.mix.items()}

    @property
    def n_ticks(self) -> int:
        return int(round(self.hours * 3600 / self.interval_s))

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.n_ticks * self.interval_s

    def node_names(self) -> list[str]:
        if self.names:
            if len(self.names) != self.nodes:
                raise ValueError(f"{len(self.names)} names given for {self.nodes} nodes")
            return list(self.names)
        width = max(3, len(str(self.nodes)))
        return [f"{self.node_prefix}{i + 1:0{width}d}" for i in range(self.nodes)]
