"""The service's jobs: a silent node is shown unknown and alerted once, never drained for silence alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from api.jobs import ServiceJobs
from api.nodeview import UNKNOWN, NodeView
from models.node_scores import NodeScores
from remediation.actions import ActionKind
from remediation.adapters.dryrun import DryRunAdapter
from remediation.engine import Engine
from remediation.store import ActionStore


def _ns(ts: float, nodes: list[str]) -> NodeScores:
    n = len(nodes)
    idx, neg = np.arange(n), -np.ones(n, int)
    none = np.array([None] * n, object)
    return NodeScores(ts, np.array(nodes, object), np.zeros(n), np.zeros(n, np.int8), np.zeros(n, int), idx,
                      neg, neg, idx, np.zeros(n, np.int8), none, none, np.zeros(n), idx, None)


def _setup(tmp_path: Path, drain: bool = False):  # noqa: ANN202
    store = ActionStore(f"sqlite:///{tmp_path / 'a.db'}")
    store.migrate()
    dry = DryRunAdapter()
    engine = Engine(store, dry, clock=lambda: 5000.0)
    nodes = NodeView()
    nodes.update(_ns(4000.0, ["n1", "n2"]))
    mono = [100.0]
    seen = {"n1": 100.0, "n2": 100.0}
    jobs = ServiceJobs(store, engine, nodes, seen, lambda: True, stale_after_s=60.0, drain_on_silence=drain,
                       monotonic=lambda: mono[0])
    return store, dry, nodes, seen, mono, jobs


def test_silent_node_is_shown_unknown_and_alerted_once_but_not_drained(tmp_path: Path) -> None:
    store, dry, nodes, seen, mono, jobs = _setup(tmp_path)
    mono[0] = 150.0
    seen["n2"] = 150.0
    assert jobs.stale_telemetry() == set()
    mono[0] = 200.0
    seen["n2"] = 200.0
    assert jobs.stale_telemetry() == {"n1"}
    assert jobs.stale_telemetry() == set()               # the same silence: no second alert
    assert nodes.get("n1")["state"] == UNKNOWN and nodes.get("n2")["state"] != UNKNOWN
    recs = store.query(limit=10)
    assert [(r.node, r.kind) for r in recs] == [("n1", ActionKind.ALERT)]
    assert "not drained" in recs[0].reason and dry.calls == []


def test_drain_on_silence_drains_in_dry_run_when_configured(tmp_path: Path) -> None:
    store, dry, nodes, seen, mono, jobs = _setup(tmp_path, drain=True)
    mono[0] = 500.0
    jobs.stale_telemetry()
    kinds = sorted(r.kind.value for r in store.query(limit=10))
    assert kinds == ["alert", "alert", "drain", "drain"]
    assert {c.verb for c in dry.calls} == {"drain"}


def test_retention_runs_on_the_leader_only(tmp_path: Path) -> None:
    store, dry, nodes, seen, mono, jobs = _setup(tmp_path)
    jobs.is_leader = lambda: False
    assert jobs.retention() == {}
    jobs.is_leader = lambda: True
    assert jobs.retention() == {"node_scores": 0, "alerts": 0}


class _Listing(DryRunAdapter):
    """Our own adapter boundary: counts list_nodes calls, returns what the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = 0

    def list_nodes(self):  # noqa: ANN201
        self.lists += 1
        return super().list_nodes()


def test_the_maintenance_view_job_relists_the_nodes_and_records_partitions_and_maintenance(tmp_path: Path) -> None:
    from remediation.adapters.base import NodeStatus

    store = ActionStore(f"sqlite:///{tmp_path / 'a.db'}")
    store.migrate()
    adapter = _Listing()
    engine = Engine(store, adapter, clock=lambda: 5000.0)
    jobs = ServiceJobs(store, engine, NodeView(), {}, lambda: True, stale_after_s=60.0)
    adapter.set_status(NodeStatus(name="n1", partitions=("gpu",)))
    assert jobs.maintenance_view() == 1 and engine.under_maintenance() == []
    adapter.set_status(NodeStatus(name="n1", partitions=("gpu", "debug"), maintenance=True))
    adapter.set_status(NodeStatus(name="n2", partitions=("gpu",), drained=True, ours=False, reason="admin"))
    assert jobs.maintenance_view() == 2
    assert engine.under_maintenance() == ["n1", "n2"]
    assert engine.groups_of("n1").partitions == ("partition/gpu", "partition/debug")
    assert adapter.lists == 2 and jobs.runs["maintenance_view"] == 2


def test_the_scheduler_runs_the_maintenance_view_job(tmp_path: Path) -> None:
    from api.config import SchedulerSection
    from api.jobs import build_scheduler

    _, _, _, _, _, jobs = _setup(tmp_path)
    sched = build_scheduler(jobs, SchedulerSection(maintenance_view_s=5))
    job = sched.get_job("maintenance_view")
    assert job is not None and job.trigger.interval.total_seconds() == 5
