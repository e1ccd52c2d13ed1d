"""``gpuops agent`` as a process: --once to stdout, start-up errors, SIGTERM flush, composition."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import orjson
import pynvml
import pytest

from api.commands.agent import compose_agent
from collector.agent_settings import AgentSettings
from collector.schema import RecordType, validate_record
from collector.sources.nvml import NvmlUnavailableError
from fake_nvml import FakeGpu, FakeNvml
from tests.helpers import wait_until

GPUOPS = [sys.executable, "-c", "from api.cli import main; main()"]


def _gpuops(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUOPS, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_once_to_stdout_prints_one_valid_record_per_line_with_its_type(shared_fixtures: Path, h100_sysfs: Path) -> None:
    out = _gpuops("agent", "--once", "--sink", "stdout", "--sources", "infiniband,kmsg,dcgm",
                  "--sysfs-root", h100_sysfs, "--kmsg-file", shared_fixtures / "xid/gpud/dmesg.0.log",
                  "--dcgm-url", shared_fixtures / "dcgm_exporter/scrapes/datadog_dcgm_fixture_metrics.txt",
                  "--node", "h100-a")
    assert out.returncode == 0, out.stderr
    records = [orjson.loads(line) for line in out.stdout.splitlines()]
    kinds = [r["type"] for r in records]
    assert (kinds.count("gpu"), kinds.count("net"), kinds.count("event")) == (1, 9, 11)
    for r in records:
        rtype = r.pop("type")
        assert r["node"] == "h100-a"
        assert validate_record(r, RecordType(rtype)) is None, r
    assert [r["code"] for r in records if "code" in r] == [48, 63] + [94] * 9


def test_unknown_source_fails_at_start_listing_the_valid_ones() -> None:
    out = _gpuops("agent", "--once", "--sink", "stdout", "--sources", "infiniband,nvlm")
    assert out.returncode == 2 and out.stdout == ""
    assert "unknown source 'nvlm'" in out.stderr and "dcgm, infiniband, ipmi, kmsg, nvml, redfish" in out.stderr


def test_a_batch_spanning_the_scorers_lateness_is_refused_at_start_and_one_within_it_runs(h100_sysfs: Path) -> None:
    out = _gpuops("agent", "--once", "--sink", "stdout", "--sources", "infiniband", "--sysfs-root", h100_sysfs,
                  "--interval", "10", "--publish-every-ticks", "5")
    assert out.returncode == 2 and "allowed lateness" in out.stderr
    ok = _gpuops("agent", "--once", "--sink", "stdout", "--sources", "infiniband", "--sysfs-root", h100_sysfs,
                 "--interval", "10", "--publish-every-ticks", "2", "--wire-format", "json")
    assert ok.returncode == 0, ok.stderr
    assert {json.loads(line)["type"] for line in ok.stdout.splitlines()} == {"net"}


def test_source_that_cannot_start_fails_with_a_clear_message(tmp_path: Path) -> None:
    out = _gpuops("agent", "--once", "--sink", "stdout", "--sources", "infiniband", "--sysfs-root", tmp_path)
    assert out.returncode == 2 and "class/infiniband does not exist" in out.stderr


def test_nvml_without_a_driver_stops_composition_and_closes_what_was_built(tmp_path: Path) -> None:
    settings = AgentSettings(node="n1", sources="nvml,kmsg", kmsg_file=tmp_path / "k.log", health_file=None)
    with pytest.raises(NvmlUnavailableError, match="libnvidia-ml.so.1"):
        compose_agent(settings, nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_composition_resolves_kernel_log_gpus_with_nvml_indexes(tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text("")
    settings = AgentSettings(node="n1", sources="kmsg,nvml", kmsg_file=log, sink="stdout", health_file=None)
    fake = FakeNvml([FakeGpu(pci_bus_id="00000000:18:00.0"), FakeGpu(pci_bus_id="00000000:3B:00.0")])
    agent = compose_agent(settings, nvml=fake)
    try:
        assert [s.name for s in agent.sources] == ["kmsg", "nvml"]
        assert agent.sources[0].gpu_index_by_pci == {"0000:18:00": 0, "0000:3b:00": 1}
    finally:
        agent.close()



def test_the_health_record_names_the_gpus_nvml_reports_lost(tmp_path: Path) -> None:
    settings = AgentSettings(node="n1", sources="nvml", sink="stdout", health_file=None)
    lost = FakeGpu(pci_bus_id="00000000:3B:00.0")
    agent = compose_agent(settings, nvml=FakeNvml([FakeGpu(), lost]))
    try:
        agent.tick()
        assert agent.health()["nvml"] == {"gpus_lost": []}
        lost.failing["nvmlDeviceGetPciInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST  # off the bus
        agent.tick()
        assert agent.health()["nvml"] == {"gpus_lost": [1]}
    finally:
        agent.close()

@contextlib.contextmanager
def running_agent(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``gpuops agent *args`` as a real process (its output piped), killed on the way out if still running."""
    proc = subprocess.Popen([*GPUOPS, "agent", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_sigterm_stops_sampling_flushes_and_exits_cleanly(h100_sysfs: Path, tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    with running_agent("--sink", "stdout", "--sources", "infiniband", "--sysfs-root", str(h100_sysfs),
                       "--interval", "0.1", "--node", "n1", "--health-file", str(health)) as proc:
        def ticked() -> bool:
            try:
                return json.loads(health.read_text())["ticks"] >= 3
            except (OSError, ValueError):
                return False

        wait_until(ticked, timeout_s=30, message="three ticks in the health file")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    final = json.loads(health.read_text())
    lines = stdout.splitlines()
    assert final["buffer_depth"] == 0 and final["published_total"] == final["ticks"] >= 3
    assert len(lines) == 9 * final["ticks"]
    assert "SIGTERM" in stderr


def test_commands_with_a_world_readable_key_file_fail_at_start_saying_how_to_fix_it(tmp_path: Path,
                                                                                   h100_sysfs: Path) -> None:
    key = tmp_path / "command.key"
    key.write_text("ab" * 32)
    key.chmod(0o644)
    env = {**os.environ, "GPUOPS_AGENT_COMMANDS_ENABLED": "true", "GPUOPS_AGENT_COMMAND_KEY_FILE": str(key)}
    out = subprocess.run([*GPUOPS, "agent", "--sink", "stdout", "--sources", "infiniband", "--sysfs-root",
                          str(h100_sysfs), "--health-file", ""], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "readable or writable by every user" in out.stderr and "chmod 600" in out.stderr


def test_node_in_a_bmc_address_is_this_nodes_name_and_no_other_placeholder_passes() -> None:
    s = AgentSettings(node="gpu-node-007", redfish_url="https://{node}-bmc.mgmt.example", bmc_host="{node}.ipmi")
    assert (s.redfish_url, s.bmc_host) == ("https://gpu-node-007-bmc.mgmt.example", "gpu-node-007.ipmi")
    assert AgentSettings(node="n", redfish_url="https://bmc-7").redfish_url == "https://bmc-7"
    for bad in ("https://{host}-bmc", "https://{node-bmc", "https://{{node}}-bmc"):
        with pytest.raises(ValueError, match=r"the only placeholder is \{node\}"):
            AgentSettings(node="n", redfish_url=bad)
