"""deploy/slurm: the example config loads in gpuops serve, the units run real gpuops commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "deploy" / "slurm"


def test_example_slurm_config_loads_with_the_slurm_adapter_and_disarmed() -> None:
    from api.config import load_service_config

    cfg = load_service_config(SLURM / "gpuops.slurm.yaml")
    assert cfg.adapter.name == "slurm" and cfg.adapter.options["slurm_conf"] == "/etc/slurm/slurm.conf"
    assert cfg.safety.armed is False


def test_units_start_gpuops_commands_the_cli_has() -> None:
    from api.cli import build_cli

    commands = {c.name or c.callback.__name__ for c in build_cli().registered_commands}
    for unit, cmd in (("gpuops-agent.service", "agent"), ("gpuops.service", "serve")):
        exec_start = re.search(r"^ExecStart=(\S+) (\S+)", (SLURM / unit).read_text(), re.M)
        assert exec_start and exec_start.group(1).endswith("/gpuops") and exec_start.group(2) == cmd
        assert cmd in commands
    assert "--config /etc/gpuops/gpuops.yaml" in (SLURM / "gpuops.service").read_text()


def test_agent_env_example_names_only_real_agent_settings() -> None:
    from collector.agent_settings import AgentSettings

    fields = {f.upper() for f in AgentSettings.model_fields}
    for line in (SLURM / "agent.env.example").read_text().splitlines():
        m = re.match(r"#?\s*GPUOPS_AGENT_([A-Z_]+)=", line)
        if m:
            assert m.group(1) in fields, line


def test_readme_states_the_reason_prefix_the_contract_fixes() -> None:
    from remediation.actions import REASON_PREFIX

    assert f"`{REASON_PREFIX}`" in (SLURM / "README.md").read_text()
