"""Drain, resume and requeue on a real Slurm 22.05 controller (no mocks).

Runs against the cluster from deploy/testservices/slurm_up.sh (nodes gpu-node-01..04,
Gres=gpu:h100:8 each). Behaviour pinned here is what the Slurm adapter relies on; see
shared/infra/slurm_transcript.txt for the full catalogue.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.slurm


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a Slurm client command (SLURM_CONF from the environment) with a timeout."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=check)


def scontrol_node(name: str) -> dict[str, str]:
    """``State`` and ``Reason`` of a node as ``scontrol show node`` prints them."""
    out = run("scontrol", "show", "node", name).stdout
    state = re.search(r"\bState=(\S+)", out)
    reason = re.search(r"^\s*Reason=(.*)$", out, re.MULTILINE)
    return {"state": state.group(1) if state else "", "reason": reason.group(1).strip() if reason else ""}


def sinfo_node(name: str) -> dict:
    """A node's record from ``sinfo --json`` (22.05 ignores ``-n``, so filter here)."""
    nodes = json.loads(run("sinfo", "--json").stdout)["nodes"]
    return next(n for n in nodes if n["name"] == name)


def job_state(job_id: str) -> str:
    return run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()


def test_drained_node_shows_drain_with_reason_and_resume_returns_it_to_idle(slurm_conf: Path):
    node = "gpu-node-02"
    reason = f"gpuops: test {uuid.uuid4().hex[:8]}"
    assert scontrol_node(node)["state"] == "IDLE", "test needs an idle node to start from"
    try:
        run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

        drained = wait_until(lambda: (s := scontrol_node(node))["state"].startswith("IDLE+DRAIN") and s,
                             timeout_s=10, message=f"{node} drained")
        # Slurm appends who and when: "gpuops: test 1a2b3c4d [root@2026-12-02T13:00:05]"
        assert re.fullmatch(re.escape(reason) + r" \[\w+@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\]", drained["reason"])
        info = sinfo_node(node)
        assert "DRAIN" in info["state_flags"]
        assert info["reason"] == reason  # the JSON view keeps the reason without the suffix

        run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        # right after RESUME the node can read IDLE+NOT_RESPONDING for a moment: poll
        wait_until(lambda: scontrol_node(node)["state"] == "IDLE", timeout_s=15, interval_s=0.1,
                   message=f"{node} idle again")
        info = sinfo_node(node)
        assert info["state"] == "idle" and info["state_flags"] == [] and info["reason"] == ""
    finally:
        if "DRAIN" in scontrol_node(node)["state"]:
            run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def test_gpu_job_runs_on_the_requested_node_and_requeue_puts_it_back_to_pending(slurm_conf: Path, tmp_path: Path):
    out = tmp_path / "job.out"
    submitted = run("sbatch", "--parsable", "-J", "gpuops-test-requeue", "-o", str(out), "-w", "gpu-node-03",
                    "--gres=gpu:1", "--wrap", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; sleep 30")
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id.isdigit(), submitted.stdout
    try:
        # the scheduler starts jobs every couple of seconds (sched_min_interval=2 s)
        wait_until(lambda: job_state(job_id) == "RUNNING", timeout_s=30, interval_s=0.1,
                   message=f"job {job_id} running")
        assert run("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip() == "gpu-node-03"
        # the GPU gres was allocated: slurmd exported the device index to the job
        wait_until(lambda: out.exists() and "CUDA_VISIBLE_DEVICES=0" in out.read_text(), timeout_s=15,
                   message="job output shows CUDA_VISIBLE_DEVICES=0")

        run("scontrol", "requeue", job_id)
        # RUNNING -> COMPLETING -> PENDING (Reason=BeginTime: held ~120 s before it may restart)
        wait_until(lambda: job_state(job_id) == "PENDING", timeout_s=30, interval_s=0.1,
                   message=f"job {job_id} pending after requeue")
        shown = run("scontrol", "show", "job", job_id).stdout
        assert "Restarts=1" in shown
        assert "Reason=BeginTime" in shown
    finally:
        run("scancel", job_id, check=False)
        wait_until(lambda: job_state(job_id) in ("", "CANCELLED"), timeout_s=30, interval_s=0.1,
                   message=f"job {job_id} gone after scancel")
