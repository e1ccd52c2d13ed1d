"""The scheduler's maintenance is a silence, on the real test Slurm: a node in an active MAINT
reservation gets no action and the record names the reservation; once the reservation is deleted the
engine acts normally again. Reuses the adapter tests' ``cluster`` fixture, which restores the cluster."""

from __future__ import annotations

import time

import pytest

from collector.schema import Action, FaultClass, Grade
from remediation.actions import ActionState
from remediation.adapters.slurm import SlurmAdapter
from remediation.engine import Engine
from remediation.policy import Decision
from remediation.safety import SafetyConfig
from remediation.store import ActionStore
from tests.helpers import wait_until
from tests.remediation.test_adapter_slurm import Cluster, cluster, run, sinfo_nodes  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm


def _failing_gpu(node: str) -> Decision:
    return Decision(time.time(), node, 3, Action.DRAIN, FaultClass.NVLINK, 0.95, "failing GPU score", "model",
                    Grade.PREDICTED)


def test_a_maint_reservation_suppresses_the_action_names_itself_and_normal_behaviour_returns_after(
        cluster, slurm_conf, tmp_path):
    store = ActionStore(f"sqlite:///{tmp_path}/actions.db")
    store.migrate()
    node = "gpu-node-02"
    resv = cluster.reserve_maintenance(node)
    engine = Engine(store, SlurmAdapter(slurm_conf=slurm_conf), safety=SafetyConfig(armed=True, node_cooldown_s=0))
    engine.start()
    [rec] = engine.submit([_failing_gpu(node)])
    assert (rec.state, rec.blocked_by) == (ActionState.REJECTED, f"maintenance:{resv}")
    assert resv in store.history(rec.id)[-1]["note"]
    assert "DRAIN" not in sinfo_nodes()[node]["state_flags"]                  # nothing reached Slurm

    run("scontrol", "delete", f"ReservationName={resv}")
    wait_until(lambda: not engine.adapter.status(node).maintenance, timeout_s=30, interval_s=0.2,
               message="the reservation gone")
    [rec] = engine.submit([_failing_gpu(node)])
    assert (rec.state, rec.blocked_by) == (ActionState.SUCCEEDED, None)
    n = sinfo_nodes()[node]
    assert "DRAIN" in n["state_flags"] and n["reason"].startswith("gpuops:")
