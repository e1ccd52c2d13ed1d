"""Safety: the limits every automatic action passes before it may touch a cluster.

The policy decides what *should* happen to a node; this module decides whether gpuops
may do it *now*, from a :class:`Snapshot` of what the engine has already done. It is a
pure function (no clock, no I/O): :func:`gate` returns a :class:`Verdict` saying go, wait
for a person, or no — and why. The engine records every verdict on the action itself
(``blocked_by``), so the audit trail says which limit held an action back; :func:`named`
puts the scheduler's own words in it where it has them (which MAINT reservation, whose drain).

Checks, in order (the first that applies wins):

1. **maintenance / not ours** — the node is under declared maintenance, or drained or
   cordoned by someone else: never acted on (rejected, with the cause).
2. **stale** — the decision is older than ``freshness_s`` (telemetry time against the
   engine's clock): after a restart, old events are not acted on.
3. **paused** — a person paused automation: proposals wait.
4. **breaker** — the circuit breaker is open (too many nodes looked bad at once; usually
   the telemetry, not the fleet): nothing automatic runs until a person closes it.
5. **cooldown** — the node had an action within ``node_cooldown_s`` (a node gpuops holds may
   still be escalated: the same incident going further).
6. **lemon** — the node was taken out ``lemon_actions`` times within ``lemon_window_s``:
   a person decides instead of another loop.
7. **caps** — concurrently held nodes (absolute, % of the fleet, % of a partition) and
   actions per ``action_window_s``.
8. **approval** — kinds in ``require_approval`` wait for a person.

Only kinds that take capacity away pass through 3–8; resumes and alerts pass 1–2 only
(holding a node longer than needed is not safer). A person's explicit approval of a held
proposal is an override, and is recorded as such.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .actions import ActionKind
from .adapters.base import NodeStatus
from .config import load_yaml_model


class SafetyConfig(BaseModel):
    """Every limit, with its unit and why its default (``safety:`` in the service config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    armed: bool = Field(
        False, description="False: every action goes to the dry-run adapter and nothing touches the cluster. "
        "Automation must be armed explicitly (config, or `gpuops engine arm` at run time).")
    max_held_nodes: int = Field(
        8, ge=0, description="Nodes gpuops may hold out of service at once (drained, resetting, rebooting). "
        "8: one rack's worth; more at once is rarely a hardware story.")
    max_held_fraction: float = Field(
        0.05, ge=0, le=1, description="...and at most this share of the fleet (0-1). 5 %: the capacity a "
        "cluster keeps spare for failures anyway. The smaller of the two caps applies.")
    max_held_fraction_per_partition: float = Field(
        0.25, ge=0, le=1, description="...and of any one partition / node pool (0-1), so a small partition "
        "is never emptied. A partition with fewer than 4 nodes may still lose one.")
    max_actions_per_window: int = Field(
        20, ge=0, description="Automatic cluster actions (not alerts) per action_window_s, fleet-wide.")
    action_window_s: float = Field(3600.0, gt=0, description="The window of max_actions_per_window, s.")
    node_cooldown_s: float = Field(
        1800.0, ge=0, description="After an action on a node, s before another automatic one on it. Stops "
        "flapping between drain and resume on a marginal part.")
    lemon_actions: int = Field(
        3, ge=1, description="A node taken out this many times within lemon_window_s is a lemon: the next "
        "action waits for a person instead of looping (reset/reboot loops are operators' top complaint).")
    lemon_window_s: float = Field(7 * 86400.0, gt=0, description="The lemon window, s (7 days).")
    breaker_nodes: int = Field(
        10, ge=1, description="The breaker opens when more than this many distinct nodes get an automatic "
        "action within breaker_window_s ...")
    breaker_fraction: float = Field(
        0.1, gt=0, le=1, description="... or more than this share of the fleet (0-1), whichever is larger. "
        "NVSentinel trips at a share of GPU nodes cordoned in a window; a person must close it.")
    breaker_window_s: float = Field(600.0, gt=0, description="The breaker's window, s.")
    require_approval: frozenset[ActionKind] = Field(
        frozenset(), description="Kinds that wait for a person's approval (e.g. [reset, reboot]). Empty: "
        "the caps above are the guard.")
    freshness_s: float = Field(
        600.0, gt=0, description="A decision older than this (its telemetry time against the engine's clock), "
        "s, is not acted on: after a restart or a backlog, stale events are recorded as rejected.")
    proposal_ttl_s: float = Field(
        3600.0, gt=0, description="A proposal nobody approved within this, s, is cancelled (the evidence "
        "behind it is old); the policy may propose again.")
    max_attempts: int = Field(
        5, ge=1, description="Adapter attempts per action on transient errors before it fails for a person.")
    retry_backoff_s: float = Field(
        10.0, gt=0, description="First wait before retrying a transient adapter error, s; doubles per attempt, "
        "capped at 300 s.")
    verify_window_s: float = Field(
        1800.0, ge=0, description="A held node is resumed only after this long of clean telemetry, s (the "
        "policy's resume_after_s for automatic resumes; also enforced for an operator's resume unless forced).")
    max_silence_s: float = Field(
        7 * 86400.0, gt=0, description="The longest silence a person may declare, s (7 days): a forgotten "
        "silence would mute gpuops for good; a longer job declares a new one when this ends.")
    facility_window_s: float = Field(
        300.0, gt=0, description="Acting decisions of one fault class on facility_min_nodes nodes of one group "
        "(rack, leaf switch, partition) within this, s, are one facility event (remediation/facility.py): one "
        "alert for the group, no drains. 300 s: a rack's power brake or a switch's flap reaches all its nodes "
        "within a few telemetry intervals; independent faults rarely line up that closely.")
    facility_min_nodes: int = Field(
        3, ge=2, description="Nodes of one group needed for a facility event. 3: two nodes of a rack failing "
        "together happens by chance in a big fleet; three with the same fault in the same minutes rarely does.")
    facility_fraction: float = Field(
        0.25, gt=0, le=1, description="For a partition, or the whole fleet when the scheduler reports no group "
        "for a node: the members must also be at least this share of it (0-1). 25 %: a partition is far bigger "
        "than a rack, so a few nodes in it are not one event, a quarter at once is.")
    facility_labels: tuple[str, ...] = Field(
        ("rack", "leaf", "switch"), description="NodeStatus.extra labels that name a node's physical group, "
        "tried in order (an adapter that knows a node's rack or switch reports it there).")
    reset_timeout_s: float = Field(
        300.0, gt=0, description="A GPU reset command's expiry, s: without a result from the node agent by then "
        "the action fails (it is never sent twice blindly).")


class SafetyConfigError(ValueError):
    """An invalid safety file (permanent: fix the file)."""


def load_safety_config(path: str | Path | None) -> SafetyConfig:
    """Read the ``safety:`` mapping of a YAML file (``None``: defaults); every problem is listed."""
    return load_yaml_model(path, SafetyConfig, "safety", SafetyConfigError)


class Outcome(str, enum.Enum):
    GO = "go"            # approve and execute now
    PERSON = "person"    # record as proposed; a person approves or rejects
    NO = "no"            # record as rejected


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    blocked_by: str | None = None   # the limit's name (None: nothing held it back)
    why: str = ""


GO = Verdict(Outcome.GO)


@dataclass
class Snapshot:
    """What the engine knows when it gates one tick's actions (kept up to date as it goes)."""

    now: float                                  # the engine's clock, s
    fleet_size: int                             # nodes scored this tick (or known)
    held: set[str] = field(default_factory=set)               # nodes gpuops holds or is about to
    partition_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    partition_size: dict[str, int] = field(default_factory=dict)
    actions_in_window: int = 0                  # automatic cluster actions within action_window_s
    last_action_at: dict[str, float] = field(default_factory=dict)   # node -> created_at of its last action
    recent_holds: dict[str, int] = field(default_factory=dict)       # node -> holds within lemon_window_s
    paused: bool = False
    breaker_open: bool = False

    def held_in(self, partition: str) -> int:
        return sum(1 for n in self.held if partition in self.partition_of.get(n, ()))


def held_cap(cfg: SafetyConfig, fleet_size: int) -> int:
    """How many nodes may be held at once: the smaller cap, at least one where any is allowed."""
    if cfg.max_held_nodes == 0 or cfg.max_held_fraction == 0:
        return 0
    return max(1, min(cfg.max_held_nodes, math.floor(cfg.max_held_fraction * fleet_size)))


def breaker_limit(cfg: SafetyConfig, fleet_size: int) -> int:
    """More distinct acted-on nodes than this within breaker_window_s opens the breaker."""
    return max(cfg.breaker_nodes, math.floor(cfg.breaker_fraction * fleet_size))


def gate(kind: ActionKind, node: str, incident_ts: float, snap: Snapshot, cfg: SafetyConfig, *,
         maintenance: bool = False, not_ours: bool = False) -> Verdict:
    """May the engine take *kind* on *node* now? (See the module docstring for the order.)"""
    if maintenance:
        return Verdict(Outcome.NO, "maintenance", "the node is under declared maintenance")
    if not_ours and kind is not ActionKind.ALERT:
        return Verdict(Outcome.NO, "not_ours", "the node is drained or cordoned by someone else")
    age = snap.now - incident_ts
    if age > cfg.freshness_s:
        return Verdict(Outcome.NO, "stale", f"decision is {age:.0f} s old (freshness_s {cfg.freshness_s:.0f})")
    if not kind.holds_node:
        return GO
    if snap.paused:
        return Verdict(Outcome.PERSON, "paused", "automation is paused")
    if snap.breaker_open:
        return Verdict(Outcome.PERSON, "breaker", "the circuit breaker is open")
    last = snap.last_action_at.get(node)
    # a node gpuops already holds may be escalated (a corroborated prediction's reset): that is the same
    # incident going further, not the flapping the cooldown is for
    if last is not None and node not in snap.held and snap.now - last < cfg.node_cooldown_s:
        return Verdict(Outcome.PERSON, "cooldown",
                       f"last action on the node {snap.now - last:.0f} s ago (node_cooldown_s {cfg.node_cooldown_s:.0f})")
    holds = snap.recent_holds.get(node, 0)
    if holds >= cfg.lemon_actions:
        return Verdict(Outcome.PERSON, "lemon",
                       f"taken out {holds} times in {cfg.lemon_window_s / 86400:.0f} days: a person decides")
    if node not in snap.held:
        cap = held_cap(cfg, snap.fleet_size)
        if len(snap.held) + 1 > cap:
            return Verdict(Outcome.PERSON, "cap_held", f"{len(snap.held)} nodes held already (cap {cap})")
        for p in snap.partition_of.get(node, ()):
            size = snap.partition_size.get(p, 0)
            pcap = max(1, math.floor(cfg.max_held_fraction_per_partition * size))
            if snap.held_in(p) + 1 > pcap:
                return Verdict(Outcome.PERSON, "cap_partition",
                               f"partition {p}: {snap.held_in(p)} of {size} nodes held (cap {pcap})")
    if snap.actions_in_window + 1 > cfg.max_actions_per_window:
        return Verdict(Outcome.PERSON, "cap_rate",
                       f"{snap.actions_in_window} actions in the last {cfg.action_window_s / 60:.0f} min "
                       f"(cap {cfg.max_actions_per_window})")
    if kind in cfg.require_approval:
        return Verdict(Outcome.PERSON, "approval", f"{kind.value} needs a person's approval (require_approval)")
    return GO


def named(verdict: Verdict, status: NodeStatus | None) -> Verdict:
    """The gate's verdict with the scheduler's own words: which MAINT reservation, whose drain."""
    if status is None:
        return verdict
    if verdict.blocked_by == "maintenance":
        resv = status.extra.get("maintenance_reservation")
        if resv:
            return Verdict(verdict.outcome, f"maintenance:{resv}",
                           f"the node is in the Slurm maintenance reservation {resv} (Flags=MAINT)")
        until = status.extra.get("maintenance_until")
        if until:
            return Verdict(verdict.outcome, "maintenance",
                           f"the node is annotated gpuops.io/maintenance-until={until}")
    if verdict.blocked_by == "not_ours" and status.reason:
        return Verdict(verdict.outcome, "not_ours",
                       f"{verdict.why} (reason {status.reason!r}: only its owner returns it to service)")
    return verdict
