"""Facility groups from the real test Slurm: the adapter reads each node's leaf switch from the
topology plugin and its rack from its features, and the engine groups by them.

deploy/testservices/slurm_up.sh lays the four nodes out as two racks of two (features ``rack_r01``,
``rack_r02``), each under its own leaf switch (topology/tree: ``leaf-01``, ``leaf-02`` under
``spine-01``). Reuses the adapter tests' ``cluster`` fixture, which resumes any drained node."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from remediation.actions import ActionKind, ActionState
from remediation.adapters.slurm import SlurmAdapter
from remediation.engine import Engine
from remediation.safety import SafetyConfig
from remediation.store import ActionStore
from tests.remediation.test_adapter_slurm import NODES, cluster, sinfo_nodes  # noqa: F401  (fixture)
from tests.remediation.test_engine import LOOSE, POLICY, explain, fleet

pytestmark = pytest.mark.slurm

NO_TOPOLOGY = ("the test cluster has no topology/tree: it was started by an older slurm_up.sh; run "
               "deploy/testservices/slurm_up.sh again (it restarts slurmctld to load topology.conf)")


def test_each_node_reports_its_rack_from_features_and_its_leaf_switch_from_the_topology(slurm_conf) -> None:
    listed = {n.name: n for n in SlurmAdapter(slurm_conf=slurm_conf, retries=1, backoff_s=0.1).list_nodes()}
    assert sorted(listed) == NODES
    assert "leaf" in listed["gpu-node-01"].extra, NO_TOPOLOGY
    assert {n: (s.extra.get("rack"), s.extra.get("leaf")) for n, s in listed.items()} == {
        "gpu-node-01": ("r01", "leaf-01"), "gpu-node-02": ("r01", "leaf-01"),
        "gpu-node-03": ("r02", "leaf-02"), "gpu-node-04": ("r02", "leaf-02")}
    # one node's status agrees with the listing; a site whose features say rack=... sets the prefix
    one = SlurmAdapter(slurm_conf=slurm_conf, rack_feature_prefix="rack=").status("gpu-node-03")
    assert (one.extra.get("rack"), one.extra.get("leaf")) == (None, "leaf-02")


def test_nodes_of_one_leaf_switch_with_the_same_fault_give_one_alert_and_no_drains(cluster, slurm_conf,
                                                                                   tmp_path) -> None:
    store = ActionStore(f"sqlite:///{tmp_path / 'actions.db'}")
    store.migrate()
    safety = LOOSE.model_copy(update={"armed": True, "facility_min_nodes": 2, "facility_labels": ("leaf",)})
    adapter = SlurmAdapter(slurm_conf=slurm_conf, retries=1, backoff_s=0.1)
    now = 1_760_000_000.0
    engine = Engine(store, adapter, policy=POLICY, safety=SafetyConfig(**safety.model_dump()), clock=lambda: now)
    engine.start()
    # gpu-node-01 and -02 (leaf-01) and gpu-node-03 (alone on leaf-02) see their IB link go down at once
    scores = replace(fleet(4, now, rule_nodes=[0, 1, 2]), node=np.array(NODES, object))
    recs = engine.tick(scores, explain)
    alerts = [(r.node, r.fault) for r in recs if r.kind is ActionKind.ALERT]
    assert alerts == [("facility:leaf/leaf-01", "ib_link")], NO_TOPOLOGY
    held = {r.node: (r.state, r.blocked_by) for r in recs if r.kind is not ActionKind.ALERT}
    assert held["gpu-node-01"] == held["gpu-node-02"] == (ActionState.REJECTED, "facility:leaf/leaf-01")
    # the control: a lone node on its own switch is a node fault, drained for real
    assert held["gpu-node-03"][1] is None
    state = sinfo_nodes()
    assert "DRAIN" in state["gpu-node-03"]["state_flags"] and state["gpu-node-03"]["reason"].startswith("gpuops:")
    assert not {"DRAIN"} & set(state["gpu-node-01"]["state_flags"] + state["gpu-node-02"]["state_flags"])
