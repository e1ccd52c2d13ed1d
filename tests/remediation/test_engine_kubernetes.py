"""The engine on a real kube-apiserver (marker ``kubernetes``): a node someone else cordoned is
left alone, and a ``gpuops.io/maintenance-until`` window is honoured until its end — with the
engine's clock and the adapter's moving together across the annotated time."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.schema import Action, FaultClass, Grade
from remediation.actions import ActionState
from remediation.adapters.kubernetes import FAULT_TAINT, MAINTENANCE_ANNOTATION, KubernetesAdapter
from remediation.adapters.kubernetes_meta import rfc3339
from remediation.engine import Engine
from remediation.policy import Decision
from remediation.store import ActionStore

from tests.remediation.test_adapter_kubernetes import NOW, World, _taints, world  # noqa: F401 - the fixture
from tests.remediation.test_engine import LOOSE, POLICY, Clock

pytestmark = pytest.mark.kubernetes


def _engine(tmp_path: Path, w: World, clock: Clock) -> tuple[Engine, KubernetesAdapter]:
    store = ActionStore(f"sqlite:///{tmp_path / 'actions.db'}")
    store.migrate()
    adapter = KubernetesAdapter(w.api, clock=clock)
    e = Engine(store, adapter, policy=POLICY, safety=LOOSE, clock=clock)
    e.start()
    e.arm("operator:test")
    return e, adapter


def _drain(node: str, ts: float) -> Decision:
    return Decision(ts, node, 0, Action.DRAIN, FaultClass.HBM_ECC, 0.95, "rows remapped", "model", Grade.PREDICTED)


def test_a_node_cordoned_by_another_actor_is_left_alone(world: World, tmp_path: Path) -> None:
    node = world.node(unschedulable=True, taints=[{"key": "ops/debugging", "effect": "NoSchedule"}])
    clock = Clock(NOW)
    e, _ = _engine(tmp_path, world, clock)
    [rec] = e.submit([_drain(node, clock.t)])
    assert (rec.state, rec.blocked_by) == (ActionState.REJECTED, "not_ours")
    obj = world.read_node(node)
    assert obj.spec.unschedulable is True and "ops/debugging" in _taints(obj) and FAULT_TAINT not in _taints(obj)
    assert node not in e.holds
    e.refresh_view()
    assert node in e.under_maintenance()


def test_an_annotated_maintenance_window_is_honoured_until_its_end(world: World, tmp_path: Path) -> None:
    until = NOW + 3600
    node = world.node(annotations={MAINTENANCE_ANNOTATION: rfc3339(until)})
    clock = Clock(NOW)
    e, _ = _engine(tmp_path, world, clock)
    [rec] = e.submit([_drain(node, clock.t)])
    assert (rec.state, rec.blocked_by) == (ActionState.REJECTED, "maintenance")
    assert rfc3339(until) in e.store.history(rec.id)[-1]["note"]
    assert world.read_node(node).spec.unschedulable is not True

    clock.t = until - 60                                  # still inside the window
    [rec] = e.submit([_drain(node, clock.t)])
    assert rec.blocked_by == "maintenance" and world.read_node(node).spec.unschedulable is not True

    clock.t = until + 60                                  # the window is over: gpuops acts again
    [rec] = e.submit([_drain(node, clock.t)])
    assert rec.state is ActionState.SUCCEEDED and rec.blocked_by is None
    obj = world.read_node(node)
    assert obj.spec.unschedulable is True and _taints(obj)[FAULT_TAINT][0] == "hbm_ecc"
