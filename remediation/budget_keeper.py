"""The fleet's false-action budget beside the engine: kept in the store, people's verdicts read back.

The budget itself is the pure policy's (:mod:`remediation.budget`, ``PolicyState.budget``): it sees
prediction holds end and brakes a class. What only a live service needs sits here:

- **Kept across restarts.** After each tick the budget is written to the store's ``false_budget``
  setting when it changed: an outcome, a class braked or released (audited, with why, so a person
  reads the setting's history), or an hour's exposure (a checkpoint, not audited). A restart or the
  next leader reads it back (:meth:`BudgetKeeper.restore`).
- **People's verdicts.** A verdict (``POST /v1/actions/{id}/verdict``, :func:`remediation.people.verdict`)
  is stored on its action, on whichever replica took the call; the leader reads verdicts back at most
  once a minute (:meth:`BudgetKeeper.sync`, from :func:`remediation.execution.maintain`) and at start,
  and counts each as its hold's outcome in place of what the policy would see later. A verdict counts
  from its hold's time (the record's ``incident_ts``), so reading it again changes nothing.
- **Shown from any replica.** A standby decides nothing, so its own budget is the one it read at start. It
  answers with the leader's instead: the ``false_budget`` setting, read at most once a minute
  (:meth:`BudgetKeeper.status`), and what it last read while the store is down. Its outcomes and brakes are
  the leader's; its exposure is as of the leader's last write (at most an hour behind).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable

from collector.schema import FaultClass

from . import budget
from .actions import ENGINE_ACTOR, ActionRecord
from .budget import BudgetState

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

#: the store setting the budget is kept under
SETTING = "false_budget"
#: verdicts are read back from a little before the last read: replicas' clocks stamp ``updated_at``
VERDICT_SKEW_S = 300.0


class BudgetKeeper:
    """See the module docstring. Called under the engine's lock (its tick, maintain, start)."""

    def __init__(self) -> None:
        self.kept = BudgetState()              # as last written to the store
        self.verdicts_read_at: float | None = None
        self._leaders: tuple[float, BudgetState] | None = None  # a standby's last read of the leader's budget

    def restore(self, engine: Engine) -> BudgetState:
        """The budget kept in the store (empty when none, or one this version cannot read)."""
        self.kept = BudgetState.from_json(engine.store.get_setting(SETTING))
        self.verdicts_read_at = None
        return self.kept

    def keep(self, engine: Engine) -> None:
        """Write the policy's budget to the store if it changed (see the module docstring). The policy has
        already decided which classes are braked this tick (``BudgetState.braked``); the reasons are only
        worked out again when that changes, for the audit note and the log."""
        new, old = engine.state.budget, self.kept
        if new is old or new.last_tick is None:
            return
        changed = new.braked != old.braked
        hour = (new.exposure[-1][0] if new.exposure else None) != (old.exposure[-1][0] if old.exposure else None)
        if not (changed or hour or new.outcomes != old.outcomes):
            return
        why = {f.value: w for f, w in budget.braked(new, new.last_tick, engine.policy).items()} if changed else {}
        note = "; ".join(f"{f} {w}" for f, w in why.items()) or "no class braked"
        try:
            engine.store.set_setting(SETTING, new.to_json(), ENGINE_ACTOR, note, audit=changed)
        except Exception as e:  # the store is down: kept in memory, written with the next change
            log.warning("cannot keep the false-action budget in the store (%s)", e)
            return
        self.kept = new
        for f in sorted(set(new.braked) - set(old.braked)):
            engine._count(f"budget_braked_{f}")
            log.warning("false-action budget: %s predictions now only alert: %s", f, why.get(f, ""))
        for f in sorted(set(old.braked) - set(new.braked)):
            log.warning("false-action budget: %s predictions act again (its brake lifted)", f)

    def apply(self, engine: Engine, recs: Iterable[ActionRecord]) -> int:
        """Count people's verdicts towards the budget (one outcome per hold: idempotent); returns how many
        records carried one. A ``faulty`` verdict also proves the prediction right, so it lifts the retry cap
        that prediction set on its node (``model_retry_window_s``), as a rule firing during the hold does."""
        n = 0
        b = engine.state.budget
        nodes = engine.state.nodes
        for r in recs:
            if r.verdict in budget.VERDICTS and r.fault in FaultClass._value2member_map_:
                b = budget.record(b, budget.HoldOutcome(r.incident_ts, r.node, FaultClass(r.fault),
                                                        budget.VERDICTS[r.verdict], r.incident_ts, "verdict"))
                n += 1
                ns = nodes.get(r.node)
                if budget.VERDICTS[r.verdict] and ns is not None and ns.predicted_action_at == r.incident_ts:
                    nodes = {**nodes, r.node: replace(ns, predicted_action_at=None, predicted_fault=None)}
        kept = b is not engine.state.budget
        if kept or nodes is not engine.state.nodes:
            engine.state = replace(engine.state, budget=b, nodes=nodes)
        if kept:
            self.keep(engine)
        return n

    def sync(self, engine: Engine, every_s: float = 60.0) -> int:
        """Read back the verdicts people gave since the last read, at most every *every_s* seconds of the
        engine's clock (0: now); the first read takes the budget's whole window."""
        now = engine.clock()
        last = self.verdicts_read_at
        if last is not None and now - last < every_s:
            return 0
        since = now - engine.policy.false_budget_window_s if last is None else last - VERDICT_SKEW_S
        n = self.apply(engine, engine.store.with_verdicts(since))
        self.verdicts_read_at = now
        return n

    def status(self, engine: Engine, every_s: float = 60.0) -> dict[str, Any]:
        """:func:`remediation.budget.status` at the budget's last tick: the engine's own while it acts (the
        leader, or an engine alone), else the leader's as kept in the store, read at most every *every_s*
        seconds of the engine's clock (API calls and metric scrapes come often)."""
        b = engine.state.budget if engine.acting else self._leaders_budget(engine, every_s)
        return budget.status(b, b.last_tick if b.last_tick is not None else engine.clock(), engine.policy)

    def _leaders_budget(self, engine: Engine, every_s: float) -> BudgetState:
        now = engine.clock()
        if self._leaders is None or now - self._leaders[0] >= every_s:
            got = self._leaders[1] if self._leaders is not None else engine.state.budget
            try:
                got = BudgetState.from_json(engine.store.get_setting(SETTING))
            except Exception as e:  # the store is down: the last read (or this replica's own) stands
                log.warning("cannot read the leader's false-action budget from the store (%s)", e)
            self._leaders = now, got
        return self._leaders[1]
