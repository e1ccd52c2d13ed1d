"""The ranges randomized worlds are drawn from: one home for every range, with unit and source.

A *world* (:mod:`.world`) is one draw from a :class:`WorldRanges`: GPU generations,
workload mix, sampling cadence and its defects, benign background on healthy parts,
counters already high at recording start, and the shapes of fault precursors. Each
field says its unit and where the range comes from; "FR §2 SBE" means the row *SBE*
of table 2 in shared/research/field-rates.md, "(D)" a derived or assumed number where
the research found none (its *Gaps* paragraph).

``TRAINING`` is what models are trained and tuned on; ``SHIFTS`` are whole worlds
*outside* those ranges (bench/bench_shift.py), never used for training or tuning.
Seeds: training 201–299, tuning 301–399, shift suite 401–499.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: Counter widths of IB PortCounters (sysfs reads them; they stick at 2^w - 1, not wrap).
#: Source: robust-detection.md §6 (OVIS LDMS: SymbolError/PortRcvErrors 16-bit, LinkErrorRecovery/
#: LinkDowned 8-bit); the 4-bit ones are IBTA PortCounters, matching a healthy H100 node reading
#: excessive_buffer_overrun_errors = 15 on all HCAs (issue 8).
IB_COUNTER_BITS: dict[str, int] = {
    "symbol_error": 16, "port_rcv_errors": 16, "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16, "VL15_dropped": 16,
    "link_error_recovery": 8, "link_downed": 8, "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4, "excessive_buffer_overrun_errors": 4,
}


@dataclass(frozen=True)
class GpuProfile:
    """Limits and operating points of one GPU generation (SXM parts)."""

    name: str
    power_limit_w: float          # board power limit; NVIDIA datasheets (A100 SXM 400 W, H100/H200 SXM 700 W)
    idle_power_w: float           # W at idle clocks (D, typical nvidia-smi readings)
    busy_power_w: float           # W added at full load below the limit (D)
    max_sm_clock_mhz: float       # boost clock; datasheets (A100 1410, H100/H200 1980)
    idle_sm_clock_mhz: float      # lowest P-state clock (D, nvidia-smi -q of idle parts)
    mem_clock_mhz: float          # HBM clock (A100 HBM2e 1593, H100 HBM3 2619, H200 HBM3e 3201)
    fb_total_mib: float           # framebuffer (80 GB, 80 GB, 141 GB parts)
    max_operating_c: float        # FR §2 Thermal limits: SW thermal slowdown starts here
    slowdown_c: float             # FR §2 Thermal limits: HW slowdown
    shutdown_c: float             # FR §2 Thermal limits
    idle_c: tuple[float, float]   # °C at idle, near inlet air (D)
    busy_rise_c: tuple[float, float]  # °C above idle at full load (D; leaves 10–20 °C to max operating)
    ib_gbps: float                # compute HCA link rate: DGX A100 HDR 200 Gb/s, DGX H100/H200 NDR 400 Gb/s


GENERATIONS: dict[str, GpuProfile] = {
    "A100": GpuProfile("A100", 400, 55, 320, 1410, 210, 1593, 81920, 85, 89, 92, (28, 36), (28, 38), 200),
    "H100": GpuProfile("H100", 700, 70, 560, 1980, 345, 2619, 81559, 87, 89, 92, (28, 38), (30, 40), 400),
    # H200 SXM: no nvidia-smi dump in the research; the same package and cooling as H100 (D)
    "H200": GpuProfile("H200", 700, 75, 580, 1980, 345, 3201, 143771, 87, 89, 92, (28, 38), (31, 41), 400),
}

#: Fields a dcgm-exporter on its default counter set does not export (null, never 0).
#: robust-detection.md §6 "dcgm-exporter defaults": ECC, retired-page and NVLink error
#: counters commented out; violation times and the pending-remap gauge not in the default set;
#: and no clock-event (throttle) reasons field at all (../shared/fixtures/dcgm_exporter/counters/
#: default-counters.csv, dcgm-exporter d5e5f51; candidate SC, bench/results/robustness.md).
EXPORTER_DEFAULT_MISSING: tuple[str, ...] = (
    "ecc_sbe_vol", "ecc_dbe_vol", "ecc_sbe_agg", "ecc_dbe_agg", "retired_pages_sbe", "retired_pages_dbe",
    "retired_pages_pending", "nvlink_crc_flit_err", "nvlink_crc_data_err", "nvlink_replay_err",
    "nvlink_recovery_err", "thermal_violation_us", "power_violation_us", "row_remap_pending", "throttle_reasons",
)

#: Optional fields a device or exporter may not report at all (null), by group: the column(s)
#: of each. Memory temperature reads "N/A" on every GPU of some nodes (shared/fixtures/nvidia_smi/
#: gpud nvidia-smi-query 535.154.05 out.2); dcgm-exporter's default counter set has no
#: DCGM_FI_DEV_POWER_MGMT_LIMIT (fixtures/dcgm_exporter/counters/default-counters.csv); framebuffer
#: use is unsupported on some partitioned or virtualised parts (D).
UNSUPPORTED_FIELDS: dict[str, tuple[str, ...]] = {
    "temp_mem_c": ("temp_mem_c",), "power_limit_w": ("power_limit_w",), "fb": ("fb_used_mib", "fb_free_mib"),
}


@dataclass(frozen=True)
class WorldRanges:
    """Ranges a world is drawn from. Pairs are (low, high), drawn uniformly unless noted."""

    #: the ranges' name: "train", or shift-NAME for the suite (manifest "world"."ranges")
    name: str = "train"
    # ---- fleet
    #: generations a world may use; FR §2 Thermal limits (A100, H100). H200 held out for the suite.
    generations: tuple[str, ...] = ("A100", "H100")
    #: probability the fleet mixes generations by node (else one generation for all); (D)
    mixed_fleet_prob: float = 0.3
    #: nodes per rack (power-brake events hit a rack); typical 4 DGX per rack (D)
    rack_nodes: tuple[int, int] = (4, 8)
    #: IB HCA ports per node, one value per world: 8 compute HCAs, or 8 + 1 storage (issue 8: "all 9 HCAs")
    ports_per_node_choices: tuple[int, ...] = (8, 9)
    # ---- workload (fractions of nodes; the rest run training jobs that start and stop)
    #: idle nodes: idle clocks, near-ambient temperature; (D)
    idle_node_frac: tuple[float, float] = (0.0, 0.15)
    #: inference nodes with a diurnal load; FR §2 Throttling (Llama 3 diurnal variation)
    inference_node_frac: tuple[float, float] = (0.0, 0.35)
    #: shared nodes: training-class nodes whose GPUs each run their own jobs (a scheduler handing
    #: out single GPUs: development and small-job partitions), so on one node some GPUs are busy
    #: while others idle at idle clocks. RD §1 (peers must share the workload to be peers); (D) share
    shared_node_frac: tuple[float, float] = (0.0, 0.25)
    #: a shared node's GPU jobs and the idle gaps between them, s (log-uniform); (D)
    shared_job_s: tuple[float, float] = (600, 6 * 3600)
    shared_gap_s: tuple[float, float] = (300, 3 * 3600)
    #: share of busy samples at the SW power cap; FR §2 Throttling ("SW power cap is routine")
    power_cap_frac: tuple[float, float] = (0.02, 0.2)
    #: hot-but-healthy nodes whose busy temperature sits within a few °C of max operating; FR §2 Thermal
    hot_node_frac: tuple[float, float] = (0.0, 0.1)
    #: rack-wide HW power-brake events on healthy nodes, per rack-day; duration s; (D, Delta power events FR §1)
    power_brake_per_rack_day: tuple[float, float] = (0.0, 0.5)
    power_brake_s: tuple[float, float] = (60, 300)
    # ---- sampling
    #: GPU sampling intervals a node may get, s; DCGM/NVML pollers run at 1–60 s (telemetry.md §1);
    #: training keeps 5–30 s so 1–2 s and 60 s stay out-of-range for the suite
    interval_choices_s: tuple[float, ...] = (5, 10, 15, 20, 30)
    #: probability a world mixes 2–3 interval groups across nodes (else one interval); (D)
    mixed_interval_prob: float = 0.5
    #: port-counter cadence choices, s; 0 = same as the node's GPU samples (D)
    port_interval_choices_s: tuple[float, ...] = (0, 0, 30)
    #: per-sample timing jitter, fraction of the node's interval (uniform ±); (D)
    jitter_frac: tuple[float, float] = (0.0, 0.1)
    #: per-node clock skew, s (normal, this sd); NTP-synced hosts (D); RD §6 (scraper stamps samples)
    skew_sd_s: tuple[float, float] = (0.0, 2.0)
    #: share of nodes whose BMC gpuops reads (SEL entries, sensor readings); the rest have none wired up,
    #: so a supply or fan shows only in the GPUs and in the node going dark; (D)
    bmc_node_frac: tuple[float, float] = (0.3, 1.0)
    #: exporter restarts per node-day, each a gap of gap_s seconds with no samples; (D)
    gap_per_node_day: tuple[float, float] = (0.0, 1.0)
    gap_s: tuple[float, float] = (20, 300)
    #: share of rows written late (out of order within a chunk); spec/recording.md allows any order
    late_row_frac: tuple[float, float] = (0.0, 0.005)
    #: driver reloads per node-day: volatile counters back to 0; RD §6 (volatile ECC resets on driver load)
    driver_reload_per_node_day: tuple[float, float] = (0.0, 0.2)
    #: share of nodes on dcgm-exporter's default counter set (EXPORTER_DEFAULT_MISSING null); RD §6
    exporter_default_node_frac: tuple[float, float] = (0.0, 0.3)
    #: share of nodes lacking each group of UNSUPPORTED_FIELDS (drawn per group); on such a node
    #: every GPU lacks it (half the time) or a random subset does; RD §6, fixtures above, (D) share
    unsupported_node_frac: tuple[float, float] = (0.0, 0.3)
    #: share of nodes whose port data/packet counters are 32-bit and wrap (RD §6 counter widths:
    #: data 32-bit in PortCounters; delta = current + 2^32 - previous); most HCAs report 64-bit (D)
    wrap_data_node_frac: tuple[float, float] = (0.0, 0.1)
    # ---- benign background on healthy parts (zero-inflated, heavy-tailed, per part)
    #: share of GPUs that ever log SBE; FR §2 SBE (about 5 % of A100s; Titan < 5 %)
    sbe_gpu_frac: tuple[float, float] = (0.02, 0.08)
    #: median SBE rate of those GPUs, per hour (lognormal, sd 1.5 in log); FR §2 SBE (0.5–2.8 per GPU-day fleet)
    sbe_rate_per_h: tuple[float, float] = (0.05, 1.0)
    #: chronic cards per world (a card with 20–200 SBE/h that never fails); FR §2 SBE (98 % from 10 cards)
    chronic_sbe_cards: tuple[int, int] = (0, 2)
    #: SBE bursts per GPU-day (100–5000 SBE in 1–30 min, a row remap + pending, XID 63/92); FR §2 SBE
    #: (Delta logged 112,656 in a day); the bursts never end in a failure
    sbe_burst_per_gpu_day: tuple[float, float] = (0.0, 0.01)
    #: share of SBE bursts that tail off instead of stopping: the same count (100–5000) decays
    #: exponentially with a time constant drawn from sbe_burst_tau_s (log-uniform) for four time
    #: constants, so a burst spreads over up to half a day. FR §2 SBE: Delta's bursts reach 112,656 SBE
    #: in one day and streaks come from a few cards; a storm that subsides is (D). Since the twelfth
    #: session; drawn from the bursts' own random stream
    sbe_burst_decay_frac: float = 0.5
    sbe_burst_tau_s: tuple[float, float] = (600, 3 * 3600)
    #: share of GPUs with a PCIe replay trickle, and its rate per minute; FR §2 PCIe (≈0) and FR §4 DCGM
    #: (WARN at 16–31/min): kept 10x below the warning
    pcie_gpu_frac: tuple[float, float] = (0.0, 0.04)
    pcie_rate_per_min: tuple[float, float] = (0.01, 1.5)
    #: ceiling on any one GPU's PCIe trickle, per minute: 4 keeps it 4x under DCGM's 16/min warning (FR §4)
    pcie_cap_per_min: float = 4.0
    #: share of GPUs with an NVLink CRC trickle, and its rate per minute; FR §3 NVLink (DCGM: matters at
    #: 100+/s) — kept far below, and below the 5/min a failing link starts at
    nvlink_gpu_frac: tuple[float, float] = (0.0, 0.05)
    nvlink_rate_per_min: tuple[float, float] = (0.01, 3.0)
    #: share of IB ports with a steady error trickle (rcv errors, symbol errors, buffer overruns),
    #: rate per hour; FR §2 IB symbol errors (raw BER never zero; post-FEC rare); below NVSentinel's
    #: symbol_error 120/h (FR §4)
    ib_noisy_port_frac: tuple[float, float] = (0.03, 0.25)
    ib_rate_per_h: tuple[float, float] = (0.05, 10.0)
    #: ceiling on any one port's trickle, per hour: under NVSentinel's 120 symbol errors/h (FR §4)
    ib_cap_per_h: float = 100.0
    #: IB error bursts per port-day (tens to thousands of rcv/symbol errors in minutes); (D)
    ib_burst_per_port_day: tuple[float, float] = (0.0, 0.03)
    #: benign sustained rises per GPU-day and per port-day: a healthy part's error counter (SBE,
    #: PCIe replay or NVLink CRC on a GPU; the IB trickle counters on a port) starts trickling
    #: mid-recording, keeps on for rise_s, then stops, and never fails. FR §2: most SBEs come from
    #: a few cards in bursts and streaks (≈5 % of GPUs ever log one, hardware failures run at
    #: 1e-4–8e-4 per GPU-day, so nearly every SBE streak is benign); link errors come and go
    #: (flaps "frequent and mostly transient"); post-FEC errors scale with the bits a link carries
    #: (IBTA BER → errors per hour of traffic, FR §4), so a quiet port that starts carrying a job
    #: starts erring. No published rate of such onsets: (D), kept rarer than the faults' precursors
    #: are in training worlds
    rise_per_gpu_day: tuple[float, float] = (0.0, 0.02)
    rise_per_port_day: tuple[float, float] = (0.0, 0.02)
    #: how long a rise lasts, s (log-uniform); (D)
    rise_s: tuple[float, float] = (3600, 12 * 3600)
    #: rate of a rising part while it is on: SBE per hour (steady trickle top to a chronic card,
    #: FR §2), PCIe replays and NVLink CRC per minute (inside the trickle ranges and caps above,
    #: 4–16x under DCGM's limits, FR §4), IB errors per hour (under the trickle cap); log-uniform
    rise_sbe_per_h: tuple[float, float] = (1.0, 200.0)
    rise_pcie_per_min: tuple[float, float] = (0.01, 4.0)
    rise_nvlink_per_min: tuple[float, float] = (0.01, 3.0)
    rise_ib_per_h: tuple[float, float] = (0.05, 100.0)
    #: link flaps per port-day that recover (state not ACTIVE for flap_s, link_downed +1); FR §2 Link flaps
    link_flap_per_port_day: tuple[float, float] = (0.0, 0.03)
    flap_s: tuple[float, float] = (5, 90)
    #: application XIDs (all RESTART_APP codes) per GPU-day as unlabelled background; FR §2 Application XIDs
    app_xid_per_gpu_day: tuple[float, float] = (0.005, 0.05)
    #: informational XIDs 63/92 per GPU-day with no failure; FR §1 Delta XIDs (63 frequent, no failure)
    info_xid_per_gpu_day: tuple[float, float] = (0.0, 0.005)
    #: application XID codes; empty = every RESTART_APP code of NVIDIA's catalogue (collector/xid.py)
    app_xid_codes: tuple[int, ...] = ()
    # ---- counters already high at recording start
    #: share of GPUs with legacy history (aggregate SBE, remapped rows); FR §2 SBE, FR §3 Row remaps
    legacy_gpu_frac: tuple[float, float] = (0.05, 0.4)
    #: share of ports with legacy IB counts, and of those, share stuck at the counter width; RD §6
    legacy_port_frac: tuple[float, float] = (0.2, 0.9)
    saturated_port_frac: tuple[float, float] = (0.0, 0.05)
    # ---- fault signatures (around today's per-class effects in faults.py)
    #: precursor growth shapes drawn per incident
    fault_shapes: tuple[str, ...] = ("exp", "linear", "step")
    #: magnitude factor on precursor rates (log-uniform); (D)
    fault_magnitude: tuple[float, float] = (0.4, 2.5)
    #: factor on each class's lead-time range (log-uniform); FR §3 (no lead-time distribution published)
    lead_scale: tuple[float, float] = (0.6, 1.6)
    #: probability a precursor is intermittent (on/off), and the on-share when it is; (D)
    intermittent_prob: float = 0.3
    on_frac: tuple[float, float] = (0.35, 0.8)
    #: failure-rate multiplier, as SimConfig.rate_multiplier (1 = field rate, FR §1 Llama 3)
    rate_multiplier: tuple[float, float] = (100, 200)
    #: notes for the manifest (what a shifted world changes)
    shift: str = ""


TRAINING = WorldRanges()


def _times(r: tuple[float, float], k: float) -> tuple[float, float]:
    """*k* times the range, starting no lower than the training range's top (so it lies outside it)."""
    return (max(r[0] * k, r[1]), r[1] * k)


def _background_times(name: str, k: float, note: str, *, sbe_frac: tuple[float, float],
                      chronic: tuple[int, int], pcie_frac: tuple[float, float], nvlink_frac: tuple[float, float],
                      noisy_port_frac: tuple[float, float], pcie_cap: float, ib_cap: float) -> WorldRanges:
    """TRAINING with every benign background rate *k* times its range (outside it), and more
    parts noisy (the fractions given, each above the training range)."""
    t = TRAINING
    return replace(
        t, name=name, shift=note,
        sbe_gpu_frac=sbe_frac, sbe_rate_per_h=_times(t.sbe_rate_per_h, k), chronic_sbe_cards=chronic,
        sbe_burst_per_gpu_day=_times(t.sbe_burst_per_gpu_day, k), pcie_gpu_frac=pcie_frac,
        pcie_rate_per_min=_times(t.pcie_rate_per_min, k), nvlink_gpu_frac=nvlink_frac,
        nvlink_rate_per_min=_times(t.nvlink_rate_per_min, k),
        ib_noisy_port_frac=noisy_port_frac, ib_rate_per_h=_times(t.ib_rate_per_h, k),
        ib_burst_per_port_day=_times(t.ib_burst_per_port_day, k),
        link_flap_per_port_day=_times(t.link_flap_per_port_day, k),
        rise_per_gpu_day=_times(t.rise_per_gpu_day, k), rise_per_port_day=_times(t.rise_per_port_day, k),
        app_xid_per_gpu_day=_times(t.app_xid_per_gpu_day, k),
        info_xid_per_gpu_day=_times(t.info_xid_per_gpu_day, k),
        pcie_cap_per_min=pcie_cap, ib_cap_per_h=ib_cap)


#: Worlds outside TRAINING that the *tuning* set may hold (seeds 301–399): a background
#: shift milder than the suite's ×10, so a choice made on tuning can see what a model does
#: on a fleet noisier than any it was trained on without looking at the judged suite.
TUNING_SHIFTS: dict[str, WorldRanges] = {
    "tune-background-x3": _background_times(
        "tune-background-x3", 3, "benign background rates x3 (tuning only)", sbe_frac=(0.08, 0.15),
        chronic=(2, 4), pcie_frac=(0.04, 0.1), nvlink_frac=(0.05, 0.1), noisy_port_frac=(0.25, 0.5),
        pcie_cap=8.0, ib_cap=300.0),
    # SBE bursts 3–5x training's top (about 15–25 per 64-node day), half of them tailing off: enough of
    # them in two recordings to see whether a model reads a benign storm as a failing HBM
    "tune-sbe-bursts": replace(TRAINING, name="tune-sbe-bursts", shift="SBE bursts x3-5 (tuning only)",
                               sbe_burst_per_gpu_day=(0.03, 0.05)),
}

#: Whole worlds outside TRAINING, for the shift suite (never train or tune on them).
SHIFTS: dict[str, WorldRanges] = {
    "shift-background-x10": _background_times(
        "shift-background-x10", 10, "benign background rates x10", sbe_frac=(0.15, 0.3), chronic=(3, 8),
        pcie_frac=(0.1, 0.3), nvlink_frac=(0.1, 0.3), noisy_port_frac=(0.3, 0.8), pcie_cap=15.0, ib_cap=1000.0),
    "shift-interval-60s": replace(TRAINING, name="shift-interval-60s", shift="every node sampled at 60 s",
                                  interval_choices_s=(60,), port_interval_choices_s=(0,)),
    "shift-interval-2s": replace(TRAINING, name="shift-interval-2s", shift="every node sampled at 2 s",
                                 interval_choices_s=(2,), port_interval_choices_s=(0,)),
    "shift-h200": replace(TRAINING, name="shift-h200", shift="H200 only (generation held out of training)",
                          generations=("H200",), mixed_fleet_prob=0.0),
    "shift-messy": replace(
        TRAINING, name="shift-messy", shift="skew, late rows, gaps, missing fields, saturated counters, resets",
        skew_sd_s=(5.0, 15.0), late_row_frac=(0.02, 0.05), wrap_data_node_frac=(0.3, 0.5),
        gap_per_node_day=(3.0, 6.0), gap_s=(60, 1200),
        jitter_frac=(0.15, 0.3), driver_reload_per_node_day=(0.5, 1.5), exporter_default_node_frac=(0.4, 0.6),
        legacy_port_frac=(0.9, 1.0), saturated_port_frac=(0.15, 0.3), legacy_gpu_frac=(0.5, 0.8)),
    "shift-mixed-fleet": replace(
        TRAINING, name="shift-mixed-fleet", shift="A100+H100+H200 by node, every interval group mixed, "
        "heavy idle/inference share", generations=("A100", "H100", "H200"), mixed_fleet_prob=1.0,
        interval_choices_s=(2, 10, 30, 60), mixed_interval_prob=1.0, idle_node_frac=(0.2, 0.3),
        inference_node_frac=(0.4, 0.5), port_interval_choices_s=(60,)),
}

RANGES: dict[str, WorldRanges] = {"train": TRAINING, **TUNING_SHIFTS, **SHIFTS}


def ranges_by_name(name: str) -> WorldRanges:
    """The named ranges; an unknown name fails listing the valid ones."""
    try:
        return RANGES[name]
    except KeyError:
        raise ValueError(f"unknown world ranges {name!r}; valid: {', '.join(sorted(RANGES))}") from None
