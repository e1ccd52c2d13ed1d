"""Facility groups from Kubernetes node labels on the real kube-apiserver (marker ``kubernetes``):
the adapter maps the site's label keys to ``rack`` / ``leaf`` in ``NodeStatus.extra``, and the
engine turns nodes of one leaf switch failing together into one grouped alert, no cordons."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from remediation.actions import ActionKind, ActionState
from remediation.adapters.kubernetes import FAULT_TAINT, KubernetesAdapter, KubernetesAdapterConfig
from remediation.engine import Engine
from remediation.safety import SafetyConfig
from remediation.store import ActionStore

from tests.remediation.test_adapter_kubernetes import NOW, World, _taints, world  # noqa: F401 - the fixture
from tests.remediation.test_engine import LOOSE, POLICY, Clock, explain, fleet

TOPOGRAPH_LEAF = "network.topology.nvidia.com/leaf"


@pytest.mark.kubernetes
def test_node_labels_become_rack_and_leaf_by_the_configured_keys(world: World) -> None:
    a = world.node("a", labels={TOPOGRAPH_LEAF: "s1", "example.com/rack": "r07"})
    b = world.node("b", labels={"fabric.topograph.run/tier-0": "s2"})       # Topograph 1.1's key
    c = world.node("c", labels={"pool": "h100"})
    default = {s.name: s.extra for s in world.adapter().list_nodes() if s.name in (a, b, c)}
    assert (default[a].get("leaf"), default[b].get("leaf"), default[c].get("leaf")) == ("s1", "s2", None)
    assert "rack" not in default[a]                                          # no well-known rack label
    site = world.adapter(facility_labels={"rack": "example.com/rack", "switch": TOPOGRAPH_LEAF})
    extra = site.status(a).extra
    assert (extra.get("rack"), extra.get("switch"), extra.get("leaf")) == ("r07", "s1", None)


@pytest.mark.kubernetes
def test_nodes_of_one_leaf_switch_with_the_same_fault_give_one_alert_and_no_cordons(world: World,
                                                                                     tmp_path: Path) -> None:
    leaf_a, leaf_b = f"leaf-a-{world.suffix}", f"leaf-b-{world.suffix}"
    nodes = [world.node("x", labels={TOPOGRAPH_LEAF: leaf_a}), world.node("y", labels={TOPOGRAPH_LEAF: leaf_a}),
             world.node("z", labels={TOPOGRAPH_LEAF: leaf_b})]
    store = ActionStore(f"sqlite:///{tmp_path / 'actions.db'}")
    store.migrate()
    clock = Clock(NOW)
    safety = SafetyConfig(**{**LOOSE.model_dump(), "facility_min_nodes": 2})
    e = Engine(store, KubernetesAdapter(world.api, clock=clock), policy=POLICY, safety=safety, clock=clock)
    e.start()
    e.arm("operator:test")
    recs = e.tick(replace(fleet(3, clock.t, rule_nodes=[0, 1, 2]), node=np.array(nodes, object)), explain)
    assert [(r.node, r.fault) for r in recs if r.kind is ActionKind.ALERT] == [(f"facility:leaf/{leaf_a}", "ib_link")]
    held = {r.node: (r.state, r.blocked_by) for r in recs if r.kind is not ActionKind.ALERT}
    assert held[nodes[0]] == held[nodes[1]] == (ActionState.REJECTED, f"facility:leaf/{leaf_a}")
    for n in nodes[:2]:
        assert world.read_node(n).spec.unschedulable is not True
    # the control: the lone node on the other switch is cordoned for real
    assert held[nodes[2]][1] is None
    assert world.read_node(nodes[2]).spec.unschedulable is True and FAULT_TAINT in _taints(world.read_node(nodes[2]))


def test_a_facility_label_key_may_be_one_string_or_several_in_order() -> None:
    cfg = KubernetesAdapterConfig(facility_labels={"rack": "example.com/rack", "leaf": ["a/leaf", "b/leaf"]})
    assert cfg.facility_labels == {"rack": ("example.com/rack",), "leaf": ("a/leaf", "b/leaf")}
    assert KubernetesAdapterConfig().facility_labels["leaf"][0] == TOPOGRAPH_LEAF
