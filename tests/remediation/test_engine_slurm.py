"""The engine on the real test Slurm: killed (SIGKILL) between "executing" and Slurm's answer, it neither
repeats nor loses the drain after a restart; a controller outage mid-action is retried and reconciled; an
admin's drain is left alone. Reuses the adapter tests' ``cluster`` fixture, which restores the cluster."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collector.schema import Action, FaultClass, Grade
from remediation.actions import ActionKind, ActionState
from remediation.adapters.slurm import SlurmAdapter
from remediation.engine import Engine
from remediation.policy import Decision
from remediation.safety import SafetyConfig
from remediation.store import ActionStore
from tests.helpers import wait_until
from tests.remediation.test_adapter_slurm import Cluster, cluster, run, sinfo_nodes  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from collector.schema import Action, FaultClass, Grade
    from remediation.adapters.slurm import SlurmAdapter
    from remediation.engine import Engine
    from remediation.policy import Decision
    from remediation.safety import SafetyConfig
    from remediation.store import ActionStore

    url, node, when, conf = sys.argv[1:5]

    class Dies(SlurmAdapter):
        def drain(self, n, reason):
            if when == "after":
                super().drain(n, reason)         # Slurm has it ...
            os.kill(os.getpid(), signal.SIGKILL)  # ... and the engine never hears back

    store = ActionStore(url)
    store.migrate()
    engine = Engine(store, Dies(slurm_conf=conf), safety=SafetyConfig(armed=True))
    engine.start()
    now = time.time()
    engine.submit([Decision(now, node, None, Action.DRAIN, FaultClass.IB_LINK, 1.0, "link down", "rule",
                            Grade.CERTAIN)])
    print("not killed")
""")


class Counting(SlurmAdapter):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.drains: list[str] = []

    def drain(self, node, reason):
        self.drains.append(node)
        super().drain(node, reason)


def drained_by_us(node: str) -> bool:
    n = sinfo_nodes()[node]
    return "DRAIN" in n["state_flags"] and n["reason"].startswith("gpuops:")


@pytest.mark.parametrize("when, node", [("after", "gpu-node-01"), ("before", "gpu-node-02")])
def test_killed_between_executing_and_slurms_answer_the_engine_neither_repeats_nor_loses_the_drain(
        cluster, slurm_conf, tmp_path, when, node):
    url = f"sqlite:///{tmp_path}/actions.db"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.run([sys.executable, str(script), url, node, when, str(slurm_conf)], cwd=REPO,
                           env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -9, child.stdout + child.stderr
    store = ActionStore(url)
    [rec] = store.query()
    assert rec.state is ActionState.EXECUTING and rec.attempts == 1
    assert drained_by_us(node) is (when == "after")

    adapter = Counting(slurm_conf=slurm_conf, retries=1, backoff_s=0.1)
    restarted = Engine(store, adapter, safety=SafetyConfig(armed=True))
    restarted.start()
    assert adapter.drains == ([] if when == "after" else [node])      # never repeated, never lost
    assert store.get(rec.id).state is ActionState.SUCCEEDED and drained_by_us(node)
    assert restarted.state.held() == [node]
    again = Engine(store, adapter, safety=SafetyConfig(armed=True))    # and a second restart changes nothing
    again.start()
    again.maintain()
    assert adapter.drains == ([] if when == "after" else [node])
    assert store.get(rec.id).state is ActionState.VERIFIED and len(store.query()) == 1


def test_a_controller_outage_mid_action_is_retried_and_reconciled(cluster, slurm_conf, tmp_path):
    store = ActionStore(f"sqlite:///{tmp_path}/actions.db")
    store.migrate()
    offset = [0.0]
    adapter = Counting(slurm_conf=slurm_conf, timeout_s=20, retries=0)
    engine = Engine(store, adapter, safety=SafetyConfig(armed=True, retry_backoff_s=5),
                    clock=lambda: time.time() + offset[0])
    engine.start()
    node = "gpu-node-03"
    cluster.stop_controller()
    [rec] = engine.submit([Decision(time.time(), node, 2, Action.DRAIN, FaultClass.NVLINK, 0.9, "nvlink CRC",
                                    "model", Grade.PREDICTED)])
    assert rec.state is ActionState.EXECUTING and "controller" in rec.error.lower()
    cluster.start_controller()
    wait_until(lambda: sinfo_nodes()[node]["state"] == "idle", timeout_s=30, interval_s=0.2,
               message=f"{node} registered again")
    offset[0] += 6                                      # past the first backoff
    engine.maintain()
    done = store.get(rec.id)
    assert done.state is ActionState.SUCCEEDED and done.attempts == 2 and drained_by_us(node)
    assert adapter.drains == [node, node] and len(store.query(node=node)) == 1


def test_an_admins_drain_is_left_alone_and_never_resumed(cluster, slurm_conf, tmp_path):
    store = ActionStore(f"sqlite:///{tmp_path}/actions.db")
    store.migrate()
    node = "gpu-node-04"
    run("scontrol", "update", f"nodename={node}", "state=DRAIN", "reason=admin: replacing a PSU")
    engine = Engine(store, SlurmAdapter(slurm_conf=slurm_conf), safety=SafetyConfig(armed=True))
    engine.start()
    assert engine.state.held() == []                     # someone else's drain is not ours to hold
    [rec] = engine.submit([Decision(time.time(), node, None, Action.DRAIN, FaultClass.POWER, 1.0, "power brake",
                                    "rule", Grade.CERTAIN)])
    assert (rec.state, rec.blocked_by) == (ActionState.REJECTED, "not_ours")
    resume = engine.request(ActionKind.RESUME, node, "try to resume", "operator:ivy", dry_run=False, force=True)
    assert resume.state is ActionState.FAILED and "held by someone else" in resume.error
    assert sinfo_nodes()[node]["reason"].startswith("admin: replacing a PSU")
