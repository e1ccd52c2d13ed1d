"""Which pipeline features the learned models read, and why the others are left out.

A feature whose healthy distribution moves from one fleet to the next teaches a model the
fleet it was trained on, not the failure (shared/research/robust-detection.md §5). The
learned detectors therefore read every pipeline feature **except** those below; the
rules, which encode published limits rather than learnt ones, may read any feature.

Each exclusion names its reason. :func:`model_inputs` applies them by name, so features
the pipeline appends later are model inputs unless a pattern here says otherwise.
"""

from __future__ import annotations

import re
from typing import Sequence

#: (regular expression on the feature name, why a model must not learn from it)
EXCLUDED: tuple[tuple[str, str], ...] = (
    (r"^sample_age_s$|^samples_short$|^node_silent_s$",
     "encodes the sampling interval: 10 s and 60 s fleets differ here while healthy; silence is "
     "the policy's business (a stale node is unknown, not failing; rule power_lost reads it)"),
    (r"^node_gpus_(lost|reading)$",
     "a GPU lost from its node is the policy's business (a held node waits for it before it is resumed); "
     "a failure it follows is already told by its XID"),
    (r"^node_gpus_scored$|^net_ports$",
     "counts the chassis (4 or 8 GPUs, 1-9 HCAs), not its health"),
    (r"_total$",
     "lifetime levels (remapped rows, retired pages, DBEs since ever) are history: a healthy GPU can "
     "carry them for years; their change is in the *_per_h rates"),
    (r"^net_(?!.*port_max)(?!ports_not_active).*_per_min_(short|long)$",
     "summed over the node's ports, so it grows with how many HCAs a node has; the worst single "
     "port (net_*_port_max_*) replaces it"),
    (r"^(sm_clock_mhz|power_w|util_gpu)_mean_(short|long)$",
     "absolute clocks, power and utilisation are the GPU generation's and the workload's, not the "
     "part's health; deficits against peers carry the fail-slow signal"),
    (r"^temp_(gpu|mem)_c_mean_(short|long)$|^temp_gpu_c_without_reasons_short$",
     "a healthy GPU's temperature is its inlet air's, its cooling's and its generation's: idle GPUs "
     "of one fleet sit near ambient, below anything busy in another; the thermal signal is the rise "
     "(slope), the excess over peers and the throttle flags, and the rules read the levels"),
    (r"^(power_w|sm_clock_mhz|util_gpu)_std_(short|long)$",
     "how much power, clocks and load vary is the workload's (idle, diurnal inference, checkpoints) "
     "and the exporter's (a cached exporter repeats one value), not the part's health"),
    (r"^(row_remap|retired_pages)_pending$",
     "a pending remap or retirement is an instruction (reset when idle), not a forecast: a healthy GPU "
     "carries one for hours after a benign burst of corrected errors; the rules act on it together "
     "with the uncorrectable error that makes it urgent"),
    (r"^net_.*_(per_min_port_max_(short|long)|excess_long_port_max)$",
     "a port's error count in a window: a tree learns 'any error is a failure' from a simulator whose "
     "healthy ports rarely err, and one benign receive error or recovered flap drains the node on a "
     "real fleet; the port's rate CUSUM against its own rate (net_*_cusum_port_max) carries a sustained "
     "rise and never shows one or two stray errors"),
    (r"^node_(sm_clock|power|util)_fleet_z$",
     "a node against the whole fleet's clocks, power or load is a generation or job mix in a mixed "
     "fleet, not a fault"),
    (r"^power_abs_dev_vs_peers$",
     "against the node's median GPU: on a node shared by jobs (one-GPU jobs, development nodes) most GPUs "
     "may idle, and a healthy busy GPU then reads ~8 (healthy p99 0.88), so its healthy spread is the "
     "fleet's job mix. Power is only comparable among one job's GPUs, and the telemetry names no job: "
     "against the node's busy GPUs instead it read 1.0-1.2 at 60 s sampling on healthy shared nodes (jobs "
     "in different phases; bench/results/robustness.md, candidates A1 and A2)"),
    (r"^(node_)?xid_(app|informational)_count_(short|long)$",
     "the catalogue's RESTART_APP and IGNORE XIDs are the job's doing or a driver's log line, not this GPU's "
     "hardware: their rate is the job mix's and the driver's, and a model learns from them what a simulator "
     "logs (a tree read an informational XID 92 as 'this storm is benign', though a driver logs it for a failing "
     "HBM's corrected errors too). The rules never act on them. The shipped model, trained before this, holds "
     "them at 0 (model.json held_inputs; bench/results/robustness.md, X3 and XW)"),
    (r"^ecc_sbe_(per_h_10m|10m_of_peak|10m_growth)$",
     "read by the policy as a stated rule (an hbm_ecc prediction waits while its GPU's storm of corrected "
     "errors falls from its own peak or holds its rate: PolicyConfig.hbm_storm_ratio, hbm_steady_growth); a "
     "model would learn the simulator's storm shapes"),
)
_PATTERNS = tuple((re.compile(p), why) for p, why in EXCLUDED)


def exclusion_reason(name: str) -> str | None:
    """Why feature *name* is not a model input (None when it is one)."""
    return next((why for p, why in _PATTERNS if p.search(name)), None)


def model_inputs(feature_names: Sequence[str]) -> tuple[str, ...]:
    """The features the learned detectors read, in pipeline order."""
    return tuple(n for n in feature_names if exclusion_reason(n) is None)
