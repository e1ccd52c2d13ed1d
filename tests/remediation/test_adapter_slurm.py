"""The Slurm adapter against the real test cluster (deploy/testservices/slurm_up.sh, Slurm 22.05).

Real jobs (``sbatch --wrap 'sleep 300'``), real drains, a real (fake-program) reboot and a
real controller outage. Every test leaves the cluster as it found it — jobs cancelled,
reservations deleted, nodes resumed, slurmctld running — in the fixture's teardown, so the
next test starts with four idle nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from remediation.adapters.base import NotOurs, PermanentAdapterError, TransientAdapterError, UnknownNode
from remediation.adapters.slurm import SlurmAdapter
from tests.helpers import wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
NODES = [f"gpu-node-{i:02d}" for i in range(1, 5)]


def run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


def sinfo_nodes() -> dict[str, dict]:
    return {n["name"]: n for n in json.loads(run("sinfo", "--json").stdout)["nodes"]}


def job(job_id: str) -> dict | None:
    """A job's ``squeue --json`` record (22.05 ignores -j with --json)."""
    return next((j for j in json.loads(run("squeue", "--json").stdout)["jobs"] if str(j["job_id"]) == job_id), None)


def running_on(job_id: str) -> str | None:
    j = job(job_id)
    return j["nodes"] if j and j["job_state"] == "RUNNING" else None


def controller_up() -> bool:
    return "is UP" in run("scontrol", "ping", check=False).stdout


def cluster_idle() -> bool:
    nodes = sinfo_nodes()
    return sorted(nodes) == NODES and all(n["state"] == "idle" and not n["state_flags"] for n in nodes.values())


class Cluster:
    """The test cluster plus what one test changed in it, undone by :meth:`restore`."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf
        self.root = conf.parent.parent  # $SLURM_ROOT: etc/, run/, log/
        self.jobs: list[str] = []
        self.reservations: list[str] = []

    def submit(self, *args: str) -> str:
        """``sbatch`` a 300 s sleeper (cancelled in teardown); its job id."""
        out = run("sbatch", "--parsable", "-J", f"gpuops-test-{uuid.uuid4().hex[:6]}", "-o", "/dev/null",
                  *args, "--wrap", "sleep 300").stdout.strip()
        job_id = out.split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def running(self, job_id: str) -> str:
        """Wait until *job_id* runs; the node it runs on."""
        return wait_until(lambda: running_on(job_id), timeout_s=30, interval_s=0.1, message=f"job {job_id} running")

    def reserve_maintenance(self, node: str) -> str:
        name = f"gpuops-test-maint-{uuid.uuid4().hex[:6]}"
        run("scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now", "Duration=10",
            f"Nodes={node}", "Users=root", "Flags=MAINT,IGNORE_JOBS")
        self.reservations.append(name)
        return name

    def stop_controller(self) -> None:
        pid = int((self.root / "run" / "slurmctld.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not controller_up(), timeout_s=30, interval_s=0.1, message="slurmctld stopped")

    def start_controller(self) -> None:
        """Start slurmctld as slurm_up.sh does but WITHOUT ``-c``: keep the saved state."""
        if not controller_up():
            run("slurmctld", "-f", str(self.conf))
            wait_until(controller_up, timeout_s=30, interval_s=0.1, message="slurmctld up again")

    def restore(self) -> None:
        if not controller_up():
            self.start_controller()
        if self.jobs:
            run("scancel", *self.jobs, check=False)
        for name in self.reservations:
            run("scontrol", "delete", f"ReservationName={name}", check=False)
        for name, node in sinfo_nodes().items():
            flags = set(node["state_flags"])
            if flags & {"REBOOT_REQUESTED"}:
                run("scontrol", "cancel_reboot", name, check=False)
            if node["state"] == "down" or flags & {"DRAIN", "REBOOT_REQUESTED"}:
                run("scontrol", "update", f"nodename={name}", "state=RESUME", check=False)
        # slurmds re-register after a controller restart, a fake reboot takes ~4 s
        wait_until(cluster_idle, timeout_s=60, interval_s=0.2, message="all four nodes idle again")


@pytest.fixture
def cluster(slurm_conf: Path) -> Iterator[Cluster]:
    wait_until(cluster_idle, timeout_s=30, interval_s=0.2, message="test starts from four idle nodes")
    c = Cluster(slurm_conf)
    try:
        yield c
    finally:
        c.restore()


@pytest.fixture
def adapter(slurm_conf: Path) -> SlurmAdapter:
    return SlurmAdapter(slurm_conf=slurm_conf, retries=1, backoff_s=0.1)


def reason(what: str) -> str:
    return f"gpuops: {what} id={uuid.uuid4().hex[:20]}"


def test_drain_keeps_the_running_job_running_and_the_node_ends_drained_with_our_reason(cluster, adapter):
    job_id = cluster.submit("--requeue")
    node = cluster.running(job_id)
    why = reason("drain xid79")

    adapter.drain(node, why)
    adapter.drain(node, reason("drain again"))  # idempotent: already ours, left as it is

    status = adapter.status(node)
    assert status.drained and status.ours and status.reason == why
    assert status.jobs == (job_id,) and "DRAIN" in status.raw_state
    assert running_on(job_id) == node
    state = run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.split()
    assert state and state[0] in ("draining", "drained")


def test_requeue_sends_the_job_to_another_node_at_once_and_reports_the_one_it_cannot_move(cluster, adapter):
    movable = cluster.submit("--requeue")
    node = cluster.running(movable)
    pinned = cluster.submit("--no-requeue", "-w", node)
    cluster.running(pinned)

    moved = adapter.requeue(node, reason("requeue xid79"))

    assert list(moved) == [movable] and moved.delayed == []
    assert set(moved.skipped) == {pinned} and "--no-requeue" in moved.skipped[pinned]
    # released with StartTime=now: running elsewhere well before Slurm's ~120 s BeginTime
    elsewhere = wait_until(lambda: (n := running_on(movable)) and n != node and n, timeout_s=20, interval_s=0.1,
                           message=f"job {movable} running on a node other than {node}")
    assert elsewhere in NODES
    assert job(movable)["restart_cnt"] == 1
    assert running_on(pinned) == node
    status = adapter.status(node)
    assert status.drained and status.ours and status.jobs == (pinned,)


def test_resume_returns_a_gpuops_drain_to_service_and_is_a_no_op_on_an_idle_node(cluster, adapter):
    node = "gpu-node-02"
    adapter.drain(node, reason("drain"))
    adapter.resume(node, reason("resume"))
    wait_until(lambda: (s := adapter.status(node)).raw_state == "IDLE" and s, timeout_s=15, interval_s=0.1,
               message=f"{node} idle after resume")
    adapter.resume(node, reason("resume again"))  # not drained: nothing to do
    assert adapter.status(node).reason is None


def test_an_admin_drain_is_never_resumed_nor_overwritten(cluster, adapter):
    node = "gpu-node-03"
    run("scontrol", "update", f"nodename={node}", "state=DRAIN", "reason=admin maintenance")

    with pytest.raises(NotOurs, match="admin maintenance"):
        adapter.resume(node, reason("resume"))
    with pytest.raises(NotOurs, match="admin maintenance"):
        adapter.drain(node, reason("drain"))
    with pytest.raises(NotOurs):
        adapter.reboot(node, reason("reboot"))

    status = adapter.status(node)
    assert status.drained and not status.ours and status.reason == "admin maintenance"


def test_reboot_of_an_idle_node_reboots_it_and_returns_it_to_service(cluster, adapter):
    node = "gpu-node-04"
    boot_before = sinfo_nodes()[node]["boot_time"]
    log = cluster.root / "log" / "fake_reboot.log"
    lines_before = log.read_text().count(f"fake reboot of {node}") if log.exists() else 0

    adapter.reboot(node, reason("reboot xid48"))

    # scontrol reboot ASAP: DRAIN+REBOOT_REQUESTED, then DOWN+DRAIN+REBOOT_ISSUED while the
    # RebootProgram runs (slurm_up.sh's fake restarts that slurmd with -b after ~3 s)
    first = adapter.status(node)
    assert first.rebooting and first.drained and first.ours
    adapter.reboot(node, reason("reboot again"))  # already rebooting for gpuops: no second request
    back = wait_until(lambda: (s := adapter.status(node)).raw_state == "IDLE" and s, timeout_s=30,
                      interval_s=0.2, message=f"{node} back in service after the reboot")
    # nextstate=RESUME: back idle, reason cleared, with a new boot time
    assert not back.drained and not back.rebooting and back.reason is None
    assert back.extra["boot_time"] > boot_before
    assert log.read_text().count(f"fake reboot of {node}") == lines_before + 1


def test_resume_withdraws_a_reboot_still_waiting_for_a_running_job(cluster, adapter):
    job_id = cluster.submit("--requeue")
    node = cluster.running(job_id)
    adapter.reboot(node, reason("drain_reboot"))
    waiting = adapter.status(node)
    assert waiting.rebooting and waiting.drained and waiting.ours and waiting.jobs == (job_id,)

    adapter.resume(node, reason("resume"))

    status = wait_until(lambda: (s := adapter.status(node)) and not s.drained and s, timeout_s=15,
                        interval_s=0.1, message=f"{node} back in service")
    assert not status.rebooting and status.jobs == (job_id,)


def test_unknown_nodes_read_as_absent_and_actions_on_them_fail_permanently(cluster, adapter):
    assert adapter.status("gpu-node-99").exists is False
    assert "gpu-node-99" not in {s.name for s in adapter.list_nodes()}
    for call in (adapter.drain, adapter.requeue, adapter.reboot, adapter.resume):
        with pytest.raises(UnknownNode, match="gpu-node-99"):
            call("gpu-node-99", reason("x"))


def test_list_nodes_reads_every_node_in_one_pass(cluster, adapter):
    job_id = cluster.submit("--requeue")
    node = cluster.running(job_id)
    statuses = {s.name: s for s in adapter.list_nodes()}
    assert sorted(statuses) == NODES
    assert statuses[node].jobs == (job_id,) and statuses[node].partitions == ("gpu",)
    assert all(not s.drained and not s.down for s in statuses.values())


def test_maintenance_reservation_marks_the_node_as_under_maintenance(cluster, adapter):
    cluster.reserve_maintenance("gpu-node-01")
    assert adapter.status("gpu-node-01").maintenance
    assert not adapter.status("gpu-node-02").maintenance


def test_controller_down_is_transient_after_retries_and_drain_works_once_it_is_back(cluster, slurm_conf):
    pauses: list[float] = []
    # timeout above Slurm's own ~9 s of connect retries, so Slurm's message is what we classify
    adapter = SlurmAdapter(slurm_conf=slurm_conf, timeout_s=20, retries=1, backoff_s=0.5, sleep=pauses.append)
    node = "gpu-node-01"
    cluster.stop_controller()

    with pytest.raises(TransientAdapterError, match="gave up after 2 attempts") as failed:
        adapter.drain(node, reason("drain"))
    assert not isinstance(failed.value, PermanentAdapterError)
    assert pauses == [0.5]

    cluster.start_controller()
    # after a restart the slurmds re-register: nodes read "unknown" for a second or two
    wait_until(lambda: adapter.status(node).raw_state == "IDLE", timeout_s=30, interval_s=0.2,
               message=f"{node} registered again")
    adapter.drain(node, reason("drain"))
    assert adapter.status(node).drained
