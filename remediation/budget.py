"""The fleet's false-action budget: predictions that do not come true brake their fault class.

A fleet tells gpuops, without anyone simulating it, whether its predictions come true. A node
held on a prediction either meets its failure while held — an acting rule fires, and the
prediction was right (*confirmed*) — or is resumed healthy after ``min_hold_s`` and
``resume_after_s`` with no such rule (*unconfirmed*), until an acting rule fires on the node
within ``false_budget_confirm_s`` (the classifier's 6 h horizon) of the hold's start: resumed
before its failure came, it came true all the same (:func:`confirm_late`). A person's verdict
(:mod:`remediation.budget_keeper`) takes the place of either. :func:`remediation.policy.decide`
records each outcome here, per predicted fault class, and the fleet's exposure in node-days
(scored nodes × telemetry time between ticks, a gap counted at most :data:`MAX_GAP_S`).

A class is *braked* once, over the last ``false_budget_window_s``, its unconfirmed count *k*
is at least ``false_budget_min_events`` and the one-sided ``false_budget_confidence`` Poisson
lower bound on *k* is above ``false_budget_per_1k_node_days`` × exposure / 1,000: the fleet has
shown, beyond chance, that this class's predictions drain healthy nodes more often than the
budget allows. Its predictions then alert instead of acting, and say why; rules on certain
evidence are never braked. The brake holds while the class's rate itself (*k* per 1,000
node-days) is over the budget, and lifts by itself once the outcomes age out of the window or
the exposure grows past them (engaging on evidence and releasing on its absence, it does not
flap as node-days accrue). It only ever takes action away (research/robust-detection.md §4).

Pure, like the policy: the state is a frozen value (``PolicyState.budget``), time is telemetry
time. A replay starts it empty; the service keeps it in its store across restarts and failovers
(:mod:`remediation.budget_keeper`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from collector.schema import FaultClass

from .config import PolicyConfig

#: a gap between ticks longer than this counts only this long towards the exposure, s (a service
#: that was down, or a recording's hole, did not watch the fleet)
MAX_GAP_S = 600.0
#: exposure is kept in buckets this long, s (a week's window is 168 of them)
BUCKET_S = 3600.0
_SECONDS_PER_DAY = 86400.0


#: a person's verdict on a prediction hold (``POST /v1/actions/{id}/verdict``) -> confirmed
VERDICTS = {"healthy": False, "faulty": True}
#: who judged an outcome the policy saw for itself; a person's verdict reads ``"verdict"`` (the action's
#: audit trail names the person)
POLICY = "policy"


@dataclass(frozen=True)
class HoldOutcome:
    """How one hold taken on a prediction ended: its failure came (confirmed) or it did not."""

    ts: float            # telemetry time the outcome was known (the resume, the rule, the verdict)
    node: str
    fault: FaultClass
    confirmed: bool
    since: float = 0.0   # the hold's own time (its decision's ts, its record's incident_ts): which hold
    by: str = POLICY     # the policy (a resume, a rule), or "verdict": a person's

    def to_json(self) -> list[object]:
        return [self.ts, self.node, self.fault.value, self.confirmed, self.since, self.by]

    @classmethod
    def from_json(cls, v: list[object]) -> "HoldOutcome":
        ts, node, fault, confirmed, since, by = v
        return cls(float(ts), str(node), FaultClass(fault), bool(confirmed), float(since), str(by))


@dataclass(frozen=True)
class BudgetState:
    """The outcomes and the exposure of the last window (see the module docstring)."""

    outcomes: tuple[HoldOutcome, ...] = ()
    #: (bucket start, node-seconds scored in it), oldest first
    exposure: tuple[tuple[float, float], ...] = ()
    last_tick: float | None = None
    #: the classes braked as of the last tick (fault values): a braked class stays so until its rate is back under
    #: the budget, not merely its lower bound (hysteresis: a brake does not flap as node-days accrue)
    braked: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The state as the engine keeps it in the store across restarts (``false_budget``)."""
        return {"outcomes": [o.to_json() for o in self.outcomes], "exposure": [list(e) for e in self.exposure],
                "last_tick": self.last_tick, "braked": list(self.braked)}

    @classmethod
    def from_json(cls, v: dict[str, object] | None) -> "BudgetState":
        """A stored state; ``None`` or one that does not read (another version's) is an empty state."""
        if not v:
            return cls()
        try:
            last = v.get("last_tick")
            return cls(tuple(HoldOutcome.from_json(o) for o in v.get("outcomes", ())),  # type: ignore[union-attr]
                       tuple((float(b), float(x)) for b, x in v.get("exposure", ())),  # type: ignore[union-attr]
                       None if last is None else float(last),  # type: ignore[arg-type]
                       tuple(str(f) for f in v.get("braked", ())))  # type: ignore[union-attr]
        except (TypeError, ValueError):
            return cls()

    def node_days(self, now: float, window_s: float) -> float:
        """The fleet's exposure over the window ending at *now*, node-days."""
        return sum(v for b, v in self.exposure if b + BUCKET_S > now - window_s) / _SECONDS_PER_DAY


def observe(state: BudgetState, n_nodes: int, now: float, cfg: PolicyConfig) -> BudgetState:
    """*state* after a tick that scored *n_nodes* nodes at *now*."""
    last = state.last_tick
    if last is not None and now < last:
        return state                      # a tick from the past adds nothing and moves no clock
    dt = 0.0 if last is None else min(now - last, MAX_GAP_S)
    bucket = math.floor(now / BUCKET_S) * BUCKET_S
    exposure = state.exposure
    add = dt * n_nodes
    if exposure and exposure[-1][0] == bucket:
        exposure = exposure[:-1] + ((bucket, exposure[-1][1] + add),)
    else:
        horizon = now - cfg.false_budget_window_s - BUCKET_S
        exposure = tuple(e for e in exposure if e[0] > horizon) + ((bucket, add),)
    outcomes = state.outcomes
    if outcomes and now - outcomes[0].ts > cfg.false_budget_window_s:
        outcomes = tuple(o for o in outcomes if now - o.ts <= cfg.false_budget_window_s)
    return replace(state, outcomes=outcomes, exposure=exposure, last_tick=now)


def record(state: BudgetState, outcome: HoldOutcome) -> BudgetState:
    """*state* with *outcome*. One outcome per hold (node, since): a person's verdict replaces what the
    policy saw, and the policy's never replaces a person's (a hold a person called faulty and gpuops
    later resumed healthy stays faulty)."""
    for i, o in enumerate(state.outcomes):
        if o.node == outcome.node and o.since == outcome.since:
            if outcome.by == POLICY and o.by != POLICY or o == outcome:
                return state
            rest = state.outcomes[:i] + state.outcomes[i + 1:]
            return replace(state, outcomes=rest + (outcome,))
    return replace(state, outcomes=state.outcomes + (outcome,))


def confirm_late(state: BudgetState, node: str, now: float, cfg: PolicyConfig) -> BudgetState:
    """*state* after an acting rule fired on *node* at *now*: a hold of it the policy counted as ended
    healthy, started within ``false_budget_confirm_s``, came true after all (it was resumed before its
    failure). A person's verdict is left as it is."""
    horizon = cfg.false_budget_confirm_s
    late = [i for i, o in enumerate(state.outcomes)
            if o.node == node and not o.confirmed and o.by == POLICY and 0.0 <= now - o.since <= horizon]
    if not late:
        return state
    outcomes = list(state.outcomes)
    for i in late:
        outcomes[i] = replace(outcomes[i], confirmed=True)
    return replace(state, outcomes=tuple(outcomes))


@lru_cache(maxsize=256)
def lower_bound(k: int, confidence: float) -> float:
    """The one-sided *confidence* lower bound on a Poisson mean from *k* events (0 for k = 0)."""
    if k <= 0:
        return 0.0
    from scipy.special import gammaincinv   # P(X >= k | mu) = P(Gamma(k) <= mu)

    return float(gammaincinv(k, 1.0 - confidence))


def braked(state: BudgetState, now: float, cfg: PolicyConfig) -> dict[FaultClass, str]:
    """The braked fault classes at *now*, each with the reason its predictions only alert."""
    if cfg.false_budget_per_1k_node_days <= 0 or not state.outcomes:
        return {}
    window = cfg.false_budget_window_s
    counts: dict[FaultClass, list[int]] = {}
    for o in state.outcomes:
        if now - o.ts <= window:
            c = counts.setdefault(o.fault, [0, 0])
            c[o.confirmed] += 1
    out: dict[FaultClass, str] = {}
    node_days = None
    for fault, (unconfirmed, confirmed) in counts.items():
        held = fault.value in state.braked
        if unconfirmed < (1 if held else cfg.false_budget_min_events):
            continue
        if node_days is None:
            node_days = state.node_days(now, window)
        allowed = cfg.false_budget_per_1k_node_days * node_days / 1000.0
        # engage on evidence (the lower bound over the budget), hold until the rate itself is back under it
        if (unconfirmed > allowed) if held else (lower_bound(unconfirmed, cfg.false_budget_confidence) > allowed):
            out[fault] = (f"braked: {unconfirmed} of this fleet's {fault.value} prediction holds in the last "
                          f"{window / 86400:.3g} d ended healthy ({confirmed} came true) over {node_days:.0f} "
                          f"node-days, beyond its budget of {cfg.false_budget_per_1k_node_days:g} per 1,000 "
                          f"node-days: its predictions alert until their rate is under it")
    return out


def with_brakes(state: BudgetState, brakes: dict[FaultClass, str]) -> BudgetState:
    """*state* remembering which classes are braked now (the brake holds on that memory)."""
    now = tuple(sorted(f.value for f in brakes))
    return state if now == state.braked else replace(state, braked=now)


def report(state: BudgetState, cfg: PolicyConfig) -> dict[str, object]:
    """A replay's budget at its end: :func:`status` at the last tick, and every hold outcome
    (``[ts, node, fault, confirmed, since, by]``: ``since`` is the hold's decision time)."""
    now = state.last_tick if state.last_tick is not None else 0.0
    return {**status(state, now, cfg), "holds": [o.to_json() for o in state.outcomes]}


def status(state: BudgetState, now: float, cfg: PolicyConfig) -> dict[str, object]:
    """The budget as the API shows it: per class, unconfirmed and confirmed outcomes in the window,
    the exposure, and which classes are braked (JSON-able)."""
    window = cfg.false_budget_window_s
    classes: dict[str, dict[str, int]] = {}
    for o in state.outcomes:
        if now - o.ts <= window:
            c = classes.setdefault(o.fault.value, {"unconfirmed": 0, "confirmed": 0})
            c["confirmed" if o.confirmed else "unconfirmed"] += 1
    return {"per_1k_node_days": cfg.false_budget_per_1k_node_days, "window_s": window,
            "node_days": round(state.node_days(now, window), 2), "outcomes": classes,
            "braked": {f.value: why for f, why in braked(state, now, cfg).items()}}
