"""The armed engine on the real kube-apiserver: a rule's drain cordons and taints the node with gpuops'
own taint, a node someone else cordoned is left alone, and the engine's resume removes only its own taint."""

from __future__ import annotations

import time

import pytest

from collector.schema import Action
from remediation.actions import ActionKind, ActionState
from remediation.engine import Engine
from remediation.safety import SafetyConfig
from tests.remediation.test_adapter_kubernetes import World, world  # noqa: F401  (fixture)
from tests.remediation.test_engine import explain, fleet

pytestmark = pytest.mark.kubernetes


def taints(w: World, name: str) -> dict[str, str]:
    """The node's taints, less the ones the API server's admission adds itself (node.kubernetes.io/...)."""
    return {t.key: t.effect for t in (w.core.read_node(name).spec.taints or [])
            if not t.key.startswith("node.kubernetes.io/")}


def test_the_armed_engine_cordons_and_taints_through_kubernetes_and_undoes_only_its_own(world: World, store):
    ours = world.node("gpu", taints=[{"key": "site/gpu-type", "value": "h100", "effect": "NoSchedule"}])
    theirs = world.node("other", unschedulable=True)
    engine = Engine(store, world.adapter(), safety=SafetyConfig(armed=True))
    engine.start()
    scores = fleet(2, time.time(), rule_nodes=[0, 1], rule_fault="ib_link")
    scores.node[:] = [ours, theirs]
    recs = {r.node: r for r in engine.tick(scores, explain)}
    assert recs[ours].state in (ActionState.SUCCEEDED, ActionState.VERIFIED)
    assert (recs[theirs].state, recs[theirs].blocked_by) == (ActionState.REJECTED, "not_ours")
    node = world.core.read_node(ours)
    assert node.spec.unschedulable is True
    assert taints(world, ours) == {"site/gpu-type": "NoSchedule", "gpuops.io/fault": "NoSchedule"}

    done = engine.request(ActionKind.RESUME, ours, "checked the cable", "operator:jo", dry_run=False, force=True)
    assert done.state is ActionState.SUCCEEDED
    assert not world.core.read_node(ours).spec.unschedulable
    assert taints(world, ours) == {"site/gpu-type": "NoSchedule"}
    assert world.core.read_node(theirs).spec.unschedulable is True     # someone else's cordon stays
