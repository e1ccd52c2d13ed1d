"""End to end on real services: simulated agents → real Kafka → ``gpuops serve`` (armed, Slurm) → a drain.

Four simulated nodes named like the test cluster's Slurm nodes (gpu-node-01..04) publish
their telemetry to real Kafka, as agents do, with no incidents of their own. A ``serve``
subprocess — Kafka, the Slurm adapter, ``safety.armed: true`` — scores them. The test then
injects a predictable fault on gpu-node-02: an NVLink error (XID 74, rule ``xid_nvlink``:
drain), declared to end in the GPU failing 10 minutes of telemetry time later. The node must
be drained in the real Slurm, with a ``gpuops:`` reason, before that failure time; no other
node is drained by this service. The node is resumed in teardown.

The fault is caught by a rule, not a prediction: deterministic and fast (a predictive catch
needs the model's 30-minute window of warm-up first).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from tests.api.serve_proc import NODES, Agents, ServeProcess, serve_topics, start_serve  # noqa: F401 (fixture)
from tests.helpers import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slurm]

TARGET = "gpu-node-02"
SPEEDUP = 10.0
FAILURE_AFTER_S = 600.0      # telemetry seconds from the NVLink error to the GPU's failure


def slurm_node(name: str) -> dict:
    out = subprocess.run(["scontrol", "-o", "show", "node", name], capture_output=True, text=True, timeout=30)
    fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
    return fields


def drained_by_gpuops(name: str) -> str | None:
    """The node's drain reason when gpuops drained it (sinfo prints the reason whole)."""
    out = subprocess.run(["sinfo", "-h", "-n", name, "-o", "%E|%T"], capture_output=True, text=True, timeout=30)
    reason, state = (out.stdout.strip().split("|") + [""])[:2]
    return reason if "drain" in state.lower() and reason.startswith("gpuops:") else None


def resume(name: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={name}", "state=RESUME"], capture_output=True, timeout=30)


def service_config(tmp_path: Path, bootstrap: str, topics: dict[str, str], slurm_conf: Path, **extra) -> dict:
    tag = uuid.uuid4().hex[:8]
    return {"port": 0, "state_dir": str(tmp_path / "state"), "store_url": f"sqlite:///{tmp_path / 'actions.db'}",
            "kafka_bootstrap": bootstrap, "replica": f"e2e-{tag}", "topics": topics,
            "scoring": {"group": f"test-scoring-{tag}"},
            "adapter": {"name": "slurm", "options": {"slurm_conf": str(slurm_conf)}},
            "safety": {"armed": True}, "scheduler": {"verify_s": 2.0}, **extra}


@pytest.mark.timeout(240)
def test_injected_nvlink_fault_ends_with_that_node_drained_in_slurm_before_it_fails(
        tmp_path: Path, kafka_bootstrap: str, serve_topics: dict[str, str], slurm_conf: Path) -> None:
    wait_until(lambda: all(drained_by_gpuops(n) is None and "DRAIN" not in slurm_node(n).get("State", "")
                           for n in NODES), timeout_s=60, interval_s=0.5, message="the test cluster's nodes undrained")
    agents = Agents(kafka_bootstrap, serve_topics, speedup=SPEEDUP)
    serve: ServeProcess | None = None
    try:
        serve = start_serve(service_config(tmp_path, kafka_bootstrap, serve_topics, slurm_conf), tmp_path, "serve")
        agents.start()
        auth = {"Authorization": f"Bearer {serve.token}"}
        wait_until(lambda: httpx.get(f"{serve.url}/v1/nodes", headers=auth, timeout=5).json()["count"] == 4,
                   timeout_s=90, interval_s=0.5, message="serve lists the four simulated nodes")
        injected = agents.inject_xid(TARGET, gpu=3, code=74)
        failure_ts = injected + FAILURE_AFTER_S
        reason = wait_until(lambda: drained_by_gpuops(TARGET), timeout_s=FAILURE_AFTER_S / SPEEDUP + 30,
                            interval_s=0.25, message=f"{TARGET} drained by gpuops in Slurm")
        drained_at = agents.fleet.now()
        assert drained_at < failure_ts, (f"drained {drained_at - injected:.0f} s (telemetry) after the fault, "
                                         f"after its failure at +{FAILURE_AFTER_S:.0f} s")
        assert reason.startswith("gpuops:") and "nvlink" in reason
        print(f"{TARGET} drained {drained_at - injected:.0f} telemetry-s "
              f"({(drained_at - injected) / SPEEDUP:.1f} wall-s) after the NVLink error: {reason!r}")
        for other in NODES:
            if other != TARGET:
                assert drained_by_gpuops(other) is None, f"{other} drained too: {slurm_node(other)}"
    except BaseException:
        if serve is not None:
            print(serve.output()[-6000:])
        raise
    finally:
        agents.close()
        if serve is not None:
            code = serve.terminate()
            assert code == 0, serve.output()[-3000:]
        resume(TARGET)
    from remediation.store import ActionStore

    store = ActionStore(f"sqlite:///{tmp_path / 'actions.db'}")
    touched = [r for r in store.query(limit=1000) if r.kind.touches_cluster and not r.dry_run]
    released = store.lease_holder("engine") is None             # released on SIGTERM
    store.close()
    assert {r.node for r in touched} == {TARGET}, [(r.node, r.kind.value, r.state.value) for r in touched]
    assert released
