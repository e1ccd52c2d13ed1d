"""The Slurm adapter without a cluster: parsing real captures, classifying errors, retrying.

The JSON and reservation captures in ``tests/remediation/data`` come from the test cluster
(deploy/testservices/slurm_up.sh, Slurm 22.05.8) with gpu-node-01 drained by gpuops with
two jobs on it (one spanning gpu-node-[01-02]), gpu-node-02 drained by an admin inside an
active MAINT reservation, gpu-node-03 DOWN and gpu-node-04 with a gpuops ``reboot ASAP``
pending behind a running job. The retry tests run the adapter against small executable
stand-ins for ``scontrol``/``sinfo`` that print what the real clients printed with the
controller stopped (shared/infra/slurm_transcript.txt and remediation/adapters/slurm_errors.py).
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from remediation.adapters.base import (NotOurs, PermanentAdapterError, TransientAdapterError,
                                       UnknownNode, adapter_class)
from remediation.adapters.slurm import SlurmAdapter
from remediation.adapters.slurm_errors import SLURM_ERRORS, classify, classify_timeout
from remediation.adapters.slurm_state import (Facility, expand_hostlist, json_errors, leaf_switches,
                                              maintenance_nodes, parse_jobs, parse_nodes, rack_of)

DATA = Path(__file__).parent / "data"


def load(name: str):
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def nodes():
    statuses = parse_nodes(load("sinfo_22.05_mixed.json"), load("squeue_22.05_mixed.json"),
                           (DATA / "scontrol_show_reservation_22.05.txt").read_text())
    return {s.name: s for s in statuses}


# ---- parsing real captures -------------------------------------------------------------

def test_gpuops_drain_with_jobs_reads_drained_ours_with_both_jobs(nodes):
    n = nodes["gpu-node-01"]
    assert (n.exists, n.drained, n.ours, n.down, n.rebooting, n.maintenance) == (True, True, True, False, False, False)
    assert n.reason == "gpuops: drain xid79 id=0123456789abcdef0123"
    assert n.jobs == ("4", "5")  # job 5 spans gpu-node-[01-02]
    assert n.partitions == ("gpu",)
    assert n.raw_state == "MIXED+DRAIN"


def test_admin_drain_in_active_maint_reservation_is_maintenance_and_not_ours(nodes):
    n = nodes["gpu-node-02"]
    assert n.drained and not n.ours and n.maintenance
    assert n.reason == "admin maintenance"
    assert n.jobs == ("5",)


def test_down_node_is_down_not_drained_and_an_inactive_maint_reservation_is_not_maintenance(nodes):
    n = nodes["gpu-node-03"]
    assert n.down and not n.drained and not n.ours and not n.maintenance
    assert n.reason == "GPU fell off bus (XID 79)"
    assert n.idle


def test_reboot_asap_behind_a_running_job_reads_rebooting_drained_ours(nodes):
    n = nodes["gpu-node-04"]
    assert n.rebooting and n.drained and n.ours and not n.maintenance
    assert n.jobs == ("6",)
    assert n.raw_state == "MIXED+DRAIN+REBOOT_REQUESTED"


def test_jobs_carry_batch_and_requeue_flags_and_finished_ones_do_not_occupy_nodes():
    jobs = {j.job_id: j for j in parse_jobs(load("squeue_22.05_mixed.json"))}
    assert jobs["4"].requeueable and jobs["4"].batch and jobs["4"].occupies_node
    assert not jobs["6"].requeueable  # submitted with --no-requeue
    assert jobs["5"].nodes == ("gpu-node-01", "gpu-node-02")
    assert jobs["7"].state == "PENDING" and not jobs["7"].occupies_node
    assert jobs["3"].state == "CANCELLED" and not jobs["3"].occupies_node


def test_maintenance_needs_an_active_reservation_with_the_maint_flag():
    text = (DATA / "scontrol_show_reservation_22.05.txt").read_text()
    assert maintenance_nodes(text) == {"gpu-node-02"}  # "later" is INACTIVE, "plain" has no MAINT
    assert maintenance_nodes("No reservations in the system\n") == set()


def test_slurm_21_08_json_from_another_site_parses_the_same_way(shared_fixtures: Path):
    base = shared_fixtures / "slurm" / "prometheus-slurm-exporter_rivosinc"
    sinfo = json.loads((base / "sinfo_out.json").read_text())
    squeue = json.loads((base / "squeue_out.json").read_text())
    statuses = parse_nodes(sinfo, squeue, "")
    assert len(statuses) == len(sinfo["nodes"]) and all(s.exists and s.partitions for s in statuses)
    running = {j.job_id for j in parse_jobs(squeue) if j.state == "RUNNING"}
    assert {j for s in statuses for j in s.jobs} <= running | {
        j.job_id for j in parse_jobs(squeue) if j.occupies_node}


@pytest.mark.parametrize("expression, names", [
    ("gpu-node-01", ["gpu-node-01"]),
    ("gpu-node-[01-03]", ["gpu-node-01", "gpu-node-02", "gpu-node-03"]),
    ("gpu-node-[01,03-04],login1", ["gpu-node-01", "gpu-node-03", "gpu-node-04", "login1"]),
    ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
    ("", []),
])
def test_hostlist_expressions_expand_with_their_zero_padding(expression, names):
    assert expand_hostlist(expression) == names


# ---- classifying failures ---------------------------------------------------------------

@pytest.mark.parametrize("message, expected", [
    ("slurm_update error: Invalid node name specified", UnknownNode),
    ("scontrol_reboot_nodes error: Invalid node name specified", UnknownNode),
    ("Node gpu-node-99 not found", UnknownNode),
    ("slurm_update error: Unable to contact slurm controller (connect failure)", TransientAdapterError),
    ("Unexpected message received for job 5", TransientAdapterError),
    ("Unspecified error", TransientAdapterError),
    ("slurm_load_jobs error: Socket timed out on send/recv operation", TransientAdapterError),
    ("Connection refused", TransientAdapterError),
    ("Requested operation is presently disabled for job 3", PermanentAdapterError),
    ("Invalid job id specified for job 99999", PermanentAdapterError),
    ("slurm_update error: Invalid node state specified", PermanentAdapterError),
    ("something Slurm never printed before", PermanentAdapterError),
])
def test_slurm_messages_map_to_their_error_class(message, expected):
    error = classify(message, "scontrol update")
    assert type(error) is expected
    assert message.split()[0] in str(error) and "scontrol update" in str(error)


def test_every_error_row_says_where_it_was_seen():
    assert all(seen.strip() for _p, _cls, seen in SLURM_ERRORS)


def test_a_client_timeout_is_transient():
    error = classify_timeout(subprocess.TimeoutExpired(["sinfo"], 2.5), "sinfo --json")
    assert isinstance(error, TransientAdapterError) and "2.5 s" in str(error)


def test_json_errors_of_a_controller_that_is_down_are_reported():
    down = {"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                        "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}
    assert json_errors(down) == ["slurm_load_jobs: Failed while looking for jobs: Unspecified error"]
    assert json_errors(load("sinfo_22.05_mixed.json")) == []


# ---- the adapter against stand-in clients -------------------------------------------------

def stand_in(tmp_path: Path, name: str, body: str) -> str:
    """An executable *name* in tmp_path that appends its argv to calls.log, then runs *body*."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp_path}/calls.log"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_controller_unreachable_is_retried_with_backoff_then_raised_as_transient(tmp_path: Path):
    down = "echo 'slurm_load_partitions: Unable to contact slurm controller (connect failure)' >&2; exit 1"
    pauses: list[float] = []
    adapter = SlurmAdapter(sinfo=stand_in(tmp_path, "sinfo", down), retries=3, backoff_s=0.5,
                           sleep=pauses.append)
    with pytest.raises(TransientAdapterError, match="Unable to contact slurm controller.*4 attempts"):
        adapter.status("gpu-node-01")
    assert pauses == [0.5, 1.0, 2.0]
    assert calls(tmp_path) == ["sinfo --json"] * 4


def test_a_hung_client_is_killed_at_the_timeout_and_counts_as_transient(tmp_path: Path):
    adapter = SlurmAdapter(sinfo=stand_in(tmp_path, "sinfo", "exec sleep 30"), timeout_s=0.3, retries=1,
                           sleep=lambda s: None)
    with pytest.raises(TransientAdapterError, match="no answer within 0.3 s"):
        adapter.list_nodes()
    assert len(calls(tmp_path)) == 2


def test_a_permanent_failure_is_not_retried(tmp_path: Path):
    sinfo = stand_in(tmp_path, "sinfo", f"cat {DATA / 'sinfo_22.05_mixed.json'}")
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue_22.05_mixed.json'}")
    scontrol = stand_in(tmp_path, "scontrol", """case "$1" in
  -o) echo 'No reservations in the system';;
  *) echo 'slurm_update error: Invalid node name specified' >&2; exit 1;;
esac""")
    adapter = SlurmAdapter(sinfo=sinfo, squeue=squeue, scontrol=scontrol, sleep=lambda s: pytest.fail("slept"))
    # gpu-node-03 is DOWN with an admin's reason: refused before any update is sent
    with pytest.raises(NotOurs, match="GPU fell off bus"):
        adapter.drain("gpu-node-03", "gpuops: drain id=x")
    assert not [c for c in calls(tmp_path) if "update" in c]


def test_requeued_jobs_still_completing_at_the_deadline_are_reported_delayed(tmp_path: Path):
    # the capture: gpu-node-01 already drained by gpuops, jobs 4 and 5 (gpu-node-[01-02]) running
    sinfo = stand_in(tmp_path, "sinfo", f"cat {DATA / 'sinfo_22.05_mixed.json'}")
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue_22.05_mixed.json'}")
    scontrol = stand_in(tmp_path, "scontrol", "exit 0")
    ticks = iter(range(0, 1000, 10))
    pauses: list[float] = []
    adapter = SlurmAdapter(sinfo=sinfo, squeue=squeue, scontrol=scontrol, requeue_release_timeout_s=25,
                           poll_interval_s=0.5, sleep=pauses.append, clock=lambda: float(next(ticks)))

    moved = adapter.requeue("gpu-node-01", "gpuops: requeue id=x")

    assert list(moved) == ["4", "5"] and moved.delayed == ["4", "5"] and moved.skipped == {}
    made = [c for c in calls(tmp_path) if c.startswith("scontrol") and "show" not in c]
    assert made == ["scontrol requeue 4", "scontrol requeue 5"]  # no StartTime=now for a job not pending
    assert pauses == [0.5, 0.5]


@pytest.mark.parametrize("node", ["gpu-node-[01-02]", "-h", "node;reboot", "a b", "", "gpu-node-01\n"])
def test_invalid_node_names_are_refused_before_any_command_runs(tmp_path: Path, node: str):
    fake = {b: stand_in(tmp_path, b, "exit 0") for b in ("scontrol", "sinfo", "squeue")}
    adapter = SlurmAdapter(**fake)
    for call in (adapter.drain, adapter.requeue, adapter.reboot, adapter.resume):
        with pytest.raises(PermanentAdapterError, match="invalid node name"):
            call(node, "gpuops: test")
    with pytest.raises(PermanentAdapterError, match="invalid node name"):
        adapter.status(node)
    assert calls(tmp_path) == []


def test_a_reason_without_the_gpuops_prefix_is_refused_before_any_command_runs(tmp_path: Path):
    fake = {b: stand_in(tmp_path, b, "exit 0") for b in ("scontrol", "sinfo", "squeue")}
    adapter = SlurmAdapter(**fake)
    for call in (adapter.drain, adapter.reboot, adapter.resume):
        with pytest.raises(PermanentAdapterError, match="must start with 'gpuops:'"):
            call("gpu-node-01", "admin maintenance")
    assert calls(tmp_path) == []


def test_a_missing_binary_is_a_permanent_error_that_names_it(tmp_path: Path):
    adapter = SlurmAdapter(sinfo=str(tmp_path / "no-sinfo"), sleep=lambda s: pytest.fail("slept"))
    with pytest.raises(PermanentAdapterError, match="no-sinfo"):
        adapter.list_nodes()


def test_the_registry_names_this_adapter_and_from_config_refuses_unknown_knobs():
    assert adapter_class("slurm") is SlurmAdapter
    assert SlurmAdapter.from_config({"timeout_s": 5, "slurm_conf": "/x/slurm.conf"}).env["SLURM_CONF"] == "/x/slurm.conf"
    with pytest.raises(ValueError, match="timeout_sec"):
        SlurmAdapter.from_config({"timeout_sec": 5})


# ---- where nodes sit: topology/tree leaf switches and rack features -----------------------

def test_a_nodes_leaf_is_the_lowest_level_switch_it_is_in():
    leaves = leaf_switches((DATA / "scontrol_show_topology_22.05.txt").read_text())
    assert leaves == {"gpu-node-01": "leaf-01", "gpu-node-02": "leaf-01",
                      "gpu-node-03": "leaf-02", "gpu-node-04": "leaf-02"}   # not spine-01, which has them all
    assert leaf_switches("") == {}                                          # no topology plugin: Slurm prints nothing


@pytest.mark.parametrize("features, prefix, rack", [
    ("rack_r07", "rack_", "r07"), ("h100,rack_r07", "rack_", "r07"), (["rack=r07"], "rack=", "r07"),
    ("h100", "rack_", None), ("rack_", "rack_", None), (None, "rack_", None), ("rack_r07", None, None),
])
def test_the_rack_comes_from_the_feature_with_the_sites_prefix(features, prefix, rack):
    assert rack_of(features, prefix) == rack


def test_node_status_carries_rack_and_leaf_only_when_known(nodes):
    raw = load("sinfo_22.05_mixed.json")["nodes"]
    raw[0] = {**raw[0], "active_features": "rack_r01,h100"}
    placed = {s.name: s for s in parse_nodes({"nodes": raw}, load("squeue_22.05_mixed.json"), "",
                                             Facility({"gpu-node-01": "leaf-01", "gpu-node-02": "leaf-01"}))}
    assert (placed["gpu-node-01"].extra["rack"], placed["gpu-node-01"].extra["leaf"]) == ("r01", "leaf-01")
    assert "rack" not in placed["gpu-node-02"].extra and placed["gpu-node-02"].extra["leaf"] == "leaf-01"
    assert not {"rack", "leaf"} & set(placed["gpu-node-03"].extra)
    assert not {"rack", "leaf"} & set(nodes["gpu-node-01"].extra)                 # no Facility: as before


def test_a_cluster_without_a_topology_plugin_lists_nodes_as_before_and_logs_nothing(tmp_path: Path, caplog):
    sinfo = stand_in(tmp_path, "sinfo", f"cat {DATA / 'sinfo_22.05_mixed.json'}")
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue_22.05_mixed.json'}")
    # what Slurm 22.05 does without TopologyPlugin: nothing on stdout, a line on stderr, status 0
    scontrol = stand_in(tmp_path, "scontrol", """case "$1" in
  -o) echo 'No reservations in the system';;
  show) echo 'scontrol: error: No topology information available' >&2;;
esac""")
    adapter = SlurmAdapter(sinfo=sinfo, squeue=squeue, scontrol=scontrol, topology_refresh_s=300)
    with caplog.at_level("INFO"):
        for _ in range(3):
            listed = adapter.list_nodes()
    assert len(listed) == 4 and not any({"rack", "leaf"} & set(n.extra) for n in listed)
    assert [r for r in caplog.records if r.levelname != "DEBUG"] == []
    assert calls(tmp_path).count("scontrol show topology") == 1           # read once per refresh_s, not per call
