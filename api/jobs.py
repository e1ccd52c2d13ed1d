"""The service's background jobs, run by APScheduler (``max_instances=1``, ``coalesce=True``).

- **stale telemetry** (every replica): a node whose scores stopped arriving for
  ``stale_after_s`` is shown ``unknown``; the leader records one ``alert`` per silence (a
  deterministic id from the node and its last telemetry time, so replicas and reruns do
  not repeat it). A silent node is never drained unless ``drain_on_silence`` is set:
  silence is usually the agent or the network, not the GPU. Standbys also refresh their
  view's held nodes from the store here (only the leader's engine knows them first-hand).
- **verification** (leader): ``engine.maintain()`` — retries, verification of held nodes
  before resume, follow-ups, expiry of proposals nobody answered.
- **maintenance view** (every replica): ``engine.refresh_view()`` re-lists the scheduler's
  nodes (``adapter.list_nodes()``) and records each one's partitions, labels (rack, switch)
  and declared maintenance (a Slurm MAINT reservation, an admin's drain, a Kubernetes cordon
  or ``gpuops.io/maintenance-until``) in the engine: silences by selector, facility groups
  and the per-partition caps use this view; the check before each action reads the node again.
- **retention** (leader): node scores and alerts older than ``retention_days`` go.
- **retraining** (leader, off by default): :func:`api.retrain.retrain` trains through the model
  registry and activates the new bundle only if it beats the current one on a held-out
  recording (docs/serve.md).

Each job logs and swallows its own errors: a job that fails runs again at its next time.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from remediation.actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, action_id
from remediation.engine import Engine
from remediation.store import ActionStore

from api.config import SchedulerSection
from api.nodeview import NodeView

log = logging.getLogger(__name__)

SILENCE_FAULT = "telemetry_silent"


class ServiceJobs:
    """The job bodies (see the module docstring); the scheduler calls them, tests call them directly."""

    def __init__(self, store: ActionStore, engine: Engine, nodes: NodeView, last_seen: dict[str, float],
                 is_leader: Callable[[], bool], *, stale_after_s: float, drain_on_silence: bool = False,
                 retention_days: float = 30.0, models: Any = None, retrain_params: dict[str, Any] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.engine, self.nodes, self.last_seen = store, engine, nodes, last_seen
        self.is_leader = is_leader
        self.stale_after_s, self.drain_on_silence = stale_after_s, drain_on_silence
        self.retention_days = retention_days
        self.models, self.retrain_params = models, dict(retrain_params or {})
        self._mono = monotonic
        self.silent: frozenset[str] = frozenset()
        self.runs: dict[str, int] = {}

    def _ran(self, job: str) -> None:
        self.runs[job] = self.runs.get(job, 0) + 1

    def stale_telemetry(self) -> set[str]:
        """Mark silent nodes unknown, alert once per silence; the newly silent nodes."""
        self._ran("stale_telemetry")
        now = self._mono()
        silent = frozenset(n for n, t in list(self.last_seen.items()) if now - t > self.stale_after_s)
        new = set(silent - self.silent)
        self.silent = silent
        self.nodes.mark_stale(silent)
        if not self.is_leader():
            held = {r.node for r in self.store.open_actions() if r.kind.holds_node}
            self.nodes.set_held(held)
            return new
        for node in sorted(new):
            self._alert_silence(node, now - self.last_seen.get(node, now))
        return new

    def _alert_silence(self, node: str, silent_s: float) -> None:
        row = self.nodes.get(node) or {}
        last_ts = float(row.get("ts") or 0.0)
        at = self.engine.clock()
        why = f"no telemetry from {node} for {silent_s:.0f} s: shown unknown"
        why += "; draining (drain_on_silence)" if self.drain_on_silence else "; not drained for silence alone"
        rec = ActionRecord(id=action_id(node, ActionKind.ALERT, None, SILENCE_FAULT, last_ts), node=node,
                           kind=ActionKind.ALERT, state=ActionState.SUCCEEDED, reason=why, actor=ENGINE_ACTOR,
                           incident_ts=last_ts, created_at=at, updated_at=at, fault=SILENCE_FAULT, source="engine",
                           dry_run=True, adapter="dryrun")
        if self.store.insert(rec, note="stale telemetry"):
            log.warning("%s", why)
        if self.drain_on_silence:
            self.engine.request(ActionKind.DRAIN, node, why, actor="engine:silence", dry_run=not self.engine.armed)

    def maintenance_view(self) -> int:
        """Refresh the engine's view of the scheduler's nodes; the number listed."""
        self._ran("maintenance_view")
        n = self.engine.refresh_view()
        under = self.engine.under_maintenance()
        if under:
            log.info("maintenance view: %d nodes listed, %d under maintenance or someone else's drain: %s",
                     n, len(under), ", ".join(under[:20]) + (" ..." if len(under) > 20 else ""))
        return n

    def verify(self) -> None:
        """The leader's pass over open actions."""
        self._ran("verify")
        if self.is_leader():
            self.engine.maintain()

    def retention(self) -> dict[str, int]:
        """Delete old node scores and alerts (the leader only; times on the engine's clock)."""
        self._ran("retention")
        if not self.is_leader():
            return {}
        out = self.store.delete_older_than(self.engine.clock() - self.retention_days * 86400.0)
        if any(out.values()):
            log.info("retention: deleted %s", out)
        return out

    def retrain(self) -> dict[str, Any] | None:
        """Train a new bundle and activate it only if it beats the current one on held-out data (api/retrain.py)."""
        from api.retrain import retrain

        self._ran("retrain")
        if not self.is_leader() or self.models is None:
            return None
        return retrain(self.models, self.retrain_params, self.engine.policy)


def build_scheduler(jobs: ServiceJobs, cfg: SchedulerSection) -> Any:
    """A BackgroundScheduler (not started) with the jobs at *cfg*'s intervals."""
    from apscheduler.schedulers.background import BackgroundScheduler

    sched = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30})

    def safe(name: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a job that fails runs again at its next time
                log.exception("job %s failed; it runs again at its next time", name)
        return run

    sched.add_job(safe("stale_telemetry", jobs.stale_telemetry), "interval", seconds=cfg.stale_check_s,
                  id="stale_telemetry")
    sched.add_job(safe("verify", jobs.verify), "interval", seconds=cfg.verify_s, id="verify")
    sched.add_job(safe("maintenance_view", jobs.maintenance_view), "interval", seconds=cfg.maintenance_view_s,
                  id="maintenance_view")
    sched.add_job(safe("retention", jobs.retention), "interval", seconds=cfg.retention_s, id="retention")
    if cfg.retrain_enabled:
        sched.add_job(safe("retrain", jobs.retrain), "interval", seconds=cfg.retrain_s, id="retrain")
    return sched
